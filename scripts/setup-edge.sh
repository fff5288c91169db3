#!/usr/bin/env bash
# Installs what the edge gateway's build and tests need, idempotently (a second run is a
# quick no-op): wrangler (which brings workerd) from npm into edge-worker/node_modules at the
# version edge-worker/package-lock.json locks, and worker-build at the version of the
# `worker` crate Cargo.lock resolves (workers-rs releases the two together). Nothing here
# needs a Cloudflare account. Expects scripts/setup-toolchain.sh to have run (wasm32 std,
# the pinned wasm-bindgen CLI, wasm-opt).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EDGE=$ROOT/edge-worker
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
log() { echo "[setup-edge] $*"; }

# --- wrangler (and workerd) from npm ---------------------------------------------------------
want_wrangler=$(node -p "require('$EDGE/package-lock.json').packages['node_modules/wrangler'].version")
have_wrangler=$(node -p "require('$EDGE/node_modules/wrangler/package.json').version" 2>/dev/null || true)
if [ "$have_wrangler" = "$want_wrangler" ] && [ -x "$EDGE/node_modules/.bin/wrangler" ]; then
    log "wrangler $want_wrangler present"
else
    command -v npm >/dev/null || { echo "[setup-edge] npm is missing: run scripts/setup-toolchain.sh" >&2; exit 1; }
    log "npm ci: wrangler $want_wrangler into $EDGE/node_modules (~30 s)"
    (cd "$EDGE" && npm ci --no-audit --no-fund --no-update-notifier)
fi

# --- worker-build at the worker crate's version ----------------------------------------------
want_wb=$(awk '/^name = "worker"$/ { getline; gsub(/version = |"/, ""); print; exit }' "$ROOT/Cargo.lock")
[ -n "$want_wb" ] || { echo "[setup-edge] Cargo.lock resolves no worker crate" >&2; exit 1; }
have_wb=$(worker-build --version 2>/dev/null || true)
if [ "$have_wb" = "$want_wb" ]; then
    log "worker-build $want_wb present"
else
    log "cargo install worker-build $want_wb (10-17 min on 2 cores, once)"
    cargo install worker-build --version "$want_wb"
fi
