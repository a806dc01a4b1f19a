//! TLS to Redis: a `rediss://` URL turns it on (as with redis-cli and redis-rs), [`Tls`]
//! adds a CA certificate to verify the server against instead of the system's roots, and a
//! client certificate and key for servers that require them (`tls-auth-clients yes`).
//!
//! `rediss://HOST:PORT/#insecure` skips the verification of the server's certificate (for
//! tests only: anyone on the path can then read and change the traffic).
//!
//! Built with the `tls` feature (on by default): rustls with the ring crypto provider.

use redis::{ConnectionAddr, ConnectionInfo};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Files for TLS connections to Redis, PEM-encoded; all optional. Loaded (read and checked)
/// by [`TlsFiles::load`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificate(s) to verify the server against, instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// Client certificate (chain) for mutual TLS; needs [`Self::key`].
    pub cert: Option<PathBuf>,
    /// The client certificate's private key; needs [`Self::cert`].
    pub key: Option<PathBuf>,
}

/// TLS settings that cannot be used (found when they are loaded, before anything connects).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read the {what} file {path}: {source}")]
    Read {
        /// Which file (`CA certificate`, `client certificate`, `client key`).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A file's content is not what it should be.
    #[error("the {what} file {path} is not usable: {reason}")]
    Invalid {
        /// Which file.
        what: &'static str,
        /// Its path (`<memory>` when given as bytes).
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A client certificate without its key.
    #[error("a client certificate needs its private key (the TLS key option)")]
    CertWithoutKey,
    /// A client key without its certificate.
    #[error("a client key needs its certificate (the TLS cert option)")]
    KeyWithoutCert,
    /// The client certificate and key were refused together (e.g. they do not match).
    #[error("the client certificate and key cannot be used together: {0}")]
    Identity(String),
    /// Built without TLS support.
    #[error("TLS to Redis is not built in: enable the `tls` feature of rsc-redis")]
    NotBuilt,
}

/// PEM contents, checked.
struct Pem {
    ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// Loaded TLS settings of Redis connections: a CA to verify the server against and a
/// client identity, both optional. Cheap to clone; `Debug` shows only which are set. The
/// default has neither (a `rediss://` URL then verifies against the system's roots).
#[derive(Clone, Default)]
pub struct Tls(Option<Arc<Pem>>);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pem = self.0.as_deref();
        f.debug_struct("Tls")
            .field("ca", &pem.is_some_and(|p| p.ca.is_some()))
            .field("client_cert", &pem.is_some_and(|p| p.identity.is_some()))
            .finish()
    }
}

const CA: &str = "CA certificate";
const CERT: &str = "client certificate";
const KEY: &str = "client key";

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

impl TlsFiles {
    /// Whether no file is named.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// Reads and checks the files: the CA must hold at least one certificate, the client
    /// certificate and key must come together and fit each other.
    pub fn load(&self) -> Result<Tls, TlsError> {
        let ca = self.ca.as_deref().map(|p| read(CA, p)).transpose()?;
        let identity = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some((read(CERT, c)?, read(KEY, k)?)),
            (Some(_), None) => return Err(TlsError::CertWithoutKey),
            (None, Some(_)) => return Err(TlsError::KeyWithoutCert),
            (None, None) => None,
        };
        Tls::check(ca, identity, |what| {
            match what {
                CA => self.ca.clone(),
                CERT => self.cert.clone(),
                _ => self.key.clone(),
            }
            .unwrap_or_default()
        })
    }
}

impl Tls {
    /// From PEM contents: CA certificate(s), and a client certificate (chain) with its
    /// private key. Checked as [`TlsFiles::load`] checks files.
    pub fn from_pem(
        ca: Option<Vec<u8>>,
        identity: Option<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Self, TlsError> {
        Self::check(ca, identity, |_| PathBuf::from("<memory>"))
    }

    fn check(
        ca: Option<Vec<u8>>,
        identity: Option<(Vec<u8>, Vec<u8>)>,
        path: impl Fn(&'static str) -> PathBuf,
    ) -> Result<Self, TlsError> {
        if ca.is_none() && identity.is_none() {
            return Ok(Tls(None));
        }
        #[cfg(feature = "tls")]
        {
            imp::validate(ca.as_deref(), identity.as_ref(), &path)?;
            Ok(Tls(Some(Arc::new(Pem { ca, identity }))))
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = path;
            Err(TlsError::NotBuilt)
        }
    }

    /// Whether a CA or a client identity is set.
    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// Gives a `rediss://` address this CA and client identity (other addresses are
    /// returned as they are).
    pub(crate) fn apply(&self, info: ConnectionInfo) -> redis::RedisResult<ConnectionInfo> {
        #[cfg(feature = "tls")]
        if let (Some(certs), true) = (self.certs(), is_tls(&info)) {
            imp::ensure_provider();
            return Ok(redis::Client::build_with_tls(info, certs)?
                .get_connection_info()
                .clone());
        }
        Ok(info)
    }

    /// The certificates in redis-rs's form.
    #[cfg(feature = "tls")]
    pub(crate) fn certs(&self) -> Option<redis::TlsCertificates> {
        let pem = self.0.as_deref()?;
        Some(redis::TlsCertificates {
            client_tls: pem
                .identity
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: pem.ca.clone(),
        })
    }
}

/// Whether `info` names a TLS connection (`rediss://`).
pub(crate) fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { .. })
}

/// `info`'s TLS settings at another host and port (a node named by a `MOVED`).
pub(crate) fn same_tls_at(info: &ConnectionInfo, host: String, port: u16) -> ConnectionInfo {
    let addr = match info.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    };
    info.clone().set_addr(addr)
}

/// The TLS failure behind `e`, when a TLS handshake or a certificate was refused (a server
/// certificate not signed by the CA, a missing client certificate, …): rustls's reason. `None`
/// for any other error (and always without the `tls` feature).
pub fn tls_failure(e: &redis::RedisError) -> Option<String> {
    #[cfg(feature = "tls")]
    {
        use std::error::Error;
        // redis-rs keeps the cause as `Arc<dyn Error>`; tokio-rustls wraps rustls's error in
        // an `io::Error`.
        let inner = e.source()?.downcast_ref::<Arc<dyn Error + Send + Sync>>()?;
        let inner: &(dyn Error + Send + Sync + 'static) = &**inner;
        let found = inner.downcast_ref::<rustls::Error>().or_else(|| {
            inner
                .downcast_ref::<std::io::Error>()?
                .get_ref()?
                .downcast_ref::<rustls::Error>()
        });
        found.map(ToString::to_string)
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = e;
        None
    }
}

/// Makes sure rustls has a crypto provider (ring) before redis-rs builds a TLS
/// configuration: without one installed, rustls panics when more than one provider is
/// compiled into the program.
pub(crate) fn ensure_provider() {
    #[cfg(feature = "tls")]
    imp::ensure_provider();
}

#[cfg(feature = "tls")]
mod imp {
    use super::{CA, CERT, KEY, TlsError};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::path::PathBuf;
    use std::sync::Arc;

    pub(super) fn ensure_provider() {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Another thread may have installed one meanwhile: either is fine.
            let _ = ring_provider().install_default();
        }
    }

    /// rustls's ring provider, the one place this crate names it. rustls 0.23.48 deprecates
    /// `ring::default_provider` for lacking post-quantum key exchange, steering to
    /// aws-lc-rs; the workspace keeps ring (no C toolchain to build), so the deprecation is
    /// acknowledged here and nowhere else.
    #[allow(deprecated)]
    pub(super) fn ring_provider() -> rustls::crypto::CryptoProvider {
        rustls::crypto::ring::default_provider()
    }

    fn certificates(
        what: &'static str,
        pem: &[u8],
        path: &dyn Fn(&'static str) -> PathBuf,
    ) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let invalid = |reason: String| TlsError::Invalid {
            what,
            path: path(what),
            reason,
        };
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(format!("not PEM: {e}")))?;
        if certs.is_empty() {
            return Err(invalid("no PEM certificate in it".into()));
        }
        Ok(certs)
    }

    /// Checks the PEM contents by building the rustls configuration they make.
    pub(super) fn validate(
        ca: Option<&[u8]>,
        identity: Option<&(Vec<u8>, Vec<u8>)>,
        path: &dyn Fn(&'static str) -> PathBuf,
    ) -> Result<(), TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        if let Some(ca) = ca {
            for cert in certificates(CA, ca, path)? {
                roots.add(cert).map_err(|e| TlsError::Invalid {
                    what: CA,
                    path: path(CA),
                    reason: format!("not a usable CA certificate: {e}"),
                })?;
            }
        }
        let Some((cert, key)) = identity else {
            return Ok(());
        };
        let chain = certificates(CERT, cert, path)?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Invalid {
            what: KEY,
            path: path(KEY),
            reason: format!("no PEM private key in it: {e}"),
        })?;
        rustls::ClientConfig::builder_with_provider(Arc::new(ring_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Identity(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| TlsError::Identity(e.to_string()))?;
        Ok(())
    }
}

/// A [`Tls`] with the unit tests' CA.
#[cfg(all(test, feature = "tls"))]
pub(crate) fn tests_ca() -> Tls {
    Tls::from_pem(Some(tests::TEST_CA.as_bytes().to_vec()), None).expect("the test CA loads")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A self-signed CA certificate (public; its key was thrown away).
    pub(crate) const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBmDCCAT+gAwIBAgIUA6xZpLltrm0fnf0BrSt15Pj//kMwCgYIKoZIzj0EAwIw
ITEfMB0GA1UEAwwWcnNjLXJlZGlzIHVuaXQgdGVzdCBDQTAgFw0yNjEyMDEyMTU5
MTlaGA8yMTI2MTEwNzIxNTkxOVowITEfMB0GA1UEAwwWcnNjLXJlZGlzIHVuaXQg
dGVzdCBDQTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABCyVjpPlEa2bdDR2c/Aj
deOUb1CID1EoL0PBXmuNsV6YBWhr33/Tdx9z0ivfwGkJNEQM1FN/2ScWMRQydp1G
Bp2jUzBRMB0GA1UdDgQWBBTcxDeRtewG4g+vNswTKrtt6lKY0TAfBgNVHSMEGDAW
gBTcxDeRtewG4g+vNswTKrtt6lKY0TAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49
BAMCA0cAMEQCIGDLMkFcC+MYIb6GafRXjpiGqz6ndROx8as/2cSlSpSTAiBK/+mB
oNfqi0HgoN+OY+aIS2waAvJ83WW+3MFdJDIfTQ==
-----END CERTIFICATE-----
";

    #[test]
    fn no_files_is_no_tls_settings() {
        let tls = TlsFiles::default().load().unwrap();
        assert!(TlsFiles::default().is_empty() && !tls.is_set());
    }

    #[test]
    fn unusable_files_are_named() {
        let missing = TlsFiles {
            ca: Some("/nonexistent/ca.pem".into()),
            ..TlsFiles::default()
        };
        let e = missing.load().unwrap_err();
        assert!(matches!(e, TlsError::Read { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("CA certificate file /nonexistent/ca.pem"),
            "{e}"
        );
        let e = TlsFiles {
            cert: Some("c.pem".into()),
            ..TlsFiles::default()
        }
        .load()
        .unwrap_err();
        assert!(matches!(e, TlsError::CertWithoutKey), "{e}");
        let e = TlsFiles {
            key: Some("k.pem".into()),
            ..TlsFiles::default()
        }
        .load()
        .unwrap_err();
        assert!(matches!(e, TlsError::KeyWithoutCert), "{e}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn pem_contents_are_checked_and_never_printed() {
        let e = Tls::from_pem(Some(b"not a certificate".to_vec()), None).unwrap_err();
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        let tls = Tls::from_pem(Some(TEST_CA.as_bytes().to_vec()), None).unwrap();
        assert!(tls.is_set());
        let shown = format!("{tls:?}");
        assert!(
            shown.contains("ca: true") && !shown.contains("MII"),
            "{shown}"
        );
        let e = Tls::from_pem(
            Some(TEST_CA.as_bytes().to_vec()),
            Some((TEST_CA.as_bytes().to_vec(), TEST_CA.as_bytes().to_vec())),
        )
        .unwrap_err();
        assert!(e.to_string().contains("no PEM private key"), "{e}");
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn without_the_feature_tls_files_are_refused() {
        let e = Tls::from_pem(Some(TEST_CA.as_bytes().to_vec()), None).unwrap_err();
        assert!(matches!(e, TlsError::NotBuilt), "{e}");
    }
}
