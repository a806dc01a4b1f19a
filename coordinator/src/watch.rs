//! Files the coordinator re-reads while serving (PROTOCOL §20): the listener's certificate
//! and key, the ACL file and the JWKS files it names.
//!
//! One mechanism for all of them: each file's [`Stamp`] (modification time, size, inode) is
//! checked every [`POLL_EVERY`], and a change of any part means "read it again"; `SIGHUP`
//! forces a re-read of everything. Polling `stat` (a few calls a second) rather than an
//! inotify watch sees a Kubernetes Secret or ConfigMap volume's update, which swaps the
//! `..data` symlink and leaves the watched files' own inodes untouched.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tracing::info;

/// How often the watched files are checked for a change.
pub(crate) const POLL_EVERY: Duration = Duration::from_secs(1);

/// What a file looked like when last read (`None`: it could not be `stat`ed).
pub(crate) type Stamp = Option<(SystemTime, u64, u64)>;

/// The stamp of `path` now, following symlinks.
pub(crate) fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// Something served from files that [`run`] keeps fresh.
pub(crate) trait Reload: Send + Sync {
    /// Re-reads the files if they changed since the last read (or always, with `force`);
    /// returns whether something new is served. A failure keeps what is served, logs the
    /// file at fault and counts it.
    fn reload(&self, force: bool) -> bool;
}

/// Polls `items` every [`POLL_EVERY`] and reloads all of them on SIGHUP, forever.
pub(crate) async fn run(items: Vec<Arc<dyn Reload>>) {
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let force = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async { hup.as_mut()?.recv().await } => {
                info!("SIGHUP received; re-reading the certificate, ACL and JWKS files");
                true
            }
        };
        #[cfg(not(unix))]
        let force = {
            tick.tick().await;
            false
        };
        for item in &items {
            item.reload(force);
        }
    }
}
