#!/usr/bin/env bash
# Capture/pull/rebuild benchmark against a throwaway PostgreSQL:
#   scripts/bench-capture.sh [transactions] [rows_per_transaction] [latency_samples] [bootstrap_rows]
# Prints rates and their ratio to the raw logical-slot read measured in the same run.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[ -f .tools/env.sh ] || scripts/setup-toolchain.sh
. .tools/env.sh
cargo run -q --release -p synchro-server --example capture_bench -- "${1:-2000}" "${2:-5}" "${3:-100}" "${4:-100000}"
