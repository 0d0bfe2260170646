# gloo.mk -- process groups on Gloo (Debian libgloo-dev and g++, in the Makefile's APT_PKGS
# where tools/check_deploy.py holds the Dockerfile to them): daemon/gloo_shim.cc, the one C++
# file of the daemon, compiled with g++ and linked into everything that links the daemon's
# objects; gloo_direct, the same shim called directly (bench/allreduce.py's baseline).
#   make bench-allreduce   all-reduce across 2 and 3 local daemons vs Gloo called directly
CXX := g++
GLOO_OBJ := $(BUILD)/obj/daemon/gloo_shim.cc.o
# clang's vptr and function checks need the C++ half of UBSan's runtime, which a link by
# clang's C driver (the fuzz targets') leaves out; g++'s are in the one libubsan
UBSAN_CXX_OFF := -fno-sanitize=vptr,function
GLOO_CXXFLAGS := -std=c++17 $(OPT) -fPIC -pthread -Wall -Wextra -Wpedantic \
                 $(if $(filter 1,$(WERROR)),-Werror) $(filter -fsanitize=% -fno-omit-frame-pointer,$(CFLAGS)) \
                 $(if $(and $(findstring undefined,$(SAN)),$(findstring clang,$(CXX))),$(UBSAN_CXX_OFF))
DAEMON_OBJ += $(GLOO_OBJ)
DAEMON_LIBS += -lgloo -lstdc++

$(GLOO_OBJ): daemon/gloo_shim.cc daemon/gloo_shim.h include/td_error.h
	@mkdir -p $(dir $@)
	@echo "  CXX      $<"
	$(Q)$(CXX) $(GLOO_CXXFLAGS) -Iinclude -Idaemon -c $< -o $@

# (not in $(BUILD)/bench/: bench/run.sh runs everything there against one daemon)
$(BUILD)/gloo/gloo_direct: bench/gloo_direct.cc $(GLOO_OBJ)
	@mkdir -p $(dir $@)
	@echo "  CXX      $@"
	$(Q)$(CXX) $(GLOO_CXXFLAGS) -Iinclude -Idaemon $^ -lgloo -o $@

.PHONY: bench-allreduce
bench-allreduce: $(BUILD)/tensordd $(PYGEN) $(BUILD)/gloo/gloo_direct
	PYTHONPATH="client/python:$(BUILD)/python" $(PY) bench/allreduce.py $(BUILD)
