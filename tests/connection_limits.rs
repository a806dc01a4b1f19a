//! Connection hygiene of the coordinator's HTTP server (PROTOCOL §4.4), against real
//! coordinator processes: a request head that does not arrive in time closes its
//! connection; an idle keep-alive connection is closed after the idle timeout while a
//! wake-up channel (a request in flight for minutes) stays open; connections over
//! `--max-connections` or `--max-connections-per-ip` are refused at once and counted while
//! the others are served; over HTTPS, HTTP/2 advertises its limits, refuses a stream over
//! `--http2-max-concurrent-streams` and ends a rapid-reset flood with `GOAWAY`.
//!
//! The clients here are raw sockets: a client library would hide what is being tested
//! (a half-sent head, a connection that sends nothing, reset streams).

use rsc_e2e::Api;
use rsc_testkit::{CoordinatorProcess, TlsCerts, metric_sum};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// How late a timeout may close a connection on a loaded test machine.
const MARGIN: Duration = Duration::from_secs(3);

/// A connection to `addr` from the loopback address `from` (any port).
async fn connect_from(addr: SocketAddr, from: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    let from: IpAddr = from.parse().unwrap();
    socket
        .bind(SocketAddr::new(from, 0))
        .unwrap_or_else(|e| panic!("bind {from}: {e}"));
    socket.connect(addr).await.expect("connect")
}

/// Reads one response with a `Content-Length` body: (status, head, body).
async fn read_response(stream: &mut TcpStream) -> std::io::Result<(u16, String, String)> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_lowercase();
    let status = head[9..12].parse().expect("a status code");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().expect("a content length"));
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await?;
    Ok((status, head, String::from_utf8_lossy(&body).into_owned()))
}

/// `GET path` on `stream` (kept alive): (status, body).
async fn get(stream: &mut TcpStream, path: &str) -> (u16, String) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let (status, _, body) = read_response(stream).await.expect("a response");
    (status, body)
}

/// How long until the server closes `stream` (EOF or reset), reading and discarding what
/// comes; `None` if it is still open after `limit`.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut sink = [0u8; 1024];
    let read_to_end = async {
        loop {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(limit, read_to_end)
        .await
        .ok()
        .map(|()| started.elapsed())
}

/// Everything the server sends on `stream` until it closes it (within 5 s).
async fn until_closed(stream: &mut TcpStream) -> String {
    let mut all = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut all));
    match read.await {
        Ok(_) => String::from_utf8_lossy(&all).into_owned(),
        Err(_) => panic!(
            "the connection stayed open: {}",
            String::from_utf8_lossy(&all)
        ),
    }
}

#[tokio::test]
async fn a_request_head_or_body_that_does_not_arrive_in_time_ends_the_connection() {
    let timeout = Duration::from_millis(700);
    let coordinator = CoordinatorProcess::start(&[
        "--header-read-timeout-ms",
        "700",
        "--idle-timeout-ms",
        "60000",
        "--max-header-bytes",
        "4096",
        "--body-read-timeout-ms",
        "700",
    ])
    .expect("coordinator");
    let addr = coordinator.addr();

    // Half a head, then nothing: the attacker's slow header.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .unwrap();
    // A connection that never sends a byte.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    // A keep-alive client: answered, then idle for longer than the head's timeout.
    let mut client = TcpStream::connect(addr).await.unwrap();
    assert_eq!(get(&mut client, "/healthz").await.0, 200);
    let answered = tokio::time::Instant::now();

    let slow_closed = closed_within(&mut slow, timeout + MARGIN).await;
    let slow_closed = slow_closed.expect("the half-sent head's connection is closed");
    assert!(
        slow_closed + Duration::from_millis(100) >= timeout,
        "closed after {slow_closed:?}, before the {timeout:?} timeout"
    );
    let silent_closed = closed_within(&mut silent, MARGIN).await;
    assert!(
        silent_closed.is_some(),
        "a connection that sends nothing owes its first head within the timeout too"
    );
    // The keep-alive connection waits twice as long (the window of a negative check), with
    // no head begun: it is idle, not late.
    tokio::time::sleep_until(answered + timeout * 2).await;
    assert_eq!(
        get(&mut client, "/healthz").await.0,
        200,
        "an idle keep-alive connection is not cut by the head's timeout"
    );
    // A head over --max-header-bytes is refused.
    let big = format!(
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {}\r\n\r\n",
        "x".repeat(5000)
    );
    let mut large = TcpStream::connect(addr).await.unwrap();
    large.write_all(big.as_bytes()).await.unwrap();
    let answer = until_closed(&mut large).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");

    // A body that stops halfway: refused once the body read timeout passes, and closed.
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    stalled
        .write_all(
            b"POST /v1/groups/slow/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\n\
              Content-Type: application/json\r\nContent-Length: 60\r\n\r\n{\"member_id\": ",
        )
        .await
        .unwrap();
    let started = Instant::now();
    let (status, head, body) = tokio::time::timeout(timeout + MARGIN, read_response(&mut stalled))
        .await
        .expect("an answer within the body read timeout")
        .expect("an answer");
    assert!(started.elapsed() + Duration::from_millis(100) >= timeout);
    assert_eq!(status, 400, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "INVALID_REQUEST", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--body-read-timeout-ms"),
        "{body}"
    );
    assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
    assert!(closed_within(&mut stalled, MARGIN).await.is_some());

    let (status, metrics) = get(&mut client, "/metrics").await;
    assert_eq!(status, 200);
    let timeouts = metric_sum(&metrics, "rsc_http_header_timeouts_total", &[]);
    assert!(timeouts >= 2.0, "rsc_http_header_timeouts_total {timeouts}");
    let body_timeouts = metric_sum(&metrics, "rsc_http_body_timeouts_total", &[]);
    assert_eq!(body_timeouts, 1.0, "rsc_http_body_timeouts_total");
}

/// A wake-up channel (PROTOCOL §13) for `member` of `group` on a raw connection, read up to
/// its `ready` event.
async fn open_channel(addr: SocketAddr, group: &str, member: &str) -> TcpStream {
    let body = json!({"members": [{"group": group, "member_id": member}]}).to_string();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /v1/wakeups HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    read_until(&mut stream, "event: ready", Duration::from_secs(5)).await;
    stream
}

/// Reads `stream` until `text` came; panics if it closes or `limit` passes first.
async fn read_until(stream: &mut TcpStream, text: &str, limit: Duration) -> String {
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    let read = async {
        while !seen.contains(text) {
            match stream.read(&mut buf).await {
                Ok(0) => return Err("the connection closed".to_owned()),
                Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    };
    match tokio::time::timeout(limit, read).await {
        Ok(Ok(())) => seen,
        Ok(Err(e)) => panic!("waiting for {text:?}: {e}; read {seen:?}"),
        Err(_) => panic!("no {text:?} within {limit:?}; read {seen:?}"),
    }
}

#[tokio::test]
async fn an_idle_keep_alive_connection_closes_while_a_wake_up_channel_stays_open() {
    let idle = Duration::from_millis(1000);
    let coordinator = CoordinatorProcess::start(&[
        "--idle-timeout-ms",
        "1000",
        "--header-read-timeout-ms",
        "500",
    ])
    .expect("coordinator");
    let addr = coordinator.addr();
    let api = Api::new(coordinator.url());
    let (s, body) = api
        .post(
            "/v1/groups",
            json!({"group": "idle", "stream": "idle-orders", "shard_count": 2}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{body}");
    let (s, body) = api.heartbeat("idle", "m1", 0, &[]).await;
    assert_eq!(s.as_u16(), 200, "{body}");
    let channel_opened = Instant::now();
    let mut channel = open_channel(addr, "idle", "m1").await;

    let mut client = TcpStream::connect(addr).await.unwrap();
    assert_eq!(get(&mut client, "/healthz").await.0, 200);
    let closed = closed_within(&mut client, idle + MARGIN).await;
    let closed = closed.expect("the idle keep-alive connection is closed");
    assert!(
        closed + Duration::from_millis(100) >= idle,
        "closed after {closed:?}, before the {idle:?} idle timeout"
    );

    // The channel has been quiet for well over the idle timeout (the window of a negative
    // check): it is a request in flight, so it is still open, and it still carries a wake-up.
    let quiet = (idle * 5 / 2).saturating_sub(channel_opened.elapsed());
    tokio::time::sleep(quiet).await;
    let (s, body) = api.heartbeat("idle", "m2", 0, &[]).await;
    assert_eq!(s.as_u16(), 200, "{body}");
    let events = read_until(&mut channel, "event: wake", Duration::from_secs(5)).await;
    assert!(events.contains("\"member_id\":\"m1\""), "{events}");

    let idle_closed = api.metric("rsc_http_idle_closed_total", &[]).await;
    assert!(
        idle_closed >= 1.0,
        "rsc_http_idle_closed_total {idle_closed}"
    );
}

/// Whether a new connection from `from` is served: `GET /healthz` answered 200.
async fn served(addr: SocketAddr, from: &str) -> bool {
    let mut stream = connect_from(addr, from).await;
    let request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    if stream.write_all(request).await.is_err() {
        return false;
    }
    let answer = tokio::time::timeout(Duration::from_secs(5), read_response(&mut stream));
    matches!(answer.await, Ok(Ok((200, _, _))))
}

/// Asserts that a new connection from `from` is refused with PROTOCOL's 429 body, saying
/// `flag`, and closed.
async fn refused(addr: SocketAddr, from: &str, flag: &str) {
    let mut stream = connect_from(addr, from).await;
    let answer = until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 429 "), "{answer:?}");
    assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "RATE_LIMITED", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(flag), "{message}");
}

#[tokio::test]
async fn connections_over_the_cap_are_refused_and_a_freed_slot_is_served() {
    const MAX: usize = 8;
    let coordinator = CoordinatorProcess::start(&[
        "--max-connections",
        "8",
        "--max-connections-per-ip",
        "8",
        "--header-read-timeout-ms",
        "60000",
    ])
    .expect("coordinator");
    let addr = coordinator.addr();
    let mut held = Vec::new();
    for _ in 0..MAX {
        held.push(connect_from(addr, "127.0.0.1").await);
    }
    // The first connection is served (the server took them in order).
    assert_eq!(get(&mut held[0], "/healthz").await.0, 200);
    for _ in 0..4 {
        refused(addr, "127.0.0.1", "--max-connections").await;
    }
    // Another address is refused too: the cap is global.
    refused(addr, "127.0.0.2", "--max-connections").await;
    // One slot freed: the server answers again.
    drop(held.pop());
    let started = Instant::now();
    while !served(addr, "127.0.0.1").await {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no slot freed within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, metrics) = get(&mut held[0], "/metrics").await;
    assert_eq!(status, 200);
    let refused_total = metric_sum(
        &metrics,
        "rsc_http_connections_refused_total",
        &[("reason", "max_connections")],
    );
    assert!(refused_total >= 5.0, "refused {refused_total}");
    let open = metric_sum(&metrics, "rsc_http_connections_open", &[]);
    assert!(
        (1.0..=MAX as f64).contains(&open),
        "rsc_http_connections_open {open}"
    );
}

#[tokio::test]
async fn one_address_at_its_cap_does_not_keep_another_out() {
    let coordinator = CoordinatorProcess::start(&[
        "--max-connections",
        "100",
        "--max-connections-per-ip",
        "3",
        "--header-read-timeout-ms",
        "60000",
    ])
    .expect("coordinator");
    let addr = coordinator.addr();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect_from(addr, "127.0.0.2").await);
    }
    assert_eq!(get(&mut held[0], "/healthz").await.0, 200);
    refused(addr, "127.0.0.2", "--max-connections-per-ip").await;
    refused(addr, "127.0.0.2", "--max-connections-per-ip").await;
    assert!(
        served(addr, "127.0.0.3").await,
        "another address is still served"
    );
    let (status, metrics) = get(&mut held[0], "/metrics").await;
    assert_eq!(status, 200);
    let per_ip = metric_sum(
        &metrics,
        "rsc_http_connections_refused_total",
        &[("reason", "per_ip")],
    );
    assert!(per_ip >= 2.0, "refused per address {per_ip}");
}

// ---------------------------------------------------------------------------------------
// HTTP/2 over TLS, frame by frame (RFC 9113).

const FRAME_HEADERS: u8 = 0x1;
const FRAME_RST_STREAM: u8 = 0x3;
const FRAME_SETTINGS: u8 = 0x4;
const FRAME_GOAWAY: u8 = 0x7;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;
const CANCEL: u32 = 0x8;
const REFUSED_STREAM: u32 = 0x7;
const ENHANCE_YOUR_CALM: u32 = 0xb;

type Tls = rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>;

/// A TLS connection to `addr` trusting `ca`, offering `alpn`.
fn tls_connect(addr: SocketAddr, ca: &std::path::Path, alpn: &[u8]) -> Tls {
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
    config.alpn_protocols = vec![alpn.to_vec()];
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

/// One frame: type, flags, stream, payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK string literal, not Huffman-coded (lengths under 127).
fn hpack_str(s: &str) -> Vec<u8> {
    let mut v = vec![s.len() as u8];
    v.extend_from_slice(s.as_bytes());
    v
}

/// A request's header block: `method` on `path` (static table names, literal values).
fn header_block(method: &str, path: &str) -> Vec<u8> {
    let mut b = vec![if method == "GET" { 0x82 } else { 0x83 }, 0x87]; // :method, :scheme https
    b.push(0x04); // :path, literal value without indexing
    b.extend(hpack_str(path));
    b.push(0x01); // :authority
    b.extend(hpack_str("127.0.0.1"));
    b.extend([0x0f, 0x10]); // content-type (static index 31)
    b.extend(hpack_str("application/json"));
    b
}

/// Reads one frame: (type, flags, stream, payload).
fn read_frame(tls: &mut Tls) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    tls.read_exact(&mut head)?;
    let len = (head[0] as usize) << 16 | (head[1] as usize) << 8 | head[2] as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    tls.read_exact(&mut payload)?;
    Ok((head[3], head[4], stream, payload))
}

/// Opens an HTTP/2 connection: the preface, empty settings, and the server's settings
/// (acknowledged), returned as (identifier, value) pairs.
fn h2_open(addr: SocketAddr, ca: &std::path::Path) -> (Tls, Vec<(u16, u32)>) {
    let mut tls = tls_connect(addr, ca, b"h2");
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    tls.write_all(&frame(FRAME_SETTINGS, 0, 0, &[])).unwrap();
    tls.flush().unwrap();
    assert_eq!(
        tls.conn.alpn_protocol(),
        Some(&b"h2"[..]),
        "ALPN chose HTTP/2"
    );
    let (kind, flags, _, payload) = read_frame(&mut tls).expect("the server's settings");
    assert_eq!(
        (kind, flags),
        (FRAME_SETTINGS, 0),
        "the server's first frame"
    );
    let settings = payload
        .chunks(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect();
    tls.write_all(&frame(FRAME_SETTINGS, 0x1, 0, &[])).unwrap();
    tls.flush().unwrap();
    (tls, settings)
}

/// Frames from `tls` until one of `kind` on `stream` (any stream: 0 for GOAWAY) comes;
/// its payload, or `None` when the connection ends first.
fn h2_wait(tls: &mut Tls, kind: u8, stream: u32) -> Option<Vec<u8>> {
    loop {
        match read_frame(tls) {
            Ok((k, _, s, payload)) if k == kind && s == stream => return Some(payload),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
}

/// The coordinator's metrics, read over HTTPS (HTTP/1.1).
fn metrics_over_tls(addr: SocketAddr, ca: &std::path::Path) -> String {
    let mut tls = tls_connect(addr, ca, b"http/1.1");
    tls.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut all = Vec::new();
    let _ = tls.read_to_end(&mut all);
    String::from_utf8_lossy(&all).into_owned()
}

#[test]
fn http2_advertises_its_limits_refuses_extra_streams_and_ends_a_reset_flood() {
    let certs = TlsCerts::generate().expect("openssl makes the certificates");
    let (cert, key) = (certs.server_cert(), certs.server_key());
    let coordinator = CoordinatorProcess::start(&[
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--http2-max-concurrent-streams",
        "3",
        "--http2-max-pending-reset-streams",
        "5",
        "--max-header-bytes",
        "4096",
    ])
    .expect("coordinator");
    let (addr, ca) = (coordinator.addr(), certs.ca());

    let (mut tls, settings) = h2_open(addr, &ca);
    assert!(
        settings.contains(&(SETTINGS_MAX_CONCURRENT_STREAMS, 3)),
        "{settings:?}"
    );
    assert!(
        settings.contains(&(SETTINGS_MAX_HEADER_LIST_SIZE, 4096)),
        "{settings:?}"
    );
    // Three requests whose bodies never come stay open; a fourth stream is refused.
    for stream in [1, 3, 5, 7] {
        let block = header_block("POST", "/v1/groups");
        tls.write_all(&frame(FRAME_HEADERS, 0x4, stream, &block))
            .unwrap();
    }
    tls.flush().unwrap();
    let reset = h2_wait(&mut tls, FRAME_RST_STREAM, 7).expect("stream 7 is reset");
    assert_eq!(
        u32::from_be_bytes(reset[..4].try_into().unwrap()),
        REFUSED_STREAM
    );
    drop(tls);

    // Rapid reset: requests cancelled as soon as they are sent, more than the limit of 5
    // (fewer than h2's default of 20) in one burst.
    let (mut tls, _) = h2_open(addr, &ca);
    let mut burst = Vec::new();
    for i in 0..8u32 {
        let stream = 2 * i + 1;
        burst.extend(frame(
            FRAME_HEADERS,
            0x5,
            stream,
            &header_block("GET", "/healthz"),
        ));
        burst.extend(frame(FRAME_RST_STREAM, 0, stream, &CANCEL.to_be_bytes()));
    }
    tls.write_all(&burst).unwrap();
    tls.flush().unwrap();
    let goaway = h2_wait(&mut tls, FRAME_GOAWAY, 0).expect("a GOAWAY");
    assert_eq!(
        u32::from_be_bytes(goaway[4..8].try_into().unwrap()),
        ENHANCE_YOUR_CALM,
        "GOAWAY's error code"
    );

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = metrics_over_tls(addr, &ca);
        if metric_sum(&metrics, "rsc_http2_flood_goaways_total", &[]) >= 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "no flood counted: {metrics}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
