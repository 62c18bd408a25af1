# ngx_http_kv_aware_module: build, test, demo, benchmark.
#
#   make deps    install what is missing from Debian's archive (apt-get)
#   make module  build/ngx_http_kv_aware_module.so against Debian's nginx
#   make test    unit tests, then the integration tests against Debian's
#                nginx 1.22.1, nginx 1.30.4 built from ../shared/vendor/,
#                and the same under ASan/UBSan (make test-asan)
#   make test-nginx [NGINX_VERSION=1.31.4]   one nginx from source only
#   make demo    nginx + the module in front of kvsim servers, narrated
#   make bench   routing cost in process, then through nginx with wrk
#   make bench-events, make bench-e2e   the event path; all policies on kvsim

SHELL      := /bin/bash
BUILD      := $(CURDIR)/build
NGX_SRC    := /usr/share/nginx/src
MODULE     := $(BUILD)/ngx_http_kv_aware_module.so

CC         ?= cc
CFLAGS_CORE = -std=gnu99 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter \
              -Wpointer-arith -Isrc $(SAN_CFLAGS)

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
              gnuplot-nox perl curl python3 procps \
              libpcre2-dev zlib1g-dev clang libclang-rt-14-dev

# nginx from source (tools/build-nginx.sh): the current stable by default
NGINX_VERSION := 1.30.4
NGINX_DIR   = $(BUILD)/nginx-$(NGINX_VERSION)
PROVE      := prove -I t/lib

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
        demo bench bench-events bench-e2e clean

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

# Stages in this order, the first failure stops make test.  CI reads the
# last summary printed, which must be prove's: a new stage goes before
# test-asan.
test: test-debian test-nginx test-asan

# prove runs the unit test binaries (TAP) and the Perl tests in one go,
# against Debian's nginx 1.22.1
test-debian: deps module unit tools
	@echo "== unit tests, integration tests: Debian's nginx 1.22.1"
	$(PROVE) $(UNIT_TESTS) -r t/

# what most users run: the same integration tests against nginx.org's
# stable (or NGINX_VERSION=1.31.4, mainline) built with the module
test-nginx: deps unit tools
	@echo "== integration tests: nginx $(NGINX_VERSION) from source"
	bash tools/build-nginx.sh $(NGINX_VERSION)
	TEST_NGINX_BINARY=$(NGINX_DIR)/objs/nginx \
	KV_AWARE_MODULE=$(NGINX_DIR)/objs/ngx_http_kv_aware_module.so \
	    $(PROVE) -r t/

# ASan and UBSan: the unit tests and kvsim rebuilt with them, and nginx
# itself built with them from source (tools/build-nginx.sh --asan) rather
# than a sanitized module preloaded into Debian's nginx.  The module
# allocates from nginx's pools; only with NGX_DEBUG_PALLOC is every pool
# allocation its own malloc, so that an overflow of request or
# configuration memory is caught instead of landing in the next object of
# the pool block (and nginx's code, which the module drives, is checked
# too).  Reports of nginx land in each test's prefix and fail that test
# (t/lib/Test/KvAware.pm).
test-asan: deps
	@echo "== unit tests, integration tests: ASan/UBSan, nginx $(NGINX_VERSION)"
	$(MAKE) -s BUILD=$(ASAN_BUILD) CC=clang SAN_CFLAGS="$(SAN)" unit tools
	bash tools/build-nginx.sh --asan $(NGINX_VERSION)
	$(ASAN_ENV) TEST_NGINX_BINARY=$(ASAN_NGINX)/objs/nginx \
	KV_AWARE_MODULE=$(ASAN_NGINX)/objs/ngx_http_kv_aware_module.so \
	KVSIM_BINARY=$(ASAN_BUILD)/kvsim \
	    $(PROVE) $(UNIT_TESTS:$(BUILD)/%=$(ASAN_BUILD)/%) -r t/

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

# every balancing policy side by side on kvsim (about 6 minutes)
bench-e2e: deps module tools
	bash bench/e2e/run.sh

clean:
	rm -rf $(BUILD)
