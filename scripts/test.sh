#!/usr/bin/env bash
# Runs every test of the project on a fresh machine: installs what the tests need when it is
# missing (redis-server, chromium, curl; schemathesis and the Docker base images install
# themselves), builds every binary the end-to-end tests spawn, runs the whole test suite, the
# API fuzzing, the container smoke test, a quick pass of the benchmarks, the packaging dry
# runs, the lints, then the API documentation build. Tests start their own redis-server /
# coordinator processes on free loopback ports; nothing needs to be running beforehand.
set -euo pipefail
cd "$(dirname "$0")/.."
# Every step's line starts with the seconds since the script began (CI's budget is 45
# minutes; the slow steps show up here).

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $*" >&2; exit 1; fi
}

apt_updated=""
apt_install() {
  [ -n "$apt_updated" ] || { as_root apt-get update -qq; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

if ! command -v curl >/dev/null; then
  echo "== installing curl (apt-get)"
  apt_install curl
fi
if ! command -v openssl >/dev/null; then
  echo "== installing openssl (apt-get; the TLS tests make certificates and CRLs with it)"
  apt_install openssl
fi
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "== installing redis-server (apt-get)"
  apt_install redis-server redis-tools
fi
if ! command -v redis-sentinel >/dev/null; then
  echo "== installing redis-sentinel (apt-get; the Sentinel failover test runs sentinels)"
  apt_install redis-sentinel
fi
if ! command -v node >/dev/null; then
  echo "== installing nodejs (apt-get; the bridge tests run the Node sample application)"
  apt_install nodejs
fi
if ! command -v java >/dev/null; then
  echo "== installing a JDK (apt-get; the bridge tests run the Java sample application)"
  apt_install default-jdk-headless
fi
if [ -z "${RSC_CHROMIUM:-}" ] && ! command -v chromium >/dev/null; then
  echo "== installing chromium (apt-get; the dashboard test drives it headless)"
  apt_install chromium
fi
# The packaged service is not used: tests start their own servers. Leave 6379 alone.

target_dir="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target_dir"
echo "== [${SECONDS}s] disk: $(df -h --output=avail "$target_dir" | tail -1 | tr -d ' ') free where the build goes ($target_dir; a full build takes about 3 GiB)"
echo "== [${SECONDS}s] format"
cargo fmt --all -- --check

echo "== [${SECONDS}s] build (all binaries the end-to-end tests spawn, and every test)"
# With the tests selected, cargo unifies the dev-dependencies' features into this build, so
# the binaries and `cargo test` below share one feature set and every dependency is compiled
# once (with `--bins` alone, tokio, serde, hyper, reqwest, redis, … are compiled twice).
cargo build --workspace --bins --tests --locked

# The server matrix (scripts/server-matrix.sh: the data-path suites on Redis 8.2 and Valkey
# 9.1) runs beside the main pass: end-to-end tests mostly wait on timers, so the two passes
# share the two cores in about the time of the longer one. Its output goes to a log, printed
# when it ends.
matrix_log="$target_dir/server-matrix.log"
echo "== [${SECONDS}s] server matrix in the background (log: $matrix_log)"
# The binary is named before the main pass takes cargo's build-directory lock.
RSC_E2E_BIN="$(scripts/server-matrix.sh --bin)"
export RSC_E2E_BIN
scripts/server-matrix.sh >"$matrix_log" 2>&1 &
matrix_pid=$!
trap 'kill "$matrix_pid" 2>/dev/null || true' EXIT

# The lints, the newest-dependencies check and the API documentation only compile: they run
# beside the main pass too, in a target directory of their own (they would otherwise wait
# for the build-directory lock `cargo test` holds), and are waited for at the end.
lint_dir="$target_dir/lint"
lint_log="$target_dir/lint.log"
echo "== [${SECONDS}s] lints, newest dependencies and API documentation in the background (log: $lint_log)"
(
  set -e
  export CARGO_TARGET_DIR="$lint_dir"
  start=$SECONDS
  echo "== [+$((SECONDS - start))s] lint: cargo clippy, warnings are errors"
  cargo clippy --workspace --all-targets --locked -- -D warnings
  # After clippy, whose dependency metadata it reuses: an application resolving our crates
  # today gets the newest compatible releases, not our lock file; the build must be clean
  # there too (the committed Cargo.lock is left as it is).
  echo "== [+$((SECONDS - start))s] newest compatible dependencies: cargo update in a scratch copy, cargo check, no warning"
  scripts/newest-deps.sh
  # The dependencies' metadata clippy checked is what rustdoc needs, so this step only
  # documents the workspace's own crates.
  echo "== [+$((SECONDS - start))s] API documentation: cargo doc, warnings are errors (default and all features)"
  RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --locked
  RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --all-features --locked
  echo "== [+$((SECONDS - start))s] lints, newest dependencies and documentation passed"
) >"$lint_log" 2>&1 &
lint_pid=$!
trap 'kill "$matrix_pid" "$lint_pid" 2>/dev/null || true' EXIT

# The wheel is built now: maturin needs cargo's build-directory lock, which `cargo test` holds
# for its whole run.
echo "== [${SECONDS}s] Python package: venv, wheel (maturin), mypy"
scripts/python-test.sh --prepare

# The suites that run real processes and need no cargo command run beside the main pass, one
# after the other in a lane of their own (they mostly wait on processes and timers, like the
# end-to-end tests): pytest and the mixed Rust/Python pods, the API fuzzing, the containers,
# the benchmarks' quick pass. Each step's line in the log starts with the lane's seconds.
extras_log="$target_dir/extras.log"
echo "== [${SECONDS}s] Python tests, API fuzzing, containers, benchmarks' quick pass in the background (log: $extras_log)"
(
  set -e
  start=$SECONDS
  echo "== [+$((SECONDS - start))s] Python package: pytest against real processes, mixed pods"
  scripts/python-test.sh --run
  echo "== [+$((SECONDS - start))s] API fuzzing against the OpenAPI document (schemathesis)"
  scripts/schemathesis.sh
  # The same over HTTPS, with fewer examples per operation: this pass is about the transport
  # (keep-alive, unread request bodies, PROTOCOL §20); the pass above covers the API. About
  # 1,400 cases, 30–50 s.
  echo "== [+$((SECONDS - start))s] API fuzzing over HTTPS (schemathesis, 10 examples per operation)"
  RSC_SCHEMATHESIS_TLS=1 RSC_SCHEMATHESIS_EXAMPLES=10 scripts/schemathesis.sh
  echo "== [+$((SECONDS - start))s] containers: images, compose, sample-pod smoke test (skipped without a Docker engine)"
  RSC_SMOKE_NO_CARGO=1 docker/smoke.sh
  echo "== [+$((SECONDS - start))s] benchmark suite, quick pass (proves it runs; figures: scripts/bench.sh)"
  RSC_BENCH_NO_BUILD=1 scripts/bench.sh --quick
  echo "== [+$((SECONDS - start))s] Python tests, API fuzzing, containers and benchmarks passed"
) >"$extras_log" 2>&1 &
extras_pid=$!
trap 'kill "$matrix_pid" "$lint_pid" "$extras_pid" 2>/dev/null || true' EXIT

echo "== [${SECONDS}s] test"
cargo test --workspace --locked

echo "== [${SECONDS}s] packaging: cargo publish --dry-run of every publishable crate (nothing is uploaded)"
scripts/package.sh

echo "== [${SECONDS}s] server matrix (waiting for it to end)"
matrix_status=0
wait "$matrix_pid" || matrix_status=$?
cat "$matrix_log"
[ "$matrix_status" = 0 ] || { echo "server matrix failed" >&2; exit 1; }

echo "== [${SECONDS}s] Python tests, API fuzzing, containers, benchmarks (waiting for them to end)"
extras_status=0
wait "$extras_pid" || extras_status=$?
cat "$extras_log"
[ "$extras_status" = 0 ] || { echo "Python tests, API fuzzing, containers or benchmarks failed" >&2; exit 1; }

echo "== [${SECONDS}s] lints, newest dependencies, API documentation (waiting for them to end)"
lint_status=0
wait "$lint_pid" || lint_status=$?
cat "$lint_log"
[ "$lint_status" = 0 ] || { echo "lints, newest dependencies or API documentation failed" >&2; exit 1; }

echo "== [${SECONDS}s] all tests passed"
