#!/usr/bin/env bash
# Client benchmarks:
#   scripts/bench-client.sh [rows] [replace_rows] [items_rows] [updates]
# 1. native: verified pull apply vs raw insert into the same SQLite (ratio, same run) and a
#    Class 2 replace over a large table;
# 2. the same in headless Chromium on OPFS (a dedicated worker);
# 3. end to end through the real server on a throwaway PostgreSQL: the items workload —
#    (a) fresh client fully synced and verified, (b) commit-to-visible latency p50/p90/p99.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[ -f .tools/env.sh ] || scripts/setup-toolchain.sh
. .tools/env.sh
rows=${1:-100000}; replace_rows=${2:-1000000}; items=${3:-100000}; updates=${4:-100}

echo "=== native"
cargo run -q --release -p synchro-client --features bench --example client_bench -- "$rows" "$replace_rows"

echo "=== browser (Chromium, OPFS)"
wasm() { if [ -n "${SYNCHRO_WASM_TOOLCHAIN:-}" ]; then RUSTUP_TOOLCHAIN=$SYNCHRO_WASM_TOOLCHAIN cargo "$@"; else cargo "$@"; fi; }
# wasm-bindgen-test prints console output only for failures unless asked (--nocapture).
SYNCHRO_BENCH_ROWS=$rows SYNCHRO_BENCH_REPLACE_ROWS=$replace_rows WASM_BINDGEN_USE_BROWSER=1 \
    wasm test --release -p synchro-client --features bench --target wasm32-unknown-unknown \
    --test bench_browser -- --nocapture 2>&1 | grep -E "^(synchro|verified|raw|ratio|Class)|FAIL|panicked"

echo "=== end to end (items workload, real server, native client)"
cargo run -q --release -p synchro-tests --example items_bench -- "$items" "$updates"
