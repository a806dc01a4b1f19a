#!/usr/bin/env bash
# Builds the Docker images of Redis Stream Coordinator without pulling anything from a registry.
#
#   rsc-base:bookworm        Debian 12 minbase + ca-certificates, made with debootstrap from the
#                            Debian mirror apt already uses on this machine (cached: built once)
#   rsc-redis-base:bookworm  the same + redis-server (cached: built once)
#   rsc-coordinator:TAG      host-built `rsc-coordinator` on rsc-base
#   rsc-sample-consumer:TAG  host-built `sample-consumer` on rsc-base
#   rsc-sample-producer:TAG  host-built `sample-producer` on rsc-base
#   rsc-bridge:TAG           host-built `rsc-bridge` on rsc-base
#   rsc-redis:TAG            redis-server on rsc-redis-base
#
# The binaries are built on the host (`cargo build`, in $CARGO_TARGET_DIR) and copied in: they
# link glibc dynamically, and the host is Debian 12 like the base, so the libraries match.
# When the bases exist a rebuild takes seconds (plus whatever cargo has to recompile).
#
# Usage: docker/build.sh [--profile release|debug] [--tag TAG] [--no-cargo] [--rebuild-base]
#   --profile      cargo profile of the binaries (default: release; env RSC_DOCKER_PROFILE)
#   --tag          image tag (default: dev; env RSC_IMAGE_TAG)
#   --no-cargo     do not run cargo: use the binaries already built
#   --rebuild-base build the two base images again even when they exist
# Env: RSC_DEBIAN_MIRROR overrides the mirror read from /etc/apt/sources.list*.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

profile="${RSC_DOCKER_PROFILE:-release}"
tag="${RSC_IMAGE_TAG:-dev}"
run_cargo=1
rebuild_base=""
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --no-cargo) run_cargo=""; shift ;;
    --rebuild-base) rebuild_base=1; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$profile" in
  release|debug) ;;
  *) echo "build.sh: --profile must be release or debug, not $profile" >&2; exit 2 ;;
esac

SUITE=bookworm
BASE_IMAGE="rsc-base:$SUITE"
REDIS_BASE_IMAGE="rsc-redis-base:$SUITE"
RSC_UID=10001
# Only the legacy builder is guaranteed here (no buildx plugin); it never pulls a FROM image
# that exists locally.
export DOCKER_BUILDKIT=0

log() { echo "== $*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $*" >&2; exit 1; fi
}

# Temporary root filesystems, removed on exit whatever happens.
rootfs_dirs=()
cleanup_rootfs() {
  local d
  for d in "${rootfs_dirs[@]}"; do as_root rm -rf "$d"; done
}
trap cleanup_rootfs EXIT

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# The Debian mirror apt uses for $SUITE (deb822 .sources or one-line .list files).
debian_mirror() {
  if [ -n "${RSC_DEBIAN_MIRROR:-}" ]; then echo "$RSC_DEBIAN_MIRROR"; return; fi
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" '
      function flush() {
        if (uris != "" && (" " suites " ") ~ (" " suite " ") && (" " comps " ") ~ / main /) {
          split(uris, u, " "); print u[1]; found = 1; exit
        }
        uris = ""; suites = ""; comps = ""
      }
      /^[[:space:]]*$/ { flush(); next }
      /^URIs:/ { sub(/^URIs:[[:space:]]*/, ""); uris = $0 }
      /^Suites:/ { sub(/^Suites:[[:space:]]*/, ""); suites = $0 }
      /^Components:/ { sub(/^Components:[[:space:]]*/, ""); comps = $0 }
      END { if (!found) flush() }' "$f"
  done | head -n1 | grep . && return
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    | sed -e 's/\[[^]]*\]//' \
    | awk -v suite="$SUITE" '$1 == "deb" && $3 == suite { print $2; exit }' | grep . && return
  echo "build.sh: no Debian $SUITE mirror in /etc/apt/sources.list*; set RSC_DEBIAN_MIRROR" >&2
  return 1
}

# debootstrap a minbase rootfs with extra packages, slim it, add the `rsc` user, import it.
make_base() {
  local image="$1" include="$2"
  if image_exists "$image" && [ -z "$rebuild_base" ]; then return; fi
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap (apt-get)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq debootstrap >/dev/null
  fi
  local mirror dir
  mirror="$(debian_mirror)"
  dir="$(mktemp -d "${TMPDIR:-/tmp}/rsc-rootfs.XXXXXX")"
  rootfs_dirs+=("$dir")
  log "debootstrap $SUITE minbase + $include -> $image (once; later builds reuse it)"
  local started=$SECONDS
  as_root debootstrap --variant=minbase --include="$include" \
    --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
    "$SUITE" "$dir/rootfs" "$mirror" >"$dir/debootstrap.log" 2>&1 || {
      tail -n 30 "$dir/debootstrap.log" >&2
      echo "build.sh: debootstrap failed" >&2
      return 1
    }
  local r="$dir/rootfs"
  # Nothing in the images runs apt: drop its lists and caches, docs, man pages and locales,
  # and the build machine's mirror.
  as_root rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/cache/apt/*.bin \
    "$r"/var/lib/apt/lists/* "$r"/usr/share/doc/* "$r"/usr/share/man/* \
    "$r"/usr/share/info/* "$r"/usr/share/locale/* "$r"/var/log/* "$r"/etc/apt/sources.list \
    "$r"/etc/hostname "$r"/etc/resolv.conf
  # The unprivileged user the application images run as.
  as_root sh -c "
    echo 'rsc:x:$RSC_UID:$RSC_UID:Redis Stream Coordinator:/nonexistent:/usr/sbin/nologin' >>'$r/etc/passwd'
    echo 'rsc:x:$RSC_UID:' >>'$r/etc/group'
    echo 'rsc:*:19000:0:99999:7:::' >>'$r/etc/shadow'"
  as_root tar -C "$r" --numeric-owner -c . \
    | docker import \
        --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' \
        --message "debootstrap --variant=minbase --include=$include $SUITE" \
        - "$image" >/dev/null
  as_root rm -rf "$dir"
  log "$image built in $((SECONDS - started)) s ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'))"
}

started=$SECONDS
make_base "$BASE_IMAGE" ca-certificates
make_base "$REDIS_BASE_IMAGE" ca-certificates,redis-server

target="${CARGO_TARGET_DIR:-$root/target}"
bins=(rsc-coordinator sample-consumer sample-producer rsc-bridge)
if [ -n "$run_cargo" ]; then
  log "cargo build --profile $profile (${bins[*]})"
  if [ "$profile" = release ]; then
    cargo build --locked --release -p rsc-coordinator -p rsc-examples -p rsc-bridge \
      --bin rsc-coordinator --bin sample-consumer --bin sample-producer --bin rsc-bridge
  else
    # Debug binaries are the ones scripts/test.sh builds: the same command, so the same
    # feature set, and cargo has nothing to recompile (a `-p … --bin …` selection unifies
    # features differently and compiles every dependency again).
    cargo build --locked --workspace --bins --tests
  fi
fi

# Each image gets a build context holding only its Dockerfile and its files.
ctx_root="$target/docker-context"
build_image() {
  local name="$1" dockerfile="$2"; shift 2
  local ctx="$ctx_root/$name"
  rm -rf "$ctx"; mkdir -p "$ctx"
  cp "$root/docker/$dockerfile" "$ctx/Dockerfile"
  local f
  for f in "$@"; do
    [ -f "$f" ] || { echo "build.sh: missing $f (build it, or drop --no-cargo)" >&2; exit 1; }
    cp "$f" "$ctx/"
  done
  # (The legacy builder's deprecation notice on stderr is shown only when the build fails.)
  if ! docker build -q --build-arg "BASE=$BASE_IMAGE" --build-arg "REDIS_BASE=$REDIS_BASE_IMAGE" \
    --label "org.opencontainers.image.revision=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    --label "rsc.cargo-profile=$profile" \
    -t "$name:$tag" "$ctx" >"$ctx_root/$name.log" 2>&1; then
    cat "$ctx_root/$name.log" >&2
    echo "build.sh: docker build of $name failed" >&2
    exit 1
  fi
  log "$name:$tag"
}

bin_dir="$target/$profile"
build_image rsc-coordinator coordinator.Dockerfile "$bin_dir/rsc-coordinator"
build_image rsc-sample-consumer consumer.Dockerfile "$bin_dir/sample-consumer" \
  "$root/docker/pod-entrypoint.sh"
build_image rsc-sample-producer producer.Dockerfile "$bin_dir/sample-producer"
build_image rsc-bridge bridge.Dockerfile "$bin_dir/rsc-bridge"
build_image rsc-redis redis.Dockerfile
# Earlier builds of these images, now untagged, would pile up run after run.
docker image prune -f --filter "label=rsc.cargo-profile" >/dev/null
log "images ready in $((SECONDS - started)) s (tag $tag, $profile binaries)"
