/*
 * kvload workloads.  Text is 4-byte pseudo-tokens "xyz " over [a-z0-9]: no
 * JSON escaping, n tokens are 4n bytes, blocks line up with tokens.
 *
 * shared-prefix  groups x prompts: a system prompt per group, a question
 *                per prompt; made once, sent cyclically in one random
 *                order (llm-d's benchmark shape).
 * multi-turn     conversations of up to turns user turns; turn k resends
 *                the system prompt and the earlier user and assistant
 *                turns.  They advance together, a new random order a round.
 * no-sharing     fresh random system prompt and question every request.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kva_rand.h"
#include "kvload_workload.h"


struct kvl_workload_s {
    kvl_wl_conf_t   conf;
    uint64_t        rng;
    char           *system;             /* [groups] texts */
    char           *question;           /* [groups * per] */
    char           *answer;             /* multi-turn: [groups * turns] */
    unsigned       *order;
    unsigned        norder;
    uint64_t        next;
    char           *body;
    size_t          len;
    size_t          cap;
    int             nomem;
};


static void kvl_shuffle(kvl_workload_t *wl);
static char *kvl_texts(uint64_t *rng, size_t n, unsigned tokens);
static void kvl_text_fill(uint64_t *rng, char *p, unsigned tokens);
static void kvl_message_ids(kvl_workload_t *wl, const char *role,
    const char *texts, size_t i, unsigned tokens);
static char *kvl_reserve(kvl_workload_t *wl, size_t n);
static void kvl_append(kvl_workload_t *wl, const char *s);
static void kvl_message(kvl_workload_t *wl, const char *role,
    const char *texts, size_t i, unsigned tokens);


kvl_workload_t *
kvl_workload_create(const kvl_wl_conf_t *conf)
{
    unsigned         n;
    kvl_workload_t  *wl;

    wl = calloc(1, sizeof(kvl_workload_t));
    if (wl == NULL) {
        return NULL;
    }

    wl->conf = *conf;
    wl->rng = conf->seed ^ 0x6b766c6f61640000ULL;

    if (conf->kind == KVL_WL_NO_SHARING) {
        return wl;
    }

    n = conf->groups * (conf->kind == KVL_WL_SHARED_PREFIX
                        ? conf->prompts_per_group : conf->turns);

    wl->system = kvl_texts(&wl->rng, conf->groups, conf->system_tokens);
    wl->question = kvl_texts(&wl->rng, n, conf->question_tokens);
    wl->order = malloc(n * sizeof(unsigned));

    if (conf->kind == KVL_WL_MULTI_TURN) {
        wl->answer = kvl_texts(&wl->rng, n, conf->output_tokens);
        n = conf->groups;
    }

    if (wl->system == NULL || wl->question == NULL || wl->order == NULL
        || (conf->kind == KVL_WL_MULTI_TURN && wl->answer == NULL))
    {
        kvl_workload_free(wl);
        return NULL;
    }

    wl->norder = n;
    kvl_shuffle(wl);

    return wl;
}


int
kvl_workload_next(kvl_workload_t *wl, const char **body, size_t *len)
{
    char            head[256];
    unsigned        g, p, t, k;
    kvl_wl_conf_t  *c = &wl->conf;

    wl->len = 0;
    wl->nomem = 0;

    snprintf(head, sizeof(head), "{\"model\":\"%s\",\"%s\":[", c->model,
             c->prompt_ids ? "prompt" : "messages");
    kvl_append(wl, head);

    if (c->kind == KVL_WL_NO_SHARING) {
        kvl_message(wl, "system", NULL, 0, c->system_tokens);
        kvl_message(wl, "user", NULL, 0, c->question_tokens);

    } else if (c->kind == KVL_WL_SHARED_PREFIX) {
        p = wl->order[wl->next % wl->norder];
        g = p / c->prompts_per_group;

        kvl_message(wl, "system", wl->system, g, c->system_tokens);
        kvl_message(wl, "user", wl->question, p, c->question_tokens);

    } else {
        /* a new order every round: no lockstep with round-robin */
        if (wl->next % wl->norder == 0 && wl->next) {
            kvl_shuffle(wl);
        }

        g = wl->order[wl->next % wl->norder];
        t = (unsigned) ((wl->next / wl->norder) % c->turns);

        kvl_message(wl, "system", wl->system, g, c->system_tokens);

        for (k = 0; k <= t; k++) {
            p = g * c->turns + k;
            kvl_message(wl, "user", wl->question, p, c->question_tokens);

            if (k < t) {
                kvl_message(wl, "assistant", wl->answer, p, c->output_tokens);
            }
        }
    }

    wl->next++;

    if (wl->nomem) {
        return -1;
    }

    wl->len--;                          /* the comma after the last one */

    snprintf(head, sizeof(head), "],\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true},"
             "\"max_tokens\":%u,\"ignore_eos\":true}", c->output_tokens);
    kvl_append(wl, head);

    *body = wl->body;
    *len = wl->len;

    return wl->nomem ? -1 : 0;
}


void
kvl_workload_free(kvl_workload_t *wl)
{
    if (wl == NULL) {
        return;
    }

    free(wl->system);
    free(wl->question);
    free(wl->answer);
    free(wl->order);
    free(wl->body);
    free(wl);
}


static void
kvl_shuffle(kvl_workload_t *wl)
{
    unsigned  i, j;

    /* a random permutation, inside-out Fisher-Yates */

    for (i = 0; i < wl->norder; i++) {
        j = (unsigned) kva_rand_below(&wl->rng, i + 1);
        wl->order[i] = wl->order[j];
        wl->order[j] = i;
    }
}


static char *
kvl_texts(uint64_t *rng, size_t n, unsigned tokens)
{
    char    *t;
    size_t   i;

    /* n texts of tokens each, back to back, no terminators */

    t = malloc(n * tokens * 4 + 1);
    if (t == NULL) {
        return NULL;
    }

    for (i = 0; i < n; i++) {
        kvl_text_fill(rng, t + i * tokens * 4, tokens);
    }

    return t;
}


static void
kvl_text_fill(uint64_t *rng, char *p, unsigned tokens)
{
    unsigned         i;
    uint64_t         r;
    static const char  a[] = "abcdefghijklmnopqrstuvwxyz0123456789";

    for (i = 0; i < tokens; i++, p += 4) {
        r = kva_rand_next(rng);
        p[0] = a[r % 36];
        p[1] = a[(r >> 8) % 36];
        p[2] = a[(r >> 16) % 36];
        p[3] = ' ';
    }
}


static char *
kvl_reserve(kvl_workload_t *wl, size_t n)
{
    char    *b;
    size_t   cap;

    /* out of memory is sticky until the next request: callers go on */

    if (wl->nomem) {
        return NULL;
    }

    if (wl->len + n + 1 > wl->cap) {
        for (cap = wl->cap ? wl->cap : 65536; cap < wl->len + n + 1; cap *= 2)
        {
            /* void */
        }

        b = realloc(wl->body, cap);
        if (b == NULL) {
            wl->nomem = 1;
            return NULL;
        }

        wl->body = b;
        wl->cap = cap;
    }

    b = wl->body + wl->len;
    wl->len += n;
    wl->body[wl->len] = '\0';

    return b;
}


static void
kvl_append(kvl_workload_t *wl, const char *s)
{
    char  *p = kvl_reserve(wl, strlen(s));

    if (p) {
        memcpy(p, s, strlen(s));
    }
}


static void
kvl_message(kvl_workload_t *wl, const char *role, const char *texts,
    size_t i, unsigned tokens)
{
    char     *p, head[64];
    size_t    n = (size_t) tokens * 4;

    if (wl->conf.prompt_ids) {
        kvl_message_ids(wl, role, texts, i, tokens);
        return;
    }

    /* texts NULL: fresh random text */

    snprintf(head, sizeof(head), "{\"role\":\"%s\",\"content\":\"", role);
    kvl_append(wl, head);

    p = kvl_reserve(wl, n);

    if (p && texts) {
        memcpy(p, texts + i * n, n);
    } else if (p) {
        kvl_text_fill(&wl->rng, p, tokens);
    }

        kvl_append(wl, "\"},");
}


/*
 * The same message as token ids: the role's id (1, 2, 3: system, user,
 * assistant), then one id a 4-byte pseudo-token, base 37 over [a-z0-9 ]
 * folded into 151936 ids; "N," each.
 */

static void
kvl_message_ids(kvl_workload_t *wl, const char *role, const char *texts,
    size_t i, unsigned tokens)
{
    char        num[16];
    char       *text;
    size_t      n = (size_t) tokens * 4, k;
    uint32_t    id;
    unsigned    j;

    snprintf(num, sizeof(num), "%d,",
             role[0] == 's' ? 1 : role[0] == 'u' ? 2 : 3);
    kvl_append(wl, num);

    text = texts ? (char *) texts + i * n : malloc(n);

    if (text == NULL) {
        wl->nomem = 1;
        return;
    }

    if (texts == NULL) {
        kvl_text_fill(&wl->rng, text, tokens);
    }

    for (k = 0; k < n; k += 4) {
        id = 0;

        for (j = 0; j < 4; j++) {
            id = id * 37 + (uint32_t) (unsigned char) text[k + j];
        }

        snprintf(num, sizeof(num), "%u,", (unsigned) (id % 151936));
        kvl_append(wl, num);
    }

    if (texts == NULL) {
        free(text);
    }
}
