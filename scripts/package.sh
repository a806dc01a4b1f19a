#!/usr/bin/env bash
# Packaging check: `cargo publish --dry-run` of every workspace crate whose `publish` is not
# false, all in one run, so that crates depending on each other (rsc-client on rsc-protocol,
# rsc-macros, …) resolve through cargo's temporary local registry instead of crates.io.
# Nothing is uploaded. Crates are picked by their manifests, so a new crate is checked as
# soon as it exists; give it `publish = false` to leave it out.
#
# Each package is also verified (built from its `.crate` file, in target/package) when
# RSC_PACKAGE_VERIFY=1. Off by default: every one of these crates is already compiled by the
# test suite, and verification builds the whole dependency tree again (minutes on 2 cores);
# what a dry run without it still catches is the packaging itself (manifest metadata,
# dependency versions resolvable against the registry, the file list).
set -euo pipefail
cd "$(dirname "$0")/.."

verify=(--no-verify)
[ "${RSC_PACKAGE_VERIFY:-0}" = 1 ] && verify=()

crates=$(cargo metadata --no-deps --format-version 1 --locked |
  python3 -c 'import json,sys
ws=json.load(sys.stdin)
print(" ".join(p["name"] for p in ws["packages"] if p.get("publish") != []))')
echo "publishable crates: $crates"

# Each published crate needs the metadata crates.io and docs.rs show; `repository` and
# `homepage` are optional (the project has no public home yet), but when given they name a
# real address, not a reserved placeholder domain (RFC 2606: .invalid, .example, .test).
cargo metadata --no-deps --format-version 1 --locked | python3 -c 'import json,sys
missing=[]
for p in json.load(sys.stdin)["packages"]:
    if p.get("publish") == []:
        continue
    for f in ("description","license","readme","documentation","keywords","categories"):
        if not p.get(f):
            missing.append(p["name"]+": "+f)
    for f in ("repository","homepage"):
        host=(p.get(f) or "").split("/")[2:3]
        if host and host[0].rsplit(".",1)[-1] in ("invalid","example","test","localhost"):
            missing.append(p["name"]+": "+f+" is a placeholder ("+p[f]+")")
if missing:
    sys.exit("missing package metadata:\n  "+"\n  ".join(missing))'

cargo publish --dry-run --workspace --locked --allow-dirty "${verify[@]}"
