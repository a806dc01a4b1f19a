//! Shared pieces of the benchmark binaries: repetition and the result table.
#![deny(missing_docs)]

/// Summary of repeated measurements of one figure.
#[derive(Debug, Clone, Copy, PartialEq)]
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
#[derive(Debug, Clone)]
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

/// Renders rows as a Markdown table (also readable as plain text).
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "| figure | median | min | max | baseline (median) | ratio | goal |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (base, ratio) = match r.baseline {
            Some(b) => (
                format!("{:.1} {}", b.median, r.unit),
                format!("{:.2}", r.value.median / b.median),
            ),
            None => ("-".into(), "-".into()),
        };
        out.push_str(&format!(
            "| {} | {:.1} {u} | {:.1} | {:.1} | {} | {} | {} |\n",
            r.name,
            r.value.median,
            r.value.min,
            r.value.max,
            base,
            ratio,
            r.goal,
            u = r.unit
        ));
    }
    out
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
}
