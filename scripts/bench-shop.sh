#!/usr/bin/env bash
# The operator's shop workload against a throwaway PostgreSQL (issue 28; docs/operator.md "Writing fast
# rules"): bootstrap, initial staging of a per-customer rule, a Class 3 change of every order
# with a 1:N impact function, heartbeat gaps, and the cost of good and bad rules.
#   scripts/bench-shop.sh [customers] [orders] [items] [--no-index]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[ -f .tools/env.sh ] || scripts/setup-toolchain.sh
. .tools/env.sh
cargo run -q --release -p synchro-server --example shop_bench -- "$@"
