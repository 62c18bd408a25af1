/*
 * ngx_http_kv_aware_module: what a channel of messages may cost the
 * subscribing worker a second (kv_aware_events max_rate, server_bytes,
 * server_hashes).  The events channel and CHANNEL:learned each count
 * their own, so that a flood on either costs the other nothing.
 */

#ifndef _NGX_HTTP_KV_AWARE_BUDGET_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_BUDGET_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"

#include "kva_index.h"


/* the limits, from the configuration */
typedef struct {
    ngx_uint_t                      max_rate;     /* messages a second */
    size_t                          server_bytes; /* a second, per server */
    ngx_uint_t                      server_hashes;
} ngx_http_kv_aware_budget_conf_t;


/* what a channel spent in the current second */
typedef struct {
    ngx_msec_t                      start;        /* of the second */
    ngx_uint_t                      messages;
    ngx_uint_t                      scanned;      /* index entries */
    size_t                          bytes[KVA_MAX_SLOTS];
    ngx_uint_t                      hashes[KVA_MAX_SLOTS];
} ngx_http_kv_aware_budget_t;


/* counts a message, before its parse; 1: over max_rate */
ngx_uint_t ngx_http_kv_aware_budget_rate(ngx_http_kv_aware_budget_t *bg,
    ngx_http_kv_aware_budget_conf_t *conf);

/* counts a server's message; the budget it is over, NULL: none */
const char *ngx_http_kv_aware_budget_server(ngx_http_kv_aware_budget_t *bg,
    ngx_http_kv_aware_budget_conf_t *conf, ngx_uint_t slot, size_t len,
    ngx_uint_t hashes);


#endif /* _NGX_HTTP_KV_AWARE_BUDGET_H_INCLUDED_ */
