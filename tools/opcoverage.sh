#!/bin/sh
# opcoverage.sh -- builds tools/opcoverage and regenerates docs/ops.md.
# usage: tools/opcoverage.sh [BUILD_DIR]   (default build/ops)
set -e
B=${1:-build/ops}
mkdir -p "$B"
${CC:-cc} -std=c11 -O2 -D_GNU_SOURCE -Iclient -Iproto -Ibackends $(pkg-config --cflags openblas 2>/dev/null) \
    -fopenmp tools/opcoverage.c tests/unit/test_conformance_cases.c backends/tensor.c backends/ops*.c \
    backends/ref/*.c backends/cpu/*.c backends/cuda/none.c common/errors.c \
    $(pkg-config --libs openblas 2>/dev/null || echo -lopenblas) -lm -o "$B/opcoverage"
"$B/opcoverage" > docs/ops.md
echo "docs/ops.md regenerated"
