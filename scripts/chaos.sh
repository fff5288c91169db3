#!/usr/bin/env bash
# A bounded chaos run on loopback (tests/examples/chaos): native clients write and sync
# through a fault proxy (latency, drops, truncated responses, resets) while the server, the
# capture worker and PostgreSQL are killed with SIGKILL and restarted at random; then the
# end state is checked against PostgreSQL (rows per client scope, one outcome per mutation,
# nothing applied twice). Prints the seed, the events and the figures; exits 0 only if every
# check holds.
#   scripts/chaos.sh [--seconds N] [--clients N] [--seed N] [--keep]   (default 120 s, 4 clients)
#   CI's short form: scripts/chaos.sh --seconds 45
# Builds the debug example and server (what `cargo test --workspace` already built), or with
# SYNCHRO_CHAOS_RELEASE=1 release builds. Extra arguments go to the program.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[ -f .tools/env.sh ] && . .tools/env.sh
profile=(); dir=debug
if [ "${SYNCHRO_CHAOS_RELEASE:-0}" = 1 ]; then profile=(--release); dir=release; fi
cargo build -q "${profile[@]}" -p synchro-tests --bin synchro-server-under-test --example chaos
target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
# The whole run is bounded: the chaos phase, then at most ~6 minutes of setup, drain and
# convergence (each step has its own deadline inside); this outer limit is the last resort.
seconds=120
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    [ "${args[$i]}" = --seconds ] && seconds=${args[$((i + 1))]:-120}
done
exec timeout --kill-after=10 $((seconds + 420)) "$target/$dir/examples/chaos" \
    --server-bin "$target/$dir/synchro-server-under-test" "$@"
