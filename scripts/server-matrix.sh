#!/usr/bin/env bash
# The server matrix (docs/COMPATIBILITY.md, "Servers"): the end-to-end suites that touch the
# data path run again on each newer server of scripts/servers.sh. The default pass of
# `cargo test` runs them on the machine's redis-server (Debian's Redis 7.0).
#
#   scripts/server-matrix.sh                 # every newer server, one after the other
#   scripts/server-matrix.sh valkey-9.1      # one server
#   scripts/server-matrix.sh --bin           # the path of the e2e test binary it runs
#
# Runs the e2e test binary directly (`RSC_E2E_BIN`, or the one cargo names), so that it can
# run beside another cargo command without waiting for cargo's build-directory lock. It is
# the binary of `cargo test --workspace` (one feature set, as scripts/test.sh builds).
set -euo pipefail
cd "$(dirname "$0")/.."

e2e_bin() {
  cargo test --workspace --locked --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "e2e" and m.get("executable"):
        print(m["executable"])'
}
if [ "${1:-}" = --bin ]; then e2e_bin; exit 0; fi
bin="${RSC_E2E_BIN:-$(e2e_bin)}"
[ -x "$bin" ] || { echo "no e2e test binary (cargo test -p rsc-e2e --test e2e --no-run)" >&2; exit 1; }

# Pods (kill -9, hand-over, routing), retention, fencing, idempotence, key lanes, resharding
# order and the data path, each with its Redis Cluster variant.
suites=(pods:: retention:: fencing:: idempotence:: key_lanes:: ordered_reshard:: data_path::)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(redis-8.2 valkey-9.1)

status=0
for name in "${names[@]}"; do
  if ! server=$(scripts/servers.sh "$name"); then
    echo "== server matrix: $name cannot be had (see above); its pass did not run" >&2
    status=1
    continue
  fi
  echo "== server matrix: ${suites[*]} on $name ($("$server" --version | cut -d' ' -f1-3))"
  start=$SECONDS
  # As cargo runs it: from the package's directory.
  if (cd tests && RSC_REDIS_SERVER="$server" "$bin" -q "${suites[@]}"); then
    echo "== server matrix: $name passed in $((SECONDS - start)) s"
  else
    echo "== server matrix: $name FAILED (after $((SECONDS - start)) s)" >&2
    status=1
  fi
done
exit $status
