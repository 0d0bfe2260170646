#!/usr/bin/env bash
# break.sh -- tools/check_layers.py must fail on what it forbids: in a scratch copy of the
# sources (the built objects linked, never written), each break is made alone and the lint
# must reject it, naming it; the untouched copy must pass.
#   tests/layers/break.sh OBJDIR       (OBJDIR: the built objects, e.g. build/obj)
set -euo pipefail
objdir=$(cd "${1:-build/obj}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-/usr/bin/python3}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/tdd-layers.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

fresh() { # a clean copy of the sources and of the objects' directory tree (hard links)
    rm -rf "$scratch/src" "$scratch/obj"
    mkdir -p "$scratch/src"
    (cd "$root" && cp -r --parents tools daemon backends client/lib client/tdctl \
        client/python/tensordd proto common include "$scratch/src/")
    cp -al "$objdir" "$scratch/obj"
}
lint() { "$PY" "$scratch/src/tools/check_layers.py" --root "$scratch/src" "$scratch/obj"; }
fails=0
expect_fail() { # what, pattern the lint's message must hold
    local out
    if out=$(lint 2>&1); then
        echo "layers-break: the lint passed $1" >&2
        fails=$((fails + 1))
    elif ! grep -q -- "$2" <<<"$out"; then
        echo "layers-break: the lint failed $1 but did not say '$2':" >&2
        echo "$out" >&2
        fails=$((fails + 1))
    else
        echo "layers-break: rejected $1"
    fi
}

fresh
lint >/dev/null || { echo "layers-break: the untouched copy fails the lint" >&2; exit 1; }

# 1. An upward include: a backend including a daemon header (-Idaemon makes it resolve).
sed -i '0,/#include "tensor.h"/s//#include "tensor.h"\n#include "session.h"/' \
    "$scratch/src/backends/tensor.c"
expect_fail "backends/tensor.c including daemon/session.h" \
    "backends/tensor.c:[0-9]* (backends/backend-base) includes daemon/session.h"

# 2. An upward call: common/ calling into the daemon (an object built here, in the
# scratch tree only, calling a function that daemon/log.o defines).
fresh
sym=$(nm -g --defined-only "$objdir/daemon/log.o" | awk '$2 == "T" {print $3; exit}')
printf 'void %s(void);\nvoid td_layers_probe(void);\nvoid td_layers_probe(void) { %s(); }\n' \
    "$sym" "$sym" >"$scratch/src/common/layers_probe.c"
cc -c "$scratch/src/common/layers_probe.c" -o "$scratch/obj/common/layers_probe.o"
expect_fail "common/ calling $sym (daemon/log.c)" \
    "common/layers_probe.c (base/common) calls $sym, defined in daemon/log.c"

# 3. A sideways call between stacks: the client library calling the daemon.
fresh
printf 'void %s(void);\nvoid td_layers_probe(void);\nvoid td_layers_probe(void) { %s(); }\n' \
    "$sym" "$sym" >"$scratch/src/client/lib/layers_probe.c"
cc -c "$scratch/src/client/lib/layers_probe.c" -o "$scratch/obj/client/lib/layers_probe.o"
expect_fail "client/lib calling $sym (daemon/log.c)" \
    "client/lib/layers_probe.c (client/libtensordd) calls $sym"

# 4. An upward call inside the backends: a reference kernel calling the cpu backend's table.
fresh
printf 'struct tdd_opcall;\n_Bool tdd_cpu_native(const struct tdd_opcall *c);\n_Bool td_layers_probe(void);\n_Bool td_layers_probe(void) { return tdd_cpu_native(0); }\n' \
    >"$scratch/src/backends/ref/layers_probe.c"
cc -c "$scratch/src/backends/ref/layers_probe.c" -o "$scratch/obj/backends/ref/layers_probe.o"
expect_fail "backends/ref/ calling tdd_cpu_native (backends/cpu/cpu.c)" \
    "backends/ref/layers_probe.c (backends/ref-kernels) calls tdd_cpu_native, defined in backends/cpu/cpu.c"

# 5. A circle across layers: two daemon layers including each other's headers.
fresh
sed -i '0,/#include "session.h"/s//#include "session.h"\n#include "reply.h"/' \
    "$scratch/src/daemon/wire.h"
expect_fail "daemon/wire.h including daemon/reply.h, whose .c calls wire.c's (a circle)" \
    "a circle across layers: .*daemon/reply.c .*daemon/wire.c"

# 6. A file with no layer.
fresh
echo '/* unplaced.c -- placed nowhere. */' >"$scratch/src/daemon/unplaced.c"
expect_fail "a daemon file with no layer" "daemon/unplaced.c has no layer"

# 7. An upward call inside the daemon: a file of the lowest daemon layer (placed there in
# the scratch copy's layers.txt) calling the request table.
fresh
printf 'struct tdd_conn;\nint tdd_dispatch_check_table(void);\nint td_layers_probe(void);\nint td_layers_probe(void) { return tdd_dispatch_check_table(); }\n' \
    >"$scratch/src/daemon/layers_probe.c"
sed -i 's|^base  *daemon/config.c|& daemon/layers_probe.c|' "$scratch/src/tools/layers.txt"
cc -c "$scratch/src/daemon/layers_probe.c" -o "$scratch/obj/daemon/layers_probe.o"
expect_fail "daemon/ (base) calling tdd_dispatch_check_table (daemon/dispatch.c)" \
    "daemon/layers_probe.c (daemon/base) calls tdd_dispatch_check_table, defined in daemon/dispatch.c"

# 8. An upward include inside the daemon: the sessions including the transport's header.
fresh
sed -i '0,/#include "session.h"/s//#include "session.h"\n#include "server_impl.h"/' \
    "$scratch/src/daemon/session.c"
expect_fail "daemon/session.c including daemon/server_impl.h" \
    "daemon/session.c:[0-9]* (daemon/sessions) includes daemon/server_impl.h"

# 9. An upward call inside the client: libtensordd calling tdctl.
fresh
printf 'void progress_begin(void);\nvoid td_layers_probe(void);\nvoid td_layers_probe(void) { progress_begin(); }\n' \
    >"$scratch/src/client/lib/layers_probe.c"
cc -c "$scratch/src/client/lib/layers_probe.c" -o "$scratch/obj/client/lib/layers_probe.o"
expect_fail "client/lib calling progress_begin (client/tdctl/progress.c)" \
    "client/lib/layers_probe.c (client/libtensordd) calls progress_begin, defined in client/tdctl/progress.c"

# 10. An upward include inside the client: libtensordd including a tdctl header.
fresh
sed -i '0,/#include "internal.h"/s//#include "internal.h"\n#include "..\/tdctl\/npy.h"/' \
    "$scratch/src/client/lib/calls.c"
expect_fail "client/lib/calls.c including client/tdctl/npy.h" \
    "client/lib/calls.c:[0-9]* (client/libtensordd) includes client/tdctl/npy.h"

# 11. A circle across layers in the backends: the rules' helpers (ops_args.c) calling the
# rules' dispatch (ops.c), which calls them. ops_args.c is built again in the scratch tree.
fresh
printf '\nint td_layers_probe(void);\nint td_layers_probe(void) { return tdd_op_prepare(0, NULL, 0, NULL, 0, NULL, NULL, NULL, NULL); }\n' \
    >>"$scratch/src/backends/ops_args.c"
rm "$scratch/obj/backends/ops_args.o" # a hard link to the real object: never written
(cd "$scratch/src" && cc -D_GNU_SOURCE -Iinclude -Iproto -Icommon -Ibackends \
    -I"$(dirname "$objdir")/gen" -std=c11 -c backends/ops_args.c -o "$scratch/obj/backends/ops_args.o")
expect_fail "backends/ops_args.c calling tdd_op_prepare (backends/ops.c), which calls it" \
    "a circle across layers: .*backends/ops.c (backends/rules).*backends/ops_args.c (backends/kits)"

# 12. An upward include inside the backends: the rules' helpers including the header of
# the rule families above them.
fresh
sed -i 's|#include "ops_args.h"|#include "ops_impl.h"|' "$scratch/src/backends/ops_args.c"
expect_fail "backends/ops_args.c including backends/ops_impl.h" \
    "backends/ops_args.c:[0-9]* (backends/kits) includes backends/ops_impl.h"

if ((fails)); then
    echo "layers-break: $fails break(s) not caught" >&2
    exit 1
fi
echo "layers-break: every break fails the lint"
