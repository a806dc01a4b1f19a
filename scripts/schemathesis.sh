#!/usr/bin/env bash
# Property-based API test of the coordinator against its own OpenAPI document (schemathesis,
# from PyPI), on the memory store with a data Redis of its own: no 5xx, and every response
# (status, content type, headers, body) matches the
# document. Bounded: a fixed number of examples per operation and a wall-clock cap.
#
# Usage: scripts/schemathesis.sh            (from the repository root)
# Env:   CARGO_TARGET_DIR       where rsc-coordinator is (built if missing)   [target]
#        RSC_SCHEMATHESIS_VENV  virtualenv for schemathesis  [~/.cache/rsc-schemathesis]
#        RSC_SCHEMATHESIS_EXAMPLES  examples per operation   [50]
#        RSC_SCHEMATHESIS_SEED      generation seed          [20261130]
#        RSC_SCHEMATHESIS_TIMEOUT   wall-clock cap, seconds  [900]
#        RSC_SCHEMATHESIS_ARGS      more `schemathesis run` options, e.g.
#                                   "--include-path-regex seek --report har"   [none]
#        RSC_SCHEMATHESIS_TLS       1: the coordinator serves HTTPS (PROTOCOL §20; a
#                                   certificate made here by openssl), and the run goes
#                                   over it                  [unset: plain HTTP]
set -euo pipefail

cd "$(dirname "$0")/.."
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
VENV="${RSC_SCHEMATHESIS_VENV:-$HOME/.cache/rsc-schemathesis}"
EXAMPLES="${RSC_SCHEMATHESIS_EXAMPLES:-50}"
SEED="${RSC_SCHEMATHESIS_SEED:-20261130}"
TIMEOUT="${RSC_SCHEMATHESIS_TIMEOUT:-900}"
VERSION="4.32.5"

if ! "$VENV/bin/schemathesis" --version 2>/dev/null | grep -q "$VERSION"; then
    echo "schemathesis.sh: installing schemathesis $VERSION into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$VERSION"
fi

BIN="$TARGET_DIR/debug/rsc-coordinator"
if [ ! -x "$BIN" ]; then
    cargo build --quiet -p rsc-coordinator --bin rsc-coordinator
fi

WORK="$(mktemp -d)"
COORD_PID=""
REDIS_PID=""
cleanup() {
    if [ -n "$COORD_PID" ]; then kill "$COORD_PID" 2>/dev/null || true; wait "$COORD_PID" 2>/dev/null || true; fi
    if [ -n "$REDIS_PID" ]; then kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# An ACL with one admin token: schemathesis sends it on every request, so it reaches the
# handlers; requests without it are checked by the `ignored_auth` check.
TOKEN="schemathesis-$RANDOM$RANDOM"
cat > "$WORK/acl.toml" <<ACL
[[tokens]]
principal = "schemathesis"
token = "$TOKEN"
roles = ["admin"]
groups = ["*"]
streams = ["*"]
ACL

# A data Redis of its own (a free loopback port, nothing saved): the routes that work on the
# shard streams (seek, dead-letter redrive, lag) answer as in production instead of refusing
# every request with "needs the data Redis".
REDIS_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$WORK" >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
for _ in $(seq 1 100); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
    kill -0 "$REDIS_PID" 2>/dev/null || { cat "$WORK/redis.log"; exit 1; }
    sleep 0.1
done

# The fuzzer sends every request from one address, many of them without the token on purpose
# (the ignored_auth check): the per-address refused-request limit (PROTOCOL §7) is off, so
# that they keep reaching the access checks instead of the 429 in front of them.
# A wake-up channel is an endless event stream: with a 1 s idle timeout each one ends soon
# after its `ready` event, so that schemathesis can check it and move on.
SCHEME=http
TLS_ARGS=()
CURL_TLS=()
VERIFY=()
if [ -n "${RSC_SCHEMATHESIS_TLS:-}" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj "/CN=rsc schemathesis" -addext "subjectAltName=IP:127.0.0.1" \
        -keyout "$WORK/tls.key" -out "$WORK/tls.crt" 2>/dev/null
    SCHEME=https
    TLS_ARGS=(--tls-cert "$WORK/tls.crt" --tls-key "$WORK/tls.key")
    CURL_TLS=(--cacert "$WORK/tls.crt")
    VERIFY=(--tls-verify "$WORK/tls.crt")
fi
"$BIN" serve --listen 127.0.0.1:0 --store memory --acl "$WORK/acl.toml" \
    --data-redis-url "redis://127.0.0.1:$REDIS_PORT" \
    --admin-rate 100000 --admin-burst 100000 --client-refusal-rate 0 \
    --wake-idle-timeout-ms 1000 "${TLS_ARGS[@]}" \
    >"$WORK/coordinator.log" 2>&1 &
COORD_PID=$!
ADDR=""
for _ in $(seq 1 100); do
    ADDR="$(grep -o 'listening on [0-9.:]*' "$WORK/coordinator.log" | head -1 | awk '{print $3}' || true)"
    [ -n "$ADDR" ] && break
    kill -0 "$COORD_PID" 2>/dev/null || { cat "$WORK/coordinator.log"; exit 1; }
    sleep 0.1
done
[ -n "$ADDR" ] || { echo "coordinator did not start"; cat "$WORK/coordinator.log"; exit 1; }
BASE="$SCHEME://$ADDR"

# Fixtures named like the document's examples, so example-driven cases reach real data.
curl -fsS "${CURL_TLS[@]}" -o /dev/null -H "Authorization: Bearer $TOKEN" -H 'content-type: application/json' \
    -d '{"group":"billing","stream":"orders","shard_count":4}' "$BASE/v1/groups"
curl -fsS "${CURL_TLS[@]}" -o /dev/null -H "Authorization: Bearer $TOKEN" -H 'content-type: application/json' \
    -d '{"protocol_version":1,"member_id":"10.0.0.7-billing-0","member_epoch":0}' \
    "$BASE/v1/groups/billing/heartbeat"

# Every check runs except two heuristics that contradict the protocol on purpose:
# - positive_data_acceptance: schema-valid is not always protocol-valid (heartbeat_interval_ms
#   must be below session_timeout_ms, an epoch must be the member's, 1.0 is not a u32 in serde);
#   the same cases make schemathesis warn "Schema validation mismatch" for a few operations
#   (seek, leave, dead-letter redrive: integers generated as `431167.0`, which JSON Schema
#   counts as integers and serde does not), a warning, not a failed check;
# - ensure_resource_availability: after a group is created, a heartbeat from a member the
#   group does not know is 404 UNKNOWN_MEMBER_ID (PROTOCOL §4), which it reads as "not created".
# One per-operation exception, for the same reason: POST /v1/heartbeats answers a schema-
# invalid item (a bad group name, a protocol_version other than 1, ...) inside a 200, in that
# item's own result, exactly as the single heartbeat route would answer it; only a malformed
# request as a whole is refused (400, or 413 over the body limit). The negative_data_rejection
# check expects the whole request refused, so it is off for that operation alone.
# (The checks are set in this file rather than with --checks/--exclude-checks: options given
# on the command line would override the per-operation setting.)
cat > "$WORK/schemathesis.toml" <<'TOML'
[checks]
positive_data_acceptance.enabled = false
ensure_resource_availability.enabled = false

[[operations]]
include-path = "/v1/heartbeats"
include-method = "POST"
checks.negative_data_rejection.enabled = false
TOML

echo "schemathesis.sh: testing $BASE (examples per operation: $EXAMPLES, seed: $SEED)"
START=$(date +%s)
set +e
timeout "$TIMEOUT" "$VENV/bin/schemathesis" --config-file "$WORK/schemathesis.toml" \
    run "$BASE/openapi.json" \
    --header "Authorization: Bearer $TOKEN" "${VERIFY[@]}" \
    --max-examples "$EXAMPLES" --seed "$SEED" --generation-database none \
    --workers 1 --no-color ${RSC_SCHEMATHESIS_ARGS:-}
STATUS=$?
set -e
echo "schemathesis.sh: finished in $(( $(date +%s) - START )) s with status $STATUS"
if grep -q '"level":"ERROR"\|ERROR' "$WORK/coordinator.log"; then
    echo "schemathesis.sh: the coordinator logged errors:"
    grep 'ERROR' "$WORK/coordinator.log" | head -20
    STATUS=1
fi
if [ "$STATUS" != 0 ]; then
    echo "schemathesis.sh: the coordinator's last log lines:"
    tail -40 "$WORK/coordinator.log"
fi
exit "$STATUS"
