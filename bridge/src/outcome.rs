//! What the application's answer to a delivery means (pure, no I/O):
//!
//! | answer | verdict |
//! |---|---|
//! | 2xx | acknowledged |
//! | 429, 503 | deferred: delivered again after `Retry-After` (else 1 s), not counted as a failure |
//! | 408 | a failure, retried by the listener's policy |
//! | other 4xx | dead-lettered at once (retrying cannot fix it) |
//! | 5xx, 1xx, 3xx, a timeout, a broken connection | a failure, retried by the listener's policy, then dead-lettered |
//! | no connection (refused, no socket file) | deferred: the application is down, the entry waits |

use rsc_client::HandlerError;
use std::time::{Duration, SystemTime};

/// How long a deferred delivery waits when the answer did not say.
pub(crate) const DEFAULT_DEFER: Duration = Duration::from_secs(1);
/// The longest `Retry-After` honoured.
pub(crate) const MAX_DEFER: Duration = Duration::from_secs(300);

/// What came back from one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// An HTTP answer.
    Status {
        /// The status code.
        code: u16,
        /// Its `Retry-After`, as the wait it asks for (seconds or an HTTP-date).
        retry_after: Option<Duration>,
    },
    /// No connection could be made.
    Unreachable(String),
    /// No answer within the delivery timeout.
    TimedOut,
    /// The request failed after the connection was made.
    Broken(String),
}

/// The verdict on one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Acknowledge.
    Ack,
    /// Deliver again after the delay, without counting a failure.
    Defer(Duration, String),
    /// Dead-letter now.
    DeadLetter(String),
    /// A failure: retry by the policy.
    Retry(String),
}

impl Verdict {
    /// The metric label of the verdict.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Verdict::Ack => "acked",
            Verdict::Defer(..) => "deferred",
            Verdict::DeadLetter(_) => "dead_lettered",
            Verdict::Retry(_) => "failed",
        }
    }

    /// As a listener's result.
    pub(crate) fn into_result(self) -> Result<(), HandlerError> {
        match self {
            Verdict::Ack => Ok(()),
            Verdict::Defer(d, why) => Err(HandlerError::defer(d, why)),
            Verdict::DeadLetter(why) => Err(HandlerError::dead_letter(why)),
            Verdict::Retry(why) => Err(HandlerError::retry(why)),
        }
    }
}

/// The verdict on `answer`.
pub(crate) fn verdict(answer: &Answer) -> Verdict {
    match answer {
        Answer::Status { code, retry_after } => match *code {
            200..=299 => Verdict::Ack,
            429 | 503 => Verdict::Defer(
                retry_after.unwrap_or(DEFAULT_DEFER).min(MAX_DEFER),
                format!("the application answered {code}: later"),
            ),
            408 => Verdict::Retry("the application answered 408".into()),
            400..=499 => Verdict::DeadLetter(format!("the application refused the entry: {code}")),
            _ => Verdict::Retry(format!("the application answered {code}")),
        },
        Answer::Unreachable(e) => Verdict::Defer(
            DEFAULT_DEFER,
            format!("the application is unreachable: {e}"),
        ),
        Answer::TimedOut => {
            Verdict::Retry("the application did not answer within the delivery timeout".into())
        }
        Answer::Broken(e) => Verdict::Retry(format!("the delivery failed: {e}")),
    }
}

/// A `Retry-After` value (RFC 9110 §10.2.3) as the wait from `now`: whole seconds, or an
/// HTTP-date (§5.6.7: IMF-fixdate or the obsolete asctime form; zero once past). `None` for
/// anything else (the obsolete RFC 850 form included).
pub(crate) fn parse_retry_after(v: &str, now: SystemTime) -> Option<Duration> {
    use time::macros::format_description;
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let imf = format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    let asctime = format_description!(
        "[weekday repr:short] [month repr:short] [day padding:space] [hour]:[minute]:[second] [year]"
    );
    let at = time::PrimitiveDateTime::parse(v, imf)
        .or_else(|_| time::PrimitiveDateTime::parse(v, asctime))
        .ok()?;
    Some(
        SystemTime::from(at.assume_utc())
            .duration_since(now)
            .unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, retry_after: Option<u64>) -> Verdict {
        verdict(&Answer::Status {
            code,
            retry_after: retry_after.map(Duration::from_secs),
        })
    }

    #[test]
    fn the_answer_decides() {
        assert_eq!(status(200, None), Verdict::Ack);
        assert_eq!(status(204, None), Verdict::Ack);
        assert!(
            matches!(status(429, Some(3)), Verdict::Defer(d, _) if d == Duration::from_secs(3))
        );
        assert!(matches!(status(503, None), Verdict::Defer(d, _) if d == DEFAULT_DEFER));
        assert!(matches!(status(503, Some(86_400)), Verdict::Defer(d, _) if d == MAX_DEFER));
        assert!(matches!(status(400, None), Verdict::DeadLetter(_)));
        assert!(matches!(status(422, None), Verdict::DeadLetter(_)));
        assert!(matches!(status(408, None), Verdict::Retry(_)));
        assert!(matches!(status(500, None), Verdict::Retry(_)));
        assert!(matches!(status(302, None), Verdict::Retry(_)));
        assert!(matches!(verdict(&Answer::TimedOut), Verdict::Retry(_)));
        assert!(matches!(
            verdict(&Answer::Broken("reset".into())),
            Verdict::Retry(_)
        ));
        assert!(matches!(
            verdict(&Answer::Unreachable("refused".into())),
            Verdict::Defer(..)
        ));
    }

    #[test]
    fn verdicts_become_handler_errors() {
        use rsc_client::FailureAction;
        assert!(Verdict::Ack.into_result().is_ok());
        let e = status(429, Some(2)).into_result().unwrap_err();
        assert_eq!(e.action(), FailureAction::Defer(Duration::from_secs(2)));
        let e = status(404, None).into_result().unwrap_err();
        assert_eq!(e.action(), FailureAction::DeadLetter);
        let e = status(500, None).into_result().unwrap_err();
        assert_eq!(e.action(), FailureAction::Retry);
    }

    #[test]
    fn retry_after_in_seconds_or_as_an_http_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480 - 90);
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(parse_retry_after(" 5 ", now), secs(5));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
            secs(90)
        );
        assert_eq!(parse_retry_after("Wed Oct 21 07:28:00 2015", now), secs(90));
        assert_eq!(
            parse_retry_after("Wed Oct  1 07:28:00 2015", now),
            secs(0),
            "past"
        );
        assert_eq!(
            parse_retry_after("Wednesday, 21-Oct-15 07:28:00 GMT", now),
            None
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-3", now), None);
    }
}
