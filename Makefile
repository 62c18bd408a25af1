# ngx_http_kv_aware_module: build, test, demo, benchmark.
#
#   make deps    install what is missing from Debian's archive (apt-get)
#   make module  build/ngx_http_kv_aware_module.so against Debian's nginx
#   make test    unit tests, then the integration tests against Debian's
#                nginx 1.22.1, nginx 1.30.4 built from vendor/nginx/,
#                and the same under ASan/UBSan (make test-asan)
#   make test-nginx [NGINX_VERSION=1.31.4]   one nginx from source only
#   make demo    nginx + the module in front of kvsim servers, narrated
#   make soak    ten minutes of faults around nginx, then the bridge, under load
#   make bench   routing cost in process, then through nginx with wrk
#   make bench-events, make bench-e2e   the event path (Redis, kvbridge);
#                all policies on kvsim
#   make bench-pd  disaggregated prefill/decode against aggregated, on kvsim
#   make fuzz    each fuzz/fuzz_<name>.c for FUZZ_SECONDS under libFuzzer
#   make bench-worst   the longest zone-lock holds adversarial input can cause
#   make index-replay  build/bench_index_replay, for bench/e2e/index_replay.py

SHELL      := /bin/bash
BUILD      := $(CURDIR)/build
NGX_SRC    := /usr/share/nginx/src
MODULE     := $(BUILD)/ngx_http_kv_aware_module.so

CC         ?= cc
CFLAGS_CORE = -std=gnu99 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter \
              -Wpointer-arith -Isrc/core -Itools/common $(SAN_CFLAGS)

# the nginx-free core: src/core/sources is its one list (config reads it
# too), built once into libkva.a, which the tests, tools and benches link
CORE_FILES := $(addprefix src/core/,$(shell sed -e 's/\#.*//' src/core/sources))
CORE_SRCS  := $(filter %.c,$(CORE_FILES))
CORE_HDRS  := $(filter %.h,$(CORE_FILES))
CORE_OBJS   = $(CORE_SRCS:src/core/%.c=$(BUILD)/core/%.o)
LIBKVA      = $(BUILD)/libkva.a
KVA_HASHES  = $(BUILD)/kva_hashes
NGX_SRCS   := $(wildcard src/ngx_http_kv_aware_*.c src/ngx_http_kv_aware_*.h)

# core unit tests link the core alone; tools/*.mk add their own
UNIT_TESTS := $(patsubst %,$(BUILD)/unit/test_%,prompt prompt_ref hash index index_wide \
              index_tiers \
              score pd_body \
              event event_encode event_limits session cluster ttft)
TOOLS      :=

# everything the tests use that a minimal Debian 12 (debootstrap minbase,
# the debian:12 image) lacks: netbase for /etc/protocols, without which
# Net::DNS's test server opens no socket (t/59); llvm for the unversioned
# llvm-symbolizer, without which LeakSanitizer's stacks have no function
# names for the suppressions to match (test_kvbridge_conf's); git for
# t/01 and the clone test
PACKAGES   := build-essential nginx nginx-dev libhiredis-dev libjansson-dev \
              libxxhash-dev libevent-dev redis-server redis-tools wrk \
              gnuplot-nox perl libredis-perl libnet-dns-perl curl python3 \
              procps libpcre2-dev zlib1g-dev clang libclang-rt-14-dev \
              python3-prometheus-client nodejs npm libnginx-mod-http-lua \
              netbase llvm git

# libFuzzer targets: fuzz/fuzz_<name>.c, seeds in fuzz/corpus/<name>/
FUZZ_TARGETS := $(patsubst fuzz/fuzz_%.c,%,$(wildcard fuzz/fuzz_*.c))
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)
FUZZ_CC      := clang
FUZZ_FLAGS   := -g -O1 -fno-sanitize-recover=undefined -Wall -Wextra -Werror \
                -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION \
                -Wno-unused-parameter -Isrc/core -It/unit -Itools/common
FUZZ_CFLAGS  := -fsanitize=fuzzer,address,undefined $(FUZZ_FLAGS)
# the core for the fuzz targets: instrumented the same way, no main
FUZZ_LIB     := $(BUILD)/fuzz/libkva.a
FUZZ_OBJS    := $(CORE_SRCS:src/core/%.c=$(BUILD)/fuzz/core/%.o)
FUZZ_SECONDS ?= 60

# nginx from source (tools/build-nginx.sh): the current stable by default
NGINX_VERSION := 1.30.4
NGINX_DIR   = $(BUILD)/nginx-$(NGINX_VERSION)
# each stage's output also lands in build/test-STAGE.log (tools/prove-stage.sh)
PROVE      = HARNESS_RULESFILE=$(TEST_RULES) \
             bash tools/prove-stage.sh $(BUILD)/$@.log --timer -I t/lib

# The stages run the tests in two phases, by a rules file that prove
# reads (HARNESS_RULESFILE, written from the lists below):
#   1. side by side, TEST_JOBS at a time: most of a test's time is
#      waiting (timeouts, heartbeats, reconnects, delays it asks for),
#      and each has its own prefix, ports, Redis and kvsim.  The fuzz
#      targets run for a fixed time whatever runs beside them (niced: the
#      others get the CPU first): they start first, then the longest
#      tests (the fresh clone builds an nginx), the Docker build (a niced
#      compiler) last.
#   2. one at a time, the ones that bound times or memory under load: the
#      unit tests (kvbridge's stream and loop time their slices in
#      milliseconds; all of them take under a minute), kvload's stages,
#      the floods whose requests must stay fast (sub-second bounds), the
#      subscribing worker's peak memory under 4 MB messages (under ASan,
#      side by side, its reads batched up and it grew 37 MB against 32),
#      the bridge's snapshot pacing and its memory with Redis hung, the
#      status page under load, the warning of a bridge pair (it waits
#      while the followed bridge's messages come later than the 2 s
#      heartbeat: under ASan beside the others one server was not warned
#      in 45 s), and the two soaks (side by side with the others, both
#      once lost every request to a flood of connections; beside each
#      other, on a loaded machine, kvload's requests piled up past
#      nginx's 1,024 connections).
# TEST_JOBS=1: everything one at a time.
TEST_JOBS   ?= 5
TESTS_ALONE := t/06-bridge-pair.t \
               t/23-kvload-stages.t t/36-clear-flood.t t/37-clear-message.t \
               t/38-hash-flood.t t/45-status-under-load.t \
               t/48-event-amplification.t \
               t/65-kvbridge-engine.t t/74-kvbridge-redis-hung.t \
               t/95-soak.t t/96-bridge-soak.t
TESTS_FIRST := t/90-fuzz.t t/16-config.t t/10-affinity.t \
               t/59-share-learned.t t/70-openai-js.t t/66-kvbridge-nginx.t \
               t/12-failover.t t/15-reload.t t/11-spread.t t/56-prometheus.t \
               t/03-fresh-clone.t
TESTS_LAST  := t/71-docker-build.t
TESTS_SIDE   = $(TESTS_FIRST) $(filter-out $(TESTS_ALONE) $(TESTS_FIRST) \
                   $(TESTS_LAST), $(wildcard t/*.t)) \
               $(TESTS_LAST)
TEST_RULES   = $(BUILD)/testrules.yml
PROVE_JOBS   = -j$(TEST_JOBS)

# YAML for TAP::Harness: a list item a test (the unit tests by a glob,
# they live under build/ or build/asan/)
yaml_list = $(foreach t,$(2),printf "%s- '%s'\n" '$(1)' '$(t)' &&)

.PHONY: $(TEST_RULES)
$(TEST_RULES):
	@mkdir -p $(BUILD)
	@{ printf 'seq:\n  - par:\n' && $(call yaml_list,      ,$(TESTS_SIDE)) \
	   printf '  - seq:\n' && \
	   $(call yaml_list,      ,**/unit/test_* $(TESTS_ALONE)) \
	   true; } > $@

# make test-asan: everything rebuilt with the sanitizers under build/asan/
ASAN_BUILD := $(BUILD)/asan
ASAN_NGINX := $(BUILD)/nginx-$(NGINX_VERSION)-asan
# the unit tests and kvsim stop at the first UBSan report, so that they
# fail; nginx goes on and its report files fail the test
SAN        := -fsanitize=address,undefined -fno-sanitize-recover=undefined \
              -fno-omit-frame-pointer
# LeakSanitizer checks every process at exit, nginx's master and workers
# included (the harness turns it off for "nginx -t" and "nginx -s", which
# exit without freeing their configuration: nginx.c's init_cycle pool)
ASAN_ENV   := ASAN_OPTIONS=detect_leaks=1 \
              UBSAN_OPTIONS=print_stacktrace=1:suppressions=$(CURDIR)/t/sanitizers.supp

.PHONY: all deps module unit tools test test-debian test-nginx test-asan \
        nginx-build asan-build \
        demo bench bench-events bench-e2e bench-pd soak fuzz fuzz-build bench-worst \
        index-replay clean

all: module

-include $(wildcard tools/*.mk)

deps:
	@bash tools/install-deps.sh $(PACKAGES)

module: $(MODULE)

# nginx's configure compiles at -O unless told, where Debian builds its
# nginx at -O2 (nginx -V) and libkva.a is built so too: at -O the index's
# small helpers were calls, one a probe through the PLT
MODULE_CC_OPT ?= -O2

$(BUILD)/Makefile: config Makefile src/core/sources
	@mkdir -p $(BUILD)
	cd $(NGX_SRC) && . ./conf_flags && \
	    ./configure "$${NGX_CONF_FLAGS[@]}" --add-dynamic-module=$(CURDIR) \
	        --with-cc-opt="$(MODULE_CC_OPT)" \
	        --builddir=$(BUILD) > $(BUILD)/configure.log 2>&1 || \
	    { tail -20 $(BUILD)/configure.log; exit 1; }

$(MODULE): $(BUILD)/Makefile $(CORE_SRCS) $(CORE_HDRS) $(NGX_SRCS)
	cd $(NGX_SRC) && $(MAKE) -s -f $(BUILD)/Makefile modules
	@ls -l $(MODULE)

$(BUILD)/core/%.o: src/core/%.c $(CORE_HDRS)
	@mkdir -p $(BUILD)/core
	$(CC) $(CFLAGS_CORE) -c -o $@ $<

$(LIBKVA): $(CORE_OBJS)
	rm -f $@
	$(AR) rcs $@ $^

# the module's block hashes of a body, for the tests and bench_events.sh
$(KVA_HASHES): t/lib/kva_hashes.c $(LIBKVA)
	$(CC) $(CFLAGS_CORE) -o $@ $< $(LIBKVA) -lxxhash

$(BUILD)/unit/%: t/unit/%.c $(LIBKVA)
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -It/unit -o $@ $< $(LIBKVA) \
	    -ljansson -lxxhash -lhiredis

# the differential test of the scanner links its random body generator
PROMPT_TEST_SRCS := $(wildcard t/unit/prompt_rand*.c)

$(BUILD)/unit/test_prompt $(BUILD)/unit/test_prompt_ref: t/unit/prompt_gen.h \
        t/unit/tap.h $(wildcard t/unit/prompt_rand*.h)

$(BUILD)/unit/test_prompt_ref: t/unit/test_prompt_ref.c $(PROMPT_TEST_SRCS) \
        $(LIBKVA)
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -It/unit -o $@ $< \
	    $(PROMPT_TEST_SRCS) $(LIBKVA) -ljansson -lxxhash

# the event codec's tests share their random batches and decode helpers
EVENT_TESTS := $(BUILD)/unit/test_event $(BUILD)/unit/test_event_encode \
               $(BUILD)/unit/test_event_limits

$(EVENT_TESTS): $(BUILD)/unit/%: t/unit/%.c t/unit/event_gen.c \
        t/unit/event_gen.h t/unit/tap.h $(LIBKVA)
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS_CORE) -It/unit -o $@ $< \
	    t/unit/event_gen.c $(LIBKVA) -ljansson -lxxhash

unit: $(UNIT_TESTS) $(KVA_HASHES)

tools: $(TOOLS)

# Stages in this order, the first failure stops make test.  CI reads the
# last summary printed, which must be prove's: a new stage goes before
# test-asan.
test: test-debian test-nginx test-asan

# within make test, a stage starts the next one's builds (nginx-build,
# asan-build)
test: BUILD_AHEAD = 1

# prove runs the unit test binaries (TAP) and the Perl tests in one go,
# against Debian's nginx 1.22.1; the fuzz targets (t/90) and the two
# fault soaks (t/95, t/96) run here, a minute each, and again under ASan
# (one at a time, they were four of the suite's 24 minutes at two each;
# `make soak` runs ten)
test-debian: deps module unit tools $(TEST_RULES)
	@echo "== unit tests, integration tests: Debian's nginx 1.22.1"
	$(if $(BUILD_AHEAD),nice -n 19 $(MAKE) -s nginx-build \
	    > $(BUILD)/nginx-build.log 2>&1 &)
	KVA_SOAK_SECONDS=60 $(PROVE) $(PROVE_JOBS) $(UNIT_TESTS) -r t/

# what most users run: the same integration tests against nginx.org's
# stable (or NGINX_VERSION=1.31.4, mainline) built with the module; the
# tests of kvbridge that run no nginx (KVA_NGINX_FREE=0) are left to the
# other two stages
test-nginx: deps unit tools $(TEST_RULES)
	@echo "== integration tests: nginx $(NGINX_VERSION) from source"
	$(MAKE) -s nginx-build
	$(if $(BUILD_AHEAD),nice -n 19 $(MAKE) -s asan-build \
	    > $(BUILD)/asan-build.log 2>&1 &)
	KVA_FUZZ_SECONDS=0 KVA_SOAK_SECONDS=0 KVA_NGINX_FREE=0 \
	TEST_NGINX_BINARY=$(NGINX_DIR)/objs/nginx \
	KV_AWARE_MODULE=$(NGINX_DIR)/objs/ngx_http_kv_aware_module.so \
	    $(PROVE) $(PROVE_JOBS) -r t/

# ASan and UBSan: the unit tests and kvsim rebuilt with them, and nginx
# itself built with them from source (tools/build-nginx.sh --asan) rather
# than a sanitized module preloaded into Debian's nginx.  The module
# allocates from nginx's pools; only with NGX_DEBUG_PALLOC is every pool
# allocation its own malloc, so that an overflow of request or
# configuration memory is caught instead of landing in the next object of
# the pool block (and nginx's code, which the module drives, is checked
# too).  Reports of nginx land in each test's prefix and fail that test
# (t/lib/Test/KvAware.pm).  The tests' hasher (build/kva_hashes, with
# build/libkva.a) is built first: tests running side by side would each
# make it at once.
test-asan: deps $(KVA_HASHES) $(TEST_RULES)
	@echo "== unit tests, integration tests: ASan/UBSan, nginx $(NGINX_VERSION)"
	$(MAKE) -s asan-build
	$(ASAN_ENV) KVA_FUZZ_SECONDS=0 KVA_SOAK_SECONDS=60 \
	TEST_NGINX_BINARY=$(ASAN_NGINX)/objs/nginx \
	KV_AWARE_MODULE=$(ASAN_NGINX)/objs/ngx_http_kv_aware_module.so \
	KVSIM_BINARY=$(ASAN_BUILD)/kvsim KVLOAD_BINARY=$(ASAN_BUILD)/kvload \
	KVBRIDGE_BINARY=$(ASAN_BUILD)/kvbridge \
	    $(PROVE) $(PROVE_JOBS) $(UNIT_TESTS:$(BUILD)/%=$(ASAN_BUILD)/%) -r t/

# The next stage's builds, each one at a time (flock): within make test
# each stage starts the next one's beside its tests, at nice 19 so that
# they only take the CPU the tests leave (the sanitized builds alone take
# 4.5 minutes of CPU from clean), and the next stage waits for that build
# to end and finds everything made.
nginx-build:
	flock $(BUILD)/nginx-build.lock bash tools/build-nginx.sh $(NGINX_VERSION)

asan-build:
	flock $(BUILD)/asan-build.lock $(MAKE) -s BUILD=$(ASAN_BUILD) CC=clang \
	    SAN_CFLAGS="$(SAN)" unit tools
	flock $(BUILD)/asan-build.lock \
	    bash tools/build-nginx.sh --asan $(NGINX_VERSION)

# the fault soaks for ten minutes each (make test runs one): t/95 reloads,
# Redis and a server killed, a hostile publisher; t/96 the bridge's
# faults (Redis hung and killed, an engine killed, replay floods, hostile
# collector peers); both while kvload runs through nginx
SOAK_SECONDS ?= 600

soak: deps module tools
	KVA_SOAK_SECONDS=$(SOAK_SECONDS) prove -v -I t/lib t/95-soak.t \
	    t/96-bridge-soak.t

demo: deps module tools
	perl tools/demo.pl

BENCHES    := $(patsubst bench/%.c,$(BUILD)/%,$(wildcard bench/bench_*.c))

$(BUILD)/bench_%: bench/bench_%.c bench/bench_util.h $(LIBKVA)
	$(CC) $(CFLAGS_CORE) -o $@ $< $(LIBKVA) -ljansson -lxxhash

# numbers, not tests: routing cost in process, then through nginx
bench: deps module $(BENCHES)
	$(BUILD)/bench_route
	$(BUILD)/bench_prompt
	$(BUILD)/bench_hash_lanes
	$(BUILD)/bench_event
	$(BUILD)/bench_event_cost
	bash bench/wrk.sh

# the Redis event path: hashes applied per second, publish-to-visible
# latency, routing latency under an event stream (about a minute); then
# kvbridge: its cost on one core, publish-to-visible through it; one bridge
# for 256 engines (kvsim, then synthetic engines until it saturates); 8
# nginx on one Redis channel
bench-events: deps module tools $(KVA_HASHES) $(BUILD)/bench_bridge
	bash bench/bench_events.sh
	bash bench/bench_bridge.sh
	bash bench/bench_fleet.sh
	bash bench/bench_fleet_flood.sh
	bash bench/bench_fanout.sh

# worst-case lock holds: floods of colliding keys, the largest messages
bench-worst: $(BUILD)/bench_worst
	$(BUILD)/bench_worst

# the core index fed a bench-e2e run's requests again, for
# bench/e2e/index_replay.py
index-replay: $(BUILD)/bench_index_replay

# every balancing policy side by side on kvsim (about 6 minutes)
bench-e2e: deps module tools
	bash bench/e2e/run.sh

# aggregated and disaggregated on the same 8 kvsim servers (about 5 minutes)
bench-pd: deps module tools
	bash bench/e2e/pd.sh

# the sanitizers and libFuzzer's main come with clang's runtime; a target
# needing more than the core names it in FUZZ_SRCS_<name>, FUZZ_LIBS_<name>
$(BUILD)/fuzz/core/%.o: src/core/%.c $(CORE_HDRS)
	@mkdir -p $(BUILD)/fuzz/core
	$(FUZZ_CC) -fsanitize=fuzzer-no-link,address,undefined $(FUZZ_FLAGS) \
	    -c -o $@ $<

$(FUZZ_LIB): $(FUZZ_OBJS)
	rm -f $@
	$(AR) rcs $@ $^

.SECONDEXPANSION:
$(BUILD)/fuzz/fuzz_%: fuzz/fuzz_%.c $(FUZZ_LIB) t/unit/json_depth.h \
        $$(FUZZ_SRCS_$$*)
	@mkdir -p $(BUILD)/fuzz
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_SRCS_$*) $(FUZZ_LIB) \
	    -ljansson -lxxhash $(FUZZ_LIBS_$*)

fuzz-build: $(FUZZ_BINS)

# fails if any target crashes; the corpora grow in build/fuzz/corpus-*/
fuzz: deps fuzz-build
	bash fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)

clean:
	rm -rf $(BUILD)
