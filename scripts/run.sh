#!/usr/bin/env bash
# The main job: a development synchro server on 127.0.0.1:8787. With no DATABASE_URL it
# starts a throwaway PostgreSQL, installs synchro, registers a demo schema and prints a
# development JWT; with DATABASE_URL (a superuser connection) it uses that database.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
cargo build -q --release -p synchro-server --bin synchro-server
exec target/release/synchro-server dev "$@"
