//! HTTPS to the coordinator ([`ClientTls`]) and a bearer token read from a file that rotates
//! (PROTOCOL §20, §8).

use crate::error::CoordinatorError;
use rsc_protocol::redact::{ExposeSecret, SecretString};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// The client's TLS files for `https://` coordinator URLs. Without a CA the system's root
/// certificates are trusted; with one, that CA too. A client certificate (mutual TLS) needs
/// both `cert` and `key`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// CA certificates (PEM) trusted besides the system's (`RSC_COORDINATOR_CA`).
    pub ca: Option<PathBuf>,
    /// Client certificate chain (PEM) for mutual TLS (`RSC_COORDINATOR_CERT`).
    pub cert: Option<PathBuf>,
    /// Its private key (PEM) (`RSC_COORDINATOR_KEY`).
    pub key: Option<PathBuf>,
}

/// Installs rustls's ring provider (the one the coordinator's and Redis's TLS use) as the
/// process default, unless one is installed already.
///
/// The workspace builds reqwest with rustls but without a built-in crypto provider (no
/// aws-lc): a [`CoordinatorClient`](crate::CoordinatorClient) brings its own configuration,
/// but any other `reqwest::Client` of the process needs a default provider before it is
/// built, or reqwest panics. Cheap; call it before building one.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have installed one meanwhile: either is fine.
        let _ = ring_provider().install_default();
    }
}

/// rustls's ring provider, the one place this crate names it. rustls 0.23.48 deprecates
/// `ring::default_provider` for lacking post-quantum key exchange, steering to aws-lc-rs;
/// the workspace keeps ring (no C toolchain to build), so the deprecation is acknowledged
/// here and nowhere else.
#[allow(deprecated)]
fn ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn setup(path: &Path, reason: impl Into<String>) -> CoordinatorError {
    CoordinatorError::Setup {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, CoordinatorError> {
    std::fs::read(path).map_err(|e| setup(path, format!("cannot read: {e}")))
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, CoordinatorError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| setup(path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(setup(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

impl ClientTls {
    /// The rustls configuration of these files (ring provider, ALPN `h2` and `http/1.1`),
    /// e.g. for `reqwest::ClientBuilder::tls_backend_preconfigured` of another HTTP client
    /// of the coordinator (a readiness check). The system's roots are read only when
    /// `https` is true (some URL is `https://`). A file that cannot be used is
    /// [`CoordinatorError::Setup`], naming it.
    pub fn rustls_config(&self, https: bool) -> Result<rustls::ClientConfig, CoordinatorError> {
        let provider = Arc::new(ring_provider());
        let mut roots = RootCertStore::empty();
        if https {
            // Unreadable system certificates are skipped: a CA file may still do.
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
        }
        if let Some(ca) = &self.ca {
            for cert in certs(ca)? {
                roots
                    .add(cert)
                    .map_err(|e| setup(ca, format!("not a usable CA certificate: {e}")))?;
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| setup(Path::new("TLS"), e.to_string()))?
            .with_root_certificates(roots);
        let mut config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let chain = certs(cert)?;
                let der = PrivateKeyDer::from_pem_slice(&read(key)?)
                    .map_err(|e| setup(key, format!("holds no usable PEM private key: {e}")))?;
                builder.with_client_auth_cert(chain, der).map_err(|e| {
                    setup(
                        key,
                        format!("does not fit the certificate {}: {e}", cert.display()),
                    )
                })?
            }
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), None) => {
                return Err(setup(
                    cert,
                    "a client certificate needs its key (RSC_COORDINATOR_KEY)",
                ));
            }
            (None, Some(key)) => {
                return Err(setup(
                    key,
                    "a client key needs its certificate (RSC_COORDINATOR_CERT)",
                ));
            }
        };
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// What a file looked like when last read.
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// A bearer token kept in a file that is replaced while the client runs (a Kubernetes
/// projected service-account token, `RSC_TOKEN_FILE`): read again whenever the file's
/// modification time, size or inode changed (one `stat` per request). A file that cannot
/// be read then keeps the last token (and logs a warning once per change).
#[derive(Debug)]
pub(crate) struct TokenFile {
    path: PathBuf,
    state: Mutex<(Stamp, SecretString)>,
}

impl TokenFile {
    /// Reads the file now: it must hold a token (surrounding whitespace is trimmed).
    pub(crate) fn open(path: PathBuf) -> Result<Self, CoordinatorError> {
        let seen = stamp(&path);
        let token = read_token(&path)?;
        Ok(TokenFile {
            path,
            state: Mutex::new((seen, token)),
        })
    }

    /// The token now.
    pub(crate) fn token(&self) -> SecretString {
        let now = stamp(&self.path);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.0 != now {
            state.0 = now;
            match read_token(&self.path) {
                Ok(t) => state.1 = t,
                Err(e) => {
                    tracing::warn!(error = %e, "token file not re-read; keeping the last token")
                }
            }
        }
        state.1.clone()
    }
}

fn read_token(path: &Path) -> Result<SecretString, CoordinatorError> {
    let text = SecretString::from(
        String::from_utf8(read(path)?).map_err(|_| setup(path, "is not UTF-8 text"))?,
    );
    let token = text.expose_secret().trim();
    if token.is_empty() {
        return Err(setup(path, "holds no token"));
    }
    Ok(SecretString::from(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_is_read_again_when_it_changes() {
        let dir = std::env::temp_dir().join(format!("rsc-api-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "first\n").unwrap();
        let file = TokenFile::open(path.clone()).unwrap();
        assert_eq!(file.token().expose_secret(), "first");
        // Replaced by a rename, as Kubernetes does: a new inode.
        let next = dir.join("token.new");
        std::fs::write(&next, "second-token").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(file.token().expose_secret(), "second-token");
        // Gone: the last token is kept.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(file.token().expose_secret(), "second-token");
        std::fs::write(&path, "  ").unwrap();
        assert_eq!(
            file.token().expose_secret(),
            "second-token",
            "an empty file keeps the last token"
        );
        let e = TokenFile::open(path.clone()).err().unwrap().to_string();
        assert!(e.contains("holds no token") && e.contains("token"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tls_files_are_named_in_errors() {
        let missing = PathBuf::from("/nonexistent/ca.pem");
        let tls = ClientTls {
            ca: Some(missing),
            ..ClientTls::default()
        };
        let e = tls.rustls_config(false).err().unwrap().to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let half = ClientTls {
            cert: Some("/x/cert.pem".into()),
            ..ClientTls::default()
        };
        let e = half.rustls_config(false).err().unwrap().to_string();
        assert!(e.contains("needs its key"), "{e}");
        assert!(ClientTls::default().rustls_config(false).is_ok());
    }
}
