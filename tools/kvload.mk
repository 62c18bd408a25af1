# kvload: open-loop load generator (tools/kvload/), included by the Makefile.

KVLOAD_SRCS := $(wildcard tools/kvload/kvload_*.c)
KVLOAD_HDRS := $(wildcard tools/kvload/*.h) tools/common/kva_rand.h

TOOLS      += $(BUILD)/kvload
UNIT_TESTS += $(BUILD)/unit/test_kvload_stats

.PHONY: kvload
kvload: $(BUILD)/kvload

$(BUILD)/kvload: $(KVLOAD_SRCS) $(KVLOAD_HDRS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_CORE) -Itools/kvload -o $@ $(KVLOAD_SRCS) \
	    -levent -ljansson -lm

# the stats are pure: the test links them alone, not the core
$(BUILD)/unit/test_kvload_stats: t/unit/test_kvload_stats.c \
	    tools/kvload/kvload_stats.c tools/kvload/kvload_stats.h
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -Itools/kvload -It/unit -o $@ $< \
	    tools/kvload/kvload_stats.c -lm

# the trace replay: its reader and bodies alone, on a small trace
UNIT_TESTS += $(BUILD)/unit/test_kvload_trace

$(BUILD)/unit/test_kvload_trace: t/unit/test_kvload_trace.c \
	    tools/kvload/kvload_trace.c $(KVLOAD_HDRS)
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -Itools/kvload -It/unit -o $@ $< \
	    tools/kvload/kvload_trace.c -ljansson

# the sessions replay: its reader and bodies alone, on small sessions
UNIT_TESTS += $(BUILD)/unit/test_kvload_sessions

$(BUILD)/unit/test_kvload_sessions: t/unit/test_kvload_sessions.c \
	    tools/kvload/kvload_sessions_load.c $(KVLOAD_HDRS)
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -Itools/kvload -It/unit -o $@ $< \
	    tools/kvload/kvload_sessions_load.c -ljansson
