//! Shared pieces of the benchmark binaries: repetition and the result table.
#![deny(missing_docs)]

/// Summary of repeated measurements of one figure.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

/// Median, min and max of `samples` (at least one).
pub fn summarize(samples: &[f64]) -> Summary {
    assert!(!samples.is_empty(), "no samples");
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    Summary {
        median,
        min: s[0],
        max: s[n - 1],
    }
}

/// One row of a result table: a figure, its baseline, and the goal for their ratio.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Row {
    /// What was measured.
    pub name: String,
    /// Unit of the figure and the baseline.
    pub unit: String,
    /// The figure.
    pub value: Summary,
    /// The baseline measured in the same run, when the goal is a ratio.
    pub baseline: Option<Summary>,
    /// The goal, in words (e.g. `ratio >= 0.5`).
    pub goal: String,
}

/// A number with the precision its size deserves: 12345, 123.4, 1.234, 0.0123.
pub fn num(x: f64) -> String {
    let a = x.abs();
    if a >= 1000.0 {
        format!("{x:.0}")
    } else if a >= 100.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.4}")
    }
}

/// Renders rows as a Markdown table (also readable as plain text).
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "| figure | median | min | max | baseline (median) | ratio | goal |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (base, ratio) = match r.baseline {
            Some(b) => (
                format!("{} {}", num(b.median), r.unit),
                format!("{:.2}", r.value.median / b.median),
            ),
            None => ("-".into(), "-".into()),
        };
        out.push_str(&format!(
            "| {} | {} {u} | {} | {} | {} | {} | {} |\n",
            r.name,
            num(r.value.median),
            num(r.value.min),
            num(r.value.max),
            base,
            ratio,
            r.goal,
            u = r.unit
        ));
    }
    out
}

/// Prints `rows` as a table and, when the environment variable `RSC_BENCH_ROWS` names a
/// file, appends them to it as JSON lines (the suite's `report` binary gathers them).
pub fn emit(rows: &[Row]) -> std::io::Result<()> {
    use std::io::Write;
    println!("{}", markdown(rows));
    if let Some(path) = std::env::var_os("RSC_BENCH_ROWS") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        for r in rows {
            writeln!(f, "{}", serde_json::to_string(r)?)?;
        }
    }
    Ok(())
}

/// Resident memory of process `pid` in MiB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_mib(pid: u32) -> std::io::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .ok_or_else(|| std::io::Error::other("no VmRSS"))
}

/// `POST /v1/groups` with `body` on the coordinator at `url`; an error unless it answers 201.
pub async fn create_group(url: &str, body: serde_json::Value) -> anyhow::Result<()> {
    let resp = {
        rsc_client::install_crypto_provider();
        reqwest::Client::new()
    }
    .post(format!("{url}/v1/groups"))
    .json(&body)
    .send()
    .await?;
    anyhow::ensure!(
        resp.status().as_u16() == 201,
        "create group {body}: {}",
        resp.text().await?
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(summarize(&[3.0, 1.0, 2.0]).median, 2.0);
        assert_eq!(summarize(&[4.0, 1.0, 2.0, 3.0]).median, 2.5);
        let s = summarize(&[5.0, 1.0]);
        assert_eq!((s.min, s.max), (1.0, 5.0));
    }

    #[test]
    fn numbers_keep_their_significant_digits() {
        assert_eq!(num(12345.6), "12346");
        assert_eq!(num(0.01234), "0.0123");
        assert_eq!(num(2.5), "2.50");
        let row = Row {
            name: "x".into(),
            unit: "ms".into(),
            value: summarize(&[0.25]),
            baseline: Some(summarize(&[0.5])),
            goal: "-".into(),
        };
        assert!(
            markdown(&[row]).contains("| x | 0.2500 ms | 0.2500 | 0.2500 | 0.5000 ms | 0.50 | - |")
        );
    }

    #[test]
    fn own_rss_is_read() {
        assert!(rss_mib(std::process::id()).unwrap() > 0.1);
    }
}
