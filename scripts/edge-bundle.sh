#!/usr/bin/env bash
# Checks that the built edge gateway (edge-worker/build/) makes a deployable bundle, locally:
# `wrangler deploy --dry-run --outdir DIR` (no account, nothing uploaded), and prints the
# bundle's size raw and gzip-compressed (Workers' limit: 3 MB compressed on the free plan,
# 10 MB on paid plans). Usage: scripts/edge-bundle.sh [OUTDIR]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-${CARGO_TARGET_DIR:-$ROOT/target}/edge-dist}
mkdir -p "$(dirname "$OUT")"
OUT=$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")
rm -rf "$OUT"
cd "$ROOT/edge-worker"
SYNCHRO_EDGE_PREBUILT=1 WRANGLER_SEND_METRICS=false NO_COLOR=1 \
    node_modules/.bin/wrangler deploy --dry-run --outdir "$OUT" | tee "$OUT.log"
[ -f "$OUT/index.js" ] || { echo "wrangler wrote no index.js into $OUT" >&2; exit 1; }
# The uploaded modules: the script and the wasm (not the source map or wrangler's README).
modules=("$OUT"/index.js "$OUT"/*.wasm)
raw=$(cat "${modules[@]}" | wc -c)
gz=$(cat "${modules[@]}" | gzip -9 | wc -c)
echo "bundle modules: $(for m in "${modules[@]}"; do printf '%s (%s bytes) ' "$(basename "$m")" "$(wc -c <"$m")"; done)"
echo "bundle size: $raw bytes raw, $gz bytes gzip -9 ($(awk "BEGIN { printf \"%.1f\", $gz / 1024 }") KiB); wrangler: $(grep -o 'Total Upload.*' "$OUT.log"); Workers' limit 3 MB compressed (free plan)"
