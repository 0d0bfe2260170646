# The Python client's optional C accelerator (client/python/tensordd/_speedups.c): built
# into $(BUILD)/python/tensordd/, next to the generated tensordd_pb2.py, when a compiler and
# Python's headers (Debian: python3-dev) are there; without it the client runs its pure-Python
# paths, with identical results. `make test-python` runs the whole suite with it and a
# focused set with TENSORDD_PURE=1 (pure Python forced). Built without sanitizers: it is
# loaded into the test's Python, not into the daemon.
PY_INCLUDE := $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
PY_EXT_SUFFIX := $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX") or "")' 2>/dev/null)
ifneq ($(and $(PY_EXT_SUFFIX),$(wildcard $(PY_INCLUDE)/Python.h)),)
SPEEDUPS := $(BUILD)/python/tensordd/_speedups$(PY_EXT_SUFFIX)
endif
# The pure-Python run: what the accelerator replaces, and the suites that drive it hardest.
PURE_TESTS := tests/python/transport/test_speedups.py tests/python/transport/test_wire_fastpath.py \
              tests/python/client/test_session.py tests/python/client/test_offline.py \
              tests/python/client/test_release.py tests/python/client/test_python_repr.py \
              tests/python/client/test_torchlike_honest.py tests/python/transport/test_resume.py

.PHONY: speedups test-python-pure
speedups: $(SPEEDUPS)
all: $(SPEEDUPS)
test-python: $(SPEEDUPS) test-python-pure

# It takes the wire's field keys from the header generated from the .proto (tensordd_keys.h).
$(BUILD)/python/tensordd/_speedups$(PY_EXT_SUFFIX): client/python/tensordd/_speedups.c $(KEYS_H)
	@mkdir -p $(dir $@)
	@echo "  CC       $<"
	$(Q)$(CC) -std=c11 -O2 -g -fPIC -shared $(WARN) -isystem $(PY_INCLUDE) -I$(BUILD)/gen $< -o $@

test-python-pure: $(BUILD)/tensordd $(BUILD)/tdctl $(PYGEN)
	TENSORDD_PURE=1 TDD_BIN=$(BUILD)/tensordd TDCTL_BIN=$(BUILD)/tdctl \
	    PYTHONPATH=client/python:$(BUILD)/python \
	    $(PY) -m pytest -q -rs -p no:cacheprovider $(PURE_TESTS)

# tensordd.torch's PrivateUse1 device guard (client/python/tensordd/torch/_guard.c): plain
# C, no torch headers; loaded with ctypes by tensordd.torch (which checks torch's layout).
TORCH_GUARD := $(BUILD)/python/tensordd/_torch_guard.so
all: $(TORCH_GUARD)
test-python: $(TORCH_GUARD)

$(TORCH_GUARD): client/python/tensordd/torch/_guard.c
	@mkdir -p $(dir $@)
	@echo "  CC       $<"
	$(Q)$(CC) -std=c11 -O2 -g -fPIC -shared $(WARN) $< -o $@
