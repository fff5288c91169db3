#!/usr/bin/env bash
# Retention soak against a throwaway PostgreSQL (issue 38.5):
#   scripts/bench-retention.sh [seconds=600] [clients=300] [row_writes_per_second=200] [offline_percent=10]
# Prints the effect log's size over time beside what the slowest live client has not
# acknowledged, each compaction pass, and pull latency during compaction against pulls
# without it (same run).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[ -f .tools/env.sh ] || scripts/setup-toolchain.sh
. .tools/env.sh
cargo run -q --release -p synchro-server --example retention_bench -- "${1:-600}" "${2:-300}" "${3:-200}" "${4:-10}"
