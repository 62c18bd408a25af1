/*
 * kvload workloads.
 *
 * Text is made of 4-byte pseudo-tokens "xyz " over [a-z0-9], which need no
 * JSON escaping, so n tokens are exactly 4n bytes of prompt text and the
 * block boundaries of kvsim and the module line up with the tokens.
 *
 * shared-prefix  groups x prompts: one system prompt per group, one
 *                question per prompt; generated once, then sent cyclically
 *                in one random order (llm-d's benchmark shape).
 * multi-turn     groups conversations of turns user turns; request k of a
 *                conversation resends the system prompt and all earlier
 *                user and assistant turns, then user turn k.
 * no-sharing     fresh random system prompt and question every request.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvload_workload.h"


struct kvl_workload_s {
    kvl_wl_conf_t   conf;
    uint64_t        rng;
    char          **system;             /* [groups] */
    char          **question;           /* [groups * prompts or turns] */
    char          **answer;             /* multi-turn: [groups * turns] */
    unsigned       *order;
    unsigned        norder;
    uint64_t        next;
    char           *body;
    size_t          body_len;
    size_t          body_cap;
};


static const char  kvl_alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";


static char *kvl_text(uint64_t *rng, unsigned tokens);
static void kvl_text_fill(uint64_t *rng, char *p, unsigned tokens);
static char **kvl_texts(uint64_t *rng, unsigned n, unsigned tokens);
static void kvl_texts_free(char **t, unsigned n);
static int kvl_append(kvl_workload_t *wl, const char *s, size_t n);
static int kvl_message(kvl_workload_t *wl, const char *role,
    const char *text, unsigned tokens);


uint64_t
kvl_rand(uint64_t *state)
{
    uint64_t  z;

    /* splitmix64: tiny, good enough, same sequence everywhere */

    z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;

    return z ^ (z >> 31);
}


double
kvl_rand_unit(uint64_t *state)
{
    /* (0, 1]: safe for -log(u) */
    return ((double) (kvl_rand(state) >> 11) + 1.0) / 9007199254740992.0;
}


kvl_workload_t *
kvl_workload_create(const kvl_wl_conf_t *conf)
{
    unsigned         i, j, n, per, tmp;
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

    per = (conf->kind == KVL_WL_SHARED_PREFIX) ? conf->prompts_per_group
                                               : conf->turns;
    n = conf->groups * per;

    wl->system = kvl_texts(&wl->rng, conf->groups, conf->system_tokens);
    wl->question = kvl_texts(&wl->rng, n, conf->question_tokens);
    wl->order = malloc(n * sizeof(unsigned));

    if (wl->system == NULL || wl->question == NULL || wl->order == NULL) {
        goto failed;
    }

    if (conf->kind == KVL_WL_MULTI_TURN) {
        wl->answer = kvl_texts(&wl->rng, n, conf->output_tokens);
        if (wl->answer == NULL) {
            goto failed;
        }

        /* conversations advance together, in a shuffled order */
        n = conf->groups;
    }

    for (i = 0; i < n; i++) {
        wl->order[i] = i;
    }

    for (i = n; i > 1; i--) {
        j = (unsigned) (kvl_rand(&wl->rng) % i);
        tmp = wl->order[i - 1];
        wl->order[i - 1] = wl->order[j];
        wl->order[j] = tmp;
    }

    wl->norder = n;

    return wl;

failed:

    kvl_workload_free(wl);
    return NULL;
}


int
kvl_workload_next(kvl_workload_t *wl, const char **body, size_t *len)
{
    char            *sys, *q, head[256];
    unsigned         g, p, t, k;
    kvl_wl_conf_t   *c = &wl->conf;

    wl->body_len = 0;

    snprintf(head, sizeof(head), "{\"model\":\"%s\",\"messages\":[", c->model);
    if (kvl_append(wl, head, strlen(head)) != 0) {
        return -1;
    }

    if (c->kind == KVL_WL_NO_SHARING) {
        sys = kvl_text(&wl->rng, c->system_tokens);
        q = kvl_text(&wl->rng, c->question_tokens);

        if (sys == NULL || q == NULL
            || kvl_message(wl, "system", sys, c->system_tokens) != 0
            || kvl_message(wl, "user", q, c->question_tokens) != 0)
        {
            free(sys);
            free(q);
            return -1;
        }

        free(sys);
        free(q);

    } else if (c->kind == KVL_WL_SHARED_PREFIX) {
        p = wl->order[wl->next % wl->norder];
        g = p / c->prompts_per_group;

        if (kvl_message(wl, "system", wl->system[g], c->system_tokens) != 0
            || kvl_message(wl, "user", wl->question[p], c->question_tokens)
               != 0)
        {
            return -1;
        }

    } else {
        g = wl->order[wl->next % wl->norder];
        t = (unsigned) ((wl->next / wl->norder) % c->turns);

        if (kvl_message(wl, "system", wl->system[g], c->system_tokens) != 0)
        {
            return -1;
        }

        for (k = 0; k <= t; k++) {
            p = g * c->turns + k;

            if (kvl_message(wl, "user", wl->question[p], c->question_tokens)
                != 0)
            {
                return -1;
            }

            if (k < t && kvl_message(wl, "assistant", wl->answer[p],
                                     c->output_tokens)
                         != 0)
            {
                return -1;
            }
        }
    }

    wl->next++;

    /* drop the comma after the last message */
    wl->body_len--;

    snprintf(head, sizeof(head), "],\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true},"
             "\"max_tokens\":%u,\"ignore_eos\":true}", c->output_tokens);

    if (kvl_append(wl, head, strlen(head)) != 0) {
        return -1;
    }

    *body = wl->body;
    *len = wl->body_len;

    return 0;
}


void
kvl_workload_free(kvl_workload_t *wl)
{
    unsigned  n;

    if (wl == NULL) {
        return;
    }

    n = wl->conf.groups * (wl->conf.kind == KVL_WL_SHARED_PREFIX
                           ? wl->conf.prompts_per_group : wl->conf.turns);

    kvl_texts_free(wl->system, wl->conf.groups);
    kvl_texts_free(wl->question, n);
    kvl_texts_free(wl->answer, n);
    free(wl->order);
    free(wl->body);
    free(wl);
}


static char *
kvl_text(uint64_t *rng, unsigned tokens)
{
    char  *p;

    p = malloc((size_t) tokens * 4 + 1);
    if (p == NULL) {
        return NULL;
    }

    kvl_text_fill(rng, p, tokens);

    return p;
}


static void
kvl_text_fill(uint64_t *rng, char *p, unsigned tokens)
{
    unsigned  i;
    uint64_t  r;

    for (i = 0; i < tokens; i++) {
        r = kvl_rand(rng);
        p[0] = kvl_alphabet[r % 36];
        p[1] = kvl_alphabet[(r >> 8) % 36];
        p[2] = kvl_alphabet[(r >> 16) % 36];
        p[3] = ' ';
        p += 4;
    }

    *p = '\0';
}


static char **
kvl_texts(uint64_t *rng, unsigned n, unsigned tokens)
{
    char     **t;
    unsigned   i;

    t = calloc(n ? n : 1, sizeof(char *));
    if (t == NULL) {
        return NULL;
    }

    for (i = 0; i < n; i++) {
        t[i] = kvl_text(rng, tokens);
        if (t[i] == NULL) {
            kvl_texts_free(t, i);
            return NULL;
        }
    }

    return t;
}


static void
kvl_texts_free(char **t, unsigned n)
{
    unsigned  i;

    if (t == NULL) {
        return;
    }

    for (i = 0; i < n; i++) {
        free(t[i]);
    }

    free(t);
}


static int
kvl_append(kvl_workload_t *wl, const char *s, size_t n)
{
    char    *b;
    size_t   cap;

    if (wl->body_len + n + 1 > wl->body_cap) {
        cap = wl->body_cap ? wl->body_cap : 65536;
        while (cap < wl->body_len + n + 1) {
            cap *= 2;
        }

        b = realloc(wl->body, cap);
        if (b == NULL) {
            return -1;
        }

        wl->body = b;
        wl->body_cap = cap;
    }

    memcpy(wl->body + wl->body_len, s, n);
    wl->body_len += n;
    wl->body[wl->body_len] = '\0';

    return 0;
}


static int
kvl_message(kvl_workload_t *wl, const char *role, const char *text,
    unsigned tokens)
{
    char  head[64];
    int   n;

    n = snprintf(head, sizeof(head), "{\"role\":\"%s\",\"content\":\"",
                 role);

    if (kvl_append(wl, head, (size_t) n) != 0
        || kvl_append(wl, text, (size_t) tokens * 4) != 0
        || kvl_append(wl, "\"},", 3) != 0)
    {
        return -1;
    }

    return 0;
}
