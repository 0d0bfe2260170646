# bench.mk -- make bench-smoke: bench/run.sh --quick, every benchmark once with tiny
# repetitions, failing when a row of the summary is missing (about a minute on 2 cores, so
# not part of make test; its figures mean nothing). tests/python/test_bench_summary.py, in
# make test, checks the summariser itself. make bench BENCH_ARGS='--runs 1 --threads 2'
# passes options to bench/run.sh.
.PHONY: bench-smoke
bench-smoke: all $(BENCH_BINS)
	@BUILD=$(BUILD) PY=$(PY) bash bench/run.sh --quick
