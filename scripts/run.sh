#!/usr/bin/env bash
# The main job, for now: build the conformance tool and run it over every vector file that
# carries expectations. (The native server takes this command over later.)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
cargo build -q --release -p synchro-protocol --bin synchro-conformance
exec target/release/synchro-conformance check vectors/conformance-v1.json vectors/synchro-v1.json
