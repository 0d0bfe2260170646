# tensordd -- one entry point: deps, all, run, test, bench, format, clean.
#
#   make            build everything into build/
#   make run        install what is missing, build, run a real session over the wire
#   make test       install what is missing, build, run every suite
#   make SAN=address,undefined test    the same under sanitizers (output in build/san/)
#   make SAN=thread test               under ThreadSanitizer (build/tsan/)

SHELL := /bin/bash
PY ?= /usr/bin/python3
SAN ?=
WERROR ?= 1

# V=1 shows the full commands.
ifeq ($(V),1)
Q :=
else
Q := @
endif

ifeq ($(SAN),)
BUILD ?= build
else ifeq ($(SAN),thread)
BUILD ?= build/tsan
else
BUILD ?= build/san
endif

# The cpu backend's threads are its own team (backends/cpu/cpu_threads.c); its loops carry
# only `omp simd` hints, which -fopenmp-simd honours without the OpenMP runtime (nothing
# spins between kernels, and ThreadSanitizer sees only the daemon's own threading).
OMP := -fopenmp-simd
ifeq ($(SAN),thread)
export TSAN_OPTIONS ?= halt_on_error=1 second_deadlock_stack=1
endif

# Debian packages the project needs; `make deps` installs the missing ones.
APT_PKGS := build-essential pkg-config libuv1-dev libprotobuf-c-dev protobuf-c-compiler \
            protobuf-compiler libopenblas-dev check uthash-dev libsubunit-dev python3 python3-numpy \
            python3-protobuf python3-pytest python3-sklearn python3-torch python3-torchvision procps \
            libinih-dev libmicrohttpd-dev libsystemd-dev curl systemd python3-yaml \
            libssl-dev openssl python3-dev g++ libgloo-dev iproute2 groff-base

CC ?= cc
PKGS := libuv libprotobuf-c check
OPENBLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
OPENBLAS_LIBS := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)

WARN := -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 \
        -Wconversion -Wvla -Wundef
ifeq ($(WERROR),1)
WARN += -Werror
endif
OPT ?= -O2 -g
CPPFLAGS := -D_GNU_SOURCE -Iinclude -Iproto -Icommon -Ibackends -Idaemon -I$(BUILD)/gen $(OPENBLAS_CFLAGS)
CFLAGS := -std=c11 $(OPT) -fPIC -pthread $(WARN)
LDFLAGS := -pthread
ifneq ($(SAN),)
CFLAGS += -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SAN)
# ASan's default 256 MiB quarantine of freed memory would read as a leak to the
# tests that bound the daemon's RSS; a small one still catches use-after-free.
export ASAN_OPTIONS ?= quarantine_size_mb=16
export UBSAN_OPTIONS ?= print_stacktrace=1
endif

# CUDA: compiled and linked when nvcc and the CUDA runtime (header and static library)
# are found; the daemon still starts without a driver. cuBLAS is opened at run time, so
# its header is optional (backends/cuda/cublas_abi.h declares what is called without it).
# Toolkits are installed in pieces: each piece is probed, and what is missing is said.
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifneq ($(NVCC),)
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_MISSING := $(foreach f,include/cuda_runtime_api.h lib64/libcudart_static.a,\
                  $(if $(wildcard $(CUDA_HOME)/$(f)),,$(CUDA_HOME)/$(f)))
endif
NVCC_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 \
             -gencode arch=compute_90,code=compute_90
# Goals that build nothing need no probe.
ifneq ($(MAKECMDGOALS),)
ifeq ($(filter-out clean deps format lint,$(MAKECMDGOALS)),)
CUDA_SKIP_PROBE := 1
endif
endif
ifneq ($(NVCC),)
ifeq ($(strip $(CUDA_MISSING)),)
ifeq ($(CUDA_SKIP_PROBE),)
CUDA_PROBE := $(shell CC="$(CC)" sh tools/cuda_probe.sh "$(NVCC)" "$(CUDA_HOME)" "$(BUILD)" $(NVCC_ARCH))
endif
endif
endif
ifeq ($(CUDA_PROBE),ok)
HAVE_CUDA := 1
HAVE_CUBLAS_H := $(if $(wildcard $(CUDA_HOME)/include/cublas_v2.h),1,0)
HAVE_CUBLAS_LIB := $(if $(wildcard $(CUDA_HOME)/lib64/libcublas.so),1,0)
CUDA_CPPFLAGS := -DTDD_HAVE_CUDA=1 -DTDD_HAVE_CUBLAS_H=$(HAVE_CUBLAS_H) -I$(CUDA_HOME)/include \
                 -DTDD_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"'
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
else
HAVE_CUDA := 0
ifeq ($(NVCC),)
CUDA_WHY := no nvcc on PATH or in /usr/local/cuda/bin
else ifneq ($(strip $(CUDA_MISSING)),)
CUDA_WHY := nvcc at $(NVCC) but the CUDA runtime is incomplete (missing: $(strip $(CUDA_MISSING)))
else
CUDA_WHY := $(CUDA_PROBE)
endif
endif

GEN := $(BUILD)/gen/tensordd.pb-c.c $(BUILD)/gen/tensordd.pb-c.h
# The Python client's generated module goes to the build directory, never the source tree:
# from the tree, PYTHONPATH=client/python:$(BUILD)/python (the package also finds build/python).
PYGEN := $(BUILD)/python/tensordd/tensordd_pb2.py
# Every field's key, for the fast codec (proto/wirecodec.h, compiled into the daemon, libtensordd
# and the Python accelerator) and the Python client's _codec.py: generated from the .proto by
# tools/gen_wire_keys.py.
KEYS_H := $(BUILD)/gen/tensordd_keys.h
KEYS_PY := $(BUILD)/python/tensordd/_wire_keys.py
PYGEN += $(KEYS_PY)

COMMON_SRC := proto/frame.c proto/utf8.c $(wildcard common/*.c)
BACKEND_SRC := backends/tensor.c backends/ops.c backends/pool.c $(wildcard backends/ops_*.c) \
               $(wildcard backends/ref/*.c) $(wildcard backends/cpu/*.c) \
               $(wildcard backends/sim/*.c)
ifeq ($(HAVE_CUDA),1)
BACKEND_SRC += $(filter-out backends/cuda/none.c,$(wildcard backends/cuda/*.c))
CUDA_CU := $(wildcard backends/cuda/*.cu)
else ifeq ($(TDD_EMU),1)
# `make emu` (backends/cuda/emu/emu.mk): the cuda backend on the host compilers' emulator
BACKEND_SRC += $(filter-out backends/cuda/none.c,$(wildcard backends/cuda/*.c))
EMU_OBJ := $(patsubst %.cu,$(BUILD)/obj/%.emu.o,$(wildcard backends/cuda/*.cu)) \
           $(BUILD)/obj/backends/cuda/emu/runtime.emu.o
else
BACKEND_SRC += backends/cuda/none.c
endif
DAEMON_SRC := $(filter-out daemon/main.c,$(wildcard daemon/*.c))
CLIENT_SRC := $(wildcard client/lib/*.c)
TDCTL_SRC := $(wildcard client/tdctl/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
GEN_OBJ := $(BUILD)/obj/gen/tensordd.pb-c.o
COMMON_OBJ := $(call obj,$(COMMON_SRC)) $(GEN_OBJ)
BACKEND_OBJ := $(call obj,$(BACKEND_SRC)) $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CUDA_CU)) $(EMU_OBJ)
DAEMON_OBJ := $(call obj,$(DAEMON_SRC))
CLIENT_OBJ := $(call obj,$(CLIENT_SRC))

# OpenSSL: the daemon's tls:// listeners and libtensordd's tls:// endpoints
TLS_LIBS := $(shell pkg-config --libs openssl 2>/dev/null || echo -lssl -lcrypto)
DAEMON_LIBS := $(shell pkg-config --libs libuv libprotobuf-c inih libmicrohttpd libsystemd 2>/dev/null) \
               $(OPENBLAS_LIBS) $(TLS_LIBS) \
               $(OMP) -lm $(CUDA_LIBS)
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)
include daemon/gloo.mk

TARGETS := $(BUILD)/tensordd $(BUILD)/libtensordd.so $(BUILD)/libtensordd.a $(BUILD)/tdctl \
           $(BUILD)/tensordd.pc client/python/tensordd/_version.py $(PYGEN) $(patsubst %.c,$(BUILD)/%,$(wildcard examples/*.c))

.PHONY: all deps run test test-unit test-integration test-python test-fuzz test-rss test-docs docs \
        install test-install test-gpu-build fuzz \
        bench clean format \
        lint check-deps check-layers test-layers test-wire-keys
.DEFAULT_GOAL := all

all: $(TARGETS)
ifneq ($(CUDA_WHY),)
	@echo "  note     cuda backend not built: $(CUDA_WHY)"
endif

# ---------------------------------------------------------------- deps
deps:
	@missing=""; for p in $(APT_PKGS); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	    echo "deps: installing$$missing"; \
	    if [ "$$(id -u)" != 0 ]; then echo "deps: need root to apt-get install:$$missing" >&2; exit 1; fi; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    (apt-get install -y -q --no-install-recommends $$missing || \
	     (apt-get update -q && apt-get install -y -q --no-install-recommends $$missing)) >$(or $(TMPDIR),/tmp)/tensordd-deps.log 2>&1 \
	     || { tail -20 $(or $(TMPDIR),/tmp)/tensordd-deps.log; exit 1; }; \
	else echo "deps: all installed"; fi

# ---------------------------------------------------------------- generated code
$(BUILD)/gen/tensordd.pb-c.c $(BUILD)/gen/tensordd.pb-c.h: proto/tensordd.proto
	@mkdir -p $(BUILD)/gen
	@echo "  PROTOC-C $<"
	$(Q)protoc-c --c_out=$(BUILD)/gen -Iproto $<

# (with the keys' module: the package imports both)
$(BUILD)/python/tensordd/tensordd_pb2.py: proto/tensordd.proto | $(KEYS_PY)
	@mkdir -p $(dir $@)
	@echo "  PROTOC   $@"
	$(Q)protoc --python_out=$(dir $@) -Iproto $<

$(KEYS_H) $(KEYS_PY) &: proto/tensordd.proto tools/gen_wire_keys.py
	@mkdir -p $(BUILD)/gen $(dir $(KEYS_PY))
	@echo "  GEN      $(KEYS_H) $(KEYS_PY)"
	$(Q)$(PY) tools/gen_wire_keys.py $< --c $(KEYS_H) --py $(KEYS_PY)
	$(Q)touch $(KEYS_H) $(KEYS_PY)

# generated code is not ours to warn about
$(GEN_OBJ): $(BUILD)/gen/tensordd.pb-c.c
	@mkdir -p $(dir $@)
	@echo "  CC       $<"
	$(Q)$(CC) $(CPPFLAGS) -std=c11 $(OPT) -fPIC $(filter -fsanitize=%,$(CFLAGS)) -c $< -o $@

# (the keys' header: order-only, as the files that include it depend on it through their .d)
$(BUILD)/obj/%.o: %.c $(BUILD)/gen/tensordd.pb-c.h | $(KEYS_H)
	@mkdir -p $(dir $@)
	@echo "  CC       $<"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(call obj,$(wildcard backends/cpu/*.c)): CFLAGS += $(OMP) -O3
$(call obj,$(wildcard backends/cuda/*.c) daemon/main.c daemon/device.c): CPPFLAGS += $(CUDA_CPPFLAGS)

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	@echo "  NVCC     $<"
	$(Q)$(NVCC) -O2 -std=c++17 -Xcompiler -fPIC $(NVCC_ARCH) -Iinclude -Iproto -Ibackends -c $< -o $@

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# ---------------------------------------------------------------- products
$(BUILD)/tensordd: $(call obj,daemon/main.c) $(DAEMON_OBJ) $(BACKEND_OBJ) $(COMMON_OBJ)
	@echo "  LINK     $@"
	$(Q)$(CC) $(LDFLAGS) $^ $(DAEMON_LIBS) -o $@

$(BUILD)/libtensordd.a: $(CLIENT_OBJ) $(COMMON_OBJ)
	@echo "  AR       $@"
	$(Q)rm -f $@ && ar rcs $@ $^

# The soname's number: bumped on an incompatible change of the library's interface
# (tools/abi/libtensordd.symbols says how that is noticed). The version script exports
# the headers' td_ functions and nothing else.
TD_SOVERSION := 0
$(BUILD)/libtensordd.so: $(CLIENT_OBJ) $(COMMON_OBJ) client/lib/libtensordd.map
	@echo "  LINK     $@"
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,libtensordd.so.$(TD_SOVERSION) \
	    -Wl,--version-script=client/lib/libtensordd.map $(filter %.o,$^) \
	    $(shell pkg-config --libs libprotobuf-c) $(TLS_LIBS) -o $@

$(BUILD)/tdctl: $(call obj,$(TDCTL_SRC)) $(BUILD)/libtensordd.a
	@echo "  LINK     $@"
	$(Q)$(CC) $(LDFLAGS) $^ $(shell pkg-config --libs libprotobuf-c) $(TLS_LIBS) -lm -o $@

PREFIX ?= /usr/local
INCLUDEDIR ?= $(PREFIX)/include
# tensordd.pc for PREFIX, LIBDIR and INCLUDEDIR: `make install` writes it again for the
# ones it installs to (a PREFIX given to install alone must reach it).
PC_SED = -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
         -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' -e 's|@VERSION@|$(TD_LIB_VERSION)|g'
$(BUILD)/tensordd.pc: client/tensordd.pc.in include/tensordd.h
	$(Q)sed $(PC_SED) $< > $@

# The Python client's version, written from the header's (the project's one version).
client/python/tensordd/_version.py: include/tensordd.h
	$(Q)sed -i 's/^__version__ = .*/__version__ = "$(TD_LIB_VERSION)"/' $@

# ---------------------------------------------------------------- tests
UNIT_SRC := $(wildcard tests/unit/*.c)
INTEG_SRC := $(wildcard tests/integration/*.c)
TEST_SUPPORT := $(call obj,$(wildcard tests/support/*.c))

# test_wire.c checks libtensordd's side of the fast codec against protobuf-c too (it needs
# nothing else of the client library).
$(BUILD)/tests/unit: $(call obj,$(UNIT_SRC)) $(DAEMON_OBJ) $(BACKEND_OBJ) $(COMMON_OBJ) \
                     $(call obj,client/lib/wire.c)
	@mkdir -p $(dir $@)
	@echo "  LINK     $@"
	$(Q)$(CC) $(LDFLAGS) $^ $(DAEMON_LIBS) $(CHECK_LIBS) -o $@

# The wire suite (test_ops_wire.c) runs the conformance table, whose shape rules come
# from the backends' op table; common/ comes from libtensordd.a only, so once.
$(BUILD)/tests/integration: $(call obj,$(INTEG_SRC)) $(TEST_SUPPORT) \
                            $(call obj,tests/unit/test_conformance_cases.c) $(BACKEND_OBJ) \
                            $(BUILD)/libtensordd.a
	@mkdir -p $(dir $@)
	@echo "  LINK     $@"
	$(Q)$(CC) $(LDFLAGS) $^ $(DAEMON_LIBS) $(CHECK_LIBS) -o $@

$(BUILD)/tests/fuzz_replay: tests/fuzz/fuzz_frame.c $(DAEMON_OBJ) $(BACKEND_OBJ) $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	@echo "  LINK     $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -DTDD_FUZZ_REPLAY $^ $(DAEMON_LIBS) -o $@

# `make fuzz`: libFuzzer (clang) on the whole request path for FUZZ_SECONDS, with ASan and
# UBSan, starting from the committed corpus. New inputs land in build/fuzz/corpus; a crash
# is written to build/fuzz/ and should be added to tests/fuzz/corpus with its fix.
FUZZ_SECONDS ?= 120
FUZZ_PKGS := clang libclang-rt-14-dev libomp-dev
$(BUILD)/tests/fuzz_target: tests/fuzz/fuzz_frame.c $(DAEMON_OBJ) $(BACKEND_OBJ) $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	@echo "  LINK     $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -fsanitize=fuzzer $^ $(DAEMON_LIBS) -o $@

fuzz:
	@$(MAKE) --no-print-directory deps APT_PKGS="$(FUZZ_PKGS)"
	@$(MAKE) --no-print-directory BUILD=build/fuzz CC=clang CXX=clang++ SAN=address,undefined WERROR=0 \
	    OPT="-O1 -g -fsanitize=fuzzer-no-link" NVCC= build/fuzz/tests/fuzz_target
	@mkdir -p build/fuzz/corpus
	cd build/fuzz && ASAN_OPTIONS=quarantine_size_mb=16:detect_leaks=1 ./tests/fuzz_target \
	    -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=30 -rss_limit_mb=4096 \
	    corpus $(abspath tests/fuzz/corpus)

BENCH_BINS := $(patsubst bench/%.c,$(BUILD)/bench/%,$(filter-out bench/gpu_check.c,$(wildcard bench/*.c)))

$(BUILD)/bench/%: bench/%.c $(BUILD)/libtensordd.a
	@mkdir -p $(dir $@)
	@echo "  LINK     $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $^ $(shell pkg-config --libs libprotobuf-c) $(TLS_LIBS) -lm -o $@

$(BUILD)/examples/%: examples/%.c $(BUILD)/libtensordd.a
	@mkdir -p $(dir $@)
	@echo "  LINK     $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $^ $(shell pkg-config --libs libprotobuf-c) $(TLS_LIBS) -o $@

# The op-coverage table is generated from the op table, never written by hand.
$(BUILD)/tools/opcoverage: tools/opcoverage.c tests/unit/test_conformance_cases.c $(BACKEND_OBJ) \
                           $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	@echo "  LINK     $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $^ $(DAEMON_LIBS) -o $@

# docs/ops.md comes from the emulated build (`make emu` builds its opcoverage), whose cuda
# column is the same on every machine; the PyTorch comparison's counts are the line
# tests/python/ops/test_opinfo.py holds them to.
OPINFO_COUNTS := tests/python/ops/opinfo_counts.txt
docs: emu $(BUILD)/tensordd
	$(EMU_BUILD)/tools/opcoverage $(OPINFO_COUNTS) > docs/ops.md
	@echo "docs/ops.md regenerated"
	$(PY) tools/man/genman.py options-md $(BUILD)/tensordd > docs/options.md
	@echo "docs/options.md regenerated"

# docs/torch_coverage.md: the torch device's aten op table (tests/python/torch_device/test_torch_device.py
# checks it).
.PHONY: docs-torch
docs-torch: $(PYGEN) $(TORCH_GUARD)
	PYTHONPATH=client/python:$(BUILD)/python $(PY) -m tensordd.torch --doc > docs/torch_coverage.md
	@echo "docs/torch_coverage.md regenerated"

# Fails when docs/ops.md no longer matches the op table (or the recorded counts), or
# docs/options.md the daemon's option table.
test-docs: emu $(BUILD)/tensordd
	@$(EMU_BUILD)/tools/opcoverage $(OPINFO_COUNTS) > $(EMU_BUILD)/ops.md.new
	@if diff -q docs/ops.md $(EMU_BUILD)/ops.md.new >/dev/null; then \
	    echo "docs: docs/ops.md matches the op table"; \
	else echo "docs: docs/ops.md is stale: run 'make docs'" >&2; exit 1; fi
	@$(PY) tools/man/genman.py options-md $(BUILD)/tensordd > $(BUILD)/options.md.new
	@if diff -q docs/options.md $(BUILD)/options.md.new >/dev/null; then \
	    echo "docs: docs/options.md matches the option table"; \
	else echo "docs: docs/options.md is stale: run 'make docs'" >&2; exit 1; fi

# bench/ops also times the cpu backend in-process.
$(BUILD)/bench/ops: bench/ops.c $(BACKEND_OBJ) $(BUILD)/libtensordd.a
	@mkdir -p $(dir $@)
	@echo "  LINK     $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $^ $(DAEMON_LIBS) -o $@

test: deps
	@$(MAKE) --no-print-directory all $(BUILD)/tests/unit $(BUILD)/tests/integration $(BENCH_BINS)
	@$(MAKE) --no-print-directory test-unit test-integration test-rss test-fuzz test-docs test-install \
	    test-gpu-build test-python test-emu test-abi test-protocol-doc test-deploy test-layers \
	    test-wire-keys
	@$(MAKE) --no-print-directory check-layers

test-rss: $(BUILD)/tensordd $(BUILD)/bench/transfer
ifeq ($(SAN),thread)
	@echo "rss: not measured under ThreadSanitizer (its shadow memory is several times the heap)"
else
	@BUILD=$(BUILD) bash tests/rss_check.sh
endif

test-unit: $(BUILD)/tests/unit
	CK_DEFAULT_TIMEOUT=120 $(BUILD)/tests/unit

test-integration: $(BUILD)/tests/integration $(BUILD)/tensordd
	CK_DEFAULT_TIMEOUT=300 TDD_BIN=$(BUILD)/tensordd $(BUILD)/tests/integration

test-fuzz:
	@if [ -f tests/fuzz/fuzz_frame.c ]; then \
	    $(MAKE) --no-print-directory $(BUILD)/tests/fuzz_replay && \
	    $(BUILD)/tests/fuzz_replay tests/fuzz/corpus/*; \
	else echo "fuzz: no targets yet"; fi

test-python: $(BUILD)/tensordd $(BUILD)/tdctl $(PYGEN)
	@if ls tests/python/*/test_*.py >/dev/null 2>&1; then \
	    TDD_BIN=$(BUILD)/tensordd TDCTL_BIN=$(BUILD)/tdctl PYTHONPATH=client/python:$(BUILD)/python \
	        $(PY) -m pytest -q -rs -p no:cacheprovider tests/python; \
	else echo "python: no tests yet"; fi

include backends/cuda/emu/emu.mk
include tests/fuzz/fuzz.mk
include tools/dist.mk
include tests/leakcheck/leakcheck.mk
include client/python/speedups.mk
include bench/bench.mk

# ---------------------------------------------------------------- run
run: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) PY=$(PY) bash examples/run.sh

bench: all $(BENCH_BINS)
	@BUILD=$(BUILD) PY=$(PY) bash bench/run.sh $(BENCH_ARGS)

# ---------------------------------------------------------------- install
# make install [PREFIX=/usr/local] [DESTDIR=/staging]
LIBDIR ?= $(PREFIX)/lib
PYDIR ?= $(shell $(PY) -c 'import sys; print("$(PREFIX)/lib/python%d.%d/dist-packages" % sys.version_info[:2])')

install: all man
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR) \
	    $(DESTDIR)$(PYDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man3 $(DESTDIR)$(MANDIR)/man8
	install -m 755 $(BUILD)/tensordd $(BUILD)/tdctl $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(BUILD)/libtensordd.a $(DESTDIR)$(LIBDIR)/
	install -m 755 $(BUILD)/libtensordd.so $(DESTDIR)$(LIBDIR)/libtensordd.so.$(TD_SOVERSION)
	ln -sf libtensordd.so.$(TD_SOVERSION) $(DESTDIR)$(LIBDIR)/libtensordd.so
	install -m 644 $(BUILD)/man/tensordd.8 $(DESTDIR)$(MANDIR)/man8/
	install -m 644 $(BUILD)/man/tdctl.1 $(DESTDIR)$(MANDIR)/man1/
	install -m 644 $(BUILD)/man/libtensordd.3 $(DESTDIR)$(MANDIR)/man3/
	install -m 644 include/tensordd.h include/td_attr.h include/td_dtype.h include/td_error.h \
	    $(DESTDIR)$(INCLUDEDIR)/
	sed $(PC_SED) client/tensordd.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/tensordd.pc
	@# the Python package is built as a wheel (pyproject.toml: setuptools, offline; tensordd_pb2
	@# generated into the build directory) and installed with its metadata
	$(PY) -m pip install -q --no-input --no-deps --no-index --no-compile --upgrade --root-user-action=ignore \
	    --target $(DESTDIR)$(PYDIR) ./client/python
	rm -rf client/python/build client/python/tensordd.egg-info
	@echo "installed under $(DESTDIR)$(PREFIX); systemd unit: deploy/tensordd.service"
	@echo "  C:      PKG_CONFIG_PATH=$(LIBDIR)/pkgconfig cc app.c \$$(pkg-config --cflags --libs tensordd)"
	@echo "          (and LD_LIBRARY_PATH=$(LIBDIR) to run it, unless the loader searches there)"
	@echo "  Python: the package tensordd is in $(PYDIR):"
	@echo "          PYTHONPATH=$(PYDIR) python3 -m tensordd --version"

# The GPU check can only run on a GPU machine, but it must always build: a link
# that broke here would be found only when a GPU is finally lent.
# The cuda backend must also build where cuBLAS's header is missing (cublas_abi.h's own
# declarations): checked here against the same source whenever the header is present.
test-gpu-build: $(BUILD)/libtensordd.a
	@if [ "$(HAVE_CUDA)$(HAVE_CUBLAS_H)" = 11 ]; then \
	    $(CC) $(CPPFLAGS) $(CUDA_CPPFLAGS) -UTDD_HAVE_CUBLAS_H -DTDD_HAVE_CUBLAS_H=0 $(CFLAGS) \
	        -fsyntax-only backends/cuda/cuda.c backends/cuda/cuda_exec.c && \
	    echo "cuda backend: builds without cublas_v2.h"; fi
	@if [ "$(HAVE_CUDA)$(HAVE_CUBLAS_H)$(HAVE_CUBLAS_LIB)" = 111 ]; then \
	    GPU_CHECK_BUILD_ONLY=1 BUILD=$(BUILD) bash bench/gpu_check.sh; \
	elif [ "$(HAVE_CUDA)" = 1 ]; then \
	    echo "gpu_check: not built (it links cuBLAS, whose header or library is not in $(CUDA_HOME))"; \
	else echo "gpu_check: not built ($(CUDA_WHY))"; fi

# Installs into a staging directory, then builds a client against the installed
# header and library through pkg-config and imports the installed Python package.
test-install:
	@rm -rf $(BUILD)/stage
	@bash tools/abi/uninstall_check.sh prepare $(abspath $(BUILD)/stage)
	@$(MAKE) --no-print-directory install DESTDIR=$(abspath $(BUILD)/stage) PREFIX=/usr/local >/dev/null
	@PKG_CONFIG_PATH=$(abspath $(BUILD)/stage)/usr/local/lib/pkgconfig \
	    PKG_CONFIG_SYSROOT_DIR=$(abspath $(BUILD)/stage) \
	    $(CC) -std=c11 $(LDFLAGS) examples/session.c $$(PKG_CONFIG_PATH=$(abspath $(BUILD)/stage)/usr/local/lib/pkgconfig \
	        PKG_CONFIG_SYSROOT_DIR=$(abspath $(BUILD)/stage) pkg-config --cflags --libs --static tensordd) \
	        -o $(BUILD)/stage/session
	@cd /tmp && PYTHONPATH=$(abspath $(BUILD)/stage)$(PYDIR) $(PY) -c \
	    'import tensordd, sys; assert tensordd.__file__.startswith(sys.argv[1]), tensordd.__file__' \
	    $(abspath $(BUILD)/stage)
	@cd /tmp && PYTHONPATH=$(abspath $(BUILD)/stage)$(PYDIR) $(PY) -m tensordd --version
	@# installed by pip, with its metadata (a venv's pip sees it), not copied
	@test -f $(abspath $(BUILD)/stage)$(PYDIR)/tensordd-$$(sed -n 's/^__version__ = "\(.*\)"/\1/p' \
	    client/python/tensordd/_version.py).dist-info/RECORD
	@echo "install: staged install links a client through pkg-config and imports the Python package"
	@CC="$(CC)" LDFLAGS="$(LDFLAGS)" bash tools/abi/installed_client.sh $(abspath $(BUILD)/stage) /usr/local
	@$(MAKE) --no-print-directory uninstall DESTDIR=$(abspath $(BUILD)/stage) PREFIX=/usr/local >/dev/null
	@bash tools/abi/uninstall_check.sh verify $(abspath $(BUILD)/stage)
	@# an install to a PREFIX of its own (no DESTDIR): its tensordd.pc names that prefix
	@p=$$(mktemp -d "$${TMPDIR:-/tmp}/tensordd-prefix.XXXXXX") && \
	    $(MAKE) --no-print-directory install PREFIX=$$p >/dev/null && \
	    CC="$(CC)" LDFLAGS="$(LDFLAGS)" bash tools/abi/installed_client.sh "" $$p && \
	    rm -rf $$p

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu')

# Calls and includes only go down in daemon/, backends/, client/ and below: tools/layers.txt
# orders the files, and the built objects' symbols (nm) and the sources' includes must agree.
# test-layers breaks a scratch copy in each way the lint forbids and expects it to fail.
LAYER_OBJ := $(call obj,daemon/main.c) $(DAEMON_OBJ) $(BACKEND_OBJ) $(COMMON_OBJ) $(CLIENT_OBJ) \
             $(call obj,$(TDCTL_SRC))
check-layers: $(LAYER_OBJ)
	@$(PY) tools/check_layers.py $(BUILD)/obj

test-layers: $(LAYER_OBJ)
	@PY=$(PY) bash tests/layers/break.sh $(BUILD)/obj

# A field added to the .proto's hot messages (in a scratch copy) needs no codec edit: the keys
# are generated, the fast codec (proto/wirecodec.h) leaves a message that sets the field to
# protobuf(-c), and peers built from the old and the new .proto read each other's messages.
test-wire-keys:
	@PY=$(PY) CC=$(CC) bash tests/wire/add_field.sh

lint:
	clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h' '*.cu')
	cppcheck --quiet --enable=warning,performance --inline-suppr -Iinclude -Iproto -Icommon -Ibackends \
	    -Idaemon daemon backends client proto common
	@$(MAKE) --no-print-directory check-layers

clean:
	rm -rf build client/python/tensordd/tensordd_pb2.py client/python/build client/python/tensordd.egg-info
