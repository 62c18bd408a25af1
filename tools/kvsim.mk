# kvsim: simulated model servers (tools/kvsim/), linked with the core so
# that its block hashes are the module's.  Included by the main Makefile.
#
#   make build/kvsim                      the simulator
#   make KVSIM_CFLAGS=-fsanitize=address,undefined build/unit/test_kvsim_cache

KVSIM_SRCS  := $(wildcard tools/kvsim/*.c)
KVSIM_HDRS  := $(wildcard tools/kvsim/*.h)
KVSIM_MODEL := tools/kvsim/kvsim_cache.c tools/kvsim/kvsim_sched.c
KVSIM_TESTS := $(patsubst t/unit/%.c,$(BUILD)/unit/%,\
                   $(wildcard t/unit/test_kvsim_*.c))

TOOLS      += $(BUILD)/kvsim
UNIT_TESTS := $(filter-out $(KVSIM_TESTS),$(UNIT_TESTS)) $(KVSIM_TESTS)

.PHONY: kvsim

kvsim: $(BUILD)/kvsim

$(BUILD)/kvsim: $(KVSIM_SRCS) $(KVSIM_HDRS) $(LIBKVA)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_CORE) $(KVSIM_CFLAGS) -Itools/kvsim -o $@ \
	    $(KVSIM_SRCS) $(LIBKVA) -levent -lhiredis -ljansson -lxxhash

# the pure model only: no libevent, no Redis
$(KVSIM_TESTS): $(BUILD)/unit/%: t/unit/%.c $(KVSIM_MODEL) $(KVSIM_HDRS) \
                $(LIBKVA)
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) $(KVSIM_CFLAGS) -Itools/kvsim -o $@ $< \
	    $(KVSIM_MODEL) $(LIBKVA) -lxxhash
