#!/usr/bin/env bash
# The benchmark suite (docs/BENCHMARKS.md): builds in release mode, then runs P1–P7, D1–D3,
# R-MEM/R-IDLE, S1–S3 and BR1.
# Every binary starts its own redis-server and rsc-coordinator on free loopback ports and
# prints its rows; at the end one table gathers them all, with the machine described.
#
#   scripts/bench.sh           full run (≥ 5 repetitions each); rewrites the results section
#                              of docs/BENCHMARKS.md
#   scripts/bench.sh --quick   smoke run for CI (proves the suite runs, on debug binaries;
#                              no thresholds; docs/BENCHMARKS.md is left alone)
#
# Honors CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=""
case "${1:-}" in
  --quick) quick="--quick" ;;
  "") ;;
  *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac

for tool in redis-server redis-cli redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "$tool is required (apt-get install redis-server redis-tools)" >&2; exit 1; }
done

# Figures come from release builds. The quick pass only proves the suite runs, so it uses the
# debug binaries the tests already built (RSC_BENCH_PROFILE=release to change that).
profile=release
[ -n "$quick" ] && profile="${RSC_BENCH_PROFILE:-debug}"
echo "== building ($profile)"
if [ -n "${RSC_BENCH_NO_BUILD:-}" ]; then
  # scripts/test.sh runs the quick pass beside `cargo test`, which holds cargo's
  # build-directory lock: the binaries are those it built before.
  echo "   (skipped: RSC_BENCH_NO_BUILD, the $profile binaries are used as they are)"
elif [ "$profile" = release ]; then
  cargo build --release -q --workspace --bins
else
  # With the tests, as scripts/test.sh builds: the same feature set, so nothing is recompiled.
  cargo build -q --workspace --bins --tests
fi
bin="${CARGO_TARGET_DIR:-target}/$profile"

rows="$(mktemp -t rsc-bench-rows.XXXXXX)"
trap 'rm -f "$rows"' EXIT
export RSC_BENCH_ROWS="$rows"
load_start="$(cat /proc/loadavg)"
start=$(date +%s)

run() { echo; echo "== $*"; "$bin/$@"; }

run assignor $quick
if [ -n "$quick" ]; then
  run heartbeat --quick --https
  run heartbeat --quick --fencing strict
  run heartbeat --quick --members 200 --shards 1024 --rss
else
  run heartbeat --https
  run heartbeat --fencing strict
  run heartbeat --members 1000 --shards 4096 --rss
fi
run listener $quick
run lifecycle $quick
# P5' cost: 10,000 open wake-up channels (RSS, heartbeat p99, Redis commands per heartbeat).
run wake $quick
# D1–D3: data-plane connections, idle commands and latency, shared reader vs per-shard.
if [ -n "$quick" ]; then run dataplane --quick; else run dataplane --reps 3; fi
# L1–L3: key concurrency (drain rate, CPU per entry, a poison key) against key_concurrency(1).
run lanes $quick
# R-MEM, R-IDLE: retention's bounded memory under load, trimming's cost at 1,000 idle shards.
run retention $quick
# S1–S3: control-plane scale (idle groups, batched heartbeats, 100,000 members).
run scale $quick
# BR1: rsc-bridge to a no-op application against the Rust listener (throughput, added latency).
run bridge $quick

seconds=$(( $(date +%s) - start ))
if [ -n "$quick" ]; then
  "$bin/report" "$rows" --mode quick --load-start "$load_start" --seconds "$seconds"
else
  "$bin/report" "$rows" --mode full --load-start "$load_start" --seconds "$seconds" \
    --write docs/BENCHMARKS.md
fi
