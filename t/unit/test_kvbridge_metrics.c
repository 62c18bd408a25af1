/*
 * kvbridge's scrape of an engine's load (tools/kvbridge/kvb_metrics.c):
 * the exposition parser on text shaped like vLLM's and SGLang's /metrics
 * (HELP and TYPE lines, histograms, labels per engine and model) and on
 * hostile text; the chunked decoder split at every byte; the HTTP client
 * against a server forked on 127.0.0.1 that answers with a length,
 * chunked, to close, slowly, with 500, with garbage and not at all.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "tap.h"
#include "kva_rand.h"
#include "kvb_scrape.h"


/* vLLM v1, two engines (data parallel), one model, as prometheus_client */
static const char  vllm_text[] =
    "# HELP python_gc_objects_collected_total Objects collected during gc\n"
    "# TYPE python_gc_objects_collected_total counter\n"
    "python_gc_objects_collected_total{generation=\"0\"} 12345.0\n"
    "# HELP vllm:num_requests_running Number of requests in model "
    "execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"meta-llama/"
    "Llama-3.1-8B-Instruct\"} 7.0\n"
    "vllm:num_requests_running{engine=\"1\",model_name=\"meta-llama/"
    "Llama-3.1-8B-Instruct\"} 5.0\n"
    "# HELP vllm:num_requests_waiting Number of requests waiting to be "
    "processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"meta-llama/"
    "Llama-3.1-8B-Instruct\"} 2.0\n"
    "vllm:num_requests_waiting{engine=\"1\",model_name=\"meta-llama/"
    "Llama-3.1-8B-Instruct\"} 1.0\n"
    "# HELP vllm:num_requests_waiting_by_reason Waiting requests by reason\n"
    "# TYPE vllm:num_requests_waiting_by_reason gauge\n"
    "vllm:num_requests_waiting_by_reason{engine=\"0\",reason=\"capacity\"} "
    "40.0\n"
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent "
    "usage.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"meta-llama/"
    "Llama-3.1-8B-Instruct\"} 0.4375\n"
    "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"meta-llama/"
    "Llama-3.1-8B-Instruct\"} 0.8125\n"
    "# HELP vllm:time_to_first_token_seconds Histogram of time to first "
    "token in seconds.\n"
    "# TYPE vllm:time_to_first_token_seconds histogram\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.001\","
    "model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.0\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\","
    "model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 310.0\n"
    "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name="
    "\"meta-llama/Llama-3.1-8B-Instruct\"} 310.0\n"
    "vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name="
    "\"meta-llama/Llama-3.1-8B-Instruct\"} 41.90625\n"
    "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
    "# TYPE vllm:prompt_tokens_total counter\n"
    "vllm:prompt_tokens_total{engine=\"0\",model_name=\"meta-llama/"
    "Llama-3.1-8B-Instruct\"} 8.125e+06\n";

/* vLLM before v0.10: the deprecated usage name, no engine label */
static const char  vllm_old_text[] =
    "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 "
    "percent usage.\n"
    "# TYPE vllm:gpu_cache_usage_perc gauge\n"
    "vllm:gpu_cache_usage_perc{model_name=\"Qwen/Qwen2.5-7B\"} 0.25\n"
    "# HELP vllm:num_requests_running Number of requests currently "
    "running on GPU.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{model_name=\"Qwen/Qwen2.5-7B\"} 3.0\n";

/* SGLang, two DP ranks, CRLF as a proxy might rewrite it */
static const char  sglang_text[] =
    "# HELP sglang:num_running_reqs The number of running requests.\r\n"
    "# TYPE sglang:num_running_reqs gauge\r\n"
    "sglang:num_running_reqs{dp_rank=\"0\",engine_type=\"unified\","
    "model_name=\"deepseek-ai/DeepSeek-V3\",pp_rank=\"0\",tp_rank=\"0\"} "
    "31.0\r\n"
    "sglang:num_running_reqs{dp_rank=\"1\",engine_type=\"unified\","
    "model_name=\"deepseek-ai/DeepSeek-V3\",pp_rank=\"0\",tp_rank=\"0\"} "
    "29.0\r\n"
    "# HELP sglang:num_queue_reqs The number of requests in the waiting "
    "queue.\r\n"
    "# TYPE sglang:num_queue_reqs gauge\r\n"
    "sglang:num_queue_reqs{dp_rank=\"0\",engine_type=\"unified\","
    "model_name=\"deepseek-ai/DeepSeek-V3\",pp_rank=\"0\",tp_rank=\"0\"} "
    "4.0\r\n"
    "sglang:num_queue_reqs{dp_rank=\"1\",engine_type=\"unified\","
    "model_name=\"deepseek-ai/DeepSeek-V3\",pp_rank=\"0\",tp_rank=\"0\"} "
    "0.0\r\n"
    "# HELP sglang:token_usage The token usage.\r\n"
    "# TYPE sglang:token_usage gauge\r\n"
    "sglang:token_usage{dp_rank=\"0\",engine_type=\"unified\","
    "model_name=\"deepseek-ai/DeepSeek-V3\",pp_rank=\"0\",tp_rank=\"0\"} "
    "0.61\r\n"
    "sglang:token_usage{dp_rank=\"1\",engine_type=\"unified\","
    "model_name=\"deepseek-ai/DeepSeek-V3\",pp_rank=\"0\",tp_rank=\"0\"} "
    "0.58\r\n"
    "# HELP sglang:num_used_tokens The number of used tokens.\r\n"
    "# TYPE sglang:num_used_tokens gauge\r\n"
    "sglang:num_used_tokens{dp_rank=\"0\"} 123456.0\r\n";


static uint64_t
now_ms(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);

    return (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}


static int
parse(const char *s, kvb_load_t *load)
{
    return kvb_metrics_parse(s, strlen(s), load);
}


static void
test_parse_engines(void)
{
    kvb_load_t  l;

    ok(parse(vllm_text, &l) == 0, "vLLM: parsed");
    ok(l.have_running && l.have_waiting && l.have_usage,
       "vLLM: all three found");
    ok(l.running == 12 && l.waiting == 3,
       "vLLM: two engines' counts added (running %u, waiting %u)",
       l.running, l.waiting);
    ok(l.kv_usage == 0.8125, "vLLM: usage is the fuller engine's (%g)",
       l.kv_usage);

    ok(parse(vllm_old_text, &l) == 0 && l.have_usage && l.have_running
       && !l.have_waiting && l.kv_usage == 0.25 && l.running == 3,
       "older vLLM: gpu_cache_usage_perc read, waiting absent");

    ok(parse(sglang_text, &l) == 0 && l.running == 60 && l.waiting == 4
       && l.kv_usage == 0.61,
       "SGLang, CRLF: running %u, waiting %u, usage %g",
       l.running, l.waiting, l.kv_usage);

    /* the text cut anywhere: never an error, never a read past len */
    {
        size_t    cut, n;
        unsigned  bad;
        char     *copy;

        n = strlen(vllm_text);
        bad = 0;

        for (cut = 0; cut <= n; cut++) {
            /* a heap copy of exactly cut bytes: ASan sees an overread */
            copy = malloc(cut ? cut : 1);
            memcpy(copy, vllm_text, cut);

            if (kvb_metrics_parse(copy, cut, &l) == 0
                && (l.kv_usage < 0 || l.kv_usage > 1
                    || l.running > 12 || l.waiting > 3))
            {
                bad++;
            }

            free(copy);
        }

        ok(bad == 0, "vLLM text cut at each of %zu bytes: sane loads", n);
    }
}


static void
test_parse_edges(void)
{
    char        *big;
    size_t       n;
    kvb_load_t   l;

    ok(parse("", &l) == -1 && !l.have_running && !l.have_usage,
       "empty text: -1");
    ok(parse("# HELP vllm:num_requests_running x\n"
             "# TYPE vllm:num_requests_running gauge\n", &l) == -1,
       "comments only: -1");
    ok(parse("foo 1\nbar{a=\"b\"} 2\n", &l) == -1, "other names: -1");
    ok(parse("\x01\xff garbage \n{}}}{\"\"\n\n\n", &l) == -1, "garbage: -1");

    ok(parse("vllm:num_requests_running 4", &l) == 0 && l.running == 4,
       "no labels, no trailing newline");
    ok(parse("  vllm:num_requests_running\t4 1700000000000\n", &l) == 0
       && l.running == 4, "leading blanks, tab, timestamp");
    ok(parse("vllm:num_requests_running{} 4\n", &l) == 0 && l.running == 4,
       "empty label set");
    ok(parse("vllm:num_requests_running{model_name=\"a\",} 4\n", &l) == 0
       && l.running == 4, "trailing comma in the labels");
    ok(parse("vllm:num_requests_running{model_name=\"a \\\"q\\\" "
             "\\\\ } 99 \\n{\",engine=\"0\"} 4\n", &l) == 0
       && l.running == 4,
       "label value with escaped quote, backslash, newline, brace");
    ok(parse("vllm:num_requests_running{model_name=\"a\\\"} 99\n", &l) == -1,
       "label value never closed: line skipped");
    ok(parse("vllm:num_requests_running{model_name=\"a\" 4\n", &l) == -1,
       "label set never closed: line skipped");
    ok(parse("vllm:num_requests_running{model_name=a} 4\n", &l) == -1,
       "unquoted label value: line skipped");

    ok(parse("vllm:num_requests_running_total 4\n"
             "vllm:num_requests_runningx 5\n"
             "xvllm:num_requests_running 6\n"
             "vllm:num_requests_running.5 7\n", &l) == -1,
       "names that only start or end like ours: skipped");

    ok(parse("vllm:kv_cache_usage_perc NaN\n", &l) == -1, "NaN ignored");
    ok(parse("vllm:kv_cache_usage_perc -0.5\n"
             "vllm:num_requests_waiting -3\n", &l) == -1,
       "negative values ignored");
    ok(parse("vllm:kv_cache_usage_perc +Inf\n", &l) == 0
       && l.kv_usage == 1.0, "usage +Inf clamped to 1");
    ok(parse("vllm:kv_cache_usage_perc 37.5\n", &l) == 0
       && l.kv_usage == 1.0, "usage given in percent clamped to 1");
    ok(parse("vllm:kv_cache_usage_perc 0\n"
             "vllm:kv_cache_usage_perc -Inf\n", &l) == 0
       && l.have_usage && l.kv_usage == 0, "usage 0 is found, -Inf not");
    ok(parse("vllm:kv_cache_usage_perc 5e-1\n", &l) == 0
       && l.kv_usage == 0.5, "exponent");
    ok(parse("vllm:num_requests_waiting 1e300\n"
             "vllm:num_requests_running +Inf\n", &l) == 0
       && l.waiting == UINT32_MAX && l.running == UINT32_MAX,
       "huge and infinite counts saturate");
    ok(parse("vllm:num_requests_waiting 4294967295\n"
             "vllm:num_requests_waiting 4294967295\n", &l) == 0
       && l.waiting == UINT32_MAX, "a sum past 2^32 saturates");
    ok(parse("vllm:num_requests_waiting 2.9999999\n", &l) == 0
       && l.waiting == 3, "a float count rounds");
    ok(parse("vllm:num_requests_waiting 1x\n"
             "vllm:num_requests_waiting 0x\n"
             "vllm:num_requests_waiting \n"
             "vllm:num_requests_waiting\n", &l) == -1,
       "bad or missing values: skipped");
    ok(parse("vllm:num_requests_waiting "
             "1.00000000000000000000000000000000000000000000000000000000000"
             "00000000000\n", &l) == -1,
       "value longer than 63 bytes: skipped");

    /* one line over the cap, a good one after it */
    n = KVB_METRICS_LINE_MAX + 100;
    big = malloc(n + 64);
    memcpy(big, "vllm:num_requests_waiting{a=\"", 29);
    memset(big + 29, 'x', n - 29);
    memcpy(big + n, "\"} 9\nvllm:num_requests_running 2\n", 33);

    ok(kvb_metrics_parse(big, n + 33, &l) == 0 && !l.have_waiting
       && l.running == 2, "a line over 64 KB skipped, the next read");

    /* NUL bytes inside, len not at a NUL */
    ok(kvb_metrics_parse("vllm:num_requests_waiting 1\n\0\0\n"
                         "vllm:num_requests_running 2\n",
                         31 + 28, &l) == 0
       && l.waiting == 1 && l.running == 2, "NUL bytes in the text");

    /* len stops mid-value: "12" read as "1" */
    ok(kvb_metrics_parse("vllm:num_requests_running 12\n", 27, &l) == 0
       && l.running == 1, "len honoured inside a value");

    free(big);
}


static size_t
chunk(char *out, const char *data, size_t n, const char *ext)
{
    return sprintf(out, "%zx%s\r\n%.*s\r\n", n, ext, (int) n, data);
}


static void
test_chunked(void)
{
    char              enc[4096], out[4096], body[2048];
    size_t            n, e, o, used, i, split, total;
    uint64_t          seed;
    unsigned          bad;
    kvb_chunked_t     c;
    kvb_chunked_rc_e  rc;

    seed = 42;

    for (i = 0; i < sizeof(body); i++) {
        body[i] = 'a' + kva_rand_below(&seed, 26);
    }

    /* uvicorn's shape: chunks of uneven size, extensions, a trailer */
    e = 0;
    e += chunk(enc + e, body, 1, "");
    e += chunk(enc + e, body + 1, 700, ";name=value");
    e += chunk(enc + e, body + 701, 300, "");
    e += chunk(enc + e, body + 1001, 1047, " ");
    e += sprintf(enc + e, "0\r\nX-Trailer: 1\r\n\r\nNEXT");

    kvb_chunked_init(&c);
    rc = kvb_chunked_decode(&c, enc, e, out, &o, &used);

    ok(rc == KVB_CHUNKED_DONE && o == sizeof(body)
       && memcmp(out, body, o) == 0 && used == e - 4,
       "chunked: decoded whole, the bytes after it left (%zu of %zu)",
       used, e);

    /* split in two at every byte, decoded in place, the client's way */
    bad = 0;

    for (split = 0; split <= e - 4; split++) {
        char  buf[4096];

        memcpy(buf, enc, e);
        kvb_chunked_init(&c);

        rc = kvb_chunked_decode(&c, buf, split, buf, &o, &used);
        total = o;

        if (rc != KVB_CHUNKED_MORE && split < e - 4) {
            bad++;
            continue;
        }

        rc = kvb_chunked_decode(&c, buf + split, e - 4 - split, buf + total,
                                &o, &used);
        total += o;

        if (rc != KVB_CHUNKED_DONE || total != sizeof(body)
            || memcmp(buf, body, total) != 0)
        {
            bad++;
        }
    }

    ok(bad == 0, "chunked: split at each of %zu bytes, in place", e - 4);

    /* bare LF line ends (lenient) */
    kvb_chunked_init(&c);
    rc = kvb_chunked_decode(&c, "3\nabc\n0\n\n", 10, out, &o, &used);
    ok(rc == KVB_CHUNKED_DONE && o == 3 && memcmp(out, "abc", 3) == 0,
       "chunked: bare LF accepted");

    kvb_chunked_init(&c);
    rc = kvb_chunked_decode(&c, "3\r\nabc\r\n", 8, out, &o, &used);
    ok(rc == KVB_CHUNKED_MORE && o == 3, "chunked: no last chunk: more");

    kvb_chunked_init(&c);
    ok(kvb_chunked_decode(&c, "zz\r\n", 4, out, &o, &used)
       == KVB_CHUNKED_ERROR, "chunked: bad size: error");

    kvb_chunked_init(&c);
    ok(kvb_chunked_decode(&c, "\r\n", 2, out, &o, &used)
       == KVB_CHUNKED_ERROR, "chunked: empty size: error");

    kvb_chunked_init(&c);
    ok(kvb_chunked_decode(&c, "3\r\nabcX\r\n", 9, out, &o, &used)
       == KVB_CHUNKED_ERROR, "chunked: data longer than its size: error");

    kvb_chunked_init(&c);
    ok(kvb_chunked_decode(&c, "fffffffffffffffff\r\n", 19, out, &o, &used)
       == KVB_CHUNKED_ERROR, "chunked: a size past 2^64: error");

    n = 0;
    kvb_chunked_init(&c);
    ok(kvb_chunked_decode(&c, "00000000000000000000001\r\nZ\r\n0\r\n\r\n", 33,
                          out, &n, &used) == KVB_CHUNKED_DONE
       && n == 1 && out[0] == 'Z', "chunked: leading zeros in a size");
}


/* the server: one process, one connection at a time, never blocking */

#define SRV_HELD  64

static pid_t           srv_pid;
static unsigned short  srv_port;


static void
srv_write(int fd, const char *p, size_t n)
{
    ssize_t  w;

    while (n) {
        w = write(fd, p, n);
        if (w <= 0) {
            if (w == -1 && errno == EINTR) {
                continue;
            }

            return;
        }

        p += w;
        n -= w;
    }
}


static void
srv_str(int fd, const char *s)
{
    srv_write(fd, s, strlen(s));
}


static void
srv_ok_length(int fd, const char *body)
{
    char  head[256];

    snprintf(head, sizeof(head),
             "HTTP/1.1 200 OK\r\n"
             "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
             "Content-Length: %zu\r\n\r\n", strlen(body));
    srv_str(fd, head);
    srv_str(fd, body);
}


static void
srv_ok_chunked(int fd, const char *body, size_t step)
{
    char    head[32];
    size_t  n, left;

    /* uvicorn's headers, lower case */
    srv_str(fd, "HTTP/1.1 200 OK\r\n"
                "date: Mon, 23 Nov 2026 12:00:00 GMT\r\n"
                "server: uvicorn\r\n"
                "content-type: text/plain; version=0.0.4; charset=utf-8\r\n"
                "transfer-encoding: chunked\r\n\r\n");

    left = strlen(body);

    while (left) {
        n = left < step ? left : step;
        snprintf(head, sizeof(head), "%zx\r\n", n);
        srv_str(fd, head);
        srv_write(fd, body, n);
        srv_str(fd, "\r\n");
        body += n;
        left -= n;

        /* separate segments, so the client sees chunks split across reads */
        usleep(1000);
    }

    srv_str(fd, "0\r\n\r\n");
}


static void
srv_stream(int fd, size_t total, int chunked)
{
    char    line[8192];
    char    head[32];
    size_t  n;

    memset(line, '#', sizeof(line));
    line[sizeof(line) - 1] = '\n';

    while (total) {
        n = total < sizeof(line) ? total : sizeof(line);

        if (chunked) {
            snprintf(head, sizeof(head), "%zx\r\n", n);
            srv_str(fd, head);
        }

        /* the client hangs up past its cap: write fails, we stop */
        if (write(fd, line, n) != (ssize_t) n) {
            return;
        }

        if (chunked) {
            srv_str(fd, "\r\n");
        }

        total -= n;
    }

    if (chunked) {
        srv_str(fd, "0\r\n\r\n");
    }
}


/* returns 1 to keep the connection open unanswered or after the answer */

static int
srv_answer(int fd, const char *req)
{
    char        path[64];
    const char  *sp;
    size_t      n;

    if (strncmp(req, "GET /", 5) != 0) {
        return 0;
    }

    sp = strchr(req + 4, ' ');
    n = sp ? (size_t) (sp - req - 4) : 0;
    if (n >= sizeof(path)) {
        n = sizeof(path) - 1;
    }

    memcpy(path, req + 4, n);
    path[n] = '\0';

    if (strcmp(path, "/metrics") == 0) {
        /* the default path, and the request as a proxy would read it */
        if (strstr(req, " HTTP/1.1\r\n") && strstr(req, "\r\nHost: 127.0.0.1:")
            && strstr(req, "\r\nConnection: close\r\n")
            && strstr(req, "\r\nAccept-Encoding: identity\r\n"))
        {
            srv_ok_length(fd, vllm_old_text);

        } else {
            srv_str(fd, "HTTP/1.1 400 Bad Request\r\n"
                        "Content-Length: 0\r\n\r\n");
        }

        return 0;
    }

    if (strcmp(path, "/length") == 0) {
        /* answered, then held open: the length alone must end the read */
        srv_ok_length(fd, vllm_text);
        return 1;
    }

    if (strcmp(path, "/chunked") == 0) {
        srv_ok_chunked(fd, vllm_text, 333);
        return 1;
    }

    if (strcmp(path, "/sglang") == 0) {
        srv_ok_chunked(fd, sglang_text, 7);
        return 1;
    }

    if (strcmp(path, "/close") == 0) {
        srv_str(fd, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n");
        srv_str(fd, sglang_text);
        return 0;
    }

    if (strcmp(path, "/slow") == 0) {
        return 1;
    }

    if (strcmp(path, "/slowbody") == 0) {
        srv_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
                    "vllm:num_requests_running 1\n");
        return 1;
    }

    if (strcmp(path, "/500") == 0) {
        srv_str(fd, "HTTP/1.1 500 Internal Server Error\r\n"
                    "Content-Length: 21\r\n\r\nInternal Server Error");
        return 0;
    }

    if (strcmp(path, "/biglength") == 0) {
        srv_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5000000\r\n\r\n");
        return 1;
    }

    if (strcmp(path, "/bigclose") == 0) {
        srv_str(fd, "HTTP/1.1 200 OK\r\n\r\n");
        srv_stream(fd, 5 * 1024 * 1024, 0);
        return 0;
    }

    if (strcmp(path, "/bigchunked") == 0) {
        srv_str(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        srv_stream(fd, 5 * 1024 * 1024, 1);
        return 0;
    }

    if (strcmp(path, "/trunc") == 0) {
        srv_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
                    "vllm:num_requests_running 1\n");
        return 0;
    }

    if (strcmp(path, "/badchunk") == 0) {
        srv_str(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "zz\r\nvllm:num_requests_running 1\n\r\n0\r\n\r\n");
        return 0;
    }

    if (strcmp(path, "/gzip") == 0) {
        srv_str(fd, "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
                    "Content-Length: 4\r\n\r\n\x1f\x8b\x08\x00");
        return 0;
    }

    if (strcmp(path, "/garbage") == 0) {
        srv_str(fd, "SSH-2.0-OpenSSH_9.2\r\n\r\n");
        return 0;
    }

    if (strcmp(path, "/empty") == 0) {
        return 0;
    }

    if (strcmp(path, "/nometrics") == 0) {
        srv_ok_length(fd, "# HELP up x\n# TYPE up gauge\nup 1\n");
        return 0;
    }

    if (strcmp(path, "/headers") == 0) {
        /* headers that never end */
        srv_str(fd, "HTTP/1.1 200 OK\r\n");
        for (n = 0; n < 2000; n++) {
            srv_str(fd, "X-Padding: aaaaaaaaaaaaaaaa\r\n");
        }
        return 1;
    }

    srv_str(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");

    return 0;
}


static void
srv_loop(int ls)
{
    int      fd, held[SRV_HELD], nheld, i;
    char     req[4096];
    size_t   n;
    ssize_t  r;

    /* the parent kills us; if it dies first, so do we */
    alarm(120);
    signal(SIGPIPE, SIG_IGN);

    nheld = 0;

    for ( ;; ) {
        fd = accept(ls, NULL, NULL);
        if (fd == -1) {
            continue;
        }

        n = 0;

        while (n < sizeof(req) - 1) {
            r = read(fd, req + n, sizeof(req) - 1 - n);
            if (r <= 0) {
                break;
            }

            n += r;
            req[n] = '\0';

            if (strstr(req, "\r\n\r\n")) {
                break;
            }
        }

        req[n] = '\0';

        if (srv_answer(fd, req) && nheld < SRV_HELD) {
            held[nheld++] = fd;
            continue;
        }

        close(fd);

        if (nheld == SRV_HELD) {
            for (i = 0; i < nheld; i++) {
                close(held[i]);
            }

            nheld = 0;
        }
    }
}


static int
srv_start(void)
{
    int                 ls, one;
    socklen_t           alen;
    struct sockaddr_in  sin;

    ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls == -1) {
        return -1;
    }

    one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));

    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

    alen = sizeof(sin);

    if (bind(ls, (struct sockaddr *) &sin, sizeof(sin)) == -1
        || listen(ls, 16) == -1
        || getsockname(ls, (struct sockaddr *) &sin, &alen) == -1)
    {
        close(ls);
        return -1;
    }

    srv_port = ntohs(sin.sin_port);

    fflush(stdout);

    srv_pid = fork();
    if (srv_pid == -1) {
        close(ls);
        return -1;
    }

    if (srv_pid == 0) {
        srv_loop(ls);
        _exit(0);
    }

    close(ls);

    return 0;
}


static void
srv_stop(void)
{
    if (srv_pid > 0) {
        kill(srv_pid, SIGKILL);
        waitpid(srv_pid, NULL, 0);
        srv_pid = 0;
    }
}


/* the bridge's loop, for one scrape: 0 when it ended, -1 past max_ms */

static int
drive(kvb_scrape_t *s, unsigned max_ms)
{
    int                 fd;
    long                wait;
    short               ev;
    uint64_t            start, now, dl, done;
    zmq_pollitem_t      item;
    kvb_scrape_stats_t  st;

    kvb_scrape_stats(s, &st);
    done = st.ok + st.failed;
    start = now_ms();
    ev = 0;

    for ( ;; ) {
        now = now_ms();

        fd = kvb_scrape_want(s, now, &ev);

        kvb_scrape_stats(s, &st);
        if (st.ok + st.failed != done) {
            return 0;
        }

        if (now - start > max_ms) {
            return -1;
        }

        dl = kvb_scrape_deadline(s);
        wait = dl > now ? (long) (dl - now) : 0;
        if (wait > 50) {
            wait = 50;
        }

        memset(&item, 0, sizeof(item));
        item.fd = fd;
        item.events = ev;

        if (zmq_poll(&item, fd == -1 ? 0 : 1, wait) == -1 && errno != EINTR) {
            return -1;
        }

        kvb_scrape_io(s, fd == -1 ? 0 : item.revents, now_ms());

        kvb_scrape_stats(s, &st);
        if (st.ok + st.failed != done) {
            return 0;
        }
    }
}


static kvb_scrape_t *
scrape(const char *path, unsigned timeout_ms, kvb_scrape_stats_t *st,
    uint64_t *took)
{
    char           url[128], err[256];
    uint64_t       t0;
    kvb_scrape_t  *s;

    snprintf(url, sizeof(url), "http://127.0.0.1:%u%s", srv_port, path);

    s = kvb_scrape_create(url, 60000, timeout_ms, err, sizeof(err));
    if (s == NULL) {
        printf("# %s: %s\n", url, err);
        memset(st, 0, sizeof(*st));
        return NULL;
    }

    t0 = now_ms();

    if (drive(s, timeout_ms + 2000) != 0) {
        printf("# %s: never ended\n", url);
    }

    *took = now_ms() - t0;
    kvb_scrape_stats(s, st);

    if (st->last_failed) {
        printf("# %s: %s\n", path, st->last_error);
    }

    return s;
}


static int
failed_with(const kvb_scrape_stats_t *st, const char *why)
{
    return st->failed == 1 && st->ok == 0 && st->last_failed
           && strstr(st->last_error, why) != NULL;
}


static void
test_client_ok(void)
{
    uint64_t            took, at;
    kvb_load_t          l;
    kvb_scrape_t       *s;
    kvb_scrape_stats_t  st;

    s = scrape("/length", 2000, &st, &took);
    ok(s && st.ok == 1 && st.failed == 0
       && kvb_scrape_load(s, &l, &at) == 0
       && l.running == 12 && l.waiting == 3 && l.kv_usage == 0.8125,
       "Content-Length, connection held open: load read at the length");
    kvb_scrape_destroy(s);

    s = scrape("/chunked", 2000, &st, &took);
    ok(s && st.ok == 1 && kvb_scrape_load(s, &l, &at) == 0
       && l.running == 12 && l.waiting == 3 && l.kv_usage == 0.8125,
       "chunked (uvicorn), connection held open: read at the last chunk");
    kvb_scrape_destroy(s);

    s = scrape("/sglang", 2000, &st, &took);
    ok(s && st.ok == 1 && kvb_scrape_load(s, &l, &at) == 0
       && l.running == 60 && l.waiting == 4 && l.kv_usage == 0.61,
       "SGLang in 7-byte chunks");
    kvb_scrape_destroy(s);

    s = scrape("/close", 2000, &st, &took);
    ok(s && st.ok == 1 && kvb_scrape_load(s, &l, &at) == 0
       && l.running == 60, "HTTP/1.0, no length: read to close");
    kvb_scrape_destroy(s);

    s = scrape("", 2000, &st, &took);
    ok(s && st.ok == 1 && kvb_scrape_load(s, &l, &at) == 0
       && l.running == 3 && l.kv_usage == 0.25,
       "no path: GET /metrics, HTTP/1.1 with Host, identity, close");
    kvb_scrape_destroy(s);
}


static void
test_client_fail(void)
{
    int                 fd;
    char                url[64], err[256];
    uint64_t            took, at;
    socklen_t           alen;
    kvb_load_t          l;
    kvb_scrape_t       *s;
    kvb_scrape_stats_t  st;
    struct sockaddr_in  sin;

    s = scrape("/500", 2000, &st, &took);
    ok(s && failed_with(&st, "HTTP status 500")
       && kvb_scrape_load(s, &l, &at) == -1, "500: failed, no load");
    kvb_scrape_destroy(s);

    s = scrape("/slow", 300, &st, &took);
    ok(s && failed_with(&st, "timed out") && took >= 300 && took < 1500,
       "no answer: timed out in %llu ms", (unsigned long long) took);
    kvb_scrape_destroy(s);

    s = scrape("/slowbody", 300, &st, &took);
    ok(s && failed_with(&st, "reading the body") && took < 1500,
       "half a body: timed out");
    kvb_scrape_destroy(s);

    s = scrape("/trunc", 2000, &st, &took);
    ok(s && failed_with(&st, "closed inside the body"),
       "closed before its length: failed");
    kvb_scrape_destroy(s);

    s = scrape("/biglength", 2000, &st, &took);
    ok(s && failed_with(&st, "over 4194304") && took < 1000,
       "Content-Length over 4 MB: failed at the headers");
    kvb_scrape_destroy(s);

    s = scrape("/bigclose", 5000, &st, &took);
    ok(s && failed_with(&st, "over 4194304"), "5 MB to close: failed");
    kvb_scrape_destroy(s);

    s = scrape("/bigchunked", 5000, &st, &took);
    ok(s && failed_with(&st, "over 4194304"), "5 MB chunked: failed");
    kvb_scrape_destroy(s);

    s = scrape("/headers", 2000, &st, &took);
    ok(s && failed_with(&st, "headers over"), "endless headers: failed");
    kvb_scrape_destroy(s);

    s = scrape("/badchunk", 2000, &st, &took);
    ok(s && failed_with(&st, "chunked"), "bad chunk size: failed");
    kvb_scrape_destroy(s);

    s = scrape("/gzip", 2000, &st, &took);
    ok(s && failed_with(&st, "Content-Encoding"), "gzip body: failed");
    kvb_scrape_destroy(s);

    s = scrape("/garbage", 2000, &st, &took);
    ok(s && failed_with(&st, "not an HTTP"), "not HTTP: failed");
    kvb_scrape_destroy(s);

    s = scrape("/empty", 2000, &st, &took);
    ok(s && failed_with(&st, "before the response headers"),
       "closed without a word: failed");
    kvb_scrape_destroy(s);

    s = scrape("/nometrics", 2000, &st, &took);
    ok(s && failed_with(&st, "no vLLM or SGLang"),
       "200 without our gauges: failed");
    kvb_scrape_destroy(s);

    /* a port that was just free: refused */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    alen = sizeof(sin);
    bind(fd, (struct sockaddr *) &sin, sizeof(sin));
    getsockname(fd, (struct sockaddr *) &sin, &alen);
    close(fd);

    snprintf(url, sizeof(url), "http://localhost:%u/metrics",
             ntohs(sin.sin_port));
    s = kvb_scrape_create(url, 60000, 2000, err, sizeof(err));
    ok(s && drive(s, 3000) == 0, "refused: the scrape ends");
    if (s) {
        kvb_scrape_stats(s, &st);
        ok(failed_with(&st, "refused"), "refused: \"%s\"", st.last_error);
        kvb_scrape_destroy(s);
    }
}


static void
test_client_schedule(void)
{
    int                 fd;
    char                url[64], err[256];
    short               ev;
    unsigned            i;
    kvb_scrape_t       *s;
    kvb_scrape_stats_t  st;
    zmq_pollitem_t      item;

    /* the clock is ours here: the loop's now, not the wall's */
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/slow", srv_port);
    s = kvb_scrape_create(url, 1000, 400, err, sizeof(err));

    ok(s && kvb_scrape_deadline(s) == 0, "a new scrape is due at once");
    if (s == NULL) {
        return;
    }

    fd = kvb_scrape_want(s, 10000, &ev);
    ok(fd >= 0 && ev == ZMQ_POLLOUT, "want at 10000: connecting");
    ok(kvb_scrape_deadline(s) == 10400, "busy: the deadline is the timeout");

    /* connect and send, the time standing still */
    for (i = 0; i < 100 && fd >= 0 && ev != ZMQ_POLLIN; i++) {
        memset(&item, 0, sizeof(item));
        item.fd = fd;
        item.events = ev;
        zmq_poll(&item, 1, 100);
        kvb_scrape_io(s, item.revents, 10000);
        fd = kvb_scrape_want(s, 10000, &ev);
    }

    ok(fd >= 0 && ev == ZMQ_POLLIN, "request sent: waiting to read");

    kvb_scrape_io(s, 0, 10399);
    kvb_scrape_stats(s, &st);
    ok(st.failed == 0, "not failed 1 ms before its timeout");

    kvb_scrape_io(s, 0, 10400);
    kvb_scrape_stats(s, &st);
    ok(st.failed == 1 && strstr(st.last_error, "timed out"),
       "failed at its timeout, without I/O");

    ok(kvb_scrape_want(s, 10400, &ev) == -1
       && kvb_scrape_deadline(s) == 11000,
       "idle: the next scrape an interval after this one started");
    ok(kvb_scrape_want(s, 10999, &ev) == -1, "not before");
    ok(kvb_scrape_want(s, 11000, &ev) >= 0, "started at 11000");

    /* a timeout longer than the interval: the next waits a whole one */
    kvb_scrape_destroy(s);
    s = kvb_scrape_create(url, 100, 500, err, sizeof(err));
    kvb_scrape_want(s, 20000, &ev);
    kvb_scrape_io(s, 0, 20500);
    ok(kvb_scrape_deadline(s) == 20600, "overran: next at end + interval");
    kvb_scrape_destroy(s);
}


static void
test_urls(void)
{
    char           err[256];
    kvb_scrape_t  *s;
    unsigned       i, good;

    static const char  *bad[] = {
        "https://127.0.0.1/metrics", "127.0.0.1:8000", "http://",
        "http://vllm-0.svc:8000/metrics", "http://10.0.0.1:0/",
        "http://10.0.0.1:65536/", "http://10.0.0.1:80x/",
        "http://[::1/metrics", "http://[10.0.0.1]:80/",
        "http://10.0.0.1/me trics", "http://10.0.0.1/a\r\nX: y",
        "http://10.0.0.1:/"
    };

    static const char  *fine[] = {
        "http://127.0.0.1:8000/metrics", "http://localhost:30000/metrics",
        "http://[::1]:8000/metrics", "http://[fe80::1]/", "http://10.1.2.3",
        "http://10.1.2.3:8000/metrics?name[]=vllm:num_requests_running"
    };

    good = 0;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        s = kvb_scrape_create(bad[i], 1000, 1000, err, sizeof(err));
        if (s == NULL && err[0] != '\0') {
            good++;

        } else {
            printf("# accepted \"%s\"\n", bad[i]);
        }

        kvb_scrape_destroy(s);
    }

    ok(good == i, "%u bad URLs refused, with a reason", good);

    err[0] = '\0';
    s = kvb_scrape_create("http://vllm-0:8000/", 1000, 1000, err,
                          sizeof(err));
    ok(s == NULL && strstr(err, "no name lookups"),
       "a host name: refused, and the reason says why");

    good = 0;

    for (i = 0; i < sizeof(fine) / sizeof(fine[0]); i++) {
        s = kvb_scrape_create(fine[i], 1000, 1000, err, sizeof(err));
        if (s != NULL) {
            good++;

        } else {
            printf("# refused \"%s\": %s\n", fine[i], err);
        }

        kvb_scrape_destroy(s);
    }

    ok(good == i, "%u good URLs accepted", good);

    ok(kvb_scrape_create("http://127.0.0.1/", 0, 1000, err, sizeof(err))
       == NULL, "interval 0 refused");
}


int
main(void)
{
    signal(SIGPIPE, SIG_IGN);

    test_parse_engines();
    test_parse_edges();
    test_chunked();
    test_urls();

    if (srv_start() != 0) {
        skip("no loopback listening socket here");

    } else {
        test_client_ok();
        test_client_fail();
        test_client_schedule();
        srv_stop();
    }

    return done_testing();
}
