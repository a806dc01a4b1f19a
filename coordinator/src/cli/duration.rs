//! Durations on the command line: `500ms`, `30s`, `15m`, `1h`, `7d`, or bare milliseconds.

/// Milliseconds of `text` (`<n>` with unit `ms`, `s`, `m`, `h` or `d`; no unit: ms).
pub(crate) fn parse_ms(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 500ms, 30s, 15m, 1h, 7d)"))?;
    let scale: u64 = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (ms, s, m, h, d)"
            ));
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too long a duration"))
}

#[cfg(test)]
mod tests {
    use super::parse_ms;

    #[test]
    fn units_and_errors() {
        assert_eq!(parse_ms("0"), Ok(0));
        assert_eq!(parse_ms("250"), Ok(250));
        assert_eq!(parse_ms("250ms"), Ok(250));
        assert_eq!(parse_ms("30s"), Ok(30_000));
        assert_eq!(parse_ms("15m"), Ok(900_000));
        assert_eq!(parse_ms("1h"), Ok(3_600_000));
        assert_eq!(parse_ms("7d"), Ok(604_800_000));
        assert!(parse_ms("1w").is_err());
        assert!(parse_ms("h").is_err());
        assert!(parse_ms("-1s").is_err());
        assert!(parse_ms("99999999999999999999d").is_err());
    }
}
