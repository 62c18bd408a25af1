/*
 * Micro benchmark of kva_prompt_extract() on chat bodies with one long user
 * message: plain ASCII, ASCII with a "\n" escape every ~80 bytes, and
 * multibyte UTF-8 text.  Prints body MB/s (1 MB = 10^6 bytes), the median
 * of many timed samples.  Then kva_hash_body(), the module's path (scan
 * and hash, nothing written), in microseconds a body, for the key orders
 * clients send: model first; messages first (openai-python), where the
 * prompt is validated, then hashed in a second pass; and messages first
 * with tools last, whose prompt goes behind the tools.
 *
 *   make $PWD/build/bench_prompt && build/bench_prompt
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kva_keys.h"
#include "kva_prompt.h"
#include "kva_rand.h"


#define SAMPLES          101
#define SAMPLE_NS        2000000        /* each sample runs about this long */

#define TEXT_PLAIN       0
#define TEXT_ESCAPES     1
#define TEXT_UTF8        2

#define ORDER_MODEL      0              /* model, messages, ... */
#define ORDER_OPENAI     1              /* messages, model, ... */
#define ORDER_TOOLS      2              /* messages, model, ..., tools */

#define BLOCK_SIZE       256


typedef struct {
    uint8_t   *p;
    size_t     len;
    size_t     cap;
} buf_t;


static uint64_t  rng = 0x243f6a8885a308d3ULL;


static uint64_t
rnd(void)
{
    return kva_rand_next(&rng);
}


static void
buf_put(buf_t *b, const void *s, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->p = realloc(b->p, b->cap);

        if (b->p == NULL) {
            abort();
        }
    }

    memcpy(b->p + b->len, s, n);
    b->len += n;
}


static void
buf_puts(buf_t *b, const char *s)
{
    buf_put(b, s, strlen(s));
}


/* words of text until about size bytes of JSON string contents */

static void
gen_text(buf_t *b, size_t size, int type)
{
    size_t       start, next_nl, n;
    const char  *w;

    static const char  *ascii[] = {
        "the", "model", "returns", "a", "cache", "of", "keys", "and",
        "values,", "which", "makes", "prefix", "reuse", "cheap;", "routing",
        "requests", "to", "warm", "replicas", "matters.", "Tokens", "(1-9)"
    };

    static const char  *utf8[] = {
        "\xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82",
        "\xd0\xbc\xd0\xb8\xd1\x80",
        "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c",
        "\xe7\xbc\x93\xe5\xad\x98",
        "caf\xc3\xa9", "na\xc3\xafve",
        "\xf0\x9f\x98\x80",
        "\xce\xba\xce\xb1\xce\xbb\xce\xb7\xce\xbc\xce\xad\xcf\x81\xce\xb1",
        "data"
    };

    start = b->len;
    next_nl = 60 + rnd() % 40;

    while (b->len - start < size) {
        if (type == TEXT_UTF8) {
            w = utf8[rnd() % (sizeof(utf8) / sizeof(utf8[0]))];

        } else {
            w = ascii[rnd() % (sizeof(ascii) / sizeof(ascii[0]))];
        }

        buf_puts(b, w);

        n = b->len - start;

        if (type == TEXT_ESCAPES && n >= next_nl) {
            buf_puts(b, "\\n");
            next_nl = n + 60 + rnd() % 40;

        } else {
            buf_puts(b, " ");
        }
    }
}


static void
gen_body(buf_t *b, size_t size, int type, int order)
{
    int  i;

    b->len = 0;
    buf_puts(b, "{");

    if (order == ORDER_MODEL) {
        buf_puts(b, "\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",");
    }

    buf_puts(b, "\"messages\":[{\"role\":\"system\",\"content\":"
                "\"You are a helpful assistant.\"},"
                "{\"role\":\"user\",\"content\":\"");
    gen_text(b, size, type);
    buf_puts(b, "\"}],");

    if (order != ORDER_MODEL) {
        buf_puts(b, "\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",");
    }

    buf_puts(b, "\"max_tokens\":256,\"temperature\":0.7,\"stream\":true");

    if (order == ORDER_TOOLS) {
        /* 16 functions, about 2 kB */
        buf_puts(b, ",\"tools\":[");

        for (i = 0; i < 16; i++) {
            buf_puts(b, i ? ",{" : "{");
            buf_puts(b, "\"type\":\"function\",\"function\":{\"name\":"
                        "\"tool\",\"description\":\"Reads a file of the "
                        "repository\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{\"path\":{\"type\":\"string\"}}}}}");
        }

        buf_puts(b, "]");
    }

    buf_puts(b, "}");
}



/* calls per sample are picked from a warm-up so that timer cost vanishes */

static void
bench(const char *name, size_t size, int type)
{
    size_t           i, r, reps, out_cap;
    buf_t            body;
    double           mbs[SAMPLES];
    uint8_t         *out;
    uint64_t         t0, t1;
    kva_prompt_t     p;
    kva_prompt_rc_e  rc;

    static volatile size_t  sink;

    memset(&body, 0, sizeof(body));
    gen_body(&body, size, type, ORDER_MODEL);

    out_cap = body.len + KVA_PROMPT_OUT_SLACK;
    out = malloc(out_cap);

    if (out == NULL) {
        abort();
    }

    rc = kva_prompt_extract(body.p, body.len, out, out_cap, &p);

    if (rc != KVA_PROMPT_OK) {
        printf("%s: %s\n", name, kva_prompt_strerror(rc));
        exit(1);
    }

    t0 = bench_now_ns();

    for (reps = 0; bench_now_ns() - t0 < SAMPLE_NS; reps++) {
        kva_prompt_extract(body.p, body.len, out, out_cap, &p);
    }

    for (i = 0; i < SAMPLES; i++) {
        t0 = bench_now_ns();

        for (r = 0; r < reps; r++) {
            kva_prompt_extract(body.p, body.len, out, out_cap, &p);
            sink += p.out_len;
        }

        t1 = bench_now_ns();
        mbs[i] = (double) body.len * reps * 1e3 / (double) (t1 - t0);
    }

    qsort(mbs, SAMPLES, sizeof(double), bench_cmp_double);

    printf("%-28s body %7zu B  out %7zu B  %8.0f MB/s  (min %.0f, max %.0f)\n",
           name, body.len, p.out_len, mbs[SAMPLES / 2], mbs[0],
           mbs[SAMPLES - 1]);

    free(out);
    free(body.p);
}


/* kva_hash_body() as the module calls it: microseconds a body */
static void
bench_hash(const char *name, size_t size, int order)
{
    size_t           i, r, reps, n;
    buf_t            body;
    double           us[SAMPLES];
    uint64_t         t0, t1, *hashes;
    kva_prompt_t     p;

    static volatile size_t  sink;

    memset(&body, 0, sizeof(body));
    gen_body(&body, size, TEXT_PLAIN, order);

    hashes = malloc(kva_hash_body_max(body.len, BLOCK_SIZE)
                    * sizeof(uint64_t));

    if (hashes == NULL
        || kva_hash_body(body.p, body.len, BLOCK_SIZE, NULL, hashes, &n, &p)
           != KVA_PROMPT_OK)
    {
        abort();
    }

    t0 = bench_now_ns();

    for (reps = 0; bench_now_ns() - t0 < SAMPLE_NS; reps++) {
        kva_hash_body(body.p, body.len, BLOCK_SIZE, NULL, hashes, &n, &p);
    }

    for (i = 0; i < SAMPLES; i++) {
        t0 = bench_now_ns();

        for (r = 0; r < reps; r++) {
            kva_hash_body(body.p, body.len, BLOCK_SIZE, NULL, hashes, &n,
                          &p);
            sink += n;
        }

        t1 = bench_now_ns();
        us[i] = (double) (t1 - t0) / 1e3 / (double) reps;
    }

    qsort(us, SAMPLES, sizeof(double), bench_cmp_double);

    printf("%-36s body %7zu B  %4zu blocks  %7.2f us  (min %.2f, max %.2f)"
           "\n", name, body.len, n, us[SAMPLES / 2], us[0],
           us[SAMPLES - 1]);

    free(hashes);
    free(body.p);
}


int
main(void)
{
    printf("kva_prompt_extract, median of %d samples of ~%d ms each\n",
           SAMPLES, SAMPLE_NS / 1000000);

    bench("8k tokens, plain ASCII", 32 * 1024, TEXT_PLAIN);
    bench("8k tokens, \\n every ~80 B", 32 * 1024, TEXT_ESCAPES);
    bench("8k tokens, UTF-8 text", 32 * 1024, TEXT_UTF8);
    bench("128k tokens, plain ASCII", 512 * 1024, TEXT_PLAIN);
    bench("128k tokens, \\n every ~80 B", 512 * 1024, TEXT_ESCAPES);
    bench("128k tokens, UTF-8 text", 512 * 1024, TEXT_UTF8);

    printf("\nkva_hash_body, blocks of %d bytes, median of %d samples\n",
           BLOCK_SIZE, SAMPLES);

    bench_hash("8k tokens, model first", 32 * 1024, ORDER_MODEL);
    bench_hash("8k tokens, messages first", 32 * 1024, ORDER_OPENAI);
    bench_hash("8k tokens, messages first, tools last", 32 * 1024,
               ORDER_TOOLS);

    return 0;
}
