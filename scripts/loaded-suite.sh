#!/usr/bin/env bash
# Runs the end-to-end suite several times while a competing load keeps every core busy, and
# lists each test that failed even once: a test that waits on timing instead of a condition
# shows up here long before it fails a CI run (tests must wait on conditions with deadlines,
# README "Tests").
#
#   scripts/loaded-suite.sh               # 5 runs of the whole e2e suite, cores kept busy
#   scripts/loaded-suite.sh 3 pods:: tls:: # 3 runs of some modules
#
# Environment: RSC_LOAD_WORKERS (busy loops, default `nproc`), RSC_LOADED_LOGS (where each
# run's output goes, default a temporary directory). Exits non-zero when any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."

runs="${1:-5}"
shift || true
filters=("$@")
workers="${RSC_LOAD_WORKERS:-$(nproc)}"
logs="${RSC_LOADED_LOGS:-$(mktemp -d -t rsc-loaded.XXXXXX)}"
mkdir -p "$logs"

echo "== building the binaries and the e2e suite"
cargo build --workspace --bins --tests --locked -q
bin="$(scripts/server-matrix.sh --bin)"

load_pids=()
stop_load() { for p in "${load_pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_load EXIT
echo "== competing load: $workers busy loop(s)"
for _ in $(seq "$workers"); do
  (while :; do :; done) &
  load_pids+=($!)
done

failed_runs=0
for run in $(seq "$runs"); do
  log="$logs/run-$run.log"
  start=$SECONDS
  if (cd tests && "$bin" "${filters[@]}") >"$log" 2>&1; then
    echo "== run $run/$runs passed in $((SECONDS - start)) s"
  else
    failed_runs=$((failed_runs + 1))
    echo "== run $run/$runs FAILED in $((SECONDS - start)) s (log: $log):"
    sed -n 's/^test \(.*\) \.\.\. FAILED$/   \1/p' "$log"
  fi
done

echo "== tests that failed at least once over $runs loaded run(s):"
cat "$logs"/run-*.log | sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' | sort | uniq -c | sort -rn
echo "== logs: $logs"
[ "$failed_runs" = 0 ]
