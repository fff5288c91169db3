#!/usr/bin/env bash
# Builds JS/wasm packages: scripts/build-wasm.sh [crate-dir...]  (default: build.crates)
# For each crate: cargo build for wasm32 -> wasm-bindgen per target -> wasm-opt, with all
# settings from wasm-pack.toml. Output: target/wasm-pkg/<crate>/<target>/.
#   SYNCHRO_WASM_FEATURES="--features bench"  extra cargo build arguments.
#   SYNCHRO_WASM_TARGETS="web"                 only these wasm-bindgen targets.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
log() { echo "[build-wasm] $*"; }
die() { echo "[build-wasm] ERROR: $*" >&2; exit 1; }
cfg() { python3 "$ROOT/scripts/wasm_config.py" "$1"; }

[ -f .tools/env.sh ] || die "missing .tools/env.sh; run scripts/setup-toolchain.sh first"
. .tools/env.sh
# Only wasm commands use the wasm toolchain; it may lack clippy/rustfmt, so never export it.
wasm_cargo() {
    if [ -n "${SYNCHRO_WASM_TOOLCHAIN:-}" ]; then RUSTUP_TOOLCHAIN=$SYNCHRO_WASM_TOOLCHAIN cargo "$@"
    else cargo "$@"; fi
}

if [ $# -gt 0 ]; then crates=("$@"); else read -ra crates <<<"$(cfg build.crates)"; fi
read -ra targets <<<"${SYNCHRO_WASM_TARGETS:-$(cfg build.targets)}"
read -ra opt_args <<<"$(cfg wasm-opt.args)"
read -ra extra <<<"${SYNCHRO_WASM_FEATURES:-}"
profile=$(cfg build.profile)
opt_enabled=$(cfg wasm-opt.enabled)
case $profile in dev | test) profile_dir=debug ;; bench) profile_dir=release ;; *) profile_dir=$profile ;; esac
[ "$opt_enabled" != true ] || [ -x "${WASM_OPT:-}" ] || die "wasm-opt not found at '${WASM_OPT:-}'"

metadata=$(wasm_cargo metadata --no-deps --format-version 1)
for crate in "${crates[@]}"; do
    # Crate directory (names the output dir), package, lib artifact name and target dir;
    # the argument may be the crate directory or the package name.
    read -r dir pkg lib target_dir < <(python3 -c '
import json, os, sys
meta, (root, name) = json.load(sys.stdin), sys.argv[1:]
manifest = os.path.realpath(os.path.join(root, name, "Cargo.toml"))
for p in meta["packages"]:
    if os.path.realpath(p["manifest_path"]) == manifest or p["name"] == name:
        libs = [t for t in p["targets"] if "cdylib" in t["crate_types"]]
        if not libs:
            sys.exit(f"{name}: [lib] crate-type must include \"cdylib\" to produce a .wasm")
        crate_dir = os.path.relpath(os.path.dirname(p["manifest_path"]), root)
        print(crate_dir, p["name"], libs[0]["name"].replace("-", "_"), meta["target_directory"])
        break
else:
    sys.exit(f"{name}: no such workspace crate (directory or package name)")
' "$ROOT" "$crate" <<<"$metadata") || die "cannot resolve crate '$crate'"

    log "$dir: cargo build -p $pkg --target wasm32-unknown-unknown --profile $profile ${extra[*]}" \
        "(toolchain: ${SYNCHRO_WASM_TOOLCHAIN:-default})"
    wasm_cargo build -p "$pkg" --lib --target wasm32-unknown-unknown --profile "$profile" "${extra[@]}"
    wasm=$target_dir/wasm32-unknown-unknown/$profile_dir/$lib.wasm
    [ -f "$wasm" ] || die "expected $wasm after the build"
    log "$dir: $(basename "$wasm") $(stat -c %s "$wasm") bytes"

    for t in "${targets[@]}"; do
        out=$target_dir/wasm-pkg/$dir/$t
        rm -rf "$out" # stale files from an earlier build must not ship
        wasm-bindgen --target "$t" --out-dir "$out" "$wasm"
        if [ "$opt_enabled" = true ]; then
            for f in "$out"/*_bg.wasm; do
                "$WASM_OPT" "${opt_args[@]}" "$f" -o "$f.opt"
                mv "$f.opt" "$f"
            done
        fi
        log "$dir/$t -> ${out#"$ROOT"/}"
        find "$out" -maxdepth 1 -type f -printf '[build-wasm]   %-40f %10s bytes\n' | sort
    done
done
log "done in ${SECONDS}s"
