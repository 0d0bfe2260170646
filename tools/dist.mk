# dist.mk -- included by the Makefile: what an installation holds besides the binaries,
# and the checks that keep it and the shipped documents honest.
#
#   make man                tensordd(8), tdctl(1), libtensordd(3) into $(BUILD)/man, generated
#                           from the option table, the programs' --help and the header
#   make uninstall          removes exactly what make install installed (same PREFIX, DESTDIR)
#   make test-abi           libtensordd.so exports only the td_ functions of its record
#                           (tools/abi/libtensordd.symbols), under the recorded soname; the
#                           man pages format without warnings
#   make test-protocol-doc  docs/protocol.md and proto/tensordd.proto name the same messages
#                           and error codes
#   make test-deploy        deploy/Dockerfile and deploy/k8s/*.yaml say what they must

.PHONY: man uninstall test-abi test-protocol-doc test-deploy

MANDIR ?= $(PREFIX)/share/man
# "0.1.0", from tensordd.h's TD_VERSION_* (tensordd.pc's Version)
TD_LIB_VERSION := $(shell sed -n 's/^\#define TD_VERSION_[A-Z]* \([0-9]*\)$$/\1/p' include/tensordd.h | paste -sd.)
MAN_PAGES := $(BUILD)/man/tensordd.8 $(BUILD)/man/tdctl.1 $(BUILD)/man/libtensordd.3
LIB_HEADERS := include/tensordd.h include/td_error.h include/td_dtype.h include/td_attr.h

man: $(MAN_PAGES)

$(BUILD)/man/tensordd.8: $(BUILD)/tensordd tools/man/genman.py
	@mkdir -p $(dir $@)
	@echo "  MAN      $@"
	$(Q)$(PY) tools/man/genman.py tensordd $< > $@.tmp && mv $@.tmp $@

$(BUILD)/man/tdctl.1: $(BUILD)/tdctl tools/man/genman.py
	@mkdir -p $(dir $@)
	@echo "  MAN      $@"
	$(Q)$(PY) tools/man/genman.py tdctl $< > $@.tmp && mv $@.tmp $@

$(BUILD)/man/libtensordd.3: $(LIB_HEADERS) tools/man/genman.py
	@mkdir -p $(dir $@)
	@echo "  MAN      $@"
	$(Q)$(PY) tools/man/genman.py lib $(LIB_HEADERS) > $@.tmp && mv $@.tmp $@

# The mirror of `make install`'s lines (test-install checks that nothing is left behind
# and nothing else is touched).
uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/tensordd $(DESTDIR)$(PREFIX)/bin/tdctl
	rm -f $(DESTDIR)$(LIBDIR)/libtensordd.a $(DESTDIR)$(LIBDIR)/libtensordd.so \
	    $(DESTDIR)$(LIBDIR)/libtensordd.so.$(TD_SOVERSION) $(DESTDIR)$(LIBDIR)/pkgconfig/tensordd.pc
	rm -f $(addprefix $(DESTDIR)$(INCLUDEDIR)/,$(notdir $(LIB_HEADERS)))
	rm -f $(DESTDIR)$(MANDIR)/man8/tensordd.8 $(DESTDIR)$(MANDIR)/man1/tdctl.1 \
	    $(DESTDIR)$(MANDIR)/man3/libtensordd.3
	rm -rf $(DESTDIR)$(PYDIR)/tensordd $(DESTDIR)$(PYDIR)/tensordd-*.dist-info

$(BUILD)/tools/abi_sizes: tools/abi/sizes.c $(LIB_HEADERS)
	@mkdir -p $(dir $@)
	$(Q)$(CC) -std=c11 -Iinclude $< -o $@

# The ABI record, and the man pages formatted without a warning (groff -ww) where groff is.
test-abi: $(BUILD)/libtensordd.so $(BUILD)/tools/abi_sizes $(MAN_PAGES)
	@$(BUILD)/tools/abi_sizes > $(BUILD)/tools/abi_sizes.txt
	@$(PY) tools/abi/check_abi.py --lib $(BUILD)/libtensordd.so \
	    --symbols tools/abi/libtensordd.symbols --map client/lib/libtensordd.map \
	    --sizes $(BUILD)/tools/abi_sizes.txt $(LIB_HEADERS)
	@if command -v groff >/dev/null; then \
	    for p in $(MAN_PAGES); do \
	        out=$$(groff -man -Tutf8 -ww -z $$p 2>&1); \
	        if [ -n "$$out" ]; then echo "man: $$p: $$out" >&2; exit 1; fi; \
	    done; echo "man: $(notdir $(MAN_PAGES)) format without warnings"; \
	else echo "man: groff not installed, pages not checked"; fi

test-protocol-doc:
	@$(PY) tools/check_protocol_doc.py proto/tensordd.proto docs/protocol.md

# Offline: docker and a cluster are not needed (nor used); the built daemon checks the
# ConfigMap's file with --check-config.
test-deploy: $(BUILD)/tensordd
	@$(PY) tools/check_deploy.py deploy --tensordd $(BUILD)/tensordd
