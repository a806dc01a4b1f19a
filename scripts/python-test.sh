#!/usr/bin/env bash
# The Python package (python/, import `rsc`): builds the wheel with maturin, installs it in a
# fresh virtual environment under the target directory, type-checks the package, its tests
# and the Python sample pods with mypy (strict, against the .pyi stubs), then runs the pytest
# suite against real redis-server and rsc-coordinator processes on free loopback ports.
# Respects CARGO_TARGET_DIR; needs python3 (>= 3.9) with venv, and PyPI for maturin, pytest,
# redis and mypy. Extra arguments go to pytest (e.g. `-k producer`). Last, the end-to-end pod
# scenarios run with Rust and Python sample pods mixed in one group (RSC_TEST_POD_LANG=mixed,
# docs/PYTHON.md "Sample pods"): routing and ownership, kill -9, SIGTERM hand-over, retries to
# the dead letters, a slow handler, a pod joining under load, and a pod joining a strictly
# fenced group (about 2 minutes).
#
#   scripts/python-test.sh [pytest args]            # everything
#   scripts/python-test.sh --prepare                # build, venv, wheel, mypy
#   scripts/python-test.sh --run [pytest args]      # pytest and the mixed pods (after --prepare)
#
# scripts/test.sh prepares before its main `cargo test` (the wheel's build needs cargo's
# build-directory lock) and runs the rest beside it; with RSC_E2E_BIN set (the e2e test binary,
# scripts/server-matrix.sh --bin) the mixed pods run that binary directly, without cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target=${CARGO_TARGET_DIR:-$root/target}
export CARGO_TARGET_DIR=$target
python=${PYTHON:-python3}
prepare=1
run=1
case "${1:-}" in
  --prepare) run=""; shift ;;
  --run) prepare=""; shift ;;
esac
venv=$target/python-venv

if [ -n "$prepare" ]; then
  echo "== building the binaries the tests spawn (rsc-coordinator; the same build as scripts/test.sh, so nothing is built twice)"
  cargo build --locked --workspace --bins --tests

  echo "== fresh venv in $venv"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "maturin>=1.5,<2" pytest redis mypy

  echo "== building the wheel (maturin)"
  wheels=$target/wheels
  rm -rf "$wheels"
  (cd python && "$venv/bin/maturin" build --locked -q -o "$wheels")
  "$venv/bin/pip" install -q "$wheels"/rsc_client-*.whl

  echo "== mypy (strict)"
  (cd python && "$venv/bin/mypy")
fi
[ -n "$run" ] || exit 0

echo "== pytest"
# From the tests' directory, with the installed wheel (not the source tree) imported.
(cd python/tests && "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  --rootdir . "$@")

echo "== e2e pod scenarios, Rust and Python pods in one group"
mixed=(listener:: fencing::strict_groups_rebalance_without_refusals_or_losses)
export RSC_TEST_POD_LANG=mixed RSC_TEST_PYTHON=$venv/bin/python
if [ -n "${RSC_E2E_BIN:-}" ]; then
  # As cargo runs it: from the package's directory.
  (cd tests && "$RSC_E2E_BIN" -q "${mixed[@]}")
else
  # The same feature set as scripts/test.sh's `cargo test --workspace`: nothing is rebuilt.
  cargo test --workspace --locked --test e2e -- "${mixed[@]}"
fi
