# make leakcheck: tensordd and tdctl built with AddressSanitizer (LeakSanitizer on) in
# $(LEAK_BUILD), a scripted set of sessions against the daemon (tests/leakcheck/sessions.py:
# training over TCP, a Unix socket and TLS, a resumed session and an expired one, typed
# errors, abrupt closes mid-payload, with queued work and before Hello, refused TLS
# clients, tdctl over each endpoint), then SIGTERM: the daemon and every tdctl run must
# exit 0 with no leak report. The run takes seconds, the sanitizer build minutes: plain
# `make test` leaves it out, `make SAN=address,undefined test` (whose build it is) runs it.
LEAK_BUILD ?= build/san

.PHONY: leakcheck test-leak
leakcheck: deps
	@$(MAKE) --no-print-directory BUILD=$(LEAK_BUILD) SAN=address,undefined test-leak

test-leak: $(BUILD)/tensordd $(BUILD)/tdctl $(PYGEN)
	ASAN_OPTIONS=detect_leaks=1:quarantine_size_mb=16 UBSAN_OPTIONS=print_stacktrace=1 \
	    PYTHONPATH=client/python:$(BUILD)/python \
	    $(PY) tests/leakcheck/sessions.py $(BUILD)/tensordd $(BUILD)/tdctl

ifneq ($(findstring address,$(SAN)),)
test: test-leak
endif
