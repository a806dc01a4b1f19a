#!/bin/sh
# Entry point of the sample consumer image. Member ids are `<POD_IP>-<group>-<index>`, so every
# pod needs its own POD_IP. Kubernetes passes it from the downward API (status.podIP). Under
# Docker / Compose it is taken here from the container's own addresses: with POD_IP_ROUTE_TO=HOST
# the address on the network through which HOST is reached (the address the coordinator sees
# when HOST is the coordinator), otherwise the first one.
set -eu

# A dotted IPv4 address as a 32-bit number.
ip4_num() {
  old_ifs=$IFS; IFS=.
  # shellcheck disable=SC2086
  set -- $1
  IFS=$old_ifs
  echo $(( ($1 << 24) | ($2 << 16) | ($3 << 8) | $4 ))
}

# How many leading bits two IPv4 addresses share.
common_bits() {
  x=$(( $(ip4_num "$1") ^ $(ip4_num "$2") ))
  n=0
  while [ "$n" -lt 32 ] && [ $(( (x >> (31 - n)) & 1 )) -eq 0 ]; do n=$((n + 1)); done
  echo "$n"
}

if [ -z "${POD_IP:-}" ]; then
  addrs=""
  for ip in $(hostname -I 2>/dev/null || hostname -i 2>/dev/null || true); do
    case "$ip" in
      127.*|*:*) ;;
      *.*.*.*) addrs="$addrs $ip" ;;
    esac
  done
  peer=""
  if [ -n "${POD_IP_ROUTE_TO:-}" ]; then
    peer=$(getent ahostsv4 "$POD_IP_ROUTE_TO" 2>/dev/null | awk 'NR == 1 { print $1 }' || true)
    [ -n "$peer" ] || echo "pod-entrypoint: cannot resolve $POD_IP_ROUTE_TO; using the first address" >&2
  fi
  best=-1
  for ip in $addrs; do
    if [ -z "$peer" ]; then POD_IP=$ip; break; fi
    bits=$(common_bits "$ip" "$peer")
    if [ "$bits" -gt "$best" ]; then best=$bits; POD_IP=$ip; fi
  done
  if [ -z "${POD_IP:-}" ]; then
    echo "pod-entrypoint: POD_IP is not set and the container has no IPv4 address" >&2
    exit 1
  fi
  export POD_IP
fi
echo "pod-entrypoint: POD_IP=$POD_IP" >&2
exec "$@"
