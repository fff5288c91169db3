#!/usr/bin/env bash
# Change-notification fan-out benchmark against a throwaway PostgreSQL, with the server as
# its own process (one instance, then two behind the same database):
#   scripts/bench-events.sh [commits] [stream counts, one instance] [stream counts, two instances] [sparse commits]
# (defaults 50 1,1000,10000 1000,10000 10). Prints commit → event latency at a watched client
# (commits back to back, then sparse ones 5.5–9 s apart) and the server's database statements
# per commit and per second without commits (pg_stat_statements) for each count.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[ -f .tools/env.sh ] && . .tools/env.sh
# Every stream is a socket, in the benchmark and in the server: as many files as allowed.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
cargo build -q --release -p synchro-tests --example events_bench --bin synchro-server-under-test
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
SYNCHRO_BENCH_SERVER_BIN=$TARGET/release/synchro-server-under-test \
    "$TARGET/release/examples/events_bench" "${1:-50}" "${2:-1,1000,10000}" "${3:-1000,10000}" "${4:-10}"
