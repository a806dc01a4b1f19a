//! Connection caps (PROTOCOL §4.4): at most `--max-connections` open connections, at most
//! `--max-connections-per-ip` from one client address. A connection over a cap is refused
//! as soon as it is accepted, counted in `rsc_http_connections_refused_total{reason}`, and
//! logged at debug level, with one warning at most every [`WARN_EVERY`] summing up the
//! refusals since the last one: a flood never writes a line per connection at warn level.

use rsc_protocol::{ErrorBody, ErrorCode};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// The shortest time between two warnings about refused connections.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// `--max-connections` connections were open.
    MaxConnections,
    /// `--max-connections-per-ip` connections from the client's address were open.
    PerIp,
}

impl Refusal {
    /// The `reason` label of `rsc_http_connections_refused_total`.
    fn label(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "max_connections",
            Refusal::PerIp => "per_ip",
        }
    }

    /// The answer written to a refused plain-HTTP connection before it is closed:
    /// `429 RATE_LIMITED` (PROTOCOL §4.2) with `Retry-After: 1` and `Connection: close`.
    pub(super) fn response(self) -> &'static [u8] {
        static ANSWERS: OnceLock<[Vec<u8>; 2]> = OnceLock::new();
        let answers = ANSWERS.get_or_init(|| {
            [Refusal::MaxConnections, Refusal::PerIp].map(|r| {
                let message = match r {
                    Refusal::MaxConnections => {
                        "the coordinator holds its most open connections (--max-connections): \
                         retry later"
                    }
                    Refusal::PerIp => {
                        "this client address holds its most open connections \
                         (--max-connections-per-ip): reuse a connection or retry later"
                    }
                };
                let body = serde_json::to_string(&ErrorBody::new(ErrorCode::RateLimited, message))
                    .unwrap_or_default();
                format!(
                    "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
                     retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .into_bytes()
            })
        });
        &answers[self as usize]
    }
}

/// The open connections, in total and per client address, against their caps.
pub(super) struct Admission {
    max: usize,
    per_ip: usize,
    state: Mutex<State>,
    open: metrics::Gauge,
}

/// What [`Admission`] counts.
#[derive(Default)]
struct State {
    /// Open connections.
    open: usize,
    /// Open connections per client address (absent: none).
    by_client: HashMap<Client, u32>,
    /// Refusals not yet in a warning, by [`Refusal`].
    unwarned: [u64; 2],
    /// When the last warning was written.
    warned: Option<Instant>,
}

/// A client address as the per-address cap counts it: an IPv4 address, or the /64 of an
/// IPv6 address (one host usually holds a whole /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Client(IpAddr);

impl Client {
    fn of(ip: IpAddr) -> Self {
        match ip.to_canonical() {
            IpAddr::V6(v6) => Client(IpAddr::V6(Ipv6Addr::from(
                u128::from(v6) & !u128::from(u64::MAX),
            ))),
            v4 => Client(v4),
        }
    }
}

/// One admitted connection: it counts as open until this is dropped.
pub(super) struct Ticket {
    admission: Arc<Admission>,
    client: Client,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admission.release(self.client);
    }
}

impl Admission {
    /// Caps of `max` connections, `per_ip` of them from one client address.
    pub(super) fn new(max: usize, per_ip: usize) -> Arc<Self> {
        let open = metrics::gauge!("rsc_http_connections_open");
        open.set(0.0);
        Arc::new(Admission {
            max,
            per_ip,
            state: Mutex::new(State::default()),
            open,
        })
    }

    /// Counts a connection from `peer` as open, or says which cap refuses it (counted and
    /// logged here).
    pub(super) fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Ticket, Refusal> {
        let client = Client::of(peer);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let refusal = if state.open >= self.max {
            Some(Refusal::MaxConnections)
        } else {
            let from_client = state.by_client.get(&client).copied().unwrap_or(0);
            (from_client as usize >= self.per_ip).then_some(Refusal::PerIp)
        };
        let Some(refusal) = refusal else {
            state.open += 1;
            *state.by_client.entry(client).or_insert(0) += 1;
            self.open.set(state.open as f64);
            return Ok(Ticket {
                admission: self.clone(),
                client,
            });
        };
        let due = state.note(refusal, Instant::now());
        let open = state.open;
        drop(state);
        metrics::counter!("rsc_http_connections_refused_total", "reason" => refusal.label())
            .increment(1);
        debug!(%peer, reason = refusal.label(), "connection refused");
        if let Some([max, per_ip]) = due {
            warn!(
                open,
                max_connections = self.max,
                max_connections_per_ip = self.per_ip,
                refused_max_connections = max,
                refused_per_ip = per_ip,
                last = %peer,
                "refusing connections over the connection caps (counts since the last such \
                 warning; rsc_http_connections_refused_total)"
            );
        }
        Err(refusal)
    }

    /// A connection of `client` closed.
    fn release(&self, client: Client) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.open = state.open.saturating_sub(1);
        if let Some(n) = state.by_client.get_mut(&client) {
            *n -= 1;
            if *n == 0 {
                state.by_client.remove(&client);
            }
        }
        self.open.set(state.open as f64);
    }

    /// Open connections (in total, and from `peer`'s address).
    #[cfg(test)]
    fn open(&self, peer: IpAddr) -> (usize, u32) {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let from = state.by_client.get(&Client::of(peer)).copied();
        (state.open, from.unwrap_or(0))
    }
}

impl State {
    /// Counts `refusal` at `now`; the counts to warn about when a warning is due (the first
    /// refusal, then at most one every [`WARN_EVERY`]).
    fn note(&mut self, refusal: Refusal, now: Instant) -> Option<[u64; 2]> {
        self.unwarned[refusal as usize] += 1;
        if self
            .warned
            .is_some_and(|t| now.saturating_duration_since(t) < WARN_EVERY)
        {
            return None;
        }
        self.warned = Some(now);
        Some(std::mem::take(&mut self.unwarned))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn caps_count_in_total_and_per_address_and_release_on_drop() {
        let admission = Admission::new(3, 2);
        let a1 = admission.admit(ip("127.0.0.2")).expect("first");
        let a2 = admission.admit(ip("127.0.0.2")).expect("second");
        assert_eq!(admission.admit(ip("127.0.0.2")).err(), Some(Refusal::PerIp));
        let b1 = admission.admit(ip("127.0.0.3")).expect("another address");
        assert_eq!(
            admission.admit(ip("127.0.0.4")).err(),
            Some(Refusal::MaxConnections)
        );
        drop(a1);
        assert_eq!(admission.open(ip("127.0.0.2")), (2, 1));
        let a3 = admission.admit(ip("127.0.0.2")).expect("a freed slot");
        drop((a2, a3, b1));
        assert_eq!(admission.open(ip("127.0.0.2")), (0, 0));
        assert!(
            admission.state.lock().unwrap().by_client.is_empty(),
            "no entry is kept for an address without connections"
        );
    }

    #[test]
    fn an_ipv6_slash_64_is_one_client_and_mapped_ipv4_is_ipv4() {
        let admission = Admission::new(10, 1);
        let _a = admission.admit(ip("2001:db8::1")).expect("first");
        assert_eq!(
            admission.admit(ip("2001:db8::ffff:2")).err(),
            Some(Refusal::PerIp),
            "same /64"
        );
        let _b = admission.admit(ip("2001:db8:0:1::1")).expect("another /64");
        let _c = admission.admit(ip("10.0.0.1")).expect("IPv4");
        assert_eq!(
            admission.admit(ip("::ffff:10.0.0.1")).err(),
            Some(Refusal::PerIp),
            "the IPv4-mapped form of the same address"
        );
    }

    #[test]
    fn warnings_about_refusals_are_at_most_one_per_period() {
        let mut state = State::default();
        let t0 = Instant::now();
        assert_eq!(
            state.note(Refusal::PerIp, t0),
            Some([0, 1]),
            "the first warns"
        );
        for i in 0..1000 {
            let refusal = if i % 2 == 0 {
                Refusal::MaxConnections
            } else {
                Refusal::PerIp
            };
            assert_eq!(state.note(refusal, t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(
            state.note(Refusal::PerIp, t0 + WARN_EVERY),
            Some([500, 501]),
            "then one warning sums up the period"
        );
    }

    #[test]
    fn the_refusal_answer_is_a_429_with_the_protocol_error_body() {
        let answer = String::from_utf8(Refusal::PerIp.response().to_vec()).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 429 "), "{head}");
        assert!(head.contains("\r\nconnection: close"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let parsed: ErrorBody = serde_json::from_str(body).unwrap();
        assert_eq!(parsed.error.code, ErrorCode::RateLimited);
        assert!(parsed.error.message.contains("--max-connections-per-ip"));
    }
}
