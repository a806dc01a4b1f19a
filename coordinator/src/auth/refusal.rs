//! Why a request could not be authenticated: the `401 UNAUTHENTICATED` message
//! (PROTOCOL §20, "Refusals") and the `reason` label of `rsc_auth_refusals_total`.

/// A failed authentication. The message says which check failed, never which tokens,
/// subjects or keys the ACL holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The metric label: `missing`, `unknown_token`, `unknown_certificate`,
    /// `credential_expired`, or `jwt_` and the JWT check (`jwt_malformed`, `jwt_algorithm`,
    /// `jwt_issuer`, `jwt_kid`, `jwt_signature`, `jwt_time_claim`, `jwt_expired`,
    /// `jwt_not_yet_valid`, `jwt_audience`, `jwt_subject`, `jwt_lifetime`).
    pub(crate) reason: &'static str,
    /// The error body's message.
    pub(crate) message: String,
}

impl Refusal {
    /// A refusal for `reason` saying `message`.
    pub(crate) fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            reason,
            message: message.into(),
        }
    }
}

/// `seconds` since the Unix epoch as RFC 3339 UTC (`2026-12-03T07:30:00Z`), for messages.
pub(crate) fn rfc3339(seconds: i64) -> String {
    let days = seconds.div_euclid(86_400);
    let secs = seconds.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (inverse of [`days_from_civil`]).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_796_283_000), "2026-12-03T07:30:00Z");
        assert_eq!(
            days_from_civil(2026, 12, 3) * 86_400 + 27_000,
            1_796_283_000
        );
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        for day in [-1000, 0, 59, 60, 11_016, 20_000, 100_000] {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
    }
}
