//! Delivery to the application: one HTTP POST per entry (or per batch), over loopback TCP or
//! a Unix socket; the answer becomes the listener's verdict (`outcome`). Keeps what
//! `/readyz` says of the application: reachable, and not asking to wait.

use crate::cloudevents::{BATCH, Event, STRUCTURED};
use crate::config::{DeliverTo, Mode, Route};
use crate::outcome::{Answer, Verdict, parse_retry_after, verdict};
use rsc_client::{BatchError, ExposeSecret, HandlerError, Message, Raw, SecretString};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tracing::{debug, warn};

/// What the bridge knows of the application behind a listener.
#[derive(Debug, Default)]
pub(crate) struct AppState {
    /// Why it cannot be reached (the last connection failed).
    unreachable: Mutex<Option<String>>,
    /// Why it is not taking deliveries (it answered 429 / 503, or did not answer in time).
    busy: Mutex<Option<String>>,
}

impl AppState {
    fn set(slot: &Mutex<Option<String>>, v: Option<String>) {
        *slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = v;
    }

    /// Why the application does not take deliveries (`None`: it does).
    pub(crate) fn not_ready(&self) -> Option<String> {
        let get = |m: &Mutex<Option<String>>| {
            m.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        };
        get(&self.unreachable).or_else(|| get(&self.busy))
    }

    /// Records what one delivery (or probe) found.
    fn saw(&self, answer: &Answer) {
        match answer {
            Answer::Unreachable(e) => {
                Self::set(&self.unreachable, Some(format!("unreachable: {e}")))
            }
            Answer::Status {
                code: 429 | 503, ..
            }
            | Answer::TimedOut => {
                Self::set(&self.unreachable, None);
                let why = match answer {
                    Answer::TimedOut => "a delivery timed out".to_owned(),
                    Answer::Status { code, .. } => format!("it answered {code}"),
                    _ => String::new(),
                };
                Self::set(&self.busy, Some(why));
            }
            _ => {
                Self::set(&self.unreachable, None);
                Self::set(&self.busy, None);
            }
        }
    }
}

/// One listener's way to its application.
#[derive(Clone)]
pub(crate) struct Target {
    inner: Arc<Inner>,
}

struct Inner {
    route: Route,
    client: reqwest::Client,
    /// The request URL (for a Unix socket, `http://localhost<path>`).
    url: String,
    token: Option<SecretString>,
    pub(crate) state: Arc<AppState>,
}

impl Target {
    /// The target of `route`, sending `token` (as `Authorization: Bearer`) when given.
    pub(crate) fn new(route: &Route, token: Option<SecretString>) -> anyhow::Result<Self> {
        let builder = reqwest::Client::builder()
            .timeout(route.delivery_timeout)
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(30))
            .no_proxy();
        let (builder, url) = match &route.deliver_to {
            DeliverTo::Http(url) => (builder, url.clone()),
            DeliverTo::Unix { socket, path } => (
                builder.unix_socket(socket.as_path()),
                format!("http://localhost{path}"),
            ),
        };
        Ok(Target {
            inner: Arc::new(Inner {
                route: route.clone(),
                client: builder.build()?,
                url,
                token,
                state: Arc::default(),
            }),
        })
    }

    /// What `/readyz` reports of the application.
    pub(crate) fn state(&self) -> Arc<AppState> {
        self.inner.state.clone()
    }

    /// The listener's name.
    pub(crate) fn name(&self) -> &str {
        &self.inner.route.name
    }

    /// Where it delivers.
    pub(crate) fn deliver_to(&self) -> &DeliverTo {
        &self.inner.route.deliver_to
    }

    fn event<'a>(&'a self, msg: &'a Message<Raw>) -> Event<'a> {
        Event {
            id: msg.id(),
            group: msg.group(),
            stream: msg.stream(),
            shard: msg.shard(),
            event_type: &self.inner.route.event_type,
            key: msg.key(),
            content_type: msg.content_type(),
            data: &msg.payload().0,
            headers: msg.headers(),
            delivery_count: msg.delivery_count(),
            attempt: msg.attempt(),
        }
    }

    /// Delivers one entry; the application's answer is the verdict.
    pub(crate) async fn deliver(&self, msg: Message<Raw>) -> Result<(), HandlerError> {
        let event = self.event(&msg);
        let mut req = self.inner.client.post(&self.inner.url);
        req = match self.inner.route.mode {
            Mode::Binary => {
                let mut req = req;
                for (n, v) in event.binary_headers() {
                    req = req.header(n, v);
                }
                req.body(msg.payload().0.clone())
            }
            Mode::Structured => req
                .header("content-type", STRUCTURED)
                .body(event.structured().to_string()),
        };
        let (answer, _) = self.send(req).await;
        let v = verdict(&answer);
        self.record(&v, msg.id());
        v.into_result()
    }

    /// Delivers a batch as one JSON array of structured events. The answer is the verdict of
    /// every entry, unless a 2xx answer's JSON body names some that failed:
    /// `{"failed": [{"id": "<entry id>", "status": 400}]}` (each with the status it would
    /// have had alone).
    pub(crate) async fn deliver_batch(
        &self,
        batch: rsc_client::Batch<Raw>,
    ) -> Result<(), BatchError> {
        let events: Vec<serde_json::Value> =
            batch.iter().map(|m| self.event(m).structured()).collect();
        let req = self
            .inner
            .client
            .post(&self.inner.url)
            .header("content-type", BATCH)
            .body(serde_json::Value::Array(events).to_string());
        let (answer, body) = self.send(req).await;
        let v = verdict(&answer);
        let first = batch.messages().first().map_or("", |m| m.id());
        self.record(&v, first);
        if v != Verdict::Ack {
            return Err(BatchError::all(v.into_result().unwrap_err()));
        }
        let mut failed = BatchError::new();
        for (id, code) in failed_entries(&body) {
            let v = verdict(&Answer::Status {
                code,
                retry_after: None,
            });
            if let Err(e) = v.into_result() {
                failed = failed.entry(id, e);
            }
        }
        failed.into_result()
    }

    fn record(&self, v: &Verdict, id: &str) {
        let name = self.inner.route.name.clone();
        metrics::counter!("rsc_bridge_deliveries_total", "listener" => name, "outcome" => v.label())
            .increment(1);
        match v {
            Verdict::Ack => {}
            Verdict::Defer(d, why) => {
                debug!(listener = %self.name(), entry_id = id, delay = ?d, reason = %why, "delivery deferred")
            }
            Verdict::DeadLetter(why) | Verdict::Retry(why) => {
                warn!(listener = %self.name(), entry_id = id, reason = %why, "delivery failed")
            }
        }
    }

    /// Sends a request (with the token); the answer, and a 2xx answer's body (bounded).
    async fn send(&self, mut req: reqwest::RequestBuilder) -> (Answer, Vec<u8>) {
        if let Some(t) = &self.inner.token {
            req = req.bearer_auth(t.expose_secret());
        }
        let started = Instant::now();
        let result = req.send().await;
        let answer = match result {
            Ok(resp) => {
                let code = resp.status().as_u16();
                let retry_after = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| parse_retry_after(v, SystemTime::now()));
                let body = if (200..300).contains(&code) {
                    resp.bytes().await.map(|b| b.to_vec()).unwrap_or_default()
                } else {
                    Vec::new()
                };
                self.observe(started);
                self.inner.state.saw(&Answer::Status { code, retry_after });
                return (Answer::Status { code, retry_after }, body);
            }
            Err(e) if e.is_connect() => Answer::Unreachable(error_text(&e)),
            Err(e) if e.is_timeout() => Answer::TimedOut,
            Err(e) => Answer::Broken(error_text(&e)),
        };
        self.inner.state.saw(&answer);
        (answer, Vec::new())
    }

    fn observe(&self, started: Instant) {
        metrics::histogram!("rsc_bridge_delivery_duration_seconds", "listener" => self.inner.route.name.clone())
            .record(started.elapsed().as_secs_f64());
    }

    /// Checks that the application accepts connections (a connection opened and closed),
    /// and records it: `/readyz` follows an application that went down or came back while
    /// nothing was delivered.
    pub(crate) async fn probe(&self) {
        let result = match &self.inner.route.deliver_to {
            DeliverTo::Unix { socket, .. } => {
                tokio::net::UnixStream::connect(socket).await.map(drop)
            }
            DeliverTo::Http(url) => match reqwest::Url::parse(url)
                .ok()
                .and_then(|u| u.socket_addrs(|| Some(80)).ok())
            {
                Some(addrs) => tokio::net::TcpStream::connect(&*addrs).await.map(drop),
                None => Err(std::io::Error::other("no address")),
            },
        };
        let up = result.is_ok();
        metrics::gauge!("rsc_bridge_app_up", "listener" => self.inner.route.name.clone())
            .set(f64::from(u8::from(up)));
        match result {
            Ok(()) => {
                if self
                    .inner
                    .state
                    .unreachable
                    .lock()
                    .map(|g| g.is_some())
                    .unwrap_or(false)
                {
                    AppState::set(&self.inner.state.unreachable, None);
                }
            }
            Err(e) => self.inner.state.saw(&Answer::Unreachable(e.to_string())),
        }
    }
}

/// The error and its causes, `: `-separated (a connection error's reason is in a cause).
fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let t = s.to_string();
        if !out.ends_with(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        source = s.source();
    }
    out
}

/// The entries a batch answer names as failed, with their status.
fn failed_entries(body: &[u8]) -> Vec<(String, u16)> {
    #[derive(serde::Deserialize)]
    struct Failed {
        id: String,
        status: u16,
    }
    #[derive(serde::Deserialize)]
    struct Body {
        #[serde(default)]
        failed: Vec<Failed>,
    }
    serde_json::from_slice::<Body>(body)
        .map(|b| b.failed.into_iter().map(|f| (f.id, f.status)).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_answer_may_name_failed_entries() {
        assert_eq!(
            failed_entries(br#"{"failed":[{"id":"1-0","status":400},{"id":"2-0","status":503}]}"#),
            [("1-0".to_owned(), 400), ("2-0".to_owned(), 503)]
        );
        assert!(failed_entries(b"").is_empty());
        assert!(failed_entries(b"ok").is_empty());
    }

    #[test]
    fn the_state_follows_the_answers() {
        let s = AppState::default();
        assert_eq!(s.not_ready(), None);
        s.saw(&Answer::Unreachable("refused".into()));
        assert!(s.not_ready().is_some_and(|r| r.contains("refused")));
        s.saw(&Answer::Status {
            code: 503,
            retry_after: None,
        });
        assert!(s.not_ready().is_some_and(|r| r.contains("503")));
        s.saw(&Answer::Status {
            code: 200,
            retry_after: None,
        });
        assert_eq!(s.not_ready(), None);
    }
}
