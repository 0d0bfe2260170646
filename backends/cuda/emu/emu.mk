# emu.mk -- `make emu` and `make test-emu` (included by the Makefile).
#
# `make emu` builds build/emu/tensordd with backends/cuda compiled by the host compilers
# against the CUDA emulator in backends/cuda/emu (kernels.cu as C++, cuda.c as C): the
# kernel and host code nvcc compiles is what runs. `build/emu/tensordd --emu-gpus N
# [--emu-gpu-memory BYTES]` then serves cuda:0..N-1 besides the CPU backends.
# `make test-emu` (part of `make test`) runs the GPU suites of tests/gpu against it.
# BUILD=build/X builds it in build/X-emu (BUILD=build/X-emu too), the default build in build/emu.
EMU_BUILD ?= $(if $(filter build,$(BUILD)),build/emu,$(patsubst %-emu,%,$(BUILD))-emu)
# The device code compiled (tests/gpu/mutate.sh points it at a broken copy).
EMU_KERNELS := backends/cuda/kernels.cu
EMU_TARGETS := $(EMU_BUILD)/tensordd $(EMU_BUILD)/tdctl $(EMU_BUILD)/tests/gpu_conformance \
               $(EMU_BUILD)/tests/emu_selftest $(EMU_BUILD)/python/tensordd/tensordd_pb2.py \
               $(EMU_BUILD)/tools/opcoverage

.PHONY: emu test-emu
emu:
	@$(MAKE) --no-print-directory TDD_EMU=1 BUILD=$(EMU_BUILD) SAN= NVCC= \
	    CUDA_CPPFLAGS="-DTDC_EMU=1 -Ibackends/cuda/emu/include" CUDA_LIBS=-lstdc++ $(EMU_TARGETS)

test-emu: emu
	@BUILD=$(EMU_BUILD) PY=$(PY) TDD_GPU_ARGS="--emu-gpus 2 --emu-gpu-memory 256M" \
	    bash tests/gpu/suites.sh

# The device code on the host compiler. Warnings stay errors; the kernels' C++ is held to
# -Wall -Wextra (not the C build's -Wconversion family, which nvcc does not apply either).
EMU_CXXFLAGS := -std=c++17 $(OPT) -fPIC -pthread -Wall -Wextra -Werror -DTDC_EMU=1 \
                -Ibackends/cuda/emu/include -Iinclude -Iproto -Ibackends -Ibackends/cuda \
                $(OPENBLAS_CFLAGS)

# Every load and store of the kernels calls runtime.cpp's checks (the thread sanitizer's
# instrumentation, without its library: runtime.cpp defines the __tsan_* hooks).
EMU_INSTRUMENT := -fsanitize=thread --param=tsan-instrument-func-entry-exit=0

$(BUILD)/obj/backends/cuda/kernels.emu.o: $(EMU_KERNELS)
	@mkdir -p $(dir $@)
	@echo "  CXX      $< (emulated)"
	$(Q)$(CXX) -x c++ $(EMU_CXXFLAGS) $(EMU_INSTRUMENT) -MMD -MP -c $< -o $@

$(BUILD)/obj/backends/cuda/emu/runtime.emu.o: backends/cuda/emu/runtime.cpp
	@mkdir -p $(dir $@)
	@echo "  CXX      $<"
	$(Q)$(CXX) $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@

# The conformance table on cuda:0 (also built by tests/gpu/run.sh on a GPU machine).
$(BUILD)/tests/gpu_conformance: $(call obj,tests/gpu/conformance.c tests/unit/test_conformance_cases.c) \
                                $(BACKEND_OBJ) $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	@echo "  LINK     $@"
	$(Q)$(CC) $(LDFLAGS) $^ $(DAEMON_LIBS) -o $@

# The emulator held to CUDA's semantics with kernels of its own (tests/gpu/emu_selftest.cpp).
$(BUILD)/tests/emu_selftest: tests/gpu/emu_selftest.cpp $(BUILD)/obj/backends/cuda/emu/runtime.emu.o
	@mkdir -p $(dir $@)
	@echo "  CXX      $<"
	$(Q)$(CXX) $(EMU_CXXFLAGS) -Ibackends/cuda/emu/include $^ $(OPENBLAS_LIBS) -pthread -o $@
