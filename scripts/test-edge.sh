#!/usr/bin/env bash
# The edge gateway's checks and tests under real workerd (`wrangler dev`, no account, no
# network): installs what is missing (scripts/setup-edge.sh), lints the worker crate for
# wasm32 and the edge tests natively, builds it with worker-build, checks a deployable bundle with
# `wrangler deploy --dry-run --outdir` and prints its compressed size, then runs
# tests/edge.rs and tests/edge_seeds.rs (seed files through the edge cache) in front of a
# real server on real PostgreSQL, and the whole-stack, schema-evolution and live-session
# scenarios again with every client request through the gateway (SYNCHRO_TEST_VIA_EDGE=1). Ends with each runner's summary lines.
#   SYNCHRO_TOOLS_ENV  another checkout's .tools/env.sh (a worktree shares the main one's)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TOOLS_ENV=${SYNCHRO_TOOLS_ENV:-$ROOT/.tools/env.sh}
[ -f "$TOOLS_ENV" ] || scripts/setup-toolchain.sh
. "$TOOLS_ENV"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
LOGS=$TARGET/test-logs/edge
mkdir -p "$LOGS"
rm -f "$LOGS"/*.log
summary=()
failed=0

step() {
    local name=$1; shift
    local log=$LOGS/$(printf '%02d' ${#summary[@]})-$name.log start=$SECONDS status
    echo "=== edge $name: $*"
    "$@" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    local lines
    lines=$(grep -E '^test result:|^bundle ' "$log" | sed 's/^/    /')
    if [ "$status" -eq 0 ]; then
        summary+=("ok     $name ($((SECONDS - start))s)${lines:+$'\n'$lines}")
    else
        summary+=("FAILED $name ($((SECONDS - start))s, exit $status, log: ${log#"$ROOT"/})${lines:+$'\n'$lines}")
        failed=1
    fi
    return "$status"
}

finish() {
    echo
    echo "=== edge summary"
    printf '%s\n' "${summary[@]}"
    if [ "$failed" -eq 0 ]; then echo "EDGE PASSED in ${SECONDS}s"; else echo "EDGE FAILED after ${SECONDS}s"; fi
    exit "$failed"
}

wasm_cargo() {
    if [ -n "${SYNCHRO_WASM_TOOLCHAIN:-}" ]; then RUSTUP_TOOLCHAIN=$SYNCHRO_WASM_TOOLCHAIN cargo "$@"; else cargo "$@"; fi
}

step setup scripts/setup-edge.sh || finish
if [ -z "${SYNCHRO_WASM_TOOLCHAIN:-}" ]; then
    # Debian's wasm toolchain has no clippy; the native lint (scripts/test.sh) covers the
    # pure modules then.
    step clippy-wasm32 cargo clippy -p synchro-edge --target wasm32-unknown-unknown -- -D warnings
fi
# The edge tests and benchmark are behind synchro-tests' `edge` feature, which
# scripts/test.sh's lint does not turn on.
step clippy-edge-tests cargo clippy -p synchro-tests --features edge --all-targets -- -D warnings
step build sh edge-worker/build.sh || finish
step bundle scripts/edge-bundle.sh "$TARGET/edge-dist"
export SYNCHRO_TEST_EDGE_LOGS=$LOGS/wrangler SYNCHRO_TEST_SERVER_LOGS=$LOGS/servers
step test-edge cargo test --no-fail-fast -p synchro-tests --features edge --test edge --test edge_seeds
step test-via-edge env SYNCHRO_TEST_VIA_EDGE=1 \
    cargo test --no-fail-fast -p synchro-tests --test whole_stack --test schema_evolution --test live_session
finish
