# fuzz.mk -- the structure-aware session target (tests/fuzz/fuzz_session.c): its corpus
# replay runs in `make test` (through test-fuzz); `make fuzz-session` runs libFuzzer on
# it for FUZZ_SECONDS, like `make fuzz` does for the frame target.
SESSION_CORPUS := tests/fuzz/corpus_session

$(BUILD)/tests/fuzz_session_replay: tests/fuzz/fuzz_session.c $(DAEMON_OBJ) $(BACKEND_OBJ) \
                                    $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	@echo "  LINK     $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -DTDD_FUZZ_REPLAY $^ $(DAEMON_LIBS) -o $@

$(BUILD)/tests/fuzz_session: tests/fuzz/fuzz_session.c $(DAEMON_OBJ) $(BACKEND_OBJ) $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	@echo "  LINK     $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -fsanitize=fuzzer $^ $(DAEMON_LIBS) -o $@

.PHONY: test-fuzz-session fuzz-session
test-fuzz: test-fuzz-session
test-fuzz-session: $(BUILD)/tests/fuzz_session_replay
	@$(BUILD)/tests/fuzz_session_replay $(SESSION_CORPUS)/*

fuzz-session:
	@$(MAKE) --no-print-directory deps APT_PKGS="$(FUZZ_PKGS)"
	@$(MAKE) --no-print-directory BUILD=build/fuzz CC=clang CXX=clang++ SAN=address,undefined WERROR=0 \
	    OPT="-O1 -g -fsanitize=fuzzer-no-link" NVCC= build/fuzz/tests/fuzz_session
	@mkdir -p build/fuzz/corpus_session
	cd build/fuzz && ASAN_OPTIONS=quarantine_size_mb=16:detect_leaks=1 ./tests/fuzz_session \
	    -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=60 -rss_limit_mb=4096 \
	    corpus_session $(abspath $(SESSION_CORPUS))
