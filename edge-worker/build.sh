#!/bin/sh
# wrangler's [build] command: builds the worker with worker-build into build/. Uses the
# pinned wasm-bindgen CLI, a local wasm-opt and wrangler's own esbuild, so nothing is
# downloaded. SYNCHRO_EDGE_PREBUILT=1 skips the build when build/index.js exists (the
# tests and the benchmark build once, then start `wrangler dev` many times).
set -eu
cd "$(dirname "$0")"
if [ "${SYNCHRO_EDGE_PREBUILT:-}" = 1 ] && [ -f build/index.js ]; then
    exit 0
fi
WASM_BINDGEN_BIN=${WASM_BINDGEN_BIN:-$(command -v wasm-bindgen)}
export WASM_BINDGEN_BIN
if [ -z "${ESBUILD_BIN:-}" ] && [ -x node_modules/.bin/esbuild ]; then
    ESBUILD_BIN=$(pwd)/node_modules/.bin/esbuild
    export ESBUILD_BIN
fi
if [ -z "${WASM_OPT_BIN:-}" ] && [ -n "${WASM_OPT:-}" ]; then
    WASM_OPT_BIN=$WASM_OPT
    export WASM_OPT_BIN
fi
# The Debian wasm route (scripts/setup-toolchain.sh) names a rustup toolchain for wasm32.
if [ -n "${SYNCHRO_WASM_TOOLCHAIN:-}" ]; then
    RUSTUP_TOOLCHAIN=$SYNCHRO_WASM_TOOLCHAIN
    export RUSTUP_TOOLCHAIN
fi
exec worker-build --release
