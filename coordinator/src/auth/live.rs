//! The ACL served now, re-read without a restart (PROTOCOL §20, "ACL reload"): when the ACL
//! file or one of the JWKS files it names changes, and on SIGHUP (the [`crate::watch`]
//! mechanism the listener's certificate uses). A file that cannot be used keeps the ACL
//! served, logs the error naming the file, and counts `rsc_acl_reload_errors_total`.

use super::acl::Acl;
use crate::watch::{self, Stamp, stamp};
use arc_swap::ArcSwap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tracing::{info, warn};

/// The ACL file, the ACL read from it, and the stamps of the files it was read from.
pub(crate) struct LiveAcl {
    path: PathBuf,
    current: ArcSwap<Acl>,
    seen: Mutex<Vec<(PathBuf, Stamp)>>,
}

impl std::fmt::Debug for LiveAcl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveAcl")
            .field("path", &self.path)
            .field("acl", &*self.current.load())
            .finish()
    }
}

/// The files an ACL was read from: the ACL file (stamped before it was read) and its JWKS
/// files (each stamped before it was read), so a change during a read is seen next time.
fn files_of(path: &Path, before: Stamp, acl: &Acl) -> Vec<(PathBuf, Stamp)> {
    let mut files = vec![(path.to_owned(), before)];
    files.extend(acl.jwks_files());
    files
}

impl LiveAcl {
    /// Loads the ACL file (an error names the file at fault).
    pub(crate) fn load(path: &Path) -> Result<Self, super::acl::AclError> {
        let before = stamp(path);
        let acl = Acl::load(path)?;
        Ok(LiveAcl {
            path: path.to_owned(),
            seen: Mutex::new(files_of(path, before, &acl)),
            current: ArcSwap::from_pointee(acl),
        })
    }

    /// The ACL served now.
    pub(crate) fn current(&self) -> Arc<Acl> {
        self.current.load_full()
    }

    /// Re-reads the files if one changed since the last read (or always, with `force`).
    /// Returns whether a new ACL is served.
    pub(crate) fn reload(&self, force: bool) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let now: Vec<(PathBuf, Stamp)> = seen.iter().map(|(p, _)| (p.clone(), stamp(p))).collect();
        if !force && *seen == now {
            return false;
        }
        let before = now[0].1;
        match Acl::load(&self.path) {
            Ok(acl) => {
                *seen = files_of(&self.path, before, &acl);
                info!(file = %self.path.display(), entries = acl.len(), "ACL reloaded");
                self.current.store(Arc::new(acl));
                metrics::counter!("rsc_acl_reloads_total").increment(1);
                true
            }
            Err(e) => {
                // Read again when one of the files changes next (or at SIGHUP).
                *seen = now;
                metrics::counter!("rsc_acl_reload_errors_total").increment(1);
                warn!(file = %self.path.display(), error = %e, "ACL reload failed; keeping the previous ACL");
                false
            }
        }
    }
}

impl watch::Reload for LiveAcl {
    fn reload(&self, force: bool) -> bool {
        LiveAcl::reload(self, force)
    }
}
