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
               $(EMU_BUILD)/tests/emu_selftest $(EMU_BUILD)/tests/emu_checks \
               $(EMU_BUILD)/tests/emu_profile \
               $(EMU_BUILD)/python/tensordd/tensordd_pb2.py \
               $(EMU_BUILD)/tools/opcoverage $(EMU_BUILD)/python/tensordd/_torch_guard.so

.PHONY: emu test-emu gpu-report
emu:
	@$(MAKE) --no-print-directory TDD_EMU=1 BUILD=$(EMU_BUILD) SAN= NVCC= \
	    CUDA_CPPFLAGS="-DTDC_EMU=1 -Ibackends/cuda/emu/include" CUDA_LIBS=-lstdc++ $(EMU_TARGETS)

# Then again in race mode (TDD_EMU_CHECK: fibers switching at memory accesses, races and
# uninitialised loads faulting), with sessions' streams deferred and the device's stream
# eager (TDD_EMU_DEFER=2: a free or a read on the wrong stream shows), another seed and an H200's 132 SMs (other grid sizes): the kernels with shared
# memory, warp operations and atomics, and the pytest files that exercise streams.
EMU_RACE_OPS := sum mean var std logsumexp argmax softmax log_softmax cumsum layer_norm \
                scatter_add embedding_bag cross_entropy nll_loss linspace cast
EMU_RACE_PYTEST := tests/python/gpu/test_cuda_streams.py tests/python/gpu/test_cuda_devices.py \
                   tests/python/gpu/test_cuda_optim.py
test-emu: emu
	@BUILD=$(EMU_BUILD) PY=$(PY) TDD_GPU_ARGS="--emu-gpus 2 --emu-gpu-memory 256M" \
	    bash tests/gpu/suites.sh
	@echo "gpu: again in race mode, deferred streams, seed 2, 132 SMs"
	@BUILD=$(EMU_BUILD) PY=$(PY) TDD_EMU_CHECK=1 TDD_EMU_DEFER=2 TDD_EMU_SEED=2 TDD_EMU_SMS=132 \
	    TDD_GPU_ARGS="--emu-gpus 2 --emu-gpu-memory 256M --emu-sms 132" \
	    GPU_PYTEST="$(EMU_RACE_PYTEST)" \
	    bash tests/gpu/suites.sh conformance $(EMU_RACE_OPS) pytest

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
$(BUILD)/tests/emu_selftest: tests/gpu/emu_selftest.cpp $(BUILD)/obj/backends/cuda/emu/runtime.emu.o tests/gpu/emu_check.h
	@mkdir -p $(dir $@)
	@echo "  CXX      $<"
	$(Q)$(CXX) $(EMU_CXXFLAGS) -Ibackends/cuda/emu/include $(filter-out %.h,$^) $(OPENBLAS_LIBS) -pthread -o $@

# Its memory checks (memcheck, racecheck, initcheck) on kernels instrumented as kernels.cu is.
# Compiled instrumented, linked without the sanitizer's library (runtime.cpp is its run time).
$(BUILD)/tests/emu_checks: tests/gpu/emu_checks.cpp $(BUILD)/obj/backends/cuda/emu/runtime.emu.o tests/gpu/emu_check.h
	@mkdir -p $(dir $@)
	@echo "  CXX      $<"
	$(Q)$(CXX) $(EMU_CXXFLAGS) $(EMU_INSTRUMENT) -c $< -o $@.o
	$(Q)$(CXX) $@.o $(BUILD)/obj/backends/cuda/emu/runtime.emu.o $(OPENBLAS_LIBS) -pthread -o $@

# Its per-launch profile (TDD_EMU_PROFILE) against hand-counted traffic of small kernels.
$(BUILD)/tests/emu_profile: tests/gpu/emu_profile.cpp $(BUILD)/obj/backends/cuda/emu/runtime.emu.o tests/gpu/emu_check.h
	@mkdir -p $(dir $@)
	@echo "  CXX      $<"
	$(Q)$(CXX) $(EMU_CXXFLAGS) $(EMU_INSTRUMENT) -c $< -o $@.o
	$(Q)$(CXX) $@.o $(BUILD)/obj/backends/cuda/emu/runtime.emu.o $(OPENBLAS_LIBS) -pthread -o $@

# `make gpu-report`: one training step of the digits MLP, ResNet-18's layout and a GPT on
# emulated cuda:0 (132 SMs), profiled (TDD_EMU_PROFILE) and set against an H200's roofline
# with ptxas's registers and shared memory (tools/gpu_report.py): bench/gpu_report.md.
$(EMU_BUILD)/kernels.ptxas.txt: backends/cuda/kernels.cu backends/cuda/kernels.h
	@mkdir -p $(dir $@)
	@echo "  PTXAS    $< (resource usage, sm_90)"
	$(Q)if [ -x "$(or $(NVCC),/usr/local/cuda/bin/nvcc)" ]; then \
	    $(or $(NVCC),/usr/local/cuda/bin/nvcc) -O2 -std=c++17 -arch=sm_90 -Xptxas -v -Iinclude \
	        -Iproto -Ibackends -c $< -o $@.o 2>$@.tmp >/dev/null && rm -f $@.o && mv $@.tmp $@; \
	else : >$@; fi
gpu-report: emu $(EMU_BUILD)/kernels.ptxas.txt
	@$(PY) tools/gpu_report.py run --build $(EMU_BUILD) --ptxas $(EMU_BUILD)/kernels.ptxas.txt \
	    --out bench/gpu_report.md
