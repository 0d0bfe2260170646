# bench.mk -- make bench-smoke: bench/run.sh --quick, every benchmark once with tiny
# repetitions, failing when a row of the summary is missing (about a minute on 2 cores, so
# not part of make test; its figures mean nothing). tests/python/daemon/test_bench_summary.py, in
# make test, checks the summariser itself. make bench BENCH_ARGS='--runs 1 --threads 2'
# passes options to bench/run.sh.
.PHONY: bench-smoke
bench-smoke: all $(BENCH_BINS)
	@BUILD=$(BUILD) PY=$(PY) bash bench/run.sh --quick

# make bench-codec: the hand-written wire codecs' CPU time per message, in process (bench/codec.c;
# it links the daemon's objects for daemon/wire.c). Not part of bench/run.sh.
.PHONY: bench-codec
$(BUILD)/bench/codec: bench/codec.c $(DAEMON_OBJ) $(BACKEND_OBJ) $(COMMON_OBJ) $(call obj,client/lib/wire.c)
	@mkdir -p $(dir $@)
	@echo "  LINK     $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $^ $(DAEMON_LIBS) -o $@

bench-codec: $(BUILD)/bench/codec
	$(BUILD)/bench/codec $(BENCH_ARGS)

# make bench-scale: how the daemon's cost grows with sessions and live handles (bench/scale.py):
# a table in bench/scale.md and a plot in bench/scale.png (python3-matplotlib, installed here
# when missing and run as root: plotting is the only use). BENCH_ARGS passes options
# (BENCH_ARGS=--why-stalls: each stall set against both ends' run-queue waits).
.PHONY: bench-scale
bench-scale: all
	@if ! $(PY) -c 'import matplotlib' 2>/dev/null && [ "$$(id -u)" = 0 ]; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-matplotlib \
	        >$(or $(TMPDIR),/tmp)/tensordd-bench-deps.log 2>&1 || echo "bench-scale: no matplotlib: table only"; fi
	$(PY) bench/scale.py $(BUILD) $(BENCH_ARGS)

# make bench-compare A=TREE_A B=TREE_B: two built source trees (a base commit's:
# `git worktree add /tmp/base COMMIT && make -C /tmp/base -j2`) in alternating turns on the
# same benchmark (bench/cpu_rows.py: CPU per training step of the GEMM-bound models), then
# each row's B/A ratio as min / median / max over the turns (bench/compare.py).
# COMPARE_ARGS='--turns 7 -- --models big --scale 2' passes options.
.PHONY: bench-compare
bench-compare:
	@test -n "$(A)" -a -n "$(B)" || { echo "usage: make bench-compare A=TREE_A B=TREE_B" >&2; exit 2; }
	$(PY) bench/compare.py $(A) $(B) $(COMPARE_ARGS)
