//! Who is calling, by address, and the per-address limits that run ahead of authentication
//! (PROTOCOL §7, "Client addresses and refusals").
//!
//! The client address of a request is its connection's peer IP; when that peer is a trusted
//! proxy (`--trusted-proxies`), it is the rightmost address of `X-Forwarded-For` that is not a
//! trusted proxy itself. Nothing else ever reads `X-Forwarded-For`: a client that is not behind
//! a trusted proxy cannot choose its address.
//!
//! Two per-address token buckets (`governor`'s GCRA) run before any credential is looked at:
//! - the request rate (`--client-rate`, `--client-burst`; off by default), every request;
//! - the refusal rate (`--client-refusal-rate`, `--client-refusal-burst`): each refused request
//!   (401, 403, 413) takes a token; an address whose bucket is empty is answered
//!   `429 RATE_LIMITED` before authentication until a token is free again. A client that
//!   authenticates never empties it; one that guesses tokens or floods refused requests is
//!   slowed to the refusal rate, and so is the audit log's refusal log behind it.

use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Request};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use ipnet::IpNet;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// How many addresses the refusal limiter keeps blocked at once at most; past that, new
/// offenders are only slowed by their own refusals being refused (never unguarded: the
/// bucket still counts them).
const BLOCKED_MAX: usize = 100_000;

/// The `X-Forwarded-For` header.
const X_FORWARDED_FOR: &str = "x-forwarded-for";

/// The address a request is attributed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ClientAddr {
    /// An IP address.
    Ip(IpAddr),
    /// No connection information (a request served in process, as in unit tests).
    Unknown,
}

impl std::fmt::Display for ClientAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientAddr::Ip(ip) => ip.fmt(f),
            ClientAddr::Unknown => f.write_str("unknown"),
        }
    }
}

/// The proxies whose `X-Forwarded-For` is believed (`--trusted-proxies`).
#[derive(Debug, Clone, Default)]
pub(crate) struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Parses a comma-separated list of addresses and CIDR ranges (`10.0.0.0/8,::1`).
    pub(crate) fn parse(list: &str) -> Result<Self, String> {
        let mut nets = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let net = match item.parse::<IpNet>() {
                Ok(n) => n,
                Err(_) => match item.parse::<IpAddr>() {
                    Ok(ip) => IpNet::from(ip),
                    Err(_) => {
                        return Err(format!(
                            "`{item}` is neither an IP address nor a CIDR range (e.g. 10.0.0.0/8)"
                        ));
                    }
                },
            };
            nets.push(net);
        }
        Ok(TrustedProxies(nets))
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|n| n.contains(&ip))
    }

    /// The client address of a request from `peer` with `headers`.
    pub(crate) fn client_addr(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> ClientAddr {
        let Some(peer) = peer.map(canonical) else {
            return ClientAddr::Unknown;
        };
        if self.0.is_empty() || !self.trusts(peer) {
            return ClientAddr::Ip(peer);
        }
        // Right to left: the nearest hop first; every trusted proxy appended what it saw.
        let mut hops = headers
            .get_all(X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect::<Vec<_>>();
        hops.reverse();
        let mut last = peer;
        for hop in hops {
            let Ok(ip) = hop.parse::<IpAddr>().map(canonical) else {
                // A hop that does not parse was written by the client: stop at the last
                // address a trusted proxy vouched for.
                return ClientAddr::Ip(last);
            };
            if !self.trusts(ip) {
                return ClientAddr::Ip(ip);
            }
            last = ip;
        }
        ClientAddr::Ip(last)
    }
}

/// `::ffff:a.b.c.d` as `a.b.c.d`, so one client has one address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The peer address of a request's connection, when the server recorded it.
pub(crate) fn peer_ip<B>(req: &Request<B>) -> Option<IpAddr> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

type Keyed<C> =
    RateLimiter<IpAddr, DefaultKeyedStateStore<IpAddr>, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// A rate and burst (`None`: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Rate {
    /// Per second.
    pub per_s: u32,
    /// Bucket size.
    pub burst: u32,
}

impl Rate {
    fn quota(self) -> Option<Quota> {
        let per_s = NonZeroU32::new(self.per_s)?;
        let burst = NonZeroU32::new(self.burst).unwrap_or(per_s);
        Some(Quota::per_second(per_s).allow_burst(burst))
    }
}

/// Why [`ClientLimiter::admit`] refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Throttled {
    /// Over `--client-rate`.
    Requests(Duration),
    /// Over `--client-refusal-rate`: too many refused requests lately.
    Refusals(Duration),
}

impl Throttled {
    /// How long until the address may send again.
    pub(crate) fn wait(self) -> Duration {
        match self {
            Throttled::Requests(d) | Throttled::Refusals(d) => d,
        }
    }

    /// The reason label of `rsc_client_throttled_total`.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Throttled::Requests(_) => "request_rate",
            Throttled::Refusals(_) => "refusal_rate",
        }
    }
}

/// The per-address limits ahead of authentication (see the [module docs](self)).
pub(crate) struct ClientLimiter<C: Clock = DefaultClock> {
    requests: Option<Keyed<C>>,
    refusals: Option<Keyed<C>>,
    /// Addresses whose refusal bucket is empty, until when. Read by every request (a shared
    /// lock), written only on a refusal over the burst and when an entry has expired.
    blocked: RwLock<HashMap<IpAddr, Instant>>,
    clock: C,
}

impl<C: Clock> std::fmt::Debug for ClientLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientLimiter")
            .field("requests", &self.requests.is_some())
            .field("refusals", &self.refusals.is_some())
            .finish_non_exhaustive()
    }
}

impl ClientLimiter {
    /// Limits of `requests` and `refusals` per address (a zero rate turns one off).
    pub(crate) fn new(requests: Rate, refusals: Rate) -> Self {
        Self::with_clock(requests, refusals, DefaultClock::default())
    }

    /// No limit at all.
    pub(crate) fn off() -> Self {
        Self::new(Rate::default(), Rate::default())
    }
}

impl<C: Clock + Clone> ClientLimiter<C> {
    /// The same with an explicit clock (tests use `governor::clock::FakeRelativeClock`).
    pub(crate) fn with_clock(requests: Rate, refusals: Rate, clock: C) -> Self {
        let keyed = |r: Rate| {
            r.quota()
                .map(|q| RateLimiter::new(q, DefaultKeyedStateStore::default(), clock.clone()))
        };
        ClientLimiter {
            requests: keyed(requests),
            refusals: keyed(refusals),
            blocked: RwLock::new(HashMap::new()),
            clock,
        }
    }

    /// Checked before anything else of a request from `client`: `Err` when its address is
    /// over either limit. Requests without an address (in process) are not limited.
    pub(crate) fn admit(&self, client: ClientAddr) -> Result<(), Throttled> {
        let ClientAddr::Ip(ip) = client else {
            return Ok(());
        };
        if self.refusals.is_some() {
            let now = Instant::now();
            // A poisoned lock still answers from the data: the map holds no invariant.
            let until = (self.blocked.read().unwrap_or_else(|p| p.into_inner()))
                .get(&ip)
                .copied();
            match until {
                Some(until) if until > now => return Err(Throttled::Refusals(until - now)),
                Some(_) => {
                    let mut blocked = self.blocked.write().unwrap_or_else(|p| p.into_inner());
                    if blocked.get(&ip).is_some_and(|until| *until <= now) {
                        blocked.remove(&ip);
                    }
                }
                None => {}
            }
        }
        if let Some(limiter) = &self.requests {
            limiter
                .check_key(&ip)
                .map_err(|n| Throttled::Requests(n.wait_time_from(self.clock.now())))?;
        }
        Ok(())
    }

    /// Records a refused request of `client`: once its refusal bucket is empty, the address
    /// is throttled until a token is free again.
    pub(crate) fn refused(&self, client: ClientAddr) {
        let (ClientAddr::Ip(ip), Some(limiter)) = (client, &self.refusals) else {
            return;
        };
        if let Err(not_until) = limiter.check_key(&ip) {
            let wait = not_until.wait_time_from(self.clock.now());
            let mut blocked = self.blocked.write().unwrap_or_else(|p| p.into_inner());
            if blocked.len() < BLOCKED_MAX || blocked.contains_key(&ip) {
                blocked.insert(ip, Instant::now() + wait);
            }
        }
    }

    /// Forgets what is no longer needed: expired blocks and full buckets (call it now and
    /// then, so that many addresses seen once do not hold memory).
    pub(crate) fn prune(&self) {
        let now = Instant::now();
        self.blocked
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, until| *until > now);
        for limiter in [&self.requests, &self.refusals].into_iter().flatten() {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use governor::clock::FakeRelativeClock;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append(X_FORWARDED_FOR, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn forwarded_for_is_read_only_behind_a_trusted_proxy() {
        let none = TrustedProxies::default();
        let h = headers(&["6.6.6.6"]);
        // Without trusted proxies, the header is the client's word: ignored.
        assert_eq!(
            none.client_addr(Some(ip("10.1.1.1")), &h),
            ClientAddr::Ip(ip("10.1.1.1"))
        );
        assert_eq!(none.client_addr(None, &h), ClientAddr::Unknown);
        let trusted = TrustedProxies::parse("10.0.0.0/8, 192.168.1.1").unwrap();
        // From a proxy that is not trusted: ignored.
        assert_eq!(
            trusted.client_addr(Some(ip("11.0.0.1")), &h),
            ClientAddr::Ip(ip("11.0.0.1"))
        );
        // The rightmost untrusted hop: a client cannot prepend its way past the proxies.
        let h = headers(&["1.1.1.1, 2.2.2.2", "192.168.1.1"]);
        assert_eq!(
            trusted.client_addr(Some(ip("10.0.0.5")), &h),
            ClientAddr::Ip(ip("2.2.2.2"))
        );
        // Every hop trusted: the farthest one.
        let h = headers(&["10.9.9.9"]);
        assert_eq!(
            trusted.client_addr(Some(ip("10.0.0.5")), &h),
            ClientAddr::Ip(ip("10.9.9.9"))
        );
        // Garbage stops the walk at the last vouched-for address.
        let h = headers(&["1.1.1.1, not-an-ip"]);
        assert_eq!(
            trusted.client_addr(Some(ip("10.0.0.5")), &h),
            ClientAddr::Ip(ip("10.0.0.5"))
        );
        // No header: the proxy itself.
        assert_eq!(
            trusted.client_addr(Some(ip("10.0.0.5")), &HeaderMap::new()),
            ClientAddr::Ip(ip("10.0.0.5"))
        );
        // IPv4-mapped IPv6 peers are their IPv4 address.
        assert_eq!(
            none.client_addr(Some(ip("::ffff:127.0.0.2")), &HeaderMap::new()),
            ClientAddr::Ip(ip("127.0.0.2"))
        );
        assert!(TrustedProxies::parse("10.0.0.0/8,bogus").is_err());
        assert!(TrustedProxies::parse("").unwrap().0.is_empty());
    }

    #[test]
    fn refusals_throttle_their_address_only() {
        let clock = FakeRelativeClock::default();
        let limiter =
            ClientLimiter::with_clock(Rate::default(), Rate { per_s: 1, burst: 3 }, clock.clone());
        let bad = ClientAddr::Ip(ip("127.0.0.9"));
        let good = ClientAddr::Ip(ip("127.0.0.10"));
        for _ in 0..3 {
            assert!(limiter.admit(bad).is_ok());
            limiter.refused(bad);
        }
        // The fourth refusal found the bucket empty: the address is throttled.
        limiter.refused(bad);
        assert!(matches!(limiter.admit(bad), Err(Throttled::Refusals(_))));
        assert!(limiter.admit(good).is_ok());
        assert!(limiter.admit(ClientAddr::Unknown).is_ok());
    }

    #[test]
    fn the_request_rate_is_per_address() {
        let clock = FakeRelativeClock::default();
        let limiter =
            ClientLimiter::with_clock(Rate { per_s: 1, burst: 2 }, Rate::default(), clock.clone());
        let a = ClientAddr::Ip(ip("127.0.0.2"));
        assert!(limiter.admit(a).is_ok());
        assert!(limiter.admit(a).is_ok());
        let Err(Throttled::Requests(wait)) = limiter.admit(a) else {
            panic!("a third request in a burst of two passed");
        };
        assert!(wait <= Duration::from_secs(1));
        assert!(limiter.admit(ClientAddr::Ip(ip("127.0.0.3"))).is_ok());
        clock.advance(Duration::from_secs(1));
        assert!(limiter.admit(a).is_ok());
        limiter.prune();
    }

    #[test]
    fn off_limits_nothing() {
        let limiter = ClientLimiter::off();
        for _ in 0..1000 {
            limiter.refused(ClientAddr::Ip(ip("127.0.0.2")));
            assert!(limiter.admit(ClientAddr::Ip(ip("127.0.0.2"))).is_ok());
        }
    }
}
