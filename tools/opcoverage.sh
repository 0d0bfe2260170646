#!/bin/sh
# opcoverage.sh -- regenerates docs/ops.md from the op table (same as `make docs`).
exec make --no-print-directory docs "$@"
