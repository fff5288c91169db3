#!/usr/bin/env bash
# Installs what the wasm build and browser tests need, and writes .tools/env.sh for other
# scripts to source. Idempotent: every step checks first, so a second run is a quick no-op.
# Versions come from wasm-pack.toml only (through scripts/wasm_config.py).
# Background on the Debian fallback: /work/shared/toolchain/README.md.
#   SYNCHRO_FORCE_DEBIAN_WASM=1  use the Debian std route even if rustup has the target.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=$ROOT/.tools
cd "$ROOT" # so rustup honours a rust-toolchain.toml in the repo
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH" # cargo-installed tools win over older copies

log() { echo "[setup] $*"; }
die() { echo "[setup] ERROR: $*" >&2; exit 1; }
cfg() { python3 "$ROOT/scripts/wasm_config.py" "$1"; }

WB_VERSION=$(cfg wasm-bindgen.version)
BINARYEN_VERSION=$(cfg wasm-opt.binaryen_npm_version)
WASM_TARGET=wasm32-unknown-unknown
DEB_TOOLCHAIN=synchro-debian
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
mkdir -p "$TOOLS"

# Installs only the Debian packages that are missing; refreshes the package lists only when
# an install fails (fresh images ship without lists, old lists point at vanished versions).
apt_install() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing Debian packages: ${missing[*]}"
    local install=($SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}")
    if ! "${install[@]}"; then
        log "apt-get install failed; running apt-get update and retrying"
        $SUDO apt-get update -q
        "${install[@]}"
    fi
}

# --- a. wasm32 standard library -------------------------------------------------------------
have_rustup_target() {
    command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx "$WASM_TARGET"
}

deb_std_dir() { echo "$(/usr/bin/rustc --print sysroot)/lib/rustlib/$WASM_TARGET/lib"; }

# Debian's rustc-web ships no wasm32 std, so build it once from rust-web-src and drop it into
# Debian rustc's sysroot. The stamp ties it to the exact compiler: stale rlibs give E0514.
debian_wasm_std() {
    apt_install rustc-web cargo-web rust-web-src lld-22
    local dest stamp want
    dest=$(deb_std_dir); stamp=$dest/.synchro-rustc-vV; want=$(/usr/bin/rustc -vV)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && compgen -G "$dest/libstd-*.rlib" >/dev/null; then
        log "Debian wasm32 std is current ($(/usr/bin/rustc --version))"
    else
        log "building wasm32 std with Debian's $(/usr/bin/rustc --version) (~80 s, once)"
        local scratch; scratch=$(mktemp -d)
        mkdir -p "$scratch/src"; : >"$scratch/src/lib.rs"
        printf '[package]\nname = "synchro-std-dummy"\nversion = "0.0.0"\nedition = "2021"\n[workspace]\n' \
            >"$scratch/Cargo.toml"
        # embed-bitcode: crates with lto = true fail to link against std without it.
        (cd "$scratch" && env -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET RUSTC=/usr/bin/rustc \
            RUSTC_BOOTSTRAP=1 RUSTFLAGS=-Cembed-bitcode=yes /usr/bin/cargo build -q --release \
            --target "$WASM_TARGET" -Zbuild-std=std,panic_abort,panic_unwind,test,proc_macro)
        $SUDO mkdir -p "$dest"
        $SUDO rm -f "$dest"/*.rlib
        find "$scratch/target/$WASM_TARGET/release/deps" -name '*.rlib' \
            ! -name 'libsynchro_std_dummy-*' -exec $SUDO cp {} "$dest/" \;
        echo "$want" | $SUDO tee "$stamp" >/dev/null
        rm -rf "$scratch"
        log "installed $(ls "$dest"/*.rlib | wc -l) std rlibs into $dest"
    fi
    command -v rustup >/dev/null || return 0 # plain /usr/bin/cargo then finds the std itself
    # Tools that run plain `rustc`/`cargo` from PATH need a rustup toolchain for Debian's.
    # Machine-wide like the std itself, so several checkouts share one link.
    local link=/usr/local/lib/synchro-debian-toolchain t
    for t in rustc cargo rustdoc; do
        [ -L "$link/bin/$t" ] || { $SUDO mkdir -p "$link/bin" "$link/lib"; $SUDO ln -sfn "/usr/bin/$t" "$link/bin/$t"; }
    done
    if ! rustup toolchain list -v | grep -q "^$DEB_TOOLCHAIN .*$link\$"; then
        log "linking rustup toolchain $DEB_TOOLCHAIN -> $link"
        rustup toolchain uninstall "$DEB_TOOLCHAIN" >/dev/null 2>&1 || true
        rustup toolchain link "$DEB_TOOLCHAIN" "$link"
    fi
}

WASM_TOOLCHAIN=
if [ "${SYNCHRO_FORCE_DEBIAN_WASM:-0}" = 1 ]; then
    log "SYNCHRO_FORCE_DEBIAN_WASM=1: using the Debian wasm32 std route"
    debian_wasm_std; WASM_TOOLCHAIN=$DEB_TOOLCHAIN
elif have_rustup_target; then
    log "rustup already has $WASM_TARGET"
elif [ -x /usr/bin/rustc ] && [ -f "$(deb_std_dir)/.synchro-rustc-vV" ]; then
    # An earlier run fell back to Debian: don't spend another 60 s timing out on rustup.
    log "rustup lacks $WASM_TARGET; reusing the Debian wasm32 std from an earlier run"
    debian_wasm_std; WASM_TOOLCHAIN=$DEB_TOOLCHAIN
elif command -v rustup >/dev/null && log "rustup target add $WASM_TARGET (60 s limit)" &&
    timeout 60 rustup target add "$WASM_TARGET"; then
    log "rustup installed $WASM_TARGET"
else
    log "rustup could not provide $WASM_TARGET; falling back to Debian's rustc-web"
    debian_wasm_std; WASM_TOOLCHAIN=$DEB_TOOLCHAIN
fi
command -v rustup >/dev/null || WASM_TOOLCHAIN= # no rustup: /usr/bin/cargo is the wasm cargo

# --- c. headless Chromium + driver ----------------------------------------------------------
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    log "chromium and chromedriver present ($(/usr/bin/chromedriver --version | cut -d' ' -f1-2))"
else
    apt_install chromium chromium-driver
fi

# --- c2. PostgreSQL server binaries for the throwaway test clusters ------------------------
if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null ||
    { command -v pg_config >/dev/null && [ -x "$(pg_config --bindir 2>/dev/null)/initdb" ]; }; then
    log "PostgreSQL server binaries present"
else
    apt_install postgresql
fi

# --- c2b. PyYAML for the static checks of compose.yaml and the release workflow ----------
if python3 -c 'import yaml' 2>/dev/null; then
    log "PyYAML present"
else
    apt_install python3-yaml
fi

# --- c3. clang for SQLite's C source in the wasm32 client build (sqlite-wasm-rs) -----------
if command -v clang-22 >/dev/null && command -v llvm-ar-22 >/dev/null; then
    log "clang-22 and llvm-ar-22 present"
else
    apt_install clang-22 llvm-22
fi

# --- d. wasm-opt from the npm binaryen package ----------------------------------------------
WASM_OPT=$TOOLS/binaryen/node_modules/.bin/wasm-opt
have_binaryen=$(node -p "require('$TOOLS/binaryen/node_modules/binaryen/package.json').version" 2>/dev/null || true)
if [ "$have_binaryen" = "$BINARYEN_VERSION" ] && [ -x "$WASM_OPT" ]; then
    log "binaryen $BINARYEN_VERSION present"
else
    command -v npm >/dev/null || apt_install nodejs npm
    log "npm install binaryen@$BINARYEN_VERSION into $TOOLS/binaryen"
    npm install --prefix "$TOOLS/binaryen" "binaryen@$BINARYEN_VERSION" --no-audit --no-fund --no-update-notifier
    "$WASM_OPT" --version
fi

# --- b. wasm-bindgen-cli at the pinned version ----------------------------------------------
wb_ok() {
    [ "$(wasm-bindgen --version 2>/dev/null)" = "wasm-bindgen $WB_VERSION" ] &&
        wasm-bindgen-test-runner --version 2>/dev/null | grep -q " $WB_VERSION\$"
}
if ! wb_ok; then
    # A parallel install (another shell, CI step) would race ours for the same binaries.
    while pgrep -f "cargo install wasm-bindgen-cli" >/dev/null; do
        log "waiting for a running 'cargo install wasm-bindgen-cli' to finish..."
        sleep 20
    done
fi
if wb_ok; then
    log "wasm-bindgen-cli $WB_VERSION present"
else
    # No --locked: its lockfile once named a crate version the registry index lacked.
    log "cargo install wasm-bindgen-cli --version =$WB_VERSION (5-11 min on 2 cores)"
    cargo install wasm-bindgen-cli --version "=$WB_VERSION"
    wb_ok || die "wasm-bindgen on PATH is '$(wasm-bindgen --version 2>&1)', want $WB_VERSION"
fi

# --- e. .tools/env.sh -----------------------------------------------------------------------
# Headless Chromium as root needs --no-sandbox; the networking switches keep it from
# flooding the closed network with refused connections.
cat >"$TOOLS/webdriver.json" <<'EOF'
{
  "goog:chromeOptions": {
    "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage"]
  }
}
EOF
{
    echo '# Written by scripts/setup-toolchain.sh; rerun it instead of editing.'
    echo '_b=${CARGO_HOME:-$HOME/.cargo}/bin'
    echo 'case ":$PATH:" in *":$_b:"*) ;; *) export PATH="$_b:$PATH" ;; esac; unset _b'
    echo '# Rustup toolchain for wasm32 commands only; empty means the default one has the target.'
    echo '# Native builds, clippy and rustfmt keep the default toolchain.'
    printf 'export SYNCHRO_WASM_TOOLCHAIN=%q\n' "$WASM_TOOLCHAIN"
    printf 'export WASM_OPT=%q\n' "$WASM_OPT"
    echo 'export CHROMEDRIVER=/usr/bin/chromedriver'
    echo 'export CC_wasm32_unknown_unknown=clang-22 AR_wasm32_unknown_unknown=llvm-ar-22'
    echo 'export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner'
    printf 'export WASM_BINDGEN_TEST_WEBDRIVER_JSON=%q\n' "$TOOLS/webdriver.json"
    echo 'export WASM_BINDGEN_TEST_TIMEOUT=300'
} >"$TOOLS/env.sh.new"
mv "$TOOLS/env.sh.new" "$TOOLS/env.sh"
log "wrote $TOOLS/env.sh (SYNCHRO_WASM_TOOLCHAIN=${WASM_TOOLCHAIN:-<default>})"
log "done in ${SECONDS}s"
