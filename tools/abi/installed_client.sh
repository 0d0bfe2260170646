#!/usr/bin/env bash
# installed_client.sh STAGE PREFIX -- checks a staged `make install DESTDIR=STAGE PREFIX=PREFIX`:
#   1. the installed libtensordd.so exports only td_ functions (nm -D --defined-only);
#   2. a client built outside the source tree through pkg-config, linked to the installed
#      shared library, runs a session against the installed daemon (started on a Unix
#      socket in a temporary directory, stopped with SIGTERM, which must exit 0);
#   3. the same client links against the installed static library;
#   4. td_version() agrees with the installed header and tensordd.pc's version.
# The client is examples/session.c, copied out of the tree: it uploads, runs ops, checks
# the sum it downloads against its own arithmetic, and expects a typed error back.
set -euo pipefail

STAGE=$1
PREFIX=$2
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LIB=$STAGE$PREFIX/lib
CC=${CC:-cc}
# the build's link flags: under SAN=... the installed libraries need the sanitizer runtimes
LDFLAGS=${LDFLAGS:-}

fail() {
    echo "install: $*" >&2
    exit 1
}

[[ -f $LIB/libtensordd.so ]] || fail "no $LIB/libtensordd.so"
others=$(nm -D --defined-only "$LIB/libtensordd.so" | awk '{print $3}' | grep -v '^td_[a-z0-9]' || true)
[[ -z $others ]] || fail "the installed libtensordd.so exports symbols other than td_*: $(echo "$others" | tr "\n" " " | head -c 300)"
n=$(nm -D --defined-only "$LIB/libtensordd.so" | wc -l)

work=$(mktemp -d "${TMPDIR:-/tmp}/tensordd-client.XXXXXX")
pid=""
cleanup() {
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

cp "$ROOT/examples/session.c" "$work/app.c"
export PKG_CONFIG_PATH=$LIB/pkgconfig PKG_CONFIG_SYSROOT_DIR=$STAGE
(
    cd "$work"
    # shellcheck disable=SC2046,SC2086
    $CC -std=c11 $LDFLAGS app.c $(pkg-config --cflags --libs tensordd) -o app
    # shellcheck disable=SC2046,SC2086
    $CC -std=c11 $LDFLAGS app.c $(pkg-config --cflags tensordd) -L"$LIB" -Wl,-Bstatic -ltensordd \
        -Wl,-Bdynamic $(pkg-config --static --libs-only-l tensordd | sed 's/-ltensordd//') \
        -o app-static
)
# The header, the library and tensordd.pc say the same version.
cat >"$work/version.c" <<'C'
#include <stdio.h>
#include <tensordd.h>
int main(void)
{
    printf("%s\n", td_version_string());
    return td_version() == TD_VERSION_HEX ? 0 : 1;
}
C
# shellcheck disable=SC2046,SC2086
(cd "$work" && $CC -std=c11 $LDFLAGS version.c $(pkg-config --cflags --libs tensordd) -o version)
v=$(LD_LIBRARY_PATH=$LIB "$work/version") || fail "td_version() differs from the header's TD_VERSION_HEX"
[[ $v == "$(pkg-config --modversion tensordd)" ]] ||
    fail "the library says version $v, tensordd.pc $(pkg-config --modversion tensordd)"
# (outputs read whole first: grep -q ending a pipe early would fail it under pipefail)
deps=$(LD_LIBRARY_PATH=$LIB ldd "$work/app")
grep -q "libtensordd.so.* => $LIB/" <<<"$deps" ||
    fail "the client does not load the installed library: $(grep tensordd <<<"$deps")"
syms=$(nm "$work/app-static")
grep -q ' T td_connect$' <<<"$syms" || fail "the static client did not take libtensordd.a"

"$STAGE$PREFIX/bin/tensordd" --listen "unix://$work/sock" >"$work/daemon.out" 2>"$work/daemon.err" &
pid=$!
for _ in $(seq 1 200); do
    [[ -S $work/sock ]] && break
    kill -0 "$pid" 2>/dev/null || fail "the installed daemon exited: $(cat "$work/daemon.err")"
    sleep 0.05
done
[[ -S $work/sock ]] || fail "the installed daemon did not listen within 10 s"
LD_LIBRARY_PATH=$LIB timeout 60 "$work/app" "unix://$work/sock" >"$work/app.out" 2>&1 ||
    fail "the client failed: $(cat "$work/app.out")"
grep -q "session still usable after the error" "$work/app.out" ||
    fail "the client's session did not complete: $(cat "$work/app.out")"
LD_LIBRARY_PATH=$LIB timeout 60 "$work/app-static" "unix://$work/sock" >"$work/static.out" 2>&1 ||
    fail "the static client failed: $(cat "$work/static.out")"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=""
[[ $rc == 0 ]] || fail "the installed daemon exited $rc on SIGTERM"
echo "install: the installed libtensordd.so $v exports $n symbols, all td_; a client built" \
    "outside the tree through pkg-config ran a session against the installed daemon (shared" \
    "and static)"
