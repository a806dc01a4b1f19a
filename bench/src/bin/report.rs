//! Gathers the rows the benchmark binaries appended to `$RSC_BENCH_ROWS` into one table,
//! headed by a description of the machine and its load, and prints it; with `--write FILE`
//! also replaces the results section of that Markdown file (between
//! `<!-- results:start -->` and `<!-- results:end -->`). Run by `scripts/bench.sh`.

use anyhow::{Context, Result};
use clap::Parser;
use rsc_bench::{Row, markdown};
use std::process::Command;

#[derive(Debug, Parser)]
#[command(about = "One table of every benchmark figure, with the machine described")]
struct Args {
    /// The JSON-lines file of rows.
    rows: std::path::PathBuf,
    /// Load average when the suite started (`/proc/loadavg`).
    #[arg(long, default_value = "")]
    load_start: String,
    /// Wall time of the suite, seconds.
    #[arg(long)]
    seconds: Option<u64>,
    /// Mode shown in the header (`full` or `quick`).
    #[arg(long, default_value = "full")]
    mode: String,
    /// Markdown file whose results section is replaced.
    #[arg(long)]
    write: Option<std::path::PathBuf>,
}

const START: &str = "<!-- results:start -->";
const END: &str = "<!-- results:end -->";

fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|e| format!("({cmd}: {e})"))
}

fn machine(args: &Args) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let load_end = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut out = format!(
        "Run {} ({} mode{}). Machine: `nproc` = {}, CPU: {cpu}; kernel {}.\n\n\
         Load average (1, 5, 15 min) at start: `{}`, at end: `{}` — the machine is shared \
         with other builds, so absolute figures are noisy; ratios are measured side by side \
         in the same run.\n\n```text\n$ free -h\n{}\n```\n\n",
        sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        args.mode,
        args.seconds.map(|s| format!(", {s} s")).unwrap_or_default(),
        sh("nproc", &[]),
        sh("uname", &["-r"]),
        args.load_start.trim(),
        load_end.trim(),
        sh("free", &["-h"]),
    );
    out.push_str(
        "Median of the repetitions with min and max; ratio = median / baseline median.\n\n",
    );
    out
}

fn main() -> Result<()> {
    let args = Args::parse();
    let text = std::fs::read_to_string(&args.rows)
        .with_context(|| format!("read {}", args.rows.display()))?;
    let mut rows: Vec<Row> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    // P1, P2, … in order; a binary's own order within a figure.
    rows.sort_by_key(|r| r.name.get(..2).unwrap_or("").to_owned());
    let section = format!("{}{}", machine(&args), markdown(&rows));
    println!("\n{section}");
    if let Some(path) = &args.write {
        let doc = std::fs::read_to_string(path).unwrap_or_default();
        let new = match (doc.find(START), doc.find(END)) {
            (Some(a), Some(b)) if a < b => {
                format!("{}{START}\n{section}{}", &doc[..a], &doc[b..])
            }
            _ => format!("{doc}\n{START}\n{section}{END}\n"),
        };
        std::fs::write(path, new).with_context(|| format!("write {}", path.display()))?;
        eprintln!("results written to {}", path.display());
    }
    Ok(())
}
