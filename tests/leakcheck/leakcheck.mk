# make leakcheck: tensordd and tdctl built with AddressSanitizer (LeakSanitizer on) in
# $(LEAK_BUILD), a scripted set of sessions against the daemon (tests/leakcheck/sessions.py:
# training over TCP, a Unix socket and TLS, typed errors, abrupt closes mid-payload, with
# queued work and before Hello, refused TLS clients, tdctl over each endpoint), then
# SIGTERM: the daemon and every tdctl run must exit 0 with no leak report. The run takes
# seconds; the sanitizer build minutes, which is why make test does not do it.
LEAK_BUILD ?= build/san

.PHONY: leakcheck
leakcheck: deps
	@$(MAKE) --no-print-directory BUILD=$(LEAK_BUILD) SAN=address,undefined \
	    $(LEAK_BUILD)/tensordd $(LEAK_BUILD)/tdctl $(LEAK_BUILD)/python/tensordd/tensordd_pb2.py
	ASAN_OPTIONS=detect_leaks=1:quarantine_size_mb=16 UBSAN_OPTIONS=print_stacktrace=1 \
	    PYTHONPATH=client/python:$(LEAK_BUILD)/python \
	    $(PY) tests/leakcheck/sessions.py $(LEAK_BUILD)/tensordd $(LEAK_BUILD)/tdctl
