//! HTTPS on the coordinator's listener (PROTOCOL §20): the certificate and key
//! files, re-read while serving, and client certificates (mutual TLS).
//!
//! The served certificate lives in an [`ArcSwap`] behind a rustls [`ResolvesServerCert`]:
//! each new handshake takes the current one, open connections keep the one they started
//! with, so a rotation drops nothing. The files are re-read when their modification time,
//! size or inode changes (a poll every [`POLL_EVERY`]: two `stat` calls a second, and it
//! sees a Kubernetes secret volume's `..data` symlink swap, which a watch on the files
//! themselves misses) and on SIGHUP — the mechanism the ACL file shares. A reload that fails
//! keeps the old certificate, logs the file at fault and counts
//! `rsc_tls_reload_errors_total`.

use crate::watch::{self, Stamp, stamp};
use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{info, warn};

/// How often the certificate and key files are checked for a change.
pub const POLL_EVERY: Duration = watch::POLL_EVERY;

/// The listener's TLS files (`--tls-cert`, `--tls-key`, `--tls-client-ca`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// Certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, SEC1 or PKCS#1).
    pub key: PathBuf,
    /// CA certificates (PEM) that client certificates must chain to; with it every client
    /// must present one.
    pub client_ca: Option<PathBuf>,
}

/// Why the listener's TLS files cannot be used. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// A file could not be read.
    #[error("cannot read {path}: {cause}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        cause: std::io::Error,
    },
    /// A file holds nothing usable of the kind expected.
    #[error("{path}: {reason}")]
    Invalid {
        /// File.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The key is not the certificate's.
    #[error("the key {key} does not match the certificate {cert}")]
    Mismatch {
        /// Certificate file.
        cert: PathBuf,
        /// Key file.
        key: PathBuf,
    },
}

/// The client certificate a connection presented (mutual TLS): its subject and its SAN
/// URIs, either of which an ACL entry's `cert_subject` may name (PROTOCOL §8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    /// The subject as an RFC 4514 string, e.g. `CN=billing-consumer`.
    pub subject: String,
    /// The subject alternative names of type URI, e.g. `spiffe://prod/ns/billing/sa/pod`.
    pub uris: Vec<String>,
}

impl ClientCertificate {
    /// The subject and SAN URIs of a DER certificate; `None` if it does not parse (it was
    /// verified by rustls already, so that does not happen in practice).
    pub fn from_der(der: &[u8]) -> Option<Self> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let uris = match cert.subject_alternative_name() {
            Ok(Some(san)) => san
                .value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(u) => Some((*u).to_owned()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        Some(ClientCertificate {
            subject: rfc4514(cert.subject()),
            uris,
        })
    }

    /// Whether an ACL entry's `cert_subject` names this certificate: its whole subject, or
    /// one of its SAN URIs (exact, case-sensitive).
    pub fn matches(&self, name: &str) -> bool {
        self.subject == name || self.uris.iter().any(|u| u == name)
    }
}

/// A distinguished name as RFC 4514 writes it: the last RDN first, RDNs joined by `,`,
/// the attributes of one RDN by `+`, the usual short names (`CN`, `O`, `OU`, `C`, `L`,
/// `ST`, `DC`, `UID`; others as dotted OIDs), special characters escaped with `\`.
fn rfc4514(name: &x509_parser::x509::X509Name<'_>) -> String {
    let rdns: Vec<String> = name
        .iter_rdn()
        .map(|rdn| {
            rdn.iter()
                .map(|attr| {
                    let oid = attr.attr_type().to_id_string();
                    let key = match oid.as_str() {
                        "2.5.4.3" => "CN",
                        "2.5.4.10" => "O",
                        "2.5.4.11" => "OU",
                        "2.5.4.6" => "C",
                        "2.5.4.7" => "L",
                        "2.5.4.8" => "ST",
                        "0.9.2342.19200300.100.1.25" => "DC",
                        "0.9.2342.19200300.100.1.1" => "UID",
                        other => other,
                    };
                    format!("{key}={}", escape_dn_value(attr.as_str().unwrap_or("")))
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    rdns.into_iter().rev().collect::<Vec<_>>().join(",")
}

/// RFC 4514 §2.4 escaping of an attribute value.
fn escape_dn_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for (i, c) in v.chars().enumerate() {
        let edge = (i == 0 && (c == ' ' || c == '#')) || (i + 1 == v.chars().count() && c == ' ');
        if edge || matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The ring provider, as the Redis TLS uses.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsSetupError> {
    std::fs::read(path).map_err(|cause| TlsSetupError::Read {
        path: path.to_owned(),
        cause,
    })
}

fn invalid(path: &Path, reason: impl Into<String>) -> TlsSetupError {
    TlsSetupError::Invalid {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// The PEM certificates of `path`: at least one.
fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// The certificate chain and key of `tls`, checked to belong together.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsSetupError> {
    let chain = load_certs(cert)?;
    let pem = read(key)?;
    let der = PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| invalid(key, format!("holds no usable PEM private key: {e}")))?;
    let signing = provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| invalid(key, format!("unsupported private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) => Ok(certified),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(TlsSetupError::Mismatch {
                cert: cert.to_owned(),
                key: key.to_owned(),
            })
        }
        // The key type cannot tell its public key: a mismatch shows at the first handshake.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(certified),
        Err(e) => Err(invalid(cert, format!("unusable certificate: {e}"))),
    }
}

/// The served certificate, swapped in place on reload.
#[derive(Debug)]
pub struct CertResolver {
    files: ListenerTls,
    current: ArcSwap<CertifiedKey>,
    seen: Mutex<(Stamp, Stamp)>,
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

impl CertResolver {
    /// Loads the files (an error names the file at fault).
    pub fn load(files: ListenerTls) -> Result<Arc<Self>, TlsSetupError> {
        let seen = (stamp(&files.cert), stamp(&files.key));
        let key = load_certified_key(&files.cert, &files.key)?;
        record_expiry(&key);
        Ok(Arc::new(CertResolver {
            files,
            current: ArcSwap::from_pointee(key),
            seen: Mutex::new(seen),
        }))
    }

    /// The DER of the certificate served now (leaf).
    pub fn current_leaf(&self) -> Vec<u8> {
        self.current.load().cert[0].as_ref().to_vec()
    }

    /// Re-reads the files if they changed since the last read (or always, with `force`).
    /// Returns whether a new certificate is served. A failure keeps the old one.
    pub fn reload(&self, force: bool) -> bool {
        let now = (stamp(&self.files.cert), stamp(&self.files.key));
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if !force && *seen == now {
                return false;
            }
            *seen = now;
        }
        match load_certified_key(&self.files.cert, &self.files.key) {
            Ok(key) => {
                record_expiry(&key);
                self.current.store(Arc::new(key));
                metrics::counter!("rsc_tls_reloads_total").increment(1);
                info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                true
            }
            Err(e) => {
                // A half-written pair (the certificate renamed in before its key) fails here
                // and is read again once the second file lands (its stamp changes).
                metrics::counter!("rsc_tls_reload_errors_total").increment(1);
                warn!(error = %e, "TLS certificate reload failed; serving the previous one");
                false
            }
        }
    }

    /// Polls the files every [`POLL_EVERY`] and reloads on SIGHUP, forever.
    pub async fn watch(self: Arc<Self>) {
        watch::run(vec![self]).await
    }
}

impl watch::Reload for CertResolver {
    fn reload(&self, force: bool) -> bool {
        CertResolver::reload(self, force)
    }
}

/// `rsc_tls_cert_expiry_timestamp_seconds`: when the served certificate expires (page on
/// it getting close).
fn record_expiry(key: &CertifiedKey) {
    if let Ok((_, cert)) = x509_parser::parse_x509_certificate(key.cert[0].as_ref()) {
        let at = cert.validity().not_after.timestamp();
        metrics::gauge!("rsc_tls_cert_expiry_timestamp_seconds").set(at as f64);
    }
}

/// The rustls server configuration: the certificate from `resolver`, ALPN `h2` then
/// `http/1.1`, and with `client_ca` a required client certificate chaining to it.
pub fn server_config(
    resolver: Arc<CertResolver>,
    client_ca: Option<&Path>,
) -> Result<ServerConfig, TlsSetupError> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(&resolver.files.cert, e.to_string()))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in load_certs(path)? {
                roots
                    .add(cert)
                    .map_err(|e| invalid(path, format!("not a usable CA certificate: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| invalid(path, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_empty_files_are_named() {
        let dir = std::env::temp_dir().join(format!("rsc-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not pem at all\n").unwrap();
        let missing = dir.join("missing.pem");
        let e = load_certified_key(&missing, &empty)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.pem"), "{e}");
        let e = load_certified_key(&empty, &empty).unwrap_err().to_string();
        assert!(
            e.contains("empty.pem") && e.contains("no PEM certificate"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dn_values_are_escaped_as_rfc_4514_says() {
        assert_eq!(escape_dn_value("billing-consumer"), "billing-consumer");
        assert_eq!(escape_dn_value("a,b+c"), "a\\,b\\+c");
        assert_eq!(escape_dn_value(" #x "), "\\ #x\\ ");
    }

    #[test]
    fn a_certificate_matches_by_subject_or_san_uri() {
        let c = ClientCertificate {
            subject: "CN=billing-consumer".into(),
            uris: vec!["spiffe://prod/billing".into()],
        };
        assert!(c.matches("CN=billing-consumer"));
        assert!(c.matches("spiffe://prod/billing"));
        assert!(!c.matches("CN=billing"));
        assert!(!c.matches("cn=billing-consumer"));
    }
}
