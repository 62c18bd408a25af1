/*
 * kvsim: disaggregated prefill and decode (--role), to vLLM's NixlConnector
 * contract, SGLang's bootstrap rooms and llm-d's sidecar header.
 *
 * kvsim_pd.c: what a request asks of its server (kv_transfer_params, the
 * bootstrap fields, x-prefiller-host-port), the prefill side's held blocks
 * and the pull endpoint that stands in for NIXL's read.  kvsim_pull.c: the
 * decode side's legs to a prefill server, the pull and its transfer time.
 */

#ifndef _KVSIM_PD_H_INCLUDED_
#define _KVSIM_PD_H_INCLUDED_


#include <event2/buffer.h>
#include <event2/http.h>
#include <jansson.h>

#include "kvsim.h"


#define KVS_PD_ID_MAX       128         /* a request id, a room's name */


typedef struct kvs_pull_s  kvs_pull_t;     /* kvsim_pull.c */


/* what a completion's body and headers ask for, read once */
typedef struct {
    unsigned            remote_decode:1;    /* leg 1: hold for a decode */
    unsigned            remote_prefill:1;   /* leg 2: pull, then decode */
    unsigned            usable:1;           /* leg 2's params all there */
    unsigned            bootstrap:1;        /* SGLang's three fields */
    unsigned            sidecar:1;          /* x-prefiller-host-port */
    unsigned            bad:1;              /* something unusable seen */

    char                host[64];           /* remote_host, bootstrap_host,
                                               or the header's */
    unsigned            port;
    char                remote_id[KVS_PD_ID_MAX + 1];
    char                engine_id[KVS_PD_ID_MAX + 1];
    uint64_t            room;
    uint32_t           *block_ids;          /* remote_block_ids, malloc'ed */
    uint32_t            nblock_ids;

    char                request_id[KVS_PD_ID_MAX + 1];  /* X-Request-Id */
    char                hold_id[KVS_PD_ID_MAX + 32];    /* leg 1's */

    /* the decode's outcome, in the reply's "kvsim" member */
    const char         *mode;               /* NULL: no disaggregation */
    const char         *fallback;           /* why served aggregated */
    uint32_t            pulled;             /* blocks */
    uint32_t            local;              /* blocks already held */
} kvs_pd_params_t;


/* the body's members (a parsed root) into p; 0, or -1 out of memory */
int kvs_pd_params(json_t *root, kvs_pd_params_t *p);
void kvs_pd_params_headers(kvs_server_t *srv, struct evhttp_request *req,
    kvs_pd_params_t *p);
void kvs_pd_params_free(kvs_pd_params_t *p);

/* a leg 1 finished: its prompt's blocks held under id, pinned; 0 or -1 */
int kvs_pd_hold(kvs_server_t *srv, kvs_seq_t *seq, const char *id);
/* the reply's top-level "kv_transfer_params" of a held leg 1 */
void kvs_pd_reply_params(kvs_server_t *srv, kvs_seq_t *seq, const char *id,
    struct evbuffer *b);
/* POST /kv/pull on a prefill server; any: on the bootstrap port */
void kvs_pd_pull_endpoint(kvs_server_t *srv, struct evhttp_request *req,
    int any);
/* --bootstrap-port's listener, for the whole process; 0 or -1 */
int kvs_pd_bootstrap_init(kvs_sim_t *sim);
void kvs_pd_free(kvs_server_t *srv);
void kvs_pd_metrics(kvs_server_t *srv, struct evbuffer *b);

const char *kvs_role_name(kvs_role_e role);


#endif /* _KVSIM_PD_H_INCLUDED_ */
