#!/usr/bin/env bash
# The server container, built and run here (podman; no Docker engine or image registry on
# the CI machine, see ../shared/toolchain/README.md "Containers"):
#   1. installs podman, buildah, mmdebstrap and runc if missing; writes a containers.conf
#      (runc, cgroupfs, lowered ulimits) and points CONTAINERS_CONF at it;
#   2. makes the base image localhost/debian:bookworm with mmdebstrap once (kept after);
#   3. builds server-native/Dockerfile with BINARY=prebuilt from the host's synchro-server
#      (the debug build `cargo test` already made, stripped; SYNCHRO_CONTAINER_PROFILE=release
#      for the release one) and prints the image size; a user's `docker build` compiles
#      from source instead (the Dockerfile's default), which costs a full release build;
#   4. checks the image: a non-root user, no compiler, the /ready health check;
#   5. runs it against a real PostgreSQL (tests/examples/container_db.rs) on the host
#      network, configured only by environment variables: /ready, `podman healthcheck
#      run`, a connect, an open events stream, then SIGTERM (`podman stop`): exit code 0,
#      the stream ended with reason "shutdown", well before the engine's SIGKILL, and no
#      secret or token in the container's log;
#   6. runs the whole-stack client scenarios (tests/tests/whole_stack.rs, and the live
#      session's event stream and schema evolution) with every server they start being a
#      container of this image (SYNCHRO_TEST_SERVER_IMAGE);
#      then the whole-stack scenario again through the edge gateway under `wrangler dev` in
#      front of containers of the image (SYNCHRO_TEST_VIA_EDGE as well);
#   7. validates server-native/compose.yaml (no compose engine runs here);
#   8. checks that no container or database it started is left, and prints its duration.
#   SYNCHRO_TOOLS_ENV  another checkout's .tools/env.sh (a worktree shares the main one's)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TOOLS_ENV=${SYNCHRO_TOOLS_ENV:-$ROOT/.tools/env.sh}
[ -f "$TOOLS_ENV" ] || scripts/setup-toolchain.sh
. "$TOOLS_ENV"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$TARGET/container
LOGS=$TARGET/test-logs/container
mkdir -p "$WORK" "$LOGS"
rm -rf "$LOGS"/*
PROFILE=${SYNCHRO_CONTAINER_PROFILE:-dev}
BASE=localhost/debian:bookworm
IMAGE=localhost/synchro-server:test
NAME=synchro-ctest-$$
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
START=$SECONDS
log() { echo "[test-container $((SECONDS - START))s] $*"; }
die() { echo "[test-container] FAILED: $*" >&2; exit 1; }

# --- 1. tools and engine configuration -----------------------------------------------------
missing=()
for p in podman buildah mmdebstrap runc; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    install=($SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}")
    "${install[@]}" || { $SUDO apt-get update -q && "${install[@]}"; }
fi
# crun fails here (hybrid cgroups, no CAP_SYS_RESOURCE for setrlimit): runc, cgroupfs and
# limits the machine can grant. Events go to a file (no journald).
cat >"$WORK/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
events_logger = "file"
EOF
export CONTAINERS_CONF=$WORK/containers.conf
ULIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)

# Everything this script starts is stopped on the way out, whatever happens.
DB_PID= SLEEPER= EVENTS_PID=
cleanup() {
    podman rm --force --time 0 "$NAME" >/dev/null 2>&1 || true
    [ -n "$EVENTS_PID" ] && kill "$EVENTS_PID" 2>/dev/null
    [ -n "$SLEEPER" ] && kill "$SLEEPER" 2>/dev/null
    [ -n "$DB_PID" ] && wait "$DB_PID" 2>/dev/null
    rm -f "${FIFO:-}"
}
trap cleanup EXIT

# --- 2. the base image ---------------------------------------------------------------------
if ! podman image exists "$BASE"; then
    log "making $BASE with mmdebstrap (Debian packages only, no registry)"
    # Documentation and translations left out, as in debian:bookworm-slim.
    mmdebstrap --variant=minbase --quiet \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        bookworm "$WORK/rootfs.tar"
    podman import --quiet "$WORK/rootfs.tar" "$BASE" >/dev/null
    rm -f "$WORK/rootfs.tar"
fi

# --- 3. the image --------------------------------------------------------------------------
log "building synchro-server ($PROFILE profile) and the database fixture"
# --workspace, as scripts/test.sh's `cargo test --workspace`: the same feature set, so
# after it nothing is compiled again (a per-package build would rebuild the shared crates).
cargo build -q --workspace --bins --examples
[ "$PROFILE" = dev ] || cargo build -q --profile "$PROFILE" -p synchro-server --bin synchro-server
case $PROFILE in dev) out=debug ;; *) out=$PROFILE ;; esac
CONTEXT=$WORK/context
rm -rf "$CONTEXT" && mkdir -p "$CONTEXT"
cp "$TARGET/$out/synchro-server" "$CONTEXT/synchro-server"
strip "$CONTEXT/synchro-server"
log "building $IMAGE (server-native/Dockerfile, BINARY=prebuilt, RUNTIME_IMAGE=$BASE)"
build_start=$SECONDS
podman build --quiet --format docker --network host "${ULIMITS[@]}" \
    --build-arg RUNTIME_IMAGE="$BASE" --build-arg BINARY=prebuilt \
    -f server-native/Dockerfile -t "$IMAGE" "$CONTEXT" >/dev/null
# The previous build's image and cached steps, now untagged, are this script's to remove.
podman images --quiet --filter dangling=true --filter label=dev.synchro.image=server-build \
    | xargs -r podman rmi >/dev/null 2>&1 || true
mb() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
base_size=$(podman image inspect --format '{{.Size}}' "$BASE")
echo "image $IMAGE: $(mb "$size") (base $BASE $(mb "$base_size"), synchro-server $(mb "$(stat -c %s "$CONTEXT/synchro-server")") stripped, $PROFILE profile); built in $((SECONDS - build_start))s"

# --- 4. what the image is ------------------------------------------------------------------
user=$(podman image inspect --format '{{.Config.User}}' "$IMAGE")
[ "$user" = 10001:10001 ] || die "the image's user is '$user', not 10001:10001"
health=$(podman image inspect --format '{{json .Config.Healthcheck.Test}}' "$IMAGE")
[ "$health" = '["CMD","synchro-server","probe"]' ] || die "health check: $health"
# Only the runtime layer: no compiler or linker, and the default user is not root.
podman run --rm --network none --entrypoint /bin/sh "$IMAGE" -c \
    'for t in cc gcc rustc cargo ld; do command -v $t && exit 1; done; [ "$(id -u)" = 10001 ]' \
    2>"$LOGS/inspect.log" || die "the image has a compiler or runs as root (see $LOGS/inspect.log)"
log "image checks passed: user 10001, no compiler, HEALTHCHECK synchro-server probe"

# --- 5. one container against a real PostgreSQL --------------------------------------------
# The stack runs until its stdin closes; this sleeper holds it open.
exec 3< <(exec sleep infinity 2>/dev/null)
SLEEPER=$!
FIFO=$(mktemp -u) && mkfifo "$FIFO"
"$TARGET/debug/examples/container_db" <&3 >"$FIFO" 2>"$LOGS/container_db.log" &
DB_PID=$!
while read -r line; do
    export "${line?}"
    [ -n "${SYNCHRO_TOKEN:-}" ] && break
done <"$FIFO"
[ -n "${SYNCHRO_TOKEN:-}" ] || die "the database fixture did not start (see $LOGS/container_db.log)"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BASE_URL=http://127.0.0.1:$PORT
# Values by name (-e NAME): they stay off the command line.
DATABASE_URL=$SYNCHRO_ADAPTER_URL SYNCHRO_WORKER_DATABASE_URL=$SYNCHRO_WORKER_URL \
SYNCHRO_LISTEN=127.0.0.1:$PORT \
    podman run -d --name "$NAME" --network host \
    -e DATABASE_URL -e SYNCHRO_WORKER_DATABASE_URL -e SYNCHRO_JWT_SECRET -e SYNCHRO_LISTEN \
    "$IMAGE" >/dev/null 2>"$LOGS/run.log" || die "podman run (see $LOGS/run.log)"
ready_start=$SECONDS
until curl -sf -o /dev/null "$BASE_URL/ready"; do
    [ "$(podman inspect --format '{{.State.Running}}' "$NAME")" = true ] \
        || { podman logs "$NAME" >"$LOGS/server.log" 2>&1; die "the container stopped (see $LOGS/server.log)"; }
    [ $((SECONDS - ready_start)) -lt 60 ] || die "/ready never answered 200 within 60 s"
    sleep 0.2
done
log "GET /ready answered 200 after $((SECONDS - ready_start))s"
# The periodic health check needs systemd timers (absent here); run the check itself.
podman healthcheck run "$NAME" >>"$LOGS/run.log" 2>&1 || die "podman healthcheck run: not healthy (see $LOGS/run.log)"
podman inspect --format '{{json .State}}' "$NAME" | grep -q '"Status":"healthy"' \
    || die "the container's recorded health is not healthy"
[ "$(podman top "$NAME" huser | tail -n +2 | sort -u)" = 10001 ] || die "processes in the container not all uid 10001"
connect=$(curl -sf -X POST "$BASE_URL/sync/connect" -H "authorization: Bearer $SYNCHRO_TOKEN" \
    -d '{"protocol_version":3,"client_id":"ctest","schema":{"version":0,"hash":""}}') \
    || die "POST /sync/connect failed"
generation=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["client_generation"])' "$connect")
curl -sN -X POST "$BASE_URL/sync/events" -H "authorization: Bearer $SYNCHRO_TOKEN" \
    -d "{\"protocol_version\":3,\"client_id\":\"ctest\",\"client_generation\":$generation}" \
    >"$LOGS/events.txt" 2>/dev/null &
EVENTS_PID=$!
deadline=$((SECONDS + 10))
until grep -q 'event: ready' "$LOGS/events.txt"; do
    [ $SECONDS -lt $deadline ] || die "the events stream never said ready"
    sleep 0.1
done
log "healthy, processes run as uid 10001, connect 200, events stream open; stopping (SIGTERM)"
stop_start=$(date +%s.%N)
podman stop --time 30 "$NAME" >/dev/null 2>>"$LOGS/run.log"
stop_s=$(python3 -c "import time; print(f'{time.time() - $stop_start:.1f}')")
code=$(podman inspect --format '{{.State.ExitCode}}' "$NAME")
podman logs "$NAME" >"$LOGS/server.log" 2>&1
wait "$EVENTS_PID" || true
EVENTS_PID=
[ "$code" = 0 ] || die "exit code $code after SIGTERM (see $LOGS/server.log)"
python3 -c "import sys; sys.exit(0 if $stop_s < 10 else 1)" || die "stopping took ${stop_s}s (the engine's SIGKILL comes at 10 s by default)"
grep -q '"reason":"shutdown"' "$LOGS/events.txt" || die "the events stream did not end with reason shutdown"
for secret in "$SYNCHRO_JWT_SECRET" "$SYNCHRO_TOKEN"; do
    ! grep -qF "$secret" "$LOGS/server.log" || die "the container's log holds a secret or token"
done
grep -q 'stopped' "$LOGS/server.log" || die "the server did not log its clean stop"
podman rm "$NAME" >/dev/null 2>>"$LOGS/run.log"
log "SIGTERM: exit code 0 in ${stop_s}s, events stream ended with reason shutdown, no secret in the log"
kill "$SLEEPER" && SLEEPER=
wait "$DB_PID" || die "the database fixture failed (see $LOGS/container_db.log)"
DB_PID=

# --- 6. the whole-stack client scenarios through the container ------------------------------
SCENARIOS=(--test whole_stack --test live_session --test schema_evolution)
log "whole-stack scenarios (${SCENARIOS[*]}) with every server in $IMAGE"
ws_start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
SYNCHRO_TEST_SERVER_IMAGE=$IMAGE SYNCHRO_TEST_SERVER_LOGS=$LOGS/servers SYNCHRO_TEST_SERVER_LOG_LEVEL=info \
    cargo test -q --no-fail-fast --workspace "${SCENARIOS[@]}" 2>&1 | tee "$LOGS/scenarios.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || die "whole-stack scenarios through the container (see $LOGS/scenarios.log)"
# (protocol/ has a pure schema_evolution test too: at least the three scenario files.)
[ "$(grep -c '^test result: ok' "$LOGS/scenarios.log")" -ge 3 ] || die "fewer than 3 test results in $LOGS/scenarios.log"
# The servers really were containers of the image.
started=$(podman events --stream=false --since "$ws_start" --filter event=start \
    --format '{{.Name}} {{.Image}}' | grep -c "^synchro-test-[0-9-]* $IMAGE\$" || true)
[ "$started" -gt 0 ] || die "the whole-stack tests started no container"
log "whole-stack scenarios passed through $started container runs of $IMAGE"

# --- 6b. the whole-stack scenario through the edge gateway in front of the container ---------
# (scripts/test-edge.sh, which .ci/run runs first, installed wrangler and built the worker;
# run alone, this script does both, once.)
scripts/setup-edge.sh >"$LOGS/setup-edge.log" 2>&1 || die "scripts/setup-edge.sh (see $LOGS/setup-edge.log)"
SYNCHRO_EDGE_PREBUILT=1 sh edge-worker/build.sh >"$LOGS/edge-build.log" 2>&1 \
    || die "the edge gateway's build (see $LOGS/edge-build.log)"
log "whole-stack scenario through the edge gateway (wrangler dev) in front of $IMAGE"
edge_start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
SYNCHRO_TEST_VIA_EDGE=1 SYNCHRO_TEST_EDGE_LOGS=$LOGS/wrangler \
SYNCHRO_TEST_SERVER_IMAGE=$IMAGE SYNCHRO_TEST_SERVER_LOGS=$LOGS/servers-edge SYNCHRO_TEST_SERVER_LOG_LEVEL=info \
    cargo test -q --no-fail-fast --workspace --test whole_stack 2>&1 | tee "$LOGS/via-edge.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || die "the whole-stack scenario through the edge and the container (see $LOGS/via-edge.log)"
grep -q '^test result: ok' "$LOGS/via-edge.log" || die "no test result in $LOGS/via-edge.log"
started=$(podman events --stream=false --since "$edge_start" --filter event=start \
    --format '{{.Name}} {{.Image}}' | grep -c "^synchro-test-[0-9-]* $IMAGE\$" || true)
[ "$started" -gt 0 ] || die "the scenario through the edge started no container"
log "whole-stack scenario passed through the edge and $started container runs of $IMAGE"

# --- 7. the compose file ---------------------------------------------------------------------
python3 scripts/check_compose.py server-native/compose.yaml "$TARGET/$out/synchro-server" \
    || die "server-native/compose.yaml"

# --- 8. nothing left -----------------------------------------------------------------------
left=$(podman ps --all --format '{{.Names}}' | grep -E '^synchro-(ctest|test)-' || true)
[ -z "$left" ] || die "containers left: $left"
echo "CONTAINER PASSED in $((SECONDS - START))s"
