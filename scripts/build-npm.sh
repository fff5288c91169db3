#!/usr/bin/env bash
# Builds the npm package @synchro/client (npm/): the client's wasm for the `web` target
# (scripts/build-wasm.sh, size-optimized: wasm-pack.toml's profile and .cargo/config.toml's
# SQLite flags) copied into npm/wasm/, then `npm pack` into target/npm/. Checks on the way
# that the package version is the crates' version and that the module imports nothing a
# browser cannot give it (a SQLite function left out by a flag would be an `env` import).
# Prints the tarball's path last.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
log() { echo "[build-npm] $*" >&2; }
die() { echo "[build-npm] ERROR: $*" >&2; exit 1; }

crates=$(python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml","rb"))["workspace"]["package"]["version"])')
package=$(node -p 'require("./npm/package.json").version')
[ "$crates" = "$package" ] || die "npm/package.json version $package differs from the crates' $crates"

SYNCHRO_WASM_TARGETS=web scripts/build-wasm.sh client-wasm >&2
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
out=$TARGET/wasm-pkg/client-wasm/web
mkdir -p npm/wasm
cp "$out/synchro_client.js" "$out/synchro_client_bg.wasm" npm/wasm/
node - npm/wasm/synchro_client_bg.wasm <<'JS'
const fs = require("fs");
const m = new WebAssembly.Module(fs.readFileSync(process.argv[2]));
const env = WebAssembly.Module.imports(m).filter((i) => i.module !== "./synchro_client_bg.js" && i.module !== "wbg");
if (env.length) {
  console.error("[build-npm] ERROR: the wasm imports", env.map((i) => `${i.module}.${i.name}`).join(", "));
  process.exit(1);
}
JS
mkdir -p "$TARGET/npm"
tarball=$(cd npm && npm pack --silent --pack-destination "$TARGET/npm")
log "packed $TARGET/npm/$tarball"
echo "$TARGET/npm/$tarball"
