//! HTTPS on the coordinator's listener (PROTOCOL §20): the certificate and key
//! files, re-read while serving, and client certificates (mutual TLS) checked against a CA
//! file and an optional CRL file, re-read the same way.
//!
//! The served certificate lives in an [`ArcSwap`] behind a rustls [`ResolvesServerCert`]:
//! each new handshake takes the current one, open connections keep the one they started
//! with, so a rotation drops nothing. The files are re-read when their modification time,
//! size or inode changes (a poll every [`POLL_EVERY`]: two `stat` calls a second, and it
//! sees a Kubernetes secret volume's `..data` symlink swap, which a watch on the files
//! themselves misses) and on SIGHUP — the mechanism the ACL file shares. A reload that fails
//! keeps the old certificate, logs the file at fault and counts
//! `rsc_tls_reload_errors_total`.
//!
//! The client certificate verifier ([`ClientVerifier`]) works the same way: the rustls
//! verifier built from the CA file (and the CRL file) lives in an [`ArcSwap`], each
//! handshake verifies with the current one, and a CA or CRL file that cannot be used keeps
//! the last good verifier (fail closed: there is no state in which any client is accepted).

use crate::watch::{self, Stamp, stamp};
use arc_swap::ArcSwap;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, UnixTime};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{debug, info, warn};

/// How often the certificate and key files are checked for a change.
pub const POLL_EVERY: Duration = watch::POLL_EVERY;

/// The listener's TLS files (`--tls-cert`, `--tls-key`, `--tls-client-ca`,
/// `--tls-client-crl`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// Certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, SEC1 or PKCS#1).
    pub key: PathBuf,
    /// CA certificates (PEM) that client certificates must chain to; with it every client
    /// must present one.
    pub client_ca: Option<PathBuf>,
    /// Certificate revocation lists (PEM) of those CAs: a client certificate they revoke is
    /// refused in the handshake. Only with `client_ca`.
    pub client_crl: Option<PathBuf>,
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

/// The client certificate a connection presented (mutual TLS): its subject, its SAN URIs
/// and its SAN DNS names — three separate namespaces, which an ACL entry names by
/// `cert_subject`, `cert_san_uri` and `cert_san_dns` respectively (PROTOCOL §8, §20).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    /// The subject as an RFC 4514 string, e.g. `CN=billing-consumer`.
    pub subject: String,
    /// The subject alternative names of type URI, e.g. `spiffe://prod/ns/billing/sa/pod`.
    pub uris: Vec<String>,
    /// The subject alternative names of type DNS name, e.g. `billing.prod.example`.
    pub dns_names: Vec<String>,
}

impl ClientCertificate {
    /// The subject and SANs of a DER certificate; `None` if it does not parse (it was
    /// verified by rustls already, so that does not happen in practice). A SAN extension
    /// that does not parse gives no SANs (the SAN matchers then name nothing).
    pub fn from_der(der: &[u8]) -> Option<Self> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let names = match cert.subject_alternative_name() {
            Ok(Some(san)) => san.value.general_names.clone(),
            _ => Vec::new(),
        };
        let uris = names
            .iter()
            .filter_map(|n| match n {
                GeneralName::URI(u) => Some((*u).to_owned()),
                _ => None,
            })
            .collect();
        let dns_names = names
            .iter()
            .filter_map(|n| match n {
                GeneralName::DNSName(d) => Some((*d).to_owned()),
                _ => None,
            })
            .collect();
        Some(ClientCertificate {
            subject: rfc4514(cert.subject()),
            uris,
            dns_names,
        })
    }

    /// Whether the subject is `dn` (exact, case-sensitive). Never a SAN.
    pub fn has_subject(&self, dn: &str) -> bool {
        self.subject == dn
    }

    /// Whether one of the SAN URIs is `uri` (exact, case-sensitive). Never the subject.
    pub fn has_san_uri(&self, uri: &str) -> bool {
        self.uris.iter().any(|u| u == uri)
    }

    /// Whether one of the SAN DNS names is `name` (exact; ASCII case does not count, as in
    /// DNS). A wildcard SAN (`*.example`) is compared as written, never expanded.
    pub fn has_san_dns(&self, name: &str) -> bool {
        self.dns_names.iter().any(|d| d.eq_ignore_ascii_case(name))
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
                    let value = match attr.as_str() {
                        Ok(v) => escape_dn_value(v),
                        Err(_) => {
                            let v = attr.attr_value();
                            der_hex(v.tag().0, v.data)
                        }
                    };
                    format!("{key}={value}")
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    rdns.into_iter().rev().collect::<Vec<_>>().join(",")
}

/// A value of a type other than the string types x509-parser reads (UTF8String,
/// PrintableString, IA5String, NumericString) — a BMPString, say — as RFC 4514 §2.4 writes
/// it: `#` and the hex of its DER encoding. It can never equal a string value, whose
/// leading `#` is escaped.
fn der_hex(tag: u32, data: &[u8]) -> String {
    use std::fmt::Write;
    let mut der: Vec<u8> = Vec::with_capacity(data.len() + 6);
    // Universal primitive string types have tags below 31: one identifier byte.
    der.push(u8::try_from(tag).unwrap_or(0x1f).min(0x1f));
    match data.len() {
        n if n < 0x80 => der.push(n as u8),
        n => {
            let bytes = n.to_be_bytes();
            let skip = bytes.iter().take_while(|&&b| b == 0).count();
            der.push(0x80 | (bytes.len() - skip) as u8);
            der.extend_from_slice(&bytes[skip..]);
        }
    }
    der.extend_from_slice(data);
    let mut out = String::with_capacity(1 + 2 * der.len());
    out.push('#');
    for b in der {
        let _ = write!(out, "{b:02x}");
    }
    out
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

/// The ring provider, as the Redis TLS uses. rustls 0.23.48 deprecates
/// `ring::default_provider` for lacking post-quantum key exchange, steering to aws-lc-rs; the
/// workspace keeps ring (no C toolchain to build), acknowledged here only.
#[allow(deprecated)]
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

/// A certificate revocation list (PEM), at least one.
fn load_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsSetupError> {
    let pem = read(path)?;
    let crls = CertificateRevocationListDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, format!("not a PEM CRL file: {e}")))?;
    if crls.is_empty() {
        return Err(invalid(path, "holds no PEM X509 CRL"));
    }
    Ok(crls)
}

/// One generation of the client certificate verifier: what the CA and CRL files held when
/// read.
#[derive(Debug)]
struct Generation {
    verifier: Arc<dyn ClientCertVerifier>,
}

/// The rustls verifier of the CA file and the CRL file (PEM): a client certificate must
/// chain to one of the CAs; with CRLs, every certificate of its chain below the CA must have
/// a known revocation status that is not revoked (rustls' defaults: a certificate whose
/// issuer has no CRL in the file is refused; a CRL past its `nextUpdate` still applies).
fn build_verifier(
    ca: &Path,
    crl: Option<&Path>,
) -> Result<(Generation, Option<i64>), TlsSetupError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(ca)? {
        roots
            .add(cert)
            .map_err(|e| invalid(ca, format!("not a usable CA certificate: {e}")))?;
    }
    let mut builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        // No CA names in the CertificateRequest: the verifier outlives a CA file (it is
        // swapped on reload), and a client sends the one certificate it has (RFC 8446
        // §4.2.4). It also keeps the CA names off the wire.
        .clear_root_hint_subjects();
    let mut next_update = None;
    if let Some(crl) = crl {
        let crls = load_crls(crl)?;
        next_update = crl_next_update(&crls);
        builder = builder.with_crls(crls);
    }
    let verifier = builder.build().map_err(|e| {
        use rustls::server::VerifierBuilderError as E;
        match (e, crl) {
            (E::InvalidCrl(e), Some(crl)) => invalid(crl, format!("not a usable CRL: {e:?}")),
            (e, _) => invalid(ca, e.to_string()),
        }
    })?;
    Ok((Generation { verifier }, next_update))
}

/// The earliest `nextUpdate` of `crls` (Unix s), when they all have one.
fn crl_next_update(crls: &[CertificateRevocationListDer<'_>]) -> Option<i64> {
    crls.iter()
        .map(|c| {
            let (_, crl) = x509_parser::parse_x509_crl(c.as_ref()).ok()?;
            Some(crl.next_update()?.timestamp())
        })
        .collect::<Option<Vec<i64>>>()?
        .into_iter()
        .min()
}

/// The client certificate verifier of mutual TLS (`--tls-client-ca`, `--tls-client-crl`):
/// each handshake verifies with the verifier built from the files as last read; the files
/// are re-read when they change and on SIGHUP (`watch::Reload`). A failed reload keeps
/// the last good verifier. Refusals are counted by reason,
/// `rsc_tls_client_cert_refusals_total{reason}`.
#[derive(Debug)]
pub struct ClientVerifier {
    ca: PathBuf,
    crl: Option<PathBuf>,
    current: ArcSwap<Generation>,
    seen: Mutex<(Stamp, Stamp)>,
}

impl ClientVerifier {
    /// Reads the CA file and the CRL file (an error names the file at fault).
    pub fn load(ca: &Path, crl: Option<&Path>) -> Result<Arc<Self>, TlsSetupError> {
        let seen = (stamp(ca), crl.and_then(stamp));
        let (generation, next_update) = build_verifier(ca, crl)?;
        record_crl(crl.is_some(), next_update);
        Ok(Arc::new(ClientVerifier {
            ca: ca.to_owned(),
            crl: crl.map(Path::to_owned),
            current: ArcSwap::from_pointee(generation),
            seen: Mutex::new(seen),
        }))
    }

    /// Re-reads the files if they changed since the last read (or always, with `force`).
    /// Returns whether a new verifier is used. A failure keeps the last good one.
    pub fn reload(&self, force: bool) -> bool {
        let now = (stamp(&self.ca), self.crl.as_deref().and_then(stamp));
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if !force && *seen == now {
                return false;
            }
            *seen = now;
        }
        match build_verifier(&self.ca, self.crl.as_deref()) {
            Ok((generation, next_update)) => {
                self.current.store(Arc::new(generation));
                record_crl(self.crl.is_some(), next_update);
                metrics::counter!("rsc_tls_client_ca_reloads_total").increment(1);
                info!(
                    client_ca = %self.ca.display(),
                    client_crl = ?self.crl,
                    "TLS client CA reloaded"
                );
                true
            }
            Err(e) => {
                // Read again when one of the files changes next (or at SIGHUP).
                metrics::counter!("rsc_tls_client_ca_reload_errors_total").increment(1);
                warn!(
                    error = %e,
                    "TLS client CA reload failed; verifying client certificates with the \
                     previous CA and CRL files"
                );
                false
            }
        }
    }
}

impl watch::Reload for ClientVerifier {
    fn reload(&self, force: bool) -> bool {
        ClientVerifier::reload(self, force)
    }
}

/// `rsc_tls_client_crl_next_update_timestamp_seconds`: the earliest `nextUpdate` of the CRL
/// file (page before it passes: a stale CRL misses the latest revocations).
fn record_crl(configured: bool, next_update: Option<i64>) {
    if let (true, Some(at)) = (configured, next_update) {
        metrics::gauge!("rsc_tls_client_crl_next_update_timestamp_seconds").set(at as f64);
    }
}

/// The `reason` label of a refused client certificate.
fn refusal_reason(e: &rustls::Error) -> &'static str {
    use CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => "unknown_ca",
            C::Revoked => "revoked",
            C::UnknownRevocationStatus => "unknown_revocation_status",
            C::Expired | C::ExpiredContext { .. } => "expired",
            C::NotValidYet | C::NotValidYetContext { .. } => "not_yet_valid",
            C::ExpiredRevocationList | C::ExpiredRevocationListContext { .. } => "expired_crl",
            C::BadSignature
            | C::UnsupportedSignatureAlgorithmContext { .. }
            | C::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => "bad_signature",
            C::InvalidPurpose | C::InvalidPurposeContext { .. } => "invalid_purpose",
            C::BadEncoding => "bad_encoding",
            _ => "other",
        },
        _ => "other",
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let result =
            self.current
                .load()
                .verifier
                .verify_client_cert(end_entity, intermediates, now);
        if let Err(e) = &result {
            let reason = refusal_reason(e);
            metrics::counter!("rsc_tls_client_cert_refusals_total", "reason" => reason)
                .increment(1);
            let subject = ClientCertificate::from_der(end_entity.as_ref())
                .map(|c| c.subject)
                .unwrap_or_default();
            if reason == "revoked" {
                info!(reason, subject, "client certificate refused: revoked");
            } else {
                debug!(reason, subject, error = %e, "client certificate refused");
            }
        }
        result
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .verifier
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .verifier
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current.load().verifier.supported_verify_schemes()
    }
}

/// The listener's TLS, loaded: the rustls configuration and what to re-read while serving
/// (the certificate, and with mutual TLS the client CA and CRL files).
#[derive(Debug)]
pub struct LoadedTls {
    /// The server configuration (ALPN `h2`, `http/1.1`).
    pub config: ServerConfig,
    /// The served certificate.
    pub resolver: Arc<CertResolver>,
    /// The client certificate verifier (mutual TLS only).
    pub client_verifier: Option<Arc<ClientVerifier>>,
}

impl LoadedTls {
    /// Loads every file of `files` (an error names the file at fault).
    pub fn load(files: &ListenerTls) -> Result<Self, TlsSetupError> {
        let resolver = CertResolver::load(files.clone())?;
        let client_verifier = match &files.client_ca {
            Some(ca) => Some(ClientVerifier::load(ca, files.client_crl.as_deref())?),
            None => None,
        };
        let config = server_config(resolver.clone(), client_verifier.clone())?;
        Ok(LoadedTls {
            config,
            resolver,
            client_verifier,
        })
    }

    /// What [`crate::watch::run`] keeps fresh.
    pub(crate) fn reloaders(&self) -> Vec<Arc<dyn watch::Reload>> {
        let mut out: Vec<Arc<dyn watch::Reload>> = vec![self.resolver.clone()];
        if let Some(v) = &self.client_verifier {
            out.push(v.clone());
        }
        out
    }
}

/// The rustls server configuration: the certificate from `resolver`, ALPN `h2` then
/// `http/1.1`, and with `client_verifier` a required client certificate it accepts.
pub fn server_config(
    resolver: Arc<CertResolver>,
    client_verifier: Option<Arc<ClientVerifier>>,
) -> Result<ServerConfig, TlsSetupError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(&resolver.files.cert, e.to_string()))?;
    let builder = match client_verifier {
        None => builder.with_no_client_auth(),
        Some(verifier) => builder.with_client_cert_verifier(verifier),
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
    fn subject_and_san_names_are_separate_namespaces() {
        let c = ClientCertificate {
            subject: "CN=nobody".into(),
            uris: vec!["CN=ops-cert".into(), "spiffe://prod/billing".into()],
            dns_names: vec!["Billing.Prod.Example".into()],
        };
        assert!(c.has_subject("CN=nobody"));
        assert!(
            !c.has_subject("CN=ops-cert"),
            "a SAN URI is not the subject"
        );
        assert!(!c.has_subject("cn=nobody"));
        assert!(c.has_san_uri("spiffe://prod/billing") && c.has_san_uri("CN=ops-cert"));
        assert!(!c.has_san_uri("CN=nobody"), "the subject is not a SAN URI");
        assert!(!c.has_san_uri("SPIFFE://prod/billing"));
        assert!(
            c.has_san_dns("billing.prod.example"),
            "DNS names ignore ASCII case"
        );
        assert!(!c.has_san_dns("spiffe://prod/billing") && !c.has_san_dns("*.prod.example"));
    }

    #[test]
    fn refused_client_certificates_are_labelled_by_reason() {
        use rustls::Error::InvalidCertificate as Bad;
        for (e, want) in [
            (Bad(CertificateError::UnknownIssuer), "unknown_ca"),
            (Bad(CertificateError::Revoked), "revoked"),
            (
                Bad(CertificateError::UnknownRevocationStatus),
                "unknown_revocation_status",
            ),
            (Bad(CertificateError::Expired), "expired"),
            (Bad(CertificateError::NotValidYet), "not_yet_valid"),
            (Bad(CertificateError::BadSignature), "bad_signature"),
            (Bad(CertificateError::ExpiredRevocationList), "expired_crl"),
            (Bad(CertificateError::InvalidPurpose), "invalid_purpose"),
            (Bad(CertificateError::BadEncoding), "bad_encoding"),
            (rustls::Error::General("x".into()), "other"),
        ] {
            assert_eq!(refusal_reason(&e), want, "{e:?}");
        }
    }

    #[test]
    fn values_of_other_string_types_are_written_as_der_hex() {
        // A BMPString "ops" (tag 30): never equal to the UTF8String "ops".
        assert_eq!(
            der_hex(30, &[0, b'o', 0, b'p', 0, b's']),
            "#1e06006f00700073"
        );
        let long = der_hex(30, &[0u8; 200]);
        assert!(long.starts_with("#1e81c8"), "{long}");
        assert_eq!(escape_dn_value("#1e"), "\\#1e");
    }
}
