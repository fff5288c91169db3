#!/usr/bin/env bash
# synchro against Rocicorp Zero 1.9.0 on the same workload, in one command:
#   scripts/bench-vs-zero.sh            env: RUNS=1 ROWS=100000 N_UPDATES=100 BROWSER=1
#                                            ZERO_DIR=../shared/peers/zero (run-zero.sh)
#                                            PARSE_ONLY=1: print the table from the last run's logs
# Each run starts ZERO_DIR/run-zero.sh (its own PostgreSQL 15, zero-cache, Zero's node client)
# and then synchro's items benchmark (tests/examples/items_bench: a throwaway PostgreSQL with
# the same settings, `synchro-server serve` as its own process, the native client, a client
# from a portable seed of the same scope; with
# BROWSER=1 also synchro's client in headless Chromium on OPFS against the same server).
# With RUNS>1 the two sides alternate and the table shows medians. Prints each figure, the
# ratio synchro / Zero, resident memory (from /proc), and the goals of issue 15 as met/not met.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[ -f .tools/env.sh ] || scripts/setup-toolchain.sh
. .tools/env.sh
RUNS=${RUNS:-1}; ROWS=${ROWS:-100000}; N_UPDATES=${N_UPDATES:-100}; BROWSER=${BROWSER:-1}
ZERO_DIR=${ZERO_DIR:-$ROOT/../shared/peers/zero}
[ -x "$ZERO_DIR/run-zero.sh" ] || ZERO_DIR=/work/shared/peers/zero
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$TARGET/bench-vs-zero
PARSE_ONLY=${PARSE_ONLY:-0}
[ "$PARSE_ONLY" = 1 ] || { rm -rf "$OUT"; mkdir -p "$OUT"; }

# PostgreSQL: run-zero.sh's server settings, read from its pg_ctl line, for synchro's cluster
# too (its harness adds full_page_writes=off and its own slot counts: overridden here).
ZERO_PG=$(grep -o -- '-c wal_level=[^"]*' "$ZERO_DIR/run-zero.sh" | sed 's/-c //g')
export SYNCHRO_BENCH_PG_SETTINGS="$ZERO_PG full_page_writes=on"

free_port() { # first port from $1 on with $1..$1+$2-1 all free on loopback
    local p=$1
    while :; do
        local busy=0 i
        for i in $(seq 0 $(($2 - 1))); do ss -ltn | grep -q ":$((p + i)) " && busy=1; done
        [ $busy = 0 ] && { echo $p; return; }
        p=$((p + 10))
    done
}
export PGPORT=${PGPORT:-$(free_port 55432 1)} ZPORT=${ZPORT:-$(free_port 4848 3)}
CONTROL_PORT=$(free_port 8798 1)
export SYNCHRO_BENCH_CONTROL_ADDR=127.0.0.1:$CONTROL_PORT SYNCHRO_ITEMS_CONTROL=http://127.0.0.1:$CONTROL_PORT

if [ "$PARSE_ONLY" != 1 ]; then
echo "=== building (before any measurement)"
cargo build -q --release -p synchro-tests --example items_bench --bin synchro-server-under-test
export SYNCHRO_BENCH_SERVER_BIN=$TARGET/release/synchro-server-under-test
if [ "$BROWSER" = 1 ]; then
    wasm() { if [ -n "${SYNCHRO_WASM_TOOLCHAIN:-}" ]; then RUSTUP_TOOLCHAIN=$SYNCHRO_WASM_TOOLCHAIN cargo "$@"; else cargo "$@"; fi; }
    WASM_TEST=(--release -p synchro-client --features bench --target wasm32-unknown-unknown --test items_browser)
    wasm test -q "${WASM_TEST[@]}" --no-run 2>&1 | grep -v "^ *Executable" || true
    # The server answers no CORS preflight: this Chromium runs without web security (its
    # own throwaway profile from chromedriver); otherwise the repository's flags.
    python3 - "$WASM_BINDGEN_TEST_WEBDRIVER_JSON" "$OUT/webdriver.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["goog:chromeOptions"]["args"].append("--disable-web-security")
json.dump(c, open(sys.argv[2], "w"))
EOF
    printf -v BROWSER_CMD 'cd %q && WASM_BINDGEN_USE_BROWSER=1 WASM_BINDGEN_TEST_TIMEOUT=900 WASM_BINDGEN_TEST_WEBDRIVER_JSON=%q %s test %s -- --nocapture' \
        "$ROOT" "$OUT/webdriver.json" "${SYNCHRO_WASM_TOOLCHAIN:+RUSTUP_TOOLCHAIN=$SYNCHRO_WASM_TOOLCHAIN }cargo" "${WASM_TEST[*]}"
    export SYNCHRO_BENCH_BROWSER_CMD=$BROWSER_CMD
fi
fi

# --- resident memory, sampled from /proc every 0.2 s: a server's process tree (peak of its
# summed PSS, which counts shared pages once; and the sum of each process's VmHWM) and the
# client process (VmHWM).
kb() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/$3" 2>/dev/null || true; }
tree() { ps -e -o pid=,ppid= | awk -v r="$1" '{ p[$1] = $2 } END { s[r] = 1; do { c = 0; for (k in p) if (!(k in s) && (p[k] in s)) { s[k] = 1; c = 1 } } while (c); for (k in s) print k }'; }
sample() { # $1 = pid to watch, $2 = its log, $3 = regex whose trailing number is the server pid,
           # $4 = "self" (the client is $1) or "node" (the first `node client-bench.js` below $1)
    local spid="" peak=0 client="" chwm=0 p v; declare -A hwm=()
    [ "$4" = self ] && client=$1
    while kill -0 "$1" 2>/dev/null; do
        [ -z "$spid" ] && spid=$(grep -m1 -oE "$3" "$2" 2>/dev/null | grep -oE '[0-9]+$' || true)
        if [ -n "$spid" ] && kill -0 "$spid" 2>/dev/null; then
            local sum=0
            for p in $(tree "$spid"); do
                v=$(kb "$p" Pss smaps_rollup); sum=$((sum + ${v:-0}))
                v=$(kb "$p" VmHWM status); [ -n "$v" ] && hwm[$p]=$v
            done
            [ $sum -gt $peak ] && peak=$sum
        fi
        if [ -z "$client" ]; then # the full-table run comes first (the small view follows)
            for p in $(tree "$1"); do
                [ "$(cat /proc/$p/comm 2>/dev/null)" = node ] && grep -q client-bench.js "/proc/$p/cmdline" 2>/dev/null && { client=$p; break; }
            done
        fi
        if [ -n "$client" ]; then v=$(kb "$client" VmHWM status); [ -n "$v" ] && chwm=$v; fi
        sleep 0.2
    done
    local s=0 k; for k in "${!hwm[@]}"; do s=$((s + hwm[$k])); done
    echo "$peak $s ${#hwm[@]} $chwm"
}
rss_line() { # $1 = file from sample, $2 = server's name
    read -r a b c d <"$1"
    echo "  rss (sampled): $2: $c process(es), peak of summed PSS $((a / 1024)) MB (sum of VmHWM $((b / 1024)) MB); client process VmHWM $((d / 1024)) MB"
}

run_zero() {
    local log=$OUT/zero-$1.log
    echo "=== run $1: Zero (run-zero.sh, PGPORT=$PGPORT ZPORT=$ZPORT)"
    RUNS=1 ROWS=$ROWS N_UPDATES=$N_UPDATES bash "$ZERO_DIR/run-zero.sh" >"$log" 2>&1 &
    local pid=$!
    sample $pid "$log" 'zero-cache pid=[0-9]+' node >"$OUT/zero-$1.rss" &
    local spid=$!
    wait $pid || { echo "run-zero.sh failed:"; tail -20 "$log"; exit 1; }
    wait $spid
    grep -vE '^(npm|added|up to date|found|run `npm|  run `npm)' "$log" | sed 's/^/  /'
    rss_line "$OUT/zero-$1.rss" zero-cache
}
run_synchro() {
    local log=$OUT/synchro-$1.log
    echo "=== run $1: synchro (items_bench, PostgreSQL: $SYNCHRO_BENCH_PG_SETTINGS)"
    "$TARGET/release/examples/items_bench" "$ROWS" "$N_UPDATES" >"$log" 2>&1 &
    local pid=$!
    sample $pid "$log" 'capture worker, pid [0-9]+' self >"$OUT/synchro-$1.rss" &
    local spid=$!
    wait $pid || { echo "items_bench failed:"; tail -20 "$log"; exit 1; }
    wait $spid
    sed 's/^/  /' "$log"
    rss_line "$OUT/synchro-$1.rss" "synchro-server serve"
}
[ "$PARSE_ONLY" = 1 ] || for r in $(seq "$RUNS"); do run_zero "$r"; run_synchro "$r"; done

# --- parsing: one value per run and side, then medians
num() { grep -m1 -oE "$2" "$1" | grep -oE '[0-9][0-9,]*(\.[0-9]+)?' | head -1 | tr -d , ; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
zero_section() { sed -n '/^--- run 1/,/^--- latency with a small view/p' "$1"; }
declare -A S Z
collect() { # name side command...
    local name=$1 side=$2; shift 2
    local vals="" r v
    for r in $(seq "$RUNS"); do v=$("$@" "$r"); [ -n "$v" ] && vals+="$v"$'\n'; done
    local m; m=$(printf '%s' "$vals" | median)
    if [ "$side" = s ]; then S[$name]=$m; else Z[$name]=$m; fi
}
s_fresh() { num "$OUT/synchro-$1.log" '^\(a\) fresh client fully synced and verified: [0-9.]+ s'; }
s_seed() { num "$OUT/synchro-$1.log" '^\(s\) fresh client from a seed: [0-9.]+ s'; }
s_bseed() { num "$OUT/synchro-$1.log" '^browser \(s\) fresh client from a seed: [0-9.]+ s'; }
s_export() { grep -m1 '^seed export:' "$OUT/synchro-$1.log" | grep -oE '= [0-9]+ rows/s' | head -1 | grep -oE '[0-9]+'; }
s_p50() { grep -m1 '^(b) commit-to-visible' "$OUT/synchro-$1.log" | grep -oE 'p50 [0-9.]+' | grep -oE '[0-9.]+$'; }
s_p99() { grep -m1 '^(b) commit-to-visible' "$OUT/synchro-$1.log" | grep -oE 'p99 [0-9.]+' | grep -oE '[0-9.]+$'; }
s_copy() { num "$OUT/synchro-$1.log" 'membership evaluated\): [0-9.]+ s'; }
s_live() { num "$OUT/synchro-$1.log" 'membership rule live after [0-9.]+ s'; }
s_push() { num "$OUT/synchro-$1.log" '= [0-9.]+ mutations/s'; }
s_srss() { awk '{ printf "%.0f\n", $1 / 1024 }' "$OUT/synchro-$1.rss"; }
s_crss() { grep -m1 '^rss client (' "$OUT/synchro-$1.log" | grep -oE 'peak [0-9]+' | grep -oE '[0-9]+$'; }
s_bfresh() { num "$OUT/synchro-$1.log" '^browser \(a\) fresh client fully synced and verified: [0-9.]+ s'; }
s_bp50() { grep -m1 '^browser (b)' "$OUT/synchro-$1.log" | grep -oE 'p50 [0-9.]+' | grep -oE '[0-9.]+$'; }
s_bp99() { grep -m1 '^browser (b)' "$OUT/synchro-$1.log" | grep -oE 'p99 [0-9.]+' | grep -oE '[0-9.]+$'; }
s_brss() { grep -m1 '^browser rss after (a)' "$OUT/synchro-$1.log" | grep -oE 'summed PSS [0-9]+' | grep -oE '[0-9]+$'; }
z_fresh() { zero_section "$OUT/zero-$1.log" | grep -m1 -oE '^INITIAL_SYNC .*total_ms=[0-9.]+' | grep -oE '[0-9.]+$' | awk '{ print $1 / 1000 }'; }
z_lat() { zero_section "$OUT/zero-$1.log" | grep -m1 '^LATENCY commitAck->client' | grep -oE "$2=[0-9.]+" | grep -oE '[0-9.]+$'; }
z_p50() { z_lat "$1" p50; }
z_p99() { z_lat "$1" p99; }
z_copy() { grep -m1 -oE '^Synced .*total: [0-9.]+ ms' "$OUT/zero-$1.log" | grep -oE '[0-9.]+ ms$' | awk '{ print $1 / 1000 }'; }
z_srss() { awk '{ printf "%.0f\n", $1 / 1024 }' "$OUT/zero-$1.rss"; }
z_crss() { awk '{ printf "%.0f\n", $4 / 1024 }' "$OUT/zero-$1.rss"; }
for f in fresh seed bseed export p50 p99 copy live push srss crss bfresh bp50 bp99 brss; do collect $f s s_$f; done
for f in fresh p50 p99 copy srss crss; do collect $f z z_$f; done

ratio() { if [ -n "${1:-}" ] && [ -n "${2:-}" ]; then awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "—" }'; else echo "—"; fi; }
fmt() { if [ -n "${2:-}" ]; then awk -v v="$2" -v f="$1" 'BEGIN { printf f, v }'; else echo "—"; fi; }
row() { # label format synchro zero
    printf '| %s | %s | %s | %s |\n' "$1" "$(fmt "$2" "${3:-}")" "$(fmt "$2" "${4:-}")" "$(ratio "${3:-}" "${4:-}")"
}
goal() { # label figure limit
    local r; r=$(ratio "${S[$2]:-}" "${Z[$2]:-}"); r=${r%x}
    if [ "$r" = "—" ]; then echo "- $1: not measured"; return; fi
    awk -v r="$r" -v l="$3" -v t="$1" 'BEGIN { printf "- %s: %.2fx → %s\n", t, r, (r <= l ? "met" : "not met") }'
}
echo
echo "=== synchro vs Zero 1.9.0 ($ROWS rows, $N_UPDATES single-row updates; median of $RUNS run(s), sides alternating; $(nproc) cores)"
echo "PostgreSQL for both: $SYNCHRO_BENCH_PG_SETTINGS (synchronous_commit default on; synchro's as shown by SHOW in its log)"
echo
echo "| figure | synchro | Zero | synchro/Zero |"
echo "|---|---|---|---|"
row "fresh client fully synced, $ROWS rows (s; synchro verified; Zero: node, in-memory store)" %.2f "${S[fresh]}" "${Z[fresh]}"
row "fresh client from a portable seed, $ROWS rows (s; download, verification, install, first connect and pull; Zero: its fresh sync, it has no seed)" %.2f "${S[seed]}" "${Z[fresh]}"
row "commit → visible in the client, p50 (ms)" %.1f "${S[p50]}" "${Z[p50]}"
row "commit → visible in the client, p99 (ms)" %.1f "${S[p99]}" "${Z[p99]}"
row "server initial copy of the $ROWS rows (s; synchro: registration → active; Zero: its \"Synced … total\")" %.2f "${S[copy]}" "${Z[copy]}"
row "server: registration → its membership rule live (s; synchro.membership_functions.live; Zero: the same \"Synced … total\")" %.2f "${S[live]}" "${Z[copy]}"
printf '| pushed mutations/s | %s | — | — |\n' "${S[push]:-—}"
printf '| seed export of the %s rows (rows/s; `seed export` whole: export, artifact, every check) | %s | — | — |\n' "$ROWS" "${S[export]:-—}"
row "server memory, peak of the process tree's summed PSS (MB; sampled every 0.2 s; synchro: serve; Zero: zero-cache)" %.0f "${S[srss]}" "${Z[srss]}"
row "client process peak RSS (MB; VmHWM; synchro: native clients + bench driver; Zero: node client)" %.0f "${S[crss]}" "${Z[crss]}"
if [ "$BROWSER" = 1 ]; then
    row "Chromium/OPFS: fresh client fully synced (s; Zero: its node client, no browser run)" %.2f "${S[bfresh]}" "${Z[fresh]}"
    row "Chromium/OPFS: fresh client from a portable seed (s; Zero: its node client's fresh sync)" %.2f "${S[bseed]}" "${Z[fresh]}"
    row "Chromium/OPFS: commit → visible p50 (ms; Zero: node client)" %.1f "${S[bp50]}" "${Z[p50]}"
    row "Chromium/OPFS: commit → visible p99 (ms; Zero: node client)" %.1f "${S[bp99]}" "${Z[p99]}"
    printf '| Chromium processes, summed PSS after the fresh sync (MB) | %s | — | — |\n' "${S[brss]:-—}"
fi
echo
echo "goals (issue 15):"
goal "commit → visible p50 ≤ 0.5x Zero" p50 0.5
goal "commit → visible p99 ≤ 0.5x Zero" p99 0.5
goal "fresh client ≤ 0.2x Zero" fresh 0.2
goal "initial copy ≤ 1.0x Zero" copy 1.0
echo "goals (issue 30):"
S[bfresh_seed]=${S[bseed]:-}; S[fresh_seed]=${S[seed]:-}; Z[bfresh_seed]=${Z[fresh]:-}; Z[fresh_seed]=${Z[fresh]:-}
goal "fresh client from a seed, native ≤ 0.1x Zero's fresh sync" fresh_seed 0.1
goal "fresh client from a seed, Chromium ≤ 0.25x Zero's fresh sync" bfresh_seed 0.25
if [ -n "${S[export]:-}" ]; then
    awk -v r="${S[export]}" 'BEGIN { printf "- seed export ≥ 100,000 rows/s: %.0f rows/s → %s\n", r, (r >= 100000 ? "met" : "not met") }'
else
    echo "- seed export ≥ 100,000 rows/s: not measured"
fi
echo "logs: $OUT"
