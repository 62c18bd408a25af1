/*
 * kvload sessions: reading and packing the recorded sessions, and the
 * request bodies made from them.
 *
 * A session file holds its requests in order, each with its time `t`
 * (seconds since the session's first request), tokens in and out, and
 * hash_ids (one per full 64-token block of the prompt, local to the
 * session); a "subagent" entry holds a sub-agent's requests, their `t`
 * from the entry's.  The requests of the main agent and of every
 * sub-agent (its thread) are merged in time order (ties: the file's
 * order), so that each request comes after its thread's previous one.
 *
 * Held for the run: each request's ids as the number it keeps from its
 * thread's previous request plus its new ones.  Sessions reuse 96% of
 * their blocks turn to turn, so this is a few percent of the ids, and a
 * prompt of 100k tokens is rebuilt from it only when it is sent.
 *
 * The bodies: one user message whose content is the prompt, 4 bytes a
 * pseudo-token, so that 64-token blocks are the module's 256-byte blocks
 * and kvsim's 64-token ones.  A block is the same text for the same
 * (session, id): two sessions share no block; with --sessions-shared-
 * prefix, the leading blocks of a thread's system prompt and tools that
 * every request of it repeats are the same text for the same (kind of
 * thread, position) in every session.
 */

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kva_rand.h"
#include "kvload_sessions.h"


#define KVL_SS_MAX_IDS       (1u << 20)     /* per request: 64M tokens */
#define KVL_SS_MAX_REQS      (1u << 20)


typedef struct {
    double          t;
    double          think;
    uint32_t        seq;
    uint32_t        thread;
    uint32_t        in;
    uint32_t        out;
    json_t         *ids;
} kvl_ss_raw_t;


typedef struct {
    kvl_ss_raw_t   *r;
    size_t          n;
    size_t          cap;
    uint64_t       *kinds;
    uint32_t       *prefix;             /* a thread's system + tools */
    uint32_t        nthreads;
    uint32_t        subagents;
} kvl_ss_flat_t;


static int kvl_ss_session(const kvl_ss_conf_t *conf, kvl_ss_set_t *set,
    json_t *root, const char *name);
static int kvl_ss_thread(kvl_ss_flat_t *fl, json_t *reqs, double t0,
    uint64_t kind, json_int_t prefix);
static int kvl_ss_pack(const kvl_ss_conf_t *conf, kvl_ss_flat_t *fl,
    kvl_ss_session_t *s);
static int kvl_ss_cmp(const void *a, const void *b);
static uint64_t kvl_ss_hash(const char *s);
static void kvl_ss_append(char **buf, size_t *cap, size_t *len,
    const char *s, size_t n);


int
kvl_ss_load(const kvl_ss_conf_t *conf, kvl_ss_set_t *set)
{
    int              n, i, rc = 0;
    FILE            *f;
    char             cmd[4200], path[4200];
    json_t          *root;
    json_error_t     err;
    struct dirent  **names;

    memset(set, 0, sizeof(kvl_ss_set_t));

    if (conf->tar) {
        /* the archive through a pipe: its files one after another */
        if (strchr(conf->tar, '\'') || strlen(conf->tar) > 4000) {
            fprintf(stderr, "kvload: unusable --trace path\n");
            return -1;
        }

        f = fopen(conf->tar, "r");
        if (f == NULL) {
            fprintf(stderr, "kvload: cannot open %s\n", conf->tar);
            return -1;
        }

        fclose(f);

        /* quiet: tar complains of the pipe closed after --sessions */
        snprintf(cmd, sizeof(cmd), "tar -xzOf '%s' --wildcards '*.json' "
                 "2>/dev/null", conf->tar);

        f = popen(cmd, "r");
        if (f == NULL) {
            fprintf(stderr, "kvload: cannot run tar on %s\n", conf->tar);
            return -1;
        }

        for ( ;; ) {
            if (conf->count && set->n >= conf->count) {
                break;
            }

            /* the next file's first character, or the end */
            for (i = fgetc(f); i == ' ' || i == '\n' || i == '\r'
                               || i == '\t'; i = fgetc(f))
            {
                /* void */
            }

            if (i == EOF) {
                break;
            }

            ungetc(i, f);

            root = json_loadf(f, JSON_DISABLE_EOF_CHECK, &err);
            if (root == NULL) {
                fprintf(stderr, "kvload: %s: not JSON after %llu "
                        "sessions: %s\n", conf->tar,
                        (unsigned long long) set->read, err.text);
                rc = -1;
                break;
            }

            rc = kvl_ss_session(conf, set, root, conf->tar);
            json_decref(root);

            if (rc != 0) {
                break;
            }
        }

        /* tar is killed by SIGPIPE when the count stopped the reading */
        (void) pclose(f);

    } else {
        n = scandir(conf->dir, &names, NULL, alphasort);
        if (n < 0) {
            fprintf(stderr, "kvload: cannot read directory %s\n", conf->dir);
            return -1;
        }

        for (i = 0; i < n; i++) {
            if (rc == 0 && (conf->count == 0 || set->n < conf->count)
                && strlen(names[i]->d_name) > 5
                && strcmp(names[i]->d_name + strlen(names[i]->d_name) - 5,
                          ".json") == 0)
            {
                snprintf(path, sizeof(path), "%s/%s", conf->dir,
                         names[i]->d_name);
                root = json_load_file(path, 0, &err);

                if (root == NULL) {
                    fprintf(stderr, "kvload: %s: %s, skipped\n", path,
                            err.text);
                    set->broken++;

                } else {
                    rc = kvl_ss_session(conf, set, root, path);
                    json_decref(root);
                }
            }

            free(names[i]);
        }

        free(names);
    }

    if (rc == 0 && set->n == 0) {
        fprintf(stderr, "kvload: no session selected (%llu read, %llu "
                "over --session-max-tokens, %llu broken)\n",
                (unsigned long long) set->read,
                (unsigned long long) set->too_long,
                (unsigned long long) set->broken);
        rc = -1;
    }

    if (rc != 0) {
        kvl_ss_set_free(set);
    }

    return rc;
}


/* 0: taken or left out, -1: out of memory */

static int
kvl_ss_session(const kvl_ss_conf_t *conf, kvl_ss_set_t *set, json_t *root,
    const char *name)
{
    int                rc;
    void              *p;
    const char        *id;
    json_int_t         sys = 0, tools = 0;
    json_t            *reqs;
    kvl_ss_flat_t      fl;
    kvl_ss_session_t   s;

    set->read++;
    memset(&fl, 0, sizeof(kvl_ss_flat_t));
    memset(&s, 0, sizeof(kvl_ss_session_t));

    if (json_unpack(root, "{s:s, s:o, s?I, s?I}", "id", &id,
                    "requests", &reqs, "system_tokens", &sys,
                    "tool_tokens", &tools) != 0
        || !json_is_array(reqs) || strlen(id) >= sizeof(s.id)
        || strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                      "0123456789_-.") != strlen(id))
    {
        fprintf(stderr, "kvload: %s: a file that is not a session, "
                "skipped\n", name);
        set->broken++;
        return 0;
    }

    rc = kvl_ss_thread(&fl, reqs, 0.0, 0, sys + tools);

    if (rc == 0 && fl.n) {
        snprintf(s.id, sizeof(s.id), "%s", id);
        s.seed = kvl_ss_hash(id);
        rc = kvl_ss_pack(conf, &fl, &s);

    } else if (rc == 0) {
        rc = 1;
    }

    free(fl.r);
    free(fl.prefix);

    if (rc > 0) {
        fprintf(stderr, "kvload: %s: session %s has a malformed request, "
                "skipped\n", name, id);
        set->broken++;
        free(s.reqs);
        free(s.ids);
        free(fl.kinds);
        return 0;
    }

    if (rc == 0 && conf->max_tokens && s.max_in > conf->max_tokens) {
        set->too_long++;
        rc = 2;

    } else if (rc == 0 && set->read - set->broken - set->too_long
                          <= conf->skip)
    {
        rc = 2;                         /* held out */
    }

    if (rc != 0) {
        free(s.reqs);
        free(s.ids);
        free(fl.kinds);
        return rc < 0 ? -1 : 0;
    }

    s.kinds = fl.kinds;
    s.nthreads = fl.nthreads;
    s.subagents = fl.subagents;

    p = realloc(set->s, (set->n + 1) * sizeof(kvl_ss_session_t));
    if (p == NULL) {
        free(s.reqs);
        free(s.ids);
        free(s.kinds);
        return -1;
    }

    set->s = p;
    set->s[set->n++] = s;

    return 0;
}


/* the requests of one thread and of the sub-agents it starts; 1: bad */

static int
kvl_ss_thread(kvl_ss_flat_t *fl, json_t *reqs, double t0, uint64_t kind,
    json_int_t prefix)
{
    int            rc;
    void          *p;
    size_t         i;
    double         t, think;
    uint32_t       thread;
    json_t        *r, *ids, *sub;
    json_int_t     in, out, sys, tools;
    const char    *type;

    thread = fl->nthreads++;

    if (thread > 65535) {
        return 1;
    }

    p = realloc(fl->kinds, fl->nthreads * sizeof(uint64_t));
    if (p == NULL) {
        return -1;
    }
    fl->kinds = p;

    p = realloc(fl->prefix, fl->nthreads * sizeof(uint32_t));
    if (p == NULL) {
        return -1;
    }
    fl->prefix = p;

    fl->kinds[thread] = kind;
    fl->prefix[thread] = prefix > 0 && prefix < 0x7fffffff
                         ? (uint32_t) (prefix / KVL_SS_BLOCK_TOKENS) : 0;

    json_array_foreach(reqs, i, r) {
        type = "";
        t = 0.0;
        think = 0.0;
        sub = NULL;
        sys = 0;
        tools = 0;
        in = 0;
        out = 0;
        ids = NULL;

        if (json_unpack(r, "{s?s, s:F, s?F}", "type", &type, "t", &t,
                        "think_time", &think) != 0
            || !(t >= 0.0) || t > 1e9 || !(think >= 0.0))
        {
            return 1;
        }

        if (strcmp(type, "subagent") == 0) {
            if (json_unpack(r, "{s:o, s?s, s?I, s?I}", "requests", &sub,
                            "subagent_type", &type, "system_tokens", &sys,
                            "tool_tokens", &tools) != 0
                || !json_is_array(sub))
            {
                return 1;
            }

            fl->subagents++;
            rc = kvl_ss_thread(fl, sub, t0 + t, kvl_ss_hash(type) | 1,
                               sys + tools);
            if (rc != 0) {
                return rc;
            }

            continue;
        }

        if (json_unpack(r, "{s:I, s:I, s:o}", "in", &in, "out", &out,
                        "hash_ids", &ids) != 0
            || !json_is_array(ids) || json_array_size(ids) > KVL_SS_MAX_IDS
            || in < 1 || in > 0x7fffffff || out < 0 || out > 1000000
            || fl->n == KVL_SS_MAX_REQS)
        {
            return 1;
        }

        if (fl->n == fl->cap) {
            fl->cap = fl->cap ? 2 * fl->cap : 64;
            p = realloc(fl->r, fl->cap * sizeof(kvl_ss_raw_t));
            if (p == NULL) {
                return -1;
            }
            fl->r = p;
        }

        fl->r[fl->n].t = t0 + t;
        fl->r[fl->n].think = think;
        fl->r[fl->n].seq = (uint32_t) fl->n;
        fl->r[fl->n].thread = thread;
        fl->r[fl->n].in = (uint32_t) in;
        /* a request recorded with no output (cut short) asks for one */
        fl->r[fl->n].out = out ? (uint32_t) out : 1;
        fl->r[fl->n].ids = ids;
        fl->n++;
    }

    return 0;
}


/* a prompt's full blocks: the ids, at most as many as `in` fills */
static size_t
kvl_ss_full(const kvl_ss_raw_t *r)
{
    size_t  n = json_array_size(r->ids);

    return n < r->in / KVL_SS_BLOCK_TOKENS ? n : r->in / KVL_SS_BLOCK_TOKENS;
}


static int
kvl_ss_pack(const kvl_ss_conf_t *conf, kvl_ss_flat_t *fl,
    kvl_ss_session_t *s)
{
    void          *p;
    size_t         i, k, n, m, cap;
    double         t_prev, t_new, gap;
    json_t        *v;
    json_int_t     id;
    kvl_ss_raw_t  *r, **prev, **first;
    kvl_ss_req_t  *q;

    qsort(fl->r, fl->n, sizeof(kvl_ss_raw_t), kvl_ss_cmp);

    n = conf->requests && conf->requests < fl->n ? conf->requests : fl->n;

    s->reqs = calloc(n, sizeof(kvl_ss_req_t));
    prev = calloc(fl->nthreads, sizeof(kvl_ss_raw_t *));
    first = calloc(fl->nthreads, sizeof(kvl_ss_raw_t *));

    if (s->reqs == NULL || prev == NULL || first == NULL) {
        free(prev);
        free(first);
        return -1;
    }

    for (i = 0; i < fl->n; i++) {
        if (first[fl->r[i].thread] == NULL) {
            first[fl->r[i].thread] = &fl->r[i];
        }
    }

    cap = 0;
    t_prev = 0.0;
    t_new = 0.0;

    for (i = 0; i < n; i++) {
        r = &fl->r[i];
        q = &s->reqs[i];
        m = kvl_ss_full(r);

        /* a long idle gap shortened: everything after it moves up */
        gap = r->t - t_prev;
        t_prev = r->t;
        t_new += conf->idle_max > 0.0 && gap > conf->idle_max
                 ? conf->idle_max : gap;

        q->t = t_new;
        q->think = conf->idle_max > 0.0 && r->think > conf->idle_max
                   ? conf->idle_max : r->think;
        q->in = r->in;
        q->out = r->out;
        q->index = (uint32_t) i;
        q->thread = (uint16_t) r->thread;

        for (k = 0; k < m; k++) {
            v = json_array_get(r->ids, k);
            id = json_integer_value(v);

            if (!json_is_integer(v) || id < 0 || id > 0xffffffffLL) {
                free(prev);
                free(first);
                return 1;
            }
        }

        /* what it keeps of its thread's previous prompt */
        k = 0;

        if (prev[r->thread]) {
            for (k = 0; k < m && k < kvl_ss_full(prev[r->thread])
                        && json_integer_value(json_array_get(r->ids, k))
                           == json_integer_value(
                                  json_array_get(prev[r->thread]->ids, k));
                 k++)
            {
                /* void */
            }
        }

        q->keep = (uint32_t) k;
        q->first = (uint32_t) s->nids;
        q->nnew = (uint32_t) (m - k);

        /* the thread's system prompt and tools, as its first request has */
        for (k = 0; k < m && k < fl->prefix[r->thread]
                    && k < kvl_ss_full(first[r->thread])
                    && json_integer_value(json_array_get(r->ids, k))
                       == json_integer_value(
                              json_array_get(first[r->thread]->ids, k));
             k++)
        {
            /* void */
        }

        q->shared = conf->shared_prefix ? (uint32_t) k : 0;

        if (s->nids + q->nnew > cap) {
            for (cap = cap ? cap : 4096; cap < s->nids + q->nnew; cap *= 2) {
                /* void */
            }

            p = realloc(s->ids, cap * sizeof(uint32_t));
            if (p == NULL) {
                free(prev);
                free(first);
                return -1;
            }
            s->ids = p;
        }

        for (k = q->keep; k < m; k++) {
            s->ids[s->nids++] = (uint32_t) json_integer_value(
                                               json_array_get(r->ids, k));
        }

        prev[r->thread] = r;
        s->max_in = r->in > s->max_in ? r->in : s->max_in;
        s->tokens_in += r->in;
    }

    free(prev);
    free(first);

    s->nreqs = (uint32_t) n;

    return 0;
}


static int
kvl_ss_cmp(const void *a, const void *b)
{
    const kvl_ss_raw_t  *x = a, *y = b;

    if (x->t != y->t) {
        return x->t < y->t ? -1 : 1;
    }

    return x->seq < y->seq ? -1 : x->seq > y->seq;
}


/* FNV-1a: a session's id or a sub-agent's type to a seed */
static uint64_t
kvl_ss_hash(const char *s)
{
    uint64_t  h = 0xcbf29ce484222325ULL;

    for ( /* void */ ; *s; s++) {
        h = (h ^ (unsigned char) *s) * 0x100000001b3ULL;
    }

    return h;
}


void
kvl_ss_set_free(kvl_ss_set_t *set)
{
    size_t  i;

    for (i = 0; i < set->n; i++) {
        free(set->s[i].reqs);
        free(set->s[i].ids);
        free(set->s[i].kinds);
    }

    free(set->s);
    memset(set, 0, sizeof(kvl_ss_set_t));
}


/* 64 pseudo-tokens of 4 bytes ("xyz "), the same for the same seed */
static void
kvl_ss_text(char **buf, size_t *cap, size_t *len, uint64_t seed,
    unsigned tokens)
{
    char               *p;
    uint64_t            rng, r;
    unsigned            i;
    static const char   a[] = "abcdefghijklmnopqrstuvwxyz0123456789";

    kvl_ss_append(buf, cap, len, NULL, 4 * tokens);

    if (*buf == NULL) {
        return;
    }

    p = *buf + *len - 4 * tokens;
    rng = seed;

    for (i = 0; i < tokens; i++) {
        r = kva_rand_next(&rng);
        *p++ = a[r % 36];
        *p++ = a[(r >> 8) % 36];
        *p++ = a[(r >> 16) % 36];
        *p++ = ' ';
    }
}


int
kvl_ss_body(const kvl_ss_session_t *s, const kvl_ss_req_t *r,
    const uint32_t *cur, const char *model, char **buf, size_t *cap,
    size_t *len)
{
    char      head[256];
    uint32_t  k, n;
    uint64_t  seed;

    *len = 0;
    n = r->keep + r->nnew;

    snprintf(head, sizeof(head), "{\"model\":\"%s\",\"messages\":"
             "[{\"role\":\"user\",\"content\":\"", model);
    kvl_ss_append(buf, cap, len, head, strlen(head));

    for (k = 0; k < n; k++) {
        seed = k < r->shared
               ? 0x7368617265640000ULL ^ s->kinds[r->thread] * 31 ^ k
               : s->seed * 0x9e3779b97f4a7c15ULL ^ cur[k];
        kvl_ss_text(buf, cap, len, seed, KVL_SS_BLOCK_TOKENS);
    }

    /* the partial last block: this request's own */
    kvl_ss_text(buf, cap, len, s->seed ^ 0x7461696c00000000ULL
                               ^ ((uint64_t) r->index << 1),
                r->in - n * KVL_SS_BLOCK_TOKENS);

    snprintf(head, sizeof(head), "\"}],\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true},"
             "\"max_tokens\":%u,\"ignore_eos\":true}", r->out);
    kvl_ss_append(buf, cap, len, head, strlen(head));

    return *buf ? 0 : -1;
}


/* s NULL: room for n more bytes, counted */
static void
kvl_ss_append(char **buf, size_t *cap, size_t *len, const char *s, size_t n)
{
    char    *b;
    size_t   c;

    if (*buf != NULL && *len + n + 1 <= *cap) {
        goto copy;
    }

    for (c = *cap ? *cap : 65536; c < *len + n + 1; c *= 2) {
        /* void */
    }

    b = realloc(*buf, c);
    if (b == NULL) {
        free(*buf);
        *buf = NULL;
        *cap = 0;
        *len = 0;
        return;
    }

    *buf = b;
    *cap = c;

copy:

    if (s) {
        memcpy(*buf + *len, s, n);
    }

    *len += n;
    (*buf)[*len] = '\0';
}
