/*
 * kvload trace replay.  The window is read once, up front, so that no
 * file I/O or JSON parse delays an arrival.  Each hash id becomes the same
 * 2,048 bytes every time (512 pseudo-tokens "xyz " drawn from a generator
 * seeded by the id alone): requests that share leading ids share leading
 * bytes, and the 512-token blocks line up with the module's 256-byte
 * blocks and kvsim's 64-token ones, the prompt starting at offset 0 of the
 * canonical prompt (the one message's content comes first).
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kva_rand.h"
#include "kvload.h"


#define KVL_TRACE_MAX_IDS    65536      /* per request: 32M tokens */


typedef struct {
    double          t;                  /* trace seconds from the start */
    uint32_t        input;
    uint32_t        output;
    uint32_t        first;              /* into ids[] */
    uint32_t        nids;
} kvl_trace_rec_t;


struct kvl_trace_s {
    kvl_trace_rec_t  *recs;
    size_t            nrecs;
    size_t            cap;
    uint32_t         *ids;
    size_t            nids;
    size_t            ids_cap;
    double            t0;               /* the window's start */
    double            length;
    size_t            next;             /* the next request */
    double            t_prev;
    char             *body;
    size_t            len;
    size_t            body_cap;
    int               nomem;
};


static int kvl_trace_line(kvl_trace_t *tr, const kvl_trace_conf_t *conf,
    const char *line, size_t lineno);
static void kvl_trace_append(kvl_trace_t *tr, const char *s, size_t n);
static void kvl_trace_block(kvl_trace_t *tr, uint32_t id, unsigned tokens,
    unsigned ids);


kvl_trace_t *
kvl_trace_load(const kvl_trace_conf_t *conf)
{
    FILE         *f;
    char         *line = NULL;
    size_t        cap = 0, lineno = 0;
    ssize_t       n;
    kvl_trace_t  *tr;

    f = fopen(conf->path, "r");
    if (f == NULL) {
        fprintf(stderr, "kvload: cannot open trace %s\n", conf->path);
        return NULL;
    }

    tr = calloc(1, sizeof(kvl_trace_t));
    if (tr == NULL) {
        fclose(f);
        return NULL;
    }

    tr->t0 = conf->start;

    while (lineno < conf->max_lines
           && (conf->count == 0 || tr->nrecs < conf->count)
           && (n = getline(&line, &cap, f)) > 0)
    {
        lineno++;

        if (n == 1 && line[0] == '\n') {
            continue;
        }

        if (kvl_trace_line(tr, conf, line, lineno) > 0) {
            break;                      /* past the window */
        }

        if (tr->nomem) {
            fprintf(stderr, "kvload: out of memory reading the trace\n");
            goto failed;
        }
    }

    if (ferror(f)) {
        fprintf(stderr, "kvload: cannot read trace %s\n", conf->path);
        goto failed;
    }

    free(line);
    fclose(f);

    if (tr->nrecs == 0) {
        fprintf(stderr, "kvload: no request of trace %s in the window\n",
                conf->path);
        kvl_trace_free(tr);
        return NULL;
    }

    /* a window of a given length, or up to the last request taken */
    tr->length = conf->seconds > 0.0 ? conf->seconds
                                     : tr->recs[tr->nrecs - 1].t - tr->t0;
    tr->t_prev = tr->t0;

    return tr;

failed:

    free(line);
    fclose(f);
    kvl_trace_free(tr);

    return NULL;
}


/* 0: taken or skipped, 1: past the window's end */

static int
kvl_trace_line(kvl_trace_t *tr, const kvl_trace_conf_t *conf,
    const char *line, size_t lineno)
{
    void             *p;
    size_t            i, n;
    double            t;
    json_t           *root, *ids, *v;
    json_int_t        ts, in, out;
    kvl_trace_rec_t  *r;

    root = json_loads(line, 0, NULL);

    if (root == NULL
        || json_unpack(root, "{s:I, s:I, s:I, s:o}", "timestamp", &ts,
                       "input_length", &in, "output_length", &out,
                       "hash_ids", &ids) != 0
        || !json_is_array(ids) || json_array_size(ids) == 0
        || json_array_size(ids) > KVL_TRACE_MAX_IDS || ts < 0 || in < 1
        || out < 1 || out > 1000000
        || (uint64_t) in > (uint64_t) json_array_size(ids)
                           * KVL_TRACE_BLOCK_TOKENS)
    {
        fprintf(stderr, "kvload: trace line %zu is not a request, "
                "skipped\n", lineno);
        json_decref(root);
        return 0;
    }

    t = ts / 1000.0;

    if (t < conf->start) {
        json_decref(root);
        return 0;
    }

    if (conf->seconds > 0.0 && t >= conf->start + conf->seconds) {
        json_decref(root);
        return 1;
    }

    n = json_array_size(ids);

    if (tr->nrecs == tr->cap) {
        tr->cap = tr->cap ? tr->cap * 2 : 4096;
        p = realloc(tr->recs, tr->cap * sizeof(kvl_trace_rec_t));
        if (p == NULL) {
            tr->nomem = 1;
            json_decref(root);
            return 0;
        }
        tr->recs = p;
    }

    while (tr->nids + n > tr->ids_cap) {
        tr->ids_cap = tr->ids_cap ? tr->ids_cap * 2 : 65536;
        p = realloc(tr->ids, tr->ids_cap * sizeof(uint32_t));
        if (p == NULL) {
            tr->nomem = 1;
            json_decref(root);
            return 0;
        }
        tr->ids = p;
    }

    r = &tr->recs[tr->nrecs];
    r->t = t;
    r->input = (uint32_t) in;
    r->output = (uint32_t) out;
    r->first = (uint32_t) tr->nids;
    r->nids = (uint32_t) n;

    for (i = 0; i < n; i++) {
        v = json_array_get(ids, i);

        if (!json_is_integer(v) || json_integer_value(v) < 0
            || json_integer_value(v) > 0xffffffffLL)
        {
            fprintf(stderr, "kvload: trace line %zu: bad hash id, "
                    "skipped\n", lineno);
            json_decref(root);
            return 0;
        }

        tr->ids[tr->nids + i] = (uint32_t) json_integer_value(v);
    }

    /* the trace is in time order; one out of order is sent at once */
    tr->nids += n;
    tr->nrecs++;

    json_decref(root);

    return 0;
}


uint64_t
kvl_trace_requests(kvl_trace_t *tr)
{
    return tr->nrecs;
}


double
kvl_trace_seconds(kvl_trace_t *tr)
{
    return tr->length;
}


double
kvl_trace_gap(kvl_trace_t *tr)
{
    double  gap;

    if (tr->next >= tr->nrecs) {
        return 1e9;
    }

    gap = tr->recs[tr->next].t - tr->t_prev;
    tr->t_prev = tr->recs[tr->next].t > tr->t_prev ? tr->recs[tr->next].t
                                                   : tr->t_prev;

    /* kvl_trace_next() takes the request this gap leads to */
    return gap > 0.0 ? gap : 0.0;
}


int
kvl_trace_next(kvl_trace_t *tr, const char *model, unsigned ids,
    const char **body, size_t *len)
{
    char              head[256];
    unsigned          k, tokens, left;
    kvl_trace_rec_t  *r;

    if (tr->next >= tr->nrecs) {
        return -1;
    }

    r = &tr->recs[tr->next++];
    tr->len = 0;
    tr->nomem = 0;

    if (ids) {
        snprintf(head, sizeof(head), "{\"model\":\"%s\",\"prompt\":[",
                 model);
    } else {
        snprintf(head, sizeof(head), "{\"model\":\"%s\",\"messages\":"
                 "[{\"role\":\"user\",\"content\":\"", model);
    }

    kvl_trace_append(tr, head, strlen(head));

    /* the last block is partial: what is left of input_length */
    left = r->input;

    for (k = 0; k < r->nids && left; k++) {
        tokens = left < KVL_TRACE_BLOCK_TOKENS ? left
                                               : KVL_TRACE_BLOCK_TOKENS;
        kvl_trace_block(tr, tr->ids[r->first + k], tokens, ids);
        left -= tokens;
    }

    if (ids) {
        tr->len--;                      /* the comma after the last id */
        snprintf(head, sizeof(head), "],");

    } else {
        snprintf(head, sizeof(head), "\"}],");
    }

    kvl_trace_append(tr, head, strlen(head));

    snprintf(head, sizeof(head), "\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true},"
             "\"max_tokens\":%u,\"ignore_eos\":true}", r->output);
    kvl_trace_append(tr, head, strlen(head));

    if (tr->nomem) {
        return -1;
    }

    *body = tr->body;
    *len = tr->len;

    return 0;
}


static void
kvl_trace_append(kvl_trace_t *tr, const char *s, size_t n)
{
    char    *b;
    size_t   cap;

    if (tr->nomem) {
        return;
    }

    if (tr->len + n + 1 > tr->body_cap) {
        for (cap = tr->body_cap ? tr->body_cap : 65536;
             cap < tr->len + n + 1;
             cap *= 2)
        {
            /* void */
        }

        b = realloc(tr->body, cap);
        if (b == NULL) {
            tr->nomem = 1;
            return;
        }

        tr->body = b;
        tr->body_cap = cap;
    }

    memcpy(tr->body + tr->len, s, n);
    tr->len += n;
    tr->body[tr->len] = '\0';
}


/*
 * One id's first `tokens` pseudo-tokens: the same for the same id whatever
 * the seed or the request.  As token ids, each is kvload's mapping of a
 * pseudo-token (kvload_workload.c): base 37 folded into 151936 ids.
 */

static void
kvl_trace_block(kvl_trace_t *tr, uint32_t id, unsigned tokens, unsigned ids)
{
    char              tok[16];
    uint32_t          v;
    uint64_t          rng, r;
    unsigned          i, j;
    static const char  a[] = "abcdefghijklmnopqrstuvwxyz0123456789";

    rng = 0x7472616365000000ULL ^ ((uint64_t) id << 1);

    for (i = 0; i < tokens; i++) {
        r = kva_rand_next(&rng);
        tok[0] = a[r % 36];
        tok[1] = a[(r >> 8) % 36];
        tok[2] = a[(r >> 16) % 36];
        tok[3] = ' ';

        if (!ids) {
            kvl_trace_append(tr, tok, 4);
            continue;
        }

        v = 0;

        for (j = 0; j < 4; j++) {
            v = v * 37 + (uint32_t) (unsigned char) tok[j];
        }

        kvl_trace_append(tr, tok + 4,
                         (size_t) snprintf(tok + 4, 12, "%u,",
                                           (unsigned) (v % 151936)));
    }
}


void
kvl_trace_free(kvl_trace_t *tr)
{
    if (tr == NULL) {
        return;
    }

    free(tr->recs);
    free(tr->ids);
    free(tr->body);
    free(tr);
}


int
kvl_trace_setup(kvl_ctx_t *ctx)
{
    uint64_t  n;
    double    len;

    ctx->trace = kvl_trace_load(&ctx->tc);
    if (ctx->trace == NULL) {
        return -1;
    }

    n = kvl_trace_requests(ctx->trace);
    len = kvl_trace_seconds(ctx->trace);

    /* one stage: the window, ended by its last request */
    ctx->nstages = 1;
    ctx->stages[0].qps = len > 0.0 ? n / len : (double) n;
    ctx->stage_seconds = len > 0.0 ? len : 1.0;
    ctx->stage_requests = n;

    return 0;
}
