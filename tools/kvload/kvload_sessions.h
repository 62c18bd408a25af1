/*
 * kvload sessions workload: recorded agentic coding sessions (one JSON
 * file a session, 64-token block ids local to the session, sub-agents
 * inside) replayed each on its own clock.  kvload_sessions_load.c reads
 * and packs them, kvload_sessions.c runs and reports them.
 */

#ifndef _KVLOAD_SESSIONS_H_INCLUDED_
#define _KVLOAD_SESSIONS_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "kvload.h"


#define KVL_SS_BLOCK_TOKENS   64


typedef struct {
    const char         *dir;            /* one JSON file a session */
    const char         *tar;            /* or a .tar.gz of them */
    uint64_t            count;          /* sessions replayed, 0: all */
    uint64_t            skip;           /* taken ones skipped first */
    uint64_t            max_tokens;     /* sessions with a longer prompt
                                           are left out; 0: none */
    unsigned            requests;       /* a session's first, 0: all */
    double              idle_max;       /* longer gaps shortened, 0: no */
    unsigned            shared_prefix;  /* system + tools shared by all */
    unsigned            live;           /* sessions at once, 0: no cap */
    double              rate;           /* arrivals/s, 0: when one ends */
    unsigned            servers;        /* for the busiest/mean ratio */
    const char         *header;         /* the session id's header */
    const char         *log;            /* a line per request sent */
} kvl_ss_conf_t;


/* one request of a session, after its thread's previous one */
typedef struct {
    double              t;              /* session seconds */
    double              think;          /* after the thread's previous */
    uint32_t            in;
    uint32_t            out;
    uint32_t            keep;           /* ids of the thread's previous */
    uint32_t            first;          /* its new ids in ids[] */
    uint32_t            nnew;
    uint32_t            shared;         /* leading ids in the shared text */
    uint32_t            index;          /* in the session's full order */
    uint16_t            thread;         /* 0: the main agent */
} kvl_ss_req_t;


typedef struct {
    char                id[64];
    uint64_t            seed;           /* from the id: blocks apart */
    kvl_ss_req_t       *reqs;           /* in time order */
    uint32_t            nreqs;
    uint32_t           *ids;
    size_t              nids;
    uint32_t            nthreads;
    uint64_t           *kinds;          /* a thread's shared text */
    uint32_t            subagents;
    uint64_t            max_in;
    uint64_t            tokens_in;
} kvl_ss_session_t;


typedef struct {
    kvl_ss_session_t   *s;
    size_t              n;
    uint64_t            read;           /* files read */
    uint64_t            too_long;       /* left out: --session-max-tokens */
    uint64_t            broken;         /* not a session */
} kvl_ss_set_t;


/* the sessions the options select, packed; -1 with a message */
int kvl_ss_load(const kvl_ss_conf_t *conf, kvl_ss_set_t *set);
void kvl_ss_set_free(kvl_ss_set_t *set);

/*
 * A chat body with one user message: the prompt's full blocks, each the
 * same 64 pseudo-tokens for the same (session, id) or, within `shared`,
 * for the same (thread kind, position), then its partial tail; cur holds
 * the request's ids.  The body goes into *buf (grown as needed).
 */
int kvl_ss_body(const kvl_ss_session_t *s, const kvl_ss_req_t *r,
    const uint32_t *cur, const char *model, char **buf, size_t *cap,
    size_t *len);

/* the replay, counted in ctx->stages[0]; -1 when out of memory */
int kvl_ss_run(kvl_ctx_t *ctx, const kvl_ss_conf_t *conf);

/* adds "sessions" to the report and prints its lines */
int kvl_ss_report(kvl_ctx_t *ctx, json_t *root);


#endif /* _KVLOAD_SESSIONS_H_INCLUDED_ */
