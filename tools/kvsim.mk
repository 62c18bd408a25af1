# kvsim: simulated model servers (tools/kvsim/), linked with the core so
# that its block hashes are the module's.  Included by the main Makefile.
#
#   make build/kvsim                      the simulator
#   make KVSIM_CFLAGS=-fsanitize=address,undefined build/unit/test_kvsim_cache
#   make build/unit/test_kvsim_vllm       its vLLM side against kvbridge's

KVSIM_SRCS  := $(wildcard tools/kvsim/*.c)
KVSIM_HDRS  := $(wildcard tools/kvsim/*.h)
KVSIM_MODEL := tools/kvsim/kvsim_cache.c tools/kvsim/kvsim_sched.c
# vLLM's side: the pseudo-tokenizer and the msgpack batches, pure
KVSIM_VLLM  := tools/kvsim/kvsim_token.c tools/kvsim/kvsim_vllm.c
KVSIM_TESTS := $(patsubst t/unit/%.c,$(BUILD)/unit/%,\
                   $(filter-out t/unit/test_kvsim_vllm%.c,\
                       $(wildcard t/unit/test_kvsim_*.c)))
KVSIM_VLLM_TESTS := $(patsubst t/unit/%.c,$(BUILD)/unit/%,\
                   $(wildcard t/unit/test_kvsim_vllm*.c))

# t/50-kvsim-vllm.t speaks ZeroMQ and msgpack from Perl
PACKAGES   += libmsgpack-dev libzmq3-dev libzmq-ffi-perl \
              libdata-messagepack-perl

TOOLS      += $(BUILD)/kvsim
UNIT_TESTS := $(filter-out $(KVSIM_TESTS) $(KVSIM_VLLM_TESTS),$(UNIT_TESTS)) \
              $(KVSIM_TESTS) $(KVSIM_VLLM_TESTS)

.PHONY: kvsim

kvsim: $(BUILD)/kvsim

$(BUILD)/kvsim: $(KVSIM_SRCS) $(KVSIM_HDRS) $(LIBKVA)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_CORE) $(KVSIM_CFLAGS) -Itools/kvsim -o $@ \
	    $(KVSIM_SRCS) $(LIBKVA) \
	    -levent -lhiredis -ljansson -lxxhash -lzmq -lmsgpackc

# the pure model only: no libevent, no Redis
$(KVSIM_TESTS): $(BUILD)/unit/%: t/unit/%.c $(KVSIM_MODEL) $(KVSIM_HDRS) \
                $(LIBKVA)
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) $(KVSIM_CFLAGS) -Itools/kvsim -o $@ $< \
	    $(KVSIM_MODEL) $(LIBKVA) -lxxhash

# kvsim's encoder against kvbridge's decoder and mirror (pure, all three)
KVSIM_BRIDGE := tools/kvbridge/kvb_vllm.c tools/kvbridge/kvb_scan.c \
                tools/kvbridge/kvb_mirror.c

$(KVSIM_VLLM_TESTS): $(BUILD)/unit/%: t/unit/%.c $(KVSIM_VLLM) $(KVSIM_HDRS) \
                $(KVSIM_BRIDGE) $(KVBRIDGE_HDRS) $(LIBKVA) t/unit/tap.h
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) $(KVSIM_CFLAGS) -Itools/kvsim -Itools/kvbridge \
	    -It/unit -o $@ $< $(KVSIM_VLLM) $(KVSIM_BRIDGE) $(LIBKVA) \
	    -lmsgpackc -ljansson -lxxhash
