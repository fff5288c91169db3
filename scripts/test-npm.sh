#!/usr/bin/env bash
# The npm package's tests (npm/test) and the web demo's end-to-end test (web-demo/test):
# builds the stack binaries and the package (scripts/build-npm.sh), installs the test
# dependencies from their locks (npm ci: vite, playwright-core, react; no browser is
# downloaded, Debian's /usr/bin/chromium is driven), then runs both in headless Chromium
# against real servers on real PostgreSQL. Screenshots of the demo go to
# target/web-demo-artifacts/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
. "${SYNCHRO_TOOLS_ENV:-$ROOT/.tools/env.sh}"
export CC_wasm32_unknown_unknown=${CC_wasm32_unknown_unknown:-clang-22} AR_wasm32_unknown_unknown=${AR_wasm32_unknown_unknown:-llvm-ar-22}
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
cargo build -q -p synchro-tests --bin synchro-server-under-test --example npm_stack
cargo build -q -p synchro-server --bin synchro-server
SYNCHRO_NPM_TARBALL=$(scripts/build-npm.sh)
export SYNCHRO_NPM_TARBALL
(cd npm && npm ci --no-audit --no-fund --loglevel=error)
(cd npm && node --test --test-timeout=600000 test/*.test.mjs)
if [ -d web-demo/test ]; then
    (cd web-demo && npm ci --no-audit --no-fund --loglevel=error && npm test)
fi
