//! Keep-alive after a response the coordinator sends before it reads the request body
//! (PROTOCOL §20, "Keep-alive and unread request bodies"), over HTTPS and plain HTTP.
//!
//! Each case sends a request's head, waits a moment for a response, and only then sends
//! the body: the order in which a client that writes head and body separately (Python's
//! urllib3 does) meets a fast refusal when it is descheduled between the two. A response
//! without `Connection: close` promises that the connection stays usable, so the next
//! request on it must be answered; a response with it must be followed by the end of the
//! connection. The coordinator reads such small bodies before it answers, so none of the
//! cases closes the connection.

use rsc_testkit::{CoordinatorProcess, TlsCerts};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &str = "keep-alive-admin";
/// A wake-up request body (PROTOCOL §13), sent with a content type the route refuses.
const WAKE_BODY: &str = r#"{"members": [{"group": "0", "member_id": "0"}]}"#;

/// A request: method, path, extra header lines, body.
struct Case {
    method: &'static str,
    path: &'static str,
    headers: &'static str,
    body: &'static str,
    /// The status the coordinator answers with.
    status: u16,
}

fn cases() -> Vec<Case> {
    vec![
        // 400: the wake-up route takes JSON only (the shape schemathesis hit over HTTPS).
        Case {
            method: "POST",
            path: "/v1/wakeups",
            headers: "Authorization: Bearer keep-alive-admin\r\nContent-Type: text/plain\r\n",
            body: WAKE_BODY,
            status: 400,
        },
        // 405: a method the route does not have.
        Case {
            method: "PUT",
            path: "/v1/heartbeats",
            headers: "Authorization: Bearer keep-alive-admin\r\nContent-Type: application/json\r\n",
            body: r#"{"heartbeats": []}"#,
            status: 405,
        },
        // 401: no token.
        Case {
            method: "POST",
            path: "/v1/groups/billing/heartbeat",
            headers: "Content-Type: application/json\r\n",
            body: r#"{"protocol_version":1,"member_id":"m","member_epoch":0}"#,
            status: 401,
        },
        // 201: a body that is read; the connection stays open without `Connection: close`.
        Case {
            method: "POST",
            path: "/v1/groups",
            headers: "Authorization: Bearer keep-alive-admin\r\nContent-Type: application/json\r\n",
            body: r#"{"group":"billing","stream":"orders","shard_count":2}"#,
            status: 201,
        },
    ]
}

/// A response: status, lower-cased head, body.
struct Response {
    status: u16,
    head: String,
    body: String,
}

/// How long a case waits for a response before it sends the body: the window of a
/// negative check (a response in it was sent before the body was read).
const EARLY: Duration = Duration::from_millis(300);

/// A connection whose read timeout can be set.
trait Conn: Read + Write {
    fn timeout(&self, after: Duration);
}

impl Conn for TcpStream {
    fn timeout(&self, after: Duration) {
        self.set_read_timeout(Some(after)).unwrap();
    }
}

impl Conn for rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    fn timeout(&self, after: Duration) {
        self.sock.set_read_timeout(Some(after)).unwrap();
    }
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Reads one response with a `Content-Length` body, `buf` holding what was read of it
/// before (a read that timed out keeps its bytes); `Err` when the connection ends first.
fn read_response(conn: &mut impl Read, buf: &mut Vec<u8>) -> std::io::Result<Response> {
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte)? == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(buf).to_lowercase();
    let status = head[9..12].parse().expect("a status code");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().expect("a content length"));
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body)?;
    buf.clear();
    Ok(Response {
        status,
        head,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// Whether the connection ends (EOF, or an error other than the read timeout).
fn ends(conn: &mut impl Read) -> bool {
    let mut rest = Vec::new();
    match conn.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(e) => !timed_out(&e),
    }
}

/// Runs `case` on a fresh connection from `connect`, as the module's doc says. Returns
/// whether the response said `Connection: close`.
fn check<S: Conn>(connect: &dyn Fn() -> S, case: &Case, scheme: &str) -> bool {
    let what = format!("{scheme} {} {}", case.method, case.path);
    let mut conn = connect();
    let head = format!(
        "{} {} HTTP/1.1\r\nHost: 127.0.0.1\r\n{}Content-Length: {}\r\n\r\n",
        case.method,
        case.path,
        case.headers,
        case.body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.flush().unwrap();
    let mut buf = Vec::new();
    conn.timeout(EARLY);
    let early = match read_response(&mut conn, &mut buf) {
        Ok(r) => Some(r),
        Err(e) if timed_out(&e) => None,
        Err(e) => panic!("{what}: the connection ended before any response: {e}"),
    };
    conn.timeout(Duration::from_secs(5));
    // The body (the server may have closed already: a write error then).
    let sent = conn
        .write_all(case.body.as_bytes())
        .and_then(|()| conn.flush());
    let first = match early {
        Some(r) => r,
        None => read_response(&mut conn, &mut buf).expect("the response once the body is in"),
    };
    assert_eq!(first.status, case.status, "{what}: {}", first.body);
    if first.head.contains("\r\nconnection: close\r\n") {
        assert!(ends(&mut conn), "{what}: `Connection: close`, then the end");
        return true;
    }
    let next = sent
        .and_then(|()| conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
        .and_then(|()| conn.flush())
        .and_then(|()| read_response(&mut conn, &mut buf));
    match next {
        Ok(next) => assert_eq!(next.status, 200, "{what}: then /healthz: {}", next.body),
        Err(e) => panic!(
            "{what}: the response (status {}) did not say `Connection: close`, yet the \
             next request on the connection got no answer: {e}",
            first.status
        ),
    }
    false
}

/// Every case over `connect`: each response keeps its promise, and none closes the
/// connection (their bodies are small and come at once, so the coordinator reads them).
fn check_all<S: Conn>(connect: &dyn Fn() -> S, scheme: &str) {
    for case in cases() {
        let closed = check(connect, &case, scheme);
        assert!(
            !closed,
            "{scheme} {} {}: a small body sent at once is read, and the connection kept",
            case.method, case.path
        );
    }
}

fn tcp(addr: SocketAddr) -> TcpStream {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    tcp.set_nodelay(true).unwrap();
    tcp
}

/// A blocking HTTP/1.1-over-TLS client configuration trusting `ca` only.
fn tls_config(ca: &Path) -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).expect("PEM file") {
        roots.add(c.expect("certificate")).expect("CA certificate");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

fn start(dir: &Path, tls: &[&str]) -> CoordinatorProcess {
    let acl = dir.join("acl.toml");
    std::fs::write(
        &acl,
        format!(
            "[[tokens]]\nprincipal = \"admin\"\ntoken = \"{TOKEN}\"\nroles = [\"admin\"]\n\
             groups = [\"*\"]\nstreams = [\"*\"]\n"
        ),
    )
    .unwrap();
    let acl = acl.to_str().unwrap().to_owned();
    let mut args = vec!["--store", "memory", "--acl", &acl];
    args.extend_from_slice(tls);
    CoordinatorProcess::start(&args).expect("the coordinator starts")
}

#[test]
fn a_response_before_the_body_is_read_closes_the_connection_or_keeps_it_usable_over_https() {
    let certs = TlsCerts::generate().expect("openssl makes the certificates");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (certs.server_cert(), certs.server_key());
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let coordinator = start(dir.path(), &["--tls-cert", cert, "--tls-key", key]);
    let config = tls_config(&certs.ca());
    let addr = coordinator.addr();
    let connect = || {
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
        rustls::StreamOwned::new(conn, tcp(addr))
    };
    check_all(&connect, "https");
}

#[test]
fn a_response_before_the_body_is_read_closes_the_connection_or_keeps_it_usable_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let coordinator = start(dir.path(), &[]);
    let addr = coordinator.addr();
    check_all(&|| tcp(addr), "http");
}
