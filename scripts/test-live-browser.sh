#!/usr/bin/env bash
# The browser's live-session test against a real server: starts PostgreSQL and the server
# (tests/examples/live_stack.rs), builds client-wasm/tests/live_browser.rs with its URL and a
# token, and runs it in headless Chromium (a dedicated worker, OPFS). Chromium gets
# --disable-web-security because the test page and the server are different origins (the
# server sends no CORS headers).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# SYNCHRO_TOOLS_ENV: another checkout's tools (a worktree shares the main one's).
. "${SYNCHRO_TOOLS_ENV:-$ROOT/.tools/env.sh}"
export CC_wasm32_unknown_unknown=${CC_wasm32_unknown_unknown:-clang-22} AR_wasm32_unknown_unknown=${AR_wasm32_unknown_unknown:-llvm-ar-22}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build -q -p synchro-tests --bin synchro-server-under-test --example live_stack
# The stack runs until its stdin closes; this sleeper holds it open (its stderr off a caller's
# pipe such as test.sh's tee, which would otherwise wait for it forever).
exec 3< <(exec sleep infinity 2>/dev/null)
SLEEPER=$!
FIFO=$(mktemp -u) && mkfifo "$FIFO"
"$TARGET/debug/examples/live_stack" <&3 >"$FIFO" &
STACK=$!
# On exit the stack's stdin closes (this shell's copy of it too) so it stops its server and
# drops its PostgreSQL cluster itself; a SIGTERM would leave both running.
stop_stack() {
    exec 3<&-
    kill "$SLEEPER" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$STACK" 2>/dev/null || break; sleep 0.1; done
    kill "$STACK" 2>/dev/null || true
    rm -f "$FIFO" "${WEBDRIVER:-}"
}
trap stop_stack EXIT
while read -r line; do
    export "${line?}"
    [ -n "${SYNCHRO_LIVE_TOKEN:-}" ] && break
done <"$FIFO"
WEBDRIVER=$(mktemp --suffix=.json)
base=${WASM_BINDGEN_TEST_WEBDRIVER_JSON:-$ROOT/.tools/webdriver.json}
python3 - "$base" "$WEBDRIVER" <<'PY'
import json, sys, tempfile
c = json.load(open(sys.argv[1]))
c["goog:chromeOptions"]["args"] += ["--disable-web-security",
                                    "--user-data-dir=" + tempfile.mkdtemp()]
json.dump(c, open(sys.argv[2], "w"))
PY
status=0
WASM_BINDGEN_USE_BROWSER=1 WASM_BINDGEN_TEST_WEBDRIVER_JSON=$WEBDRIVER \
    cargo test -p synchro-client --target wasm32-unknown-unknown --test live_browser || status=$?
# The stack checks, once its input closes, what the browser pushed against PostgreSQL.
exec 3<&-
kill "$SLEEPER" 2>/dev/null || true
wait "$STACK" || { echo "live stack: PostgreSQL does not hold what the browser pushed" >&2; status=1; }
exit $status
