//! Certificates for TLS tests, made with the `openssl` command-line tool: a CA, server and
//! client certificates it signed, client certificates of a chosen subject and SANs, and
//! certificate revocation lists (`openssl ca -gencrl`).

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A test CA, a server certificate it signed for `127.0.0.1` (and `localhost`), a client
/// certificate it signed, and an unrelated CA (to be refused), in a temporary directory
/// removed when dropped. EC P-256 keys, valid for two days. Needs the `openssl` CLI.
#[derive(Debug)]
pub struct TlsCerts {
    dir: tempfile::TempDir,
}

impl TlsCerts {
    /// Generates the certificates (a few tens of milliseconds).
    pub fn generate() -> io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("rsc-tls-").tempdir()?;
        let d = dir.path();
        ca(d, "ca")?;
        ca(d, "other-ca")?;
        leaf(
            d,
            "server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
        )?;
        leaf(d, "client", "extendedKeyUsage=clientAuth\n")?;
        Ok(TlsCerts { dir })
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate (PEM) that signed the server and client certificates.
    pub fn ca(&self) -> PathBuf {
        self.dir().join("ca.crt")
    }

    /// Another CA's certificate: it signed nothing here.
    pub fn other_ca(&self) -> PathBuf {
        self.dir().join("other-ca.crt")
    }

    /// The server certificate (SAN `IP:127.0.0.1`, `DNS:localhost`; also usable as a client
    /// certificate, as redis-server uses it for replication).
    pub fn server_cert(&self) -> PathBuf {
        self.dir().join("server.crt")
    }

    /// The server certificate's key.
    pub fn server_key(&self) -> PathBuf {
        self.dir().join("server.key")
    }

    /// A client certificate signed by [`Self::ca`].
    pub fn client_cert(&self) -> PathBuf {
        self.dir().join("client.crt")
    }

    /// The client certificate's key.
    pub fn client_key(&self) -> PathBuf {
        self.dir().join("client.key")
    }

    /// A client certificate signed by [`Self::ca`], named `name` (files `NAME.crt` and
    /// `NAME.key`, returned in that order), with the subject `CN=<cn>` and the subject
    /// alternative names `uris` (type URI, written as given: `CN=ops-cert` too) and `dns`
    /// (type DNS name).
    pub fn client_with(
        &self,
        name: &str,
        cn: &str,
        uris: &[&str],
        dns: &[&str],
    ) -> io::Result<(PathBuf, PathBuf)> {
        let sans: Vec<String> = uris
            .iter()
            .map(|u| format!("URI:{u}"))
            .chain(dns.iter().map(|d| format!("DNS:{d}")))
            .collect();
        let mut ext = String::from("extendedKeyUsage=clientAuth\n");
        if !sans.is_empty() {
            ext.push_str(&format!("subjectAltName={}\n", sans.join(",")));
        }
        let cn = cn.replace('\\', "\\\\").replace('/', "\\/");
        leaf_as(self.dir(), name, &format!("/CN={cn}"), &ext)?;
        Ok((
            self.dir().join(format!("{name}.crt")),
            self.dir().join(format!("{name}.key")),
        ))
    }

    /// A certificate revocation list (PEM) of [`Self::ca`] that revokes `revoked` (none:
    /// an empty CRL), valid for two days; written to `NAME.pem` and returned. Each call
    /// starts a new CA database, so the list holds exactly `revoked`.
    pub fn crl(&self, name: &str, revoked: &[&Path]) -> io::Result<PathBuf> {
        let d = self.dir();
        std::fs::write(
            d.join("ca.cnf"),
            "[ca]\ndefault_ca = test_ca\n[test_ca]\ndatabase = index.txt\n\
             crlnumber = crlnumber\ndefault_md = sha256\ndefault_crl_days = 2\n\
             certificate = ca.crt\nprivate_key = ca.key\n",
        )?;
        std::fs::write(d.join("index.txt"), "")?;
        std::fs::write(d.join("crlnumber"), "01\n")?;
        for cert in revoked {
            let cert = cert.display().to_string();
            openssl(d, &["ca", "-config", "ca.cnf", "-revoke", &cert])?;
        }
        let out = format!("{name}.pem");
        openssl(d, &["ca", "-config", "ca.cnf", "-gencrl", "-out", &out])?;
        Ok(d.join(out))
    }
}

fn openssl(dir: &Path, args: &[&str]) -> io::Result<()> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run openssl: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

/// A self-signed CA: `NAME.crt`, `NAME.key`.
fn ca(dir: &Path, name: &str) -> io::Result<()> {
    let (key, crt, subj) = (
        format!("{name}.key"),
        format!("{name}.crt"),
        format!("/CN=rsc test {name}"),
    );
    let mut args = vec!["req", "-x509", "-new", "-nodes"];
    args.extend(EC);
    args.extend(["-keyout", &key, "-out", &crt, "-days", "2", "-subj", &subj]);
    args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
    args.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
    openssl(dir, &args)
}

/// A certificate signed by `ca`, with the extensions `ext` (lines of an extension file).
fn leaf(dir: &Path, name: &str, ext: &str) -> io::Result<()> {
    leaf_as(dir, name, &format!("/CN=rsc test {name}"), ext)
}

/// [`leaf`] with the subject `subj` (`openssl -subj` form: `/CN=x/O=y`).
fn leaf_as(dir: &Path, name: &str, subj: &str, ext: &str) -> io::Result<()> {
    let (key, csr, crt, extfile) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    std::fs::write(
        dir.join(&extfile),
        format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{ext}"),
    )?;
    let mut args = vec!["req", "-new", "-nodes"];
    args.extend(EC);
    args.extend(["-keyout", &key, "-out", &csr, "-subj", subj]);
    openssl(dir, &args)?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &extfile,
        ],
    )
}
