# kvbridge: vLLM's and SGLang's KV cache events (ZeroMQ, msgpack) to the
# module's protocol on Redis (tools/kvbridge/).  Included by the Makefile.

KVBRIDGE_DECODE := tools/kvbridge/kvb_vllm.c tools/kvbridge/kvb_scan.c
KVBRIDGE_HDRS   := $(wildcard tools/kvbridge/*.h)
KVBRIDGE_SRCS   := $(wildcard tools/kvbridge/*.c)

PACKAGES   += libmsgpack-dev libzmq3-dev
TOOLS      += $(BUILD)/kvbridge

.PHONY: kvbridge
kvbridge: $(BUILD)/kvbridge

$(BUILD)/kvbridge: $(KVBRIDGE_SRCS) $(KVBRIDGE_HDRS) $(LIBKVA)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_CORE) $(KVBRIDGE_CFLAGS) -Itools/kvbridge \
	    -o $@ $(KVBRIDGE_SRCS) $(LIBKVA) \
	    -lzmq -lmsgpackc -lhiredis -ljansson -lxxhash

UNIT_TESTS += $(BUILD)/unit/test_kvbridge_decode \
              $(BUILD)/unit/test_kvbridge_mirror \
              $(BUILD)/unit/test_kvbridge_stream

# the decoder is pure: its test and its fuzz target link it alone
$(BUILD)/unit/test_kvbridge_decode: t/unit/test_kvbridge_decode.c \
        $(KVBRIDGE_DECODE) $(KVBRIDGE_HDRS) t/unit/tap.h
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -Itools/kvbridge -It/unit -o $@ $< \
	    $(KVBRIDGE_DECODE) -lmsgpackc

# the configuration, data-parallel ranks and the collector's rank look
UNIT_TESTS += $(BUILD)/unit/test_kvbridge_conf

$(BUILD)/unit/test_kvbridge_conf: t/unit/test_kvbridge_conf.c \
        tools/kvbridge/kvb_conf.c tools/kvbridge/kvb_log.c \
        tools/kvbridge/kvbridge.conf.example \
        $(KVBRIDGE_DECODE) $(KVBRIDGE_HDRS) t/unit/tap.h
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -Itools/kvbridge -It/unit -o $@ $< \
	    tools/kvbridge/kvb_conf.c tools/kvbridge/kvb_log.c \
	    $(KVBRIDGE_DECODE) -lmsgpackc

# the mirror keys blocks with the core's token key space
KVBRIDGE_MIRROR := tools/kvbridge/kvb_mirror.c $(KVBRIDGE_DECODE)

$(BUILD)/unit/test_kvbridge_mirror: t/unit/test_kvbridge_mirror.c \
        $(KVBRIDGE_MIRROR) $(KVBRIDGE_HDRS) $(LIBKVA)
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -Itools/kvbridge -It/unit -o $@ $< \
	    $(KVBRIDGE_MIRROR) $(LIBKVA) -lmsgpackc -ljansson -lxxhash

# the stream against a real ZeroMQ ROUTER answering replays
$(BUILD)/unit/test_kvbridge_stream: t/unit/test_kvbridge_stream.c \
        tools/kvbridge/kvb_stream.c tools/kvbridge/kvb_zmsg.c \
        $(KVBRIDGE_HDRS) t/unit/tap.h
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -Itools/kvbridge -It/unit -o $@ $< \
	    tools/kvbridge/kvb_stream.c tools/kvbridge/kvb_zmsg.c -lzmq -lxxhash

# the loop's budgets, deadlines and timings on real inproc sockets
UNIT_TESTS += $(BUILD)/unit/test_kvbridge_loop

$(BUILD)/unit/test_kvbridge_loop: t/unit/test_kvbridge_loop.c \
        tools/kvbridge/kvb_loop.c tools/kvbridge/kvb_log.c \
        $(KVBRIDGE_HDRS) t/unit/tap.h
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -Itools/kvbridge -It/unit -o $@ $< \
	    tools/kvbridge/kvb_loop.c tools/kvbridge/kvb_log.c -lzmq

# what the bridge costs on one core (make bench-events runs it)
$(BUILD)/bench_bridge: bench/bench_bridge.c bench/bench_util.h \
        $(KVBRIDGE_MIRROR) $(KVBRIDGE_HDRS) $(LIBKVA)
	$(CC) $(CFLAGS_CORE) -Itools/kvbridge -o $@ $< $(KVBRIDGE_MIRROR) \
	    $(LIBKVA) -lmsgpackc -ljansson -lxxhash

# the loop budget: one engine floods, another's latency is timed
.PHONY: bench-loop
bench-loop: $(BUILD)/kvbridge
	bash bench/bench_loop.sh

# the tests' reference for keys=tokens (t/5x): kva_token_keys BLOCK MODEL
$(BUILD)/kva_token_keys: t/lib/kva_token_keys.c $(LIBKVA)
	$(CC) $(CFLAGS_CORE) -o $@ $< $(LIBKVA) -lxxhash

TOOLS      += $(BUILD)/kva_token_keys

FUZZ_CFLAGS          += -Itools/kvbridge
FUZZ_SRCS_kvb_decode := $(KVBRIDGE_DECODE)
FUZZ_LIBS_kvb_decode := -lmsgpackc

# the mirror against an engine model and nginx's view (differential)
FUZZ_SRCS_kvb_mirror := $(KVBRIDGE_MIRROR)
FUZZ_LIBS_kvb_mirror := -lmsgpackc

# the stream against a real ZeroMQ ROUTER on inproc
FUZZ_SRCS_kvb_stream := tools/kvbridge/kvb_stream.c tools/kvbridge/kvb_zmsg.c
FUZZ_LIBS_kvb_stream := -lzmq

# the load scraper: its parser and chunked decoder are pure, its client
# needs only a loopback server, which the test forks
KVBRIDGE_METRICS := tools/kvbridge/kvb_metrics.c tools/kvbridge/kvb_chunked.c \
                    tools/kvbridge/kvb_scrape.c tools/kvbridge/kvb_log.c

UNIT_TESTS += $(BUILD)/unit/test_kvbridge_metrics \
              $(BUILD)/unit/test_kvbridge_chunked \
              $(BUILD)/unit/test_kvbridge_scrape

KVBRIDGE_FIXTURES := t/unit/kvb_metrics_fixtures.c t/unit/kvb_metrics_fixtures.h

$(BUILD)/unit/test_kvbridge_metrics: t/unit/test_kvbridge_metrics.c \
        tools/kvbridge/kvb_metrics.c $(KVBRIDGE_FIXTURES) $(KVBRIDGE_HDRS) \
        t/unit/tap.h
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -Itools/kvbridge -It/unit -o $@ $< \
	    tools/kvbridge/kvb_metrics.c t/unit/kvb_metrics_fixtures.c -lm

$(BUILD)/unit/test_kvbridge_chunked: t/unit/test_kvbridge_chunked.c \
        tools/kvbridge/kvb_chunked.c $(KVBRIDGE_HDRS) \
        tools/common/kva_rand.h t/unit/tap.h
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -Itools/kvbridge -Itools/common -It/unit -o $@ $< \
	    tools/kvbridge/kvb_chunked.c

$(BUILD)/unit/test_kvbridge_scrape: t/unit/test_kvbridge_scrape.c \
        t/unit/kvb_test_server.c t/unit/kvb_test_server.h \
        $(KVBRIDGE_METRICS) $(KVBRIDGE_FIXTURES) $(KVBRIDGE_HDRS) t/unit/tap.h
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -Itools/kvbridge -It/unit -o $@ $< \
	    t/unit/kvb_test_server.c t/unit/kvb_metrics_fixtures.c \
	    $(KVBRIDGE_METRICS) -lzmq -lm

# zmq.h gives the client its poll constants only: no -lzmq
FUZZ_SRCS_kvb_metrics := $(KVBRIDGE_METRICS)
FUZZ_LIBS_kvb_metrics := -lm

# the scraper's HTTP client past recv(): status line, headers, chunks,
# encodings refused, truncation (kvb_scrape_feed())
FUZZ_SRCS_kvb_scrape := $(KVBRIDGE_METRICS)
FUZZ_LIBS_kvb_scrape := -lm
