#!/usr/bin/env bash
# The main job: a development synchro server on 127.0.0.1:8787. With no DATABASE_URL it
# starts a throwaway PostgreSQL, installs synchro, registers a demo schema and prints a
# development JWT; with DATABASE_URL (a superuser connection) it uses that database.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
cargo build -q --release -p synchro-server --bin synchro-server
# Where cargo put it: CARGO_TARGET_DIR and build.target-dir move the target directory.
TARGET_DIR=$(cargo metadata -q --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
exec "$TARGET_DIR/release/synchro-server" dev "$@"
