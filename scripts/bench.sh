#!/usr/bin/env bash
# Digest benchmark, native and wasm-in-node: scripts/bench.sh [rows] [entries] [runs]
# Prints throughput and ratios to raw SHA-256 over the same octets in the same run.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
rows=${1:-200000}; entries=${2:-1000000}; runs=${3:-5}
[ -f .tools/env.sh ] || scripts/setup-toolchain.sh
. .tools/env.sh
cargo run -q --release -p synchro-protocol --features bench --example digest_bench -- \
    --rows "$rows" --entries "$entries" --runs "$runs"
echo
# A separate target dir keeps the bench-enabled wasm apart from the published build.
CARGO_TARGET_DIR=$ROOT/target/bench SYNCHRO_WASM_FEATURES="--features bench" \
    scripts/build-wasm.sh protocol >/dev/null
node protocol/bench/node-bench.mjs target/bench/wasm-pkg/protocol/nodejs "$rows" "$entries" "$runs"
