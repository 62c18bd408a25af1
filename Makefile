# ngx_http_kv_aware_module: build, test, demo, benchmark.
#
#   make deps    install what is missing from Debian's archive (apt-get)
#   make module  build/ngx_http_kv_aware_module.so against Debian's nginx
#   make test    unit tests of the core, then the nginx integration tests
#   make demo    nginx + the module in front of kvsim servers, narrated
#   make bench   routing cost in process, then through nginx with wrk
#   make bench-events, make bench-e2e   the event path; all policies on kvsim
#   make bench-worst   the longest zone-lock holds adversarial input can cause

SHELL      := /bin/bash
BUILD      := $(CURDIR)/build
NGX_SRC    := /usr/share/nginx/src
MODULE     := $(BUILD)/ngx_http_kv_aware_module.so

CC         ?= cc
CFLAGS_CORE = -std=gnu99 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter \
              -Wpointer-arith -Isrc

CORE_SRCS  := src/kva_prompt.c src/kva_hash.c src/kva_index.c src/kva_score.c \
              src/kva_event.c
CORE_HDRS  := $(CORE_SRCS:.c=.h)
NGX_SRCS   := $(wildcard src/ngx_http_kv_aware_*.c src/ngx_http_kv_aware_*.h)

# core unit tests link the core alone; tools/*.mk add their own
UNIT_TESTS := $(patsubst %,$(BUILD)/unit/test_%,prompt prompt_ref hash index score \
              event)
TOOLS      :=

PACKAGES   := build-essential nginx nginx-dev libhiredis-dev libjansson-dev \
              libxxhash-dev libevent-dev redis-server redis-tools wrk \
              gnuplot-nox perl curl python3 procps

.PHONY: all deps module unit tools test demo bench bench-events bench-e2e \
        bench-worst clean

all: module

-include $(wildcard tools/*.mk)

deps:
	@bash tools/install-deps.sh $(PACKAGES)

module: $(MODULE)

$(BUILD)/Makefile: config
	@mkdir -p $(BUILD)
	cd $(NGX_SRC) && . ./conf_flags && \
	    ./configure "$${NGX_CONF_FLAGS[@]}" --add-dynamic-module=$(CURDIR) \
	        --builddir=$(BUILD) > $(BUILD)/configure.log 2>&1 || \
	    { tail -20 $(BUILD)/configure.log; exit 1; }

$(MODULE): $(BUILD)/Makefile $(CORE_SRCS) $(CORE_HDRS) $(NGX_SRCS)
	cd $(NGX_SRC) && $(MAKE) -s -f $(BUILD)/Makefile modules
	@ls -l $(MODULE)

$(BUILD)/unit/%: t/unit/%.c $(CORE_SRCS) $(CORE_HDRS)
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -It/unit -o $@ $< $(CORE_SRCS) -ljansson -lxxhash

# the differential test of the scanner links its random body generator
PROMPT_TEST_SRCS := $(wildcard t/unit/prompt_rand.c)

$(BUILD)/unit/test_prompt $(BUILD)/unit/test_prompt_ref: t/unit/prompt_gen.h \
        t/unit/tap.h $(wildcard t/unit/prompt_rand.h)

$(BUILD)/unit/test_prompt_ref: t/unit/test_prompt_ref.c $(PROMPT_TEST_SRCS) \
        $(CORE_SRCS) $(CORE_HDRS)
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -It/unit -o $@ $< $(PROMPT_TEST_SRCS) \
	    $(CORE_SRCS) -ljansson -lxxhash

unit: $(UNIT_TESTS)

tools: $(TOOLS)

# prove runs the unit test binaries (TAP) and the Perl tests in one go
test: deps module unit tools
	prove -I t/lib $(UNIT_TESTS) -r t/

demo: deps module tools
	perl tools/demo.pl

BENCHES    := $(patsubst bench/%.c,$(BUILD)/%,$(wildcard bench/bench_*.c))

$(BUILD)/bench_%: bench/bench_%.c bench/bench_util.h $(CORE_SRCS) $(CORE_HDRS)
	$(CC) $(CFLAGS_CORE) -o $@ $< $(CORE_SRCS) -ljansson -lxxhash

# numbers, not tests: routing cost in process, then through nginx
bench: deps module $(BENCHES)
	$(BUILD)/bench_route
	$(BUILD)/bench_prompt
	$(BUILD)/bench_event
	bash bench/wrk.sh

# the Redis event path: hashes applied per second, publish-to-visible
# latency, routing latency under an event stream (about a minute)
bench-events: deps module
	bash bench/bench_events.sh

# worst-case lock holds: floods of colliding keys, the largest messages
bench-worst: $(BUILD)/bench_worst
	$(BUILD)/bench_worst

# every balancing policy side by side on kvsim (about 6 minutes)
bench-e2e: deps module tools
	bash bench/e2e/run.sh

clean:
	rm -rf $(BUILD)
