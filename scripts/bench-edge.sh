#!/usr/bin/env bash
# The edge gateway's benchmark: builds the worker (worker-build, pinned wasm-bindgen),
# prints its deployable bundle's size raw and compressed (wrangler deploy --dry-run), then
# the latency it adds: p50/p99 of connect, pull and push straight to a real server on real
# PostgreSQL and through `wrangler dev` (real workerd) in front of it, same run
# (tests/examples/edge_bench.rs). A benchmark prints figures; it never fails on time.
#   scripts/bench-edge.sh [iterations]   (default 300)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
. "${SYNCHRO_TOOLS_ENV:-$ROOT/.tools/env.sh}"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
scripts/setup-edge.sh
sh edge-worker/build.sh
scripts/edge-bundle.sh "$TARGET/edge-dist" | grep '^bundle'
cargo build -q -p synchro-tests --bin synchro-server-under-test --features edge --example edge_bench
"$TARGET/debug/examples/edge_bench" "${1:-300}"
