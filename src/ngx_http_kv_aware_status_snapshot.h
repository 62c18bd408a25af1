/*
 * ngx_http_kv_aware_module: what the status pages show, copied out of
 * shared memory in one place.  The JSON and Prometheus renderers read
 * this plain copy and never the zone: a new counter is a field in its
 * slice of the zone (copied here whole) and a line in each renderer's
 * table, which finds it by offsetof().
 */

#ifndef _NGX_HTTP_KV_AWARE_STATUS_SNAPSHOT_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_STATUS_SNAPSHOT_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_zone.h"

#include "kva_token.h"


/* how a renderer reads a field of the copy */
typedef enum {
    NGX_HTTP_KV_AWARE_SV_UINT = 0,        /* ngx_uint_t, ngx_atomic_t */
    NGX_HTTP_KV_AWARE_SV_INT,             /* ngx_atomic_int_t */
    NGX_HTTP_KV_AWARE_SV_U32,
    NGX_HTTP_KV_AWARE_SV_U64
} ngx_http_kv_aware_status_value_e;


/* a server (a rank of one) as the page lists it: peer i of the lists */
typedef struct {
    ngx_http_kv_aware_slot_t        slot;         /* its slot, copied */
    ngx_str_t                       name;         /* into slot.name */
    ngx_uint_t                      index;        /* its slot's number */
    ngx_uint_t                      backup;
    ngx_uint_t                      ranked;       /* data_parallel > 1 */
    ngx_atomic_int_t                in_flight;    /* may read below 0 */
    kva_slot_count_t                count;        /* index entries */
} ngx_http_kv_aware_status_server_t;


/* an upstream: its slices of the zone, copied whole */
typedef struct {
    ngx_str_t                       name;
    ngx_uint_t                      tokens;       /* keys=tokens */
    ngx_uint_t                      events;       /* kv_aware_events */
    ngx_uint_t                      share;        /* share=on */
    ngx_str_t                       redis_address;

    ngx_http_kv_aware_routing_sh_t   routing;
    ngx_http_kv_aware_events_sh_t    ev;
    ngx_http_kv_aware_redis_stats_t  redis;
    ngx_http_kv_aware_share_stats_t  shared;
    ngx_http_kv_aware_pd_sh_t        pd;          /* kv_aware_prefill's */
    ngx_http_kv_aware_session_sh_t   session;     /* kv_aware session= */
    kva_index_t                      index;       /* its header */

    /* tokenizer calls by kva_tokenize_e, made of the routing counters */
    ngx_uint_t                      tokenize[KVA_TOKENIZE_LAST];

    ngx_uint_t                      checked;      /* ?check asked */
    ngx_str_t                       check;        /* "ok", or what failed */

    ngx_uint_t                      nservers;
    ngx_http_kv_aware_status_server_t  *servers;

    /* the rows all told, and those ?server= kept (status.c's paging) */
    ngx_uint_t                      listed;
    ngx_uint_t                      servers_total;
} ngx_http_kv_aware_status_upstream_t;


typedef struct {
    ngx_uint_t                      nupstreams;
    ngx_http_kv_aware_status_upstream_t  *upstreams;
    ngx_uint_t                      per_rank;     /* ?ranks=all */
} ngx_http_kv_aware_status_t;


/*
 * Every kv_aware upstream's state, in r's pool; check: also the index's
 * whole-index check (a diagnostic).  NGX_ERROR: no memory.
 */
ngx_int_t ngx_http_kv_aware_status_snapshot(ngx_http_request_t *r,
    ngx_uint_t check, ngx_http_kv_aware_status_t *st);

/* element k of the field of the given type at offset in base */
uint64_t ngx_http_kv_aware_status_snapshot_value(void *base, size_t offset,
    ngx_http_kv_aware_status_value_e type, ngx_uint_t k);


#endif /* _NGX_HTTP_KV_AWARE_STATUS_SNAPSHOT_H_INCLUDED_ */
