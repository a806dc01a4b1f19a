//! Plain-text tables and the small formatters the CLI's human output uses.

use std::fmt;

/// A left-aligned text table with a header row, columns two spaces apart.
#[derive(Debug, Clone, Default)]
pub(super) struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub(super) fn new<I, S>(headers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (missing cells are blank, extra cells are kept).
    pub(super) fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let columns = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.headers.len()])
            .max()
            .unwrap_or(0);
        let mut widths = vec![0usize; columns];
        for line in std::iter::once(&self.headers).chain(&self.rows) {
            for (w, cell) in widths.iter_mut().zip(line) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for line in std::iter::once(&self.headers).chain(&self.rows) {
            let mut out = String::new();
            for (i, w) in widths.iter().enumerate() {
                let cell = line.get(i).map(String::as_str).unwrap_or("");
                out.push_str(cell);
                if i + 1 < columns {
                    out.extend(std::iter::repeat_n(' ', w - cell.chars().count() + 2));
                }
            }
            writeln!(f, "{}", out.trim_end())?;
        }
        Ok(())
    }
}

/// Shard indexes as compact ranges: `[0,1,2,3,7,9,10]` → `0-3,7,9-10`; empty → `-`.
pub(super) fn shard_ranges(shards: &[u32]) -> String {
    let mut sorted = shards.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut iter = sorted.into_iter().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(",")
    }
}

/// A duration in milliseconds, short: `850ms`, `4.2s`, `3m05s`, `2h10m`.
pub(super) fn duration_ms(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

/// A Unix time in ms as RFC 3339 UTC to the millisecond (`2026-01-31T09:30:00.250Z`); the
/// number itself when out of range.
pub(super) fn rfc3339_ms(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| t.format(&format).ok())
        .unwrap_or_else(|| ms.to_string())
}

/// An RFC 3339 time (`2026-01-31T09:30:00Z`, `2026-01-31T10:30:00+01:00`) as Unix ms.
pub(super) fn parse_rfc3339_ms(text: &str) -> Option<u64> {
    let t =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// An optional value, or `-`.
pub(super) fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// A serde enum as its wire name (`stable`, `draining`, …).
pub(super) fn wire_name<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_trim() {
        let mut t = Table::new(["A", "LONGER"]);
        t.row(["xyz", "1"]);
        t.row(["q", ""]);
        assert_eq!(t.to_string(), "A    LONGER\nxyz  1\nq\n");
    }

    #[test]
    fn ranges() {
        assert_eq!(shard_ranges(&[]), "-");
        assert_eq!(shard_ranges(&[5]), "5");
        assert_eq!(shard_ranges(&[10, 9, 0, 1, 2, 3, 7]), "0-3,7,9-10");
    }

    #[test]
    fn rfc3339_times() {
        assert_eq!(rfc3339_ms(1_767_225_600_250), "2026-01-01T00:00:00.250Z");
        assert_eq!(
            parse_rfc3339_ms("2026-01-01T00:00:00.250Z"),
            Some(1_767_225_600_250)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-01-01T01:00:00+01:00"),
            Some(1_767_225_600_000)
        );
        assert_eq!(parse_rfc3339_ms("2026-01-01"), None);
        assert_eq!(parse_rfc3339_ms("1969-12-31T23:59:59Z"), None);
    }

    #[test]
    fn durations() {
        assert_eq!(duration_ms(850), "850ms");
        assert_eq!(duration_ms(4_240), "4.2s");
        assert_eq!(duration_ms(185_000), "3m05s");
        assert_eq!(duration_ms(7_800_000), "2h10m");
    }
}
