# ngx_http_kv_aware_module: build, test, demo, benchmark.
#
#   make deps    install what is missing from Debian's archive (apt-get)
#   make module  build/ngx_http_kv_aware_module.so against Debian's nginx
#   make test    unit tests of the core, then the nginx integration tests
#   make demo    nginx + the module in front of kvsim servers, narrated
#   make soak    ten minutes of faults around nginx under load
#   make bench   routing cost in process, then through nginx with wrk
#   make bench-events, make bench-e2e   the event path; all policies on kvsim
#   make fuzz    each fuzz/fuzz_<name>.c for FUZZ_SECONDS under libFuzzer
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
              gnuplot-nox perl curl python3 procps clang libclang-rt-14-dev

# libFuzzer targets: fuzz/fuzz_<name>.c, seeds in fuzz/corpus/<name>/
FUZZ_TARGETS := $(patsubst fuzz/fuzz_%.c,%,$(wildcard fuzz/fuzz_*.c))
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)
FUZZ_CC      := clang
FUZZ_CFLAGS  := -g -O1 -fsanitize=fuzzer,address,undefined \
                -fno-sanitize-recover=undefined -Wall -Wextra -Werror \
                -Wno-unused-parameter -Isrc -It/unit
FUZZ_SECONDS ?= 60

.PHONY: all deps module unit tools test demo bench bench-events bench-e2e \
        soak fuzz fuzz-build bench-worst clean

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

# the fault soak for ten minutes (make test runs two): reloads, Redis and a
# server killed, a hostile publisher, while kvload runs through nginx
SOAK_SECONDS ?= 600

soak: deps module tools
	KVA_SOAK_SECONDS=$(SOAK_SECONDS) prove -v -I t/lib t/95-soak.t

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
	$(BUILD)/bench_event_cost
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

# the sanitizers and libFuzzer's main come with clang's runtime; a target
# needing more than the core names it in FUZZ_SRCS_<name>, FUZZ_LIBS_<name>
.SECONDEXPANSION:
$(BUILD)/fuzz/fuzz_%: fuzz/fuzz_%.c $(CORE_SRCS) $(CORE_HDRS) t/unit/json_depth.h \
        $$(FUZZ_SRCS_$$*)
	@mkdir -p $(BUILD)/fuzz
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $< $(CORE_SRCS) $(FUZZ_SRCS_$*) \
	    -ljansson -lxxhash $(FUZZ_LIBS_$*)

fuzz-build: $(FUZZ_BINS)

# fails if any target crashes; the corpora grow in build/fuzz/corpus-*/
fuzz: deps fuzz-build
	bash fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)

clean:
	rm -rf $(BUILD)
