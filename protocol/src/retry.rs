//! Non-blocking retries (PROTOCOL §2.2 "Retry stages"): a listener's retry stages, written
//! `10s,1m,10m` in an attribute or a setting.
//!
//! ```
//! use rsc_protocol::retry::parse_stages;
//! use std::time::Duration;
//!
//! assert_eq!(
//!     parse_stages("10s, 1m").unwrap(),
//!     [Duration::from_secs(10), Duration::from_secs(60)]
//! );
//! assert!(parse_stages("10x").is_err());
//! ```

use std::time::Duration;

/// The most retry stages a listener may have.
pub const MAX_STAGES: usize = 16;

/// The longest delay of one stage (7 days).
pub const MAX_DELAY: Duration = Duration::from_secs(7 * 86_400);

/// The stages of `text`: durations separated by commas, each a whole number with unit `ms`,
/// `s`, `m`, `h` or `d` (no unit: milliseconds), each at least 1 ms and at most
/// [`MAX_DELAY`], at most [`MAX_STAGES`]; an empty text is no stage (blocking retries).
/// The error says what is wrong, for a compile error or a configuration error.
pub fn parse_stages(text: &str) -> Result<Vec<Duration>, String> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let stages = text
        .split(',')
        .map(parse_delay)
        .collect::<Result<Vec<_>, _>>()?;
    if stages.len() > MAX_STAGES {
        return Err(format!(
            "{} stages in {text:?}: at most {MAX_STAGES}",
            stages.len()
        ));
    }
    Ok(stages)
}

/// Milliseconds of `text`: a whole number with unit `ms`, `s`, `m`, `h` or `d` (no unit:
/// milliseconds), as retry stages and the operators' CLI (`--by-duration 10m`) write them.
/// The error says what is wrong.
pub fn parse_millis(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{t:?} is not a duration (e.g. 500ms, 30s, 15m, 1h, 7d)"))?;
    let scale: u64 = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => return Err(format!("unknown unit {other:?} in {t:?} (ms, s, m, h, d)")),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{t:?} is too long a duration"))
}

/// One stage's delay (see [`parse_stages`]).
fn parse_delay(text: &str) -> Result<Duration, String> {
    let delay = Duration::from_millis(parse_millis(text)?);
    if delay.is_zero() || delay > MAX_DELAY {
        return Err(format!(
            "{:?}: a stage's delay is at least 1ms and at most 7d",
            text.trim()
        ));
    }
    Ok(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_lists_and_errors() {
        assert_eq!(parse_stages(""), Ok(vec![]));
        assert_eq!(
            parse_stages("250, 2s,1m,1h,1d"),
            Ok(vec![
                Duration::from_millis(250),
                Duration::from_secs(2),
                Duration::from_secs(60),
                Duration::from_secs(3600),
                Duration::from_secs(86_400),
            ])
        );
        for bad in [
            "0s",
            "8d",
            "1w",
            "s",
            "-1s",
            "1s,,2s",
            "99999999999999999999d",
        ] {
            assert!(parse_stages(bad).is_err(), "{bad}");
        }
        let seventeen = vec!["1s"; 17].join(",");
        assert!(parse_stages(&seventeen).is_err());
    }
}
