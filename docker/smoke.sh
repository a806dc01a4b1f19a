#!/usr/bin/env bash
# Smoke test of the Docker images and docker/compose.yml, with real sample pods:
#   1. build the images (docker/build.sh: nothing pulled), start Redis, the coordinator (Redis
#      store) and 3 sample consumer pods; produce N messages; every one is handled (checked on
#      the pods' record stream)
#   2. `docker stop` a pod (graceful): its shards move within a heartbeat interval
#   3. `docker kill` a pod: its shards move after the session timeout, not before
#   4. `docker network disconnect` a pod from the coordinator's network while it still reaches
#      Redis: it self-fences before its shards are reassigned (per shard, no two members'
#      handling intervals overlap), then rejoins once reconnected
#   5. scale up to 4 pods: balanced; finally every message was handled, none twice at once
#   6. tear down (also on failure or interruption: trap)
# A producer publishes at a steady rate throughout 2–5. Bounded: the script gives up after
# RSC_SMOKE_LIMIT_S (default 540 s). Without a Docker engine it prints
# "skipped: no Docker engine" and exits 0.
#
# Env: RSC_SMOKE_NO_CARGO=1 uses the binaries already built (docker/build.sh --no-cargo);
#      RSC_DOCKER_PROFILE [debug] cargo profile of the binaries put in the images (debug reuses
#      what scripts/test.sh built); CARGO_TARGET_DIR as for cargo; RSC_SMOKE_KEEP=1 leaves the
#      stack running on failure for inspection.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! docker info >/dev/null 2>&1; then
  echo "skipped: no Docker engine"
  exit 0
fi
# What the checks use, installed when missing (as scripts/test.sh does for its tools).
missing=()
command -v jq >/dev/null || missing+=(jq)
command -v curl >/dev/null || missing+=(curl)
command -v python3 >/dev/null || missing+=(python3)
if ! command -v docker-compose >/dev/null && ! docker compose version >/dev/null 2>&1; then
  missing+=(docker-compose)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]} (apt-get)"
  if [ "$(id -u)" = 0 ]; then sudo=(); else sudo=(sudo); fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if command -v docker-compose >/dev/null; then
  COMPOSE=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
else
  echo "smoke: a Docker engine answers but Docker Compose is missing (docker-compose)" >&2
  exit 1
fi

# --- settings ----------------------------------------------------------------------------
PROJECT="rsc-smoke-$$"
export RSC_IMAGE_TAG=smoke
export RSC_COORDINATOR_PORT=          # a free port on 127.0.0.1
export RSC_GROUP=smoke RSC_STREAM=orders RSC_SHARDS=12
export RSC_SESSION_TIMEOUT_MS=6000 RSC_HEARTBEAT_INTERVAL_MS=1000
export RSC_CONCURRENCY=2 RSC_HANDLE_MS=5
RECORDS="$RSC_STREAM:handled"
N=2000          # first batch
RATE=100        # msgs/s of the background producer during the churn
SWEEP_MS=250    # the coordinator's default expiry sweep period
SESSION=$RSC_SESSION_TIMEOUT_MS
HB=$RSC_HEARTBEAT_INTERVAL_MS
LIMIT_S="${RSC_SMOKE_LIMIT_S:-540}"
PROFILE="${RSC_DOCKER_PROFILE:-debug}"

compose() { "${COMPOSE[@]}" -p "$PROJECT" -f docker/compose.yml "$@"; }
now_ms() { date +%s%3N; }
log() { echo "[$(date +%H:%M:%S)] $*"; }
fail() { echo "SMOKE FAILED: $*" >&2; exit 1; }

# --- watchdog and cleanup ----------------------------------------------------------------
started_s=$SECONDS
ok=""
watchdog_pid=""
on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  set +e   # clean up whatever fails here
  if [ -n "$watchdog_pid" ]; then kill "$watchdog_pid" 2>/dev/null; fi
  if [ -z "$ok" ]; then
    echo "---- diagnostics (exit $rc) ----" >&2
    compose ps >&2 2>/dev/null || true
    [ -n "${API:-}" ] && group \
      | jq -c '{state, group_epoch, members: [.members[] | {member_id, member_epoch, state, last_heartbeat_ms_ago, owned_shards}]}' >&2 2>/dev/null
    local c
    for c in $(compose ps -q 2>/dev/null); do
      echo "-- $(docker inspect -f '{{.Name}}' "$c")" >&2
      docker logs --tail 25 "$c" 2>&1 | cut -c1-300 >&2 || true
    done
    if [ "${RSC_SMOKE_KEEP:-}" = 1 ]; then
      echo "RSC_SMOKE_KEEP=1: left running; remove with: ${COMPOSE[*]} -p $PROJECT -f docker/compose.yml down -v" >&2
      exit "$rc"
    fi
  fi
  log "tearing down $PROJECT"
  docker rm -f "${PROJECT}-producer" >/dev/null 2>&1 || true
  compose --profile tools down -v --remove-orphans -t 5 >/dev/null 2>&1 \
    || compose down -v --remove-orphans -t 5 >/dev/null 2>&1 || true
  local left
  left=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT"; \
    docker network ls -q --filter "label=com.docker.compose.project=$PROJECT")
  [ -z "$left" ] || { echo "smoke: left over after teardown: $left" >&2; rc=1; }
  if [ -n "$ok" ] && [ "$rc" = 0 ]; then
    log "smoke passed in $((SECONDS - started_s)) s"
  fi
  exit "$rc"
}
trap on_exit EXIT
trap 'fail "interrupted"' INT
trap 'fail "gave up after ${LIMIT_S} s (RSC_SMOKE_LIMIT_S)"' TERM
# The watchdog: TERM to this script after LIMIT_S. Its own sleep goes when it is stopped, and it
# holds none of our output open.
(
  trap 'kill "$sleep_pid" 2>/dev/null; exit 0' TERM
  sleep "$LIMIT_S" &
  sleep_pid=$!
  wait "$sleep_pid" && kill -TERM $$
) >/dev/null 2>&1 &
watchdog_pid=$!

# --- helpers ---------------------------------------------------------------------------------
# wait_for WHAT TIMEOUT_MS COMMAND...: polls COMMAND every 100 ms.
wait_for() {
  local what="$1" timeout="$2"; shift 2
  local deadline=$(( $(now_ms) + timeout ))
  until "$@"; do
    [ "$(now_ms)" -lt "$deadline" ] || fail "timed out after ${timeout} ms waiting for: $what"
    sleep 0.1
  done
}

VIEWER_TOKEN=rsc-sample-viewer   # docker/acl.toml
group() {
  curl -fsS --max-time 2 -H "Authorization: Bearer $VIEWER_TOKEN" "http://$API/v1/groups/$RSC_GROUP"
}
status_of() {  # status_of PATH [TOKEN]: the HTTP status of a GET
  curl -s -o /dev/null -w '%{http_code}' --max-time 2 ${2:+-H "Authorization: Bearer $2"} "http://$API$1"
}

# The consumer pod containers, by name.
pods() {
  docker ps -a --filter "label=com.docker.compose.project=$PROJECT" \
    --filter "label=com.docker.compose.service=consumer" --format '{{.Names}}' | sort
}
running_pods() {
  docker ps --filter "label=com.docker.compose.project=$PROJECT" \
    --filter "label=com.docker.compose.service=consumer" --format '{{.Names}}' | sort
}
# The POD_IP a pod's current run uses (its entrypoint logs it).
pod_ip() { docker logs "$1" 2>&1 | sed -n 's/^pod-entrypoint: POD_IP=//p' | tail -n1; }

# The member ids the running pods should have, as a JSON array.
expected_members() {
  local p ip i
  for p in $(running_pods); do
    ip=$(pod_ip "$p")
    [ -n "$ip" ] || return 1
    for ((i = 0; i < RSC_CONCURRENCY; i++)); do echo "$ip-$RSC_GROUP-$i"; done
  done | jq -R . | jq -sc 'sort'
}

# The group is stable with exactly the running pods' members, every shard held by one of them,
# each member working what it was assigned, and the assignment balanced.
converged() {
  local want
  want=$(expected_members) || return 1
  group 2>/dev/null | jq -e --argjson want "$want" '
    ([.members[].member_id] | sort) == $want
    and .state == "stable"
    and all(.shards[]; .current_owner != null)
    and all(.members[]; (.owned_shards | sort) == (.assigned_shards | sort))
    and ((.shards | length) as $s | ($want | length) as $m
         | all(.members[]; (.owned_shards | length) as $n
               | $n == (($s / $m) | floor) or $n == (($s / $m) | ceil)))' >/dev/null
}

# Every shard is held by a member that does not belong to POD_IP, and none of its members is left.
moved_off() {
  group 2>/dev/null | jq -e --arg p "$1-" '
    all(.shards[]; .current_owner != null and (.current_owner | startswith($p) | not))
    and all(.members[]; .member_id | startswith($p) | not)' >/dev/null
}
has_members_of() {
  group 2>/dev/null | jq -e --arg p "$1-" 'any(.members[]; .member_id | startswith($p))' >/dev/null
}

# log_ms CONTAINER TEXT ALSO: the time (Unix ms) of the first log line after t0 holding TEXT and
# ALSO (text logs start with an RFC 3339 timestamp); empty when there is none.
log_ms() {
  local line ts first=""
  while IFS= read -r line; do
    ts=$(date -d "${line%% *}" +%s%3N 2>/dev/null) || continue
    if [ "$ts" -ge "$t0" ]; then first=$ts; break; fi
  done < <(docker logs "$1" 2>&1 | grep -F -- "$2" | grep -F -- "$3")
  echo "$first"
}

check() {
  python3 docker/smoke_check.py "$(compose ps -q redis)" "$RSC_STREAM" "$RSC_SHARDS" \
    "$RSC_GROUP" "$RECORDS" "$@"
}
all_handled() { check handled >/dev/null; }

# --- 1. build, start, first batch --------------------------------------------------------------
log "building images ($PROFILE binaries, tag $RSC_IMAGE_TAG)"
t=$SECONDS
no_cargo=()
[ -n "${RSC_SMOKE_NO_CARGO:-}" ] && no_cargo=(--no-cargo)
docker/build.sh --profile "$PROFILE" --tag "$RSC_IMAGE_TAG" "${no_cargo[@]}" 2>&1 | sed 's/^/  /'
build_s=$((SECONDS - t))

log "starting $PROJECT: redis, coordinator, 3 consumer pods"
t=$(now_ms)
compose up -d >/dev/null 2>&1 || { compose up -d; fail "compose up"; }
API=$(compose port coordinator 7070)
[ -n "$API" ] || fail "no published coordinator port"
wait_for "3 pods converged" 60000 converged
log "converged with $(pods | wc -l) pods in $(( $(now_ms) - t )) ms; coordinator on $API"
[ "$(pods | wc -l)" = 3 ] || fail "expected 3 consumer pods, got $(pods | wc -l)"

# The ACL (docker/acl.toml) applies when the coordinator supports one.
[ "$(status_of "/v1/groups/$RSC_GROUP")" = 401 ] || fail "a request without a token was not refused"
[ "$(status_of "/v1/groups/$RSC_GROUP" rsc-sample-producer)" = 403 ] \
  || fail "the producer token may read a group"
[ "$(status_of "/v1/groups/$RSC_GROUP" "$VIEWER_TOKEN")" = 200 ] || fail "the viewer token was refused"
log "ACL in force: no token 401, producer token 403 on a group, viewer 200"

log "producing $N messages"
out=$(compose run --rm producer --count "$N" --keys 100 2>/dev/null | tail -n1)
[ "$out" = "published $N" ] || fail "producer said: $out"
t=$(now_ms)
wait_for "all $N messages handled" 60000 all_handled
log "all handled in $(( $(now_ms) - t )) ms: $(check handled)"

log "background producer: $RATE msgs/s until the end"
compose run -d --name "${PROJECT}-producer" producer --count 1000000 --keys 100 \
  --rate "$RATE" >/dev/null 2>&1 || fail "background producer did not start"

mapfile -t POD < <(pods)

# --- 2. docker stop: graceful -----------------------------------------------------------------
A=${POD[0]}; A_IP=$(pod_ip "$A")
sleep 1
log "docker stop $A ($A_IP)"
t_stop=$(now_ms)
docker stop -t 30 "$A" >/dev/null
t0=$(now_ms)
code=$(docker inspect -f '{{.State.ExitCode}}' "$A")
[ "$code" = 0 ] || fail "$A exited with $code after SIGTERM (graceful shutdown exits 0)"
wait_for "shards of $A moved" 10000 moved_off "$A_IP"
stop_move_ms=$(( $(now_ms) - t0 ))
log "stopped (exit 0) in $(( t0 - t_stop )) ms; its shards moved $stop_move_ms ms after it exited"
[ "$stop_move_ms" -le $((HB + 500)) ] \
  || fail "shards of a stopped pod moved after $stop_move_ms ms (heartbeat interval $HB ms)"
docker start "$A" >/dev/null
wait_for "3 pods converged after restarting $A" 30000 converged

# --- 3. docker kill: session timeout ----------------------------------------------------------
B=${POD[1]}; B_IP=$(pod_ip "$B")
sleep 1
log "docker kill $B ($B_IP)"
docker kill "$B" >/dev/null
t0=$(now_ms)
wait_for "shards of $B moved" $((SESSION + 5000)) moved_off "$B_IP"
kill_move_ms=$(( $(now_ms) - t0 ))
log "its shards moved $kill_move_ms ms after the kill (session timeout $SESSION ms)"
# Its last heartbeat was at most one interval before the kill; expiry is swept every SWEEP_MS,
# and the new owners take the shards at their next heartbeat.
[ "$kill_move_ms" -ge $((SESSION - HB - 200)) ] \
  || fail "shards of a killed pod moved after $kill_move_ms ms, before the session timeout"
[ "$kill_move_ms" -le $((SESSION + SWEEP_MS + HB + 1000)) ] \
  || fail "shards of a killed pod moved only after $kill_move_ms ms"
docker start "$B" >/dev/null
wait_for "3 pods converged after restarting $B" 30000 converged

# --- 4. network partition from the coordinator ------------------------------------------------
C=${POD[2]}; C_IP=$(pod_ip "$C")
CONTROL_NET="$(docker inspect -f '{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}' "$C" \
  | tr ' ' '\n' | grep -E '_control$')"
sleep 2
log "docker network disconnect $CONTROL_NET $C ($C_IP): it still reaches Redis"
t0=$(now_ms)
docker network disconnect "$CONTROL_NET" "$C"
busy=$(check activity "$C_IP-" $((t0 - 2000)) "$t0")
[ "$busy" -gt 0 ] || fail "$C handled nothing in the 2 s before the partition: the check would prove nothing"
wait_for "shards of $C reassigned" $((SESSION + 5000)) moved_off "$C_IP"
t_moved=$(now_ms)
part_move_ms=$((t_moved - t0))
# Per member of the pod: when it fenced (the pod's log), when it last finished a handling (the
# record stream) and when the coordinator expired it (its log), from which on its shards are
# free. Both must come first.
coord_id=$(compose ps -q coordinator)
summary=""
for ((i = 0; i < RSC_CONCURRENCY; i++)); do
  m="$C_IP-$RSC_GROUP-$i"
  fence_ms=$(log_ms "$C" 'self-fence' "member=$m}")
  expired_ms=$(log_ms "$coord_id" 'member expired' "member=$m")
  last_ms=$(check last-finish "$m")
  [ -n "$fence_ms" ] || fail "$m did not log a self-fence"
  [ -n "$expired_ms" ] || fail "the coordinator did not log the expiry of $m"
  summary+=" $m fenced +$((fence_ms - t0)), last handling +$((last_ms - t0)), expired +$((expired_ms - t0));"
  [ "$fence_ms" -lt "$expired_ms" ] || fail "$m fenced only after the coordinator expired it"
  [ "$last_ms" -lt "$expired_ms" ] || fail "$m still handled messages after the coordinator expired it"
done
log "partition (ms after it):${summary} shards held by others +$part_move_ms"
health_is() { [ "$(docker inspect -f '{{.State.Health.Status}}' "$1")" = "$2" ]; }
wait_for "$C reported unhealthy (its /readyz: no coordinator)" 10000 health_is "$C" unhealthy
sleep 2   # let the new owners handle some of its shards' messages
check handoffs "$C_IP-" "$t0" | sed 's/^/  /' || fail "a new owner started before $C finished"
check overlaps | sed 's/^/  /' || fail "overlapping handling after the partition"
log "docker network connect $CONTROL_NET $C"
docker network connect "$CONTROL_NET" "$C"
wait_for "3 pods converged after reconnecting $C" 30000 converged
wait_for "$C healthy again" 10000 health_is "$C" healthy

# --- 5. scale up --------------------------------------------------------------------------------
log "scaling up to 4 pods"
t=$(now_ms)
compose up -d --no-recreate --scale consumer=4 consumer >/dev/null 2>&1 || fail "scale up"
[ "$(running_pods | wc -l)" = 4 ] || fail "expected 4 running pods"
wait_for "4 pods converged" 30000 converged
scale_ms=$(( $(now_ms) - t ))
log "4 pods converged and balanced in $scale_ms ms"

# --- final checks ------------------------------------------------------------------------------
docker kill "${PROJECT}-producer" >/dev/null
t=$(now_ms)
wait_for "every message handled" 60000 all_handled
log "$(check handled)"
check overlaps | sed 's/^/  /' || fail "overlapping handling"
ok=1
cat <<EOF
smoke summary: build ${build_s} s; stop: shards moved ${stop_move_ms} ms after exit (heartbeat ${HB} ms);
  kill: ${kill_move_ms} ms (session ${SESSION} ms); partition:${summary}
  shards held by others +${part_move_ms} ms; scale-up converged in ${scale_ms} ms
EOF
