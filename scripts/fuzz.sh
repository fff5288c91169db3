#!/usr/bin/env bash
# Runs every cargo-fuzz target of protocol/fuzz for a while: scripts/fuzz.sh [seconds-per-target] [target...]
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Seeds the corpora
# from the conformance vectors. Any crash is copied to protocol/fuzz/regressions/<target>/,
# where `cargo test` replays it from then on (protocol/tests/fuzz_regressions.rs).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FUZZ=$ROOT/protocol/fuzz
secs=${1:-60}; shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(json typed_value decimal manifest row_identity semver checksum conformance token)
command -v cargo-fuzz >/dev/null || { echo "[fuzz] installing cargo-fuzz"; cargo install cargo-fuzz; }

python3 "$ROOT/scripts/fuzz_seeds.py" "$ROOT/vectors" "$FUZZ/corpus"
status=0
for t in "${targets[@]}"; do
    echo "[fuzz] $t for ${secs}s"
    if ! (cd "$FUZZ" && cargo +nightly fuzz run "$t" "corpus/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 2>&1 |
        grep -E "^(#[0-9]+ *DONE|stat::number_of_executed_units|stat::peak_rss_mb|SUMMARY|==[0-9]+==|error)" ); then
        status=1
    fi
    if compgen -G "$FUZZ/artifacts/$t/*" >/dev/null; then
        mkdir -p "$FUZZ/regressions/$t"
        cp "$FUZZ"/artifacts/"$t"/* "$FUZZ/regressions/$t/"
        echo "[fuzz] $t: crash inputs kept in protocol/fuzz/regressions/$t/"
        status=1
    fi
done
exit $status
