#!/usr/bin/env bash
# Installs what is missing, then runs every test: format, lints (native and wasm32), native
# tests (the server's against throwaway PostgreSQL clusters: the distribution's, then 16, 17 and
# 18 through scripts/test-pg-versions.sh), wasm tests in node and in
# headless Chromium, the wasm packages, the native/wasm parity test, the conformance run and
# the npm package's and web demo's tests (scripts/test-npm.sh).
# Ends with each runner's summary lines.
#   SYNCHRO_SKIP_SETUP=1  skip scripts/setup-toolchain.sh (tools already installed)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
LOGS=$ROOT/target/test-logs
mkdir -p "$LOGS"
rm -f "$LOGS"/*.log
summary=()
failed=0

# step NAME COMMAND... : run, log, remember the runner's summary lines.
step() {
    local name=$1; shift
    local log=$LOGS/$(printf '%02d' ${#summary[@]})-$name.log start=$SECONDS status
    echo "=== $name: $*"
    "$@" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    local lines
    lines=$(grep -E '^test result:|^# (tests|pass|fail) |cases match|^\[build-wasm\] done|^chaos: (every check|FAILED)' "$log" | sed 's/^/    /')
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
    echo "=== summary"
    printf '%s\n' "${summary[@]}"
    if [ "$failed" -eq 0 ]; then echo "ALL PASSED in ${SECONDS}s"; else echo "FAILED after ${SECONDS}s"; fi
    exit "$failed"
}

if [ "${SYNCHRO_SKIP_SETUP:-0}" != 1 ]; then
    step setup scripts/setup-toolchain.sh || finish
fi
. .tools/env.sh
wasm_cargo() {
    if [ -n "${SYNCHRO_WASM_TOOLCHAIN:-}" ]; then RUSTUP_TOOLCHAIN=$SYNCHRO_WASM_TOOLCHAIN cargo "$@"; else cargo "$@"; fi
}
WASM_TESTS=(-p synchro-protocol --target wasm32-unknown-unknown --test vectors --test negative_controls --test tokens)

step fmt cargo fmt --all --check
# The release workflow (no workflow runs here): its shape, scripts and provenance settings.
step release-workflow python3 scripts/check_release.py .github/workflows/release.yml
step clippy cargo clippy --workspace --all-targets --features synchro-protocol/bench,synchro-client/bench -- -D warnings
if [ -z "${SYNCHRO_WASM_TOOLCHAIN:-}" ]; then
    # Debian's wasm toolchain has no clippy; the native lint covers the shared code then.
    step clippy-wasm32 cargo clippy -p synchro-protocol --target wasm32-unknown-unknown --features bench -- -D warnings
    step clippy-wasm32-client cargo clippy -p synchro-client --target wasm32-unknown-unknown --lib --tests --features bench -- -D warnings
fi
# wasm-bindgen-test-runner gives up on chromedriver when the driver writes anything to stderr
# while it starts ("driver failed to bind port during startup", wasm-bindgen#5110; seen once
# in this CI): such a run is tried again, at most three times in all. A failing test is
# never retried.
driver_retry() {
    local attempt status out
    for attempt in 1 2 3; do
        out=$(mktemp)
        "$@" 2>&1 | tee "$out"
        status=${PIPESTATUS[0]}
        if [ "$status" -eq 0 ] || ! grep -q 'driver failed to bind port during startup' "$out"; then
            rm -f "$out"
            return "$status"
        fi
        rm -f "$out"
        [ "$attempt" -lt 3 ] && echo "=== chromedriver did not start (attempt $attempt); running the step again"
    done
    return "$status"
}

# Every test server's log is kept (a failing test can print the end of it).
mkdir -p "$LOGS/servers" && rm -f "$LOGS"/servers/*.log
step test-native env SYNCHRO_TEST_SERVER_LOGS="$LOGS/servers" cargo test --workspace --no-fail-fast
# The chaos run's short form (tests/examples/chaos, built by the step above): clients through a
# fault proxy while the server, capture and PostgreSQL are killed with SIGKILL; end-state checks.
step chaos scripts/chaos.sh --seconds 45
# The same native tests on the other PostgreSQL major versions (16, 17, 18 from npm packages of
# server binaries): all of them on the newest, the PostgreSQL-facing suites on the others.
step test-pg-versions scripts/test-pg-versions.sh
step test-wasm-node wasm_cargo test "${WASM_TESTS[@]}"
step test-wasm-chromium driver_retry env WASM_BINDGEN_USE_BROWSER=1 bash -c "$(declare -f wasm_cargo); wasm_cargo test ${WASM_TESTS[*]}"
# The client's storage, materialization, verification and journal tests on OPFS in a
# dedicated worker of headless Chromium (OPFS has no node equivalent).
CLIENT_WASM_TESTS=(-p synchro-client --target wasm32-unknown-unknown --test storage --test apply --test journal --test queue --test metadata_upgrade --test browser_api --test scope_index)
step test-client-chromium driver_retry env WASM_BINDGEN_USE_BROWSER=1 bash -c "$(declare -f wasm_cargo); wasm_cargo test ${CLIENT_WASM_TESTS[*]}"
# The worker's live session in Chromium against a real server on real PostgreSQL.
step test-live-chromium driver_retry scripts/test-live-browser.sh
step build-wasm scripts/build-wasm.sh
step test-parity-node node --test protocol/js-tests/
step conformance cargo run -q --release -p synchro-protocol --bin synchro-conformance -- \
    check vectors/conformance-v1.json vectors/synchro-v1.json
# The npm package and the web demo in headless Chromium against real servers.
step test-npm scripts/test-npm.sh
finish
