#!/usr/bin/env bash
# Builds the workspace against the newest dependency versions its manifests allow, as an
# application depending on our crates would resolve them, and fails on any warning there
# (a deprecation in a new minor release of a dependency, say). The committed Cargo.lock is
# not touched: the workspace's files are copied to a scratch directory, `cargo update`
# rewrites the copy's lock file (reading the crates.io index), and `cargo check` runs there.
# The copy shares the build's target directory, so the dependencies whose version did not
# move are not checked again; the workspace's crates are (their path differs).
set -euo pipefail
cd "$(dirname "$0")/.."

target_dir="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# Tracked and untracked (not ignored) files: what the next commit would build.
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$scratch"
cp Cargo.lock "$scratch/Cargo.lock.committed"
start=$(date +%s)
(
  cd "$scratch"
  cargo update --quiet
  echo "== newest compatible dependencies: what moved from the committed lock file"
  versions() { grep -A1 '^name = ' "$1" | grep -v '^--$' | paste -d' ' - - | sed 's/name = //; s/ version = / /; s/"//g' | sort; }
  diff <(versions Cargo.lock.committed) <(versions Cargo.lock) | sed -n 's/^> /  /p' || true
  # Cargo caps lints of registry dependencies, so only the workspace's crates can warn;
  # their warnings are replayed even when cached.
  CARGO_TARGET_DIR="$target_dir" cargo check --workspace --color never 2>"$scratch/check.log" \
    || { cat "$scratch/check.log" >&2; exit 1; }
  if grep -E '^(warning|error)' "$scratch/check.log" >&2; then
    echo "the workspace warns when built with the newest compatible dependencies (above)" >&2
    exit 1
  fi
)
echo "== newest compatible dependencies: cargo check clean in $(( $(date +%s) - start )) s"
