//! Durations on the command line: `500ms`, `30s`, `15m`, `1h`, `7d`, or bare milliseconds.

/// Milliseconds of `text` (`<n>` with unit `ms`, `s`, `m`, `h` or `d`; no unit: ms): the
/// same syntax as a listener's retry stages.
pub(crate) fn parse_ms(text: &str) -> Result<u64, String> {
    rsc_protocol::retry::parse_millis(text)
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
