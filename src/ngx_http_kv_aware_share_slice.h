/*
 * ngx_http_kv_aware_module: the share ring's slice of the zone, the
 * hashes this nginx routed waiting to go out on CHANNEL:learned.
 *
 * It has no .c of its own: ngx_http_kv_aware_zone.h composes the slices
 * and the concern's .c reads the zone, so the slice lives apart from
 * both and includes neither.
 */

#ifndef _NGX_HTTP_KV_AWARE_SHARE_SLICE_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_SHARE_SLICE_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"


/* hashes waiting to go out: a power of two */
#define NGX_HTTP_KV_AWARE_SHARE_RING     8192


/* the share ring's counters, as the status pages show them */
typedef struct {
    ngx_atomic_t                    sent;         /* hashes */
    ngx_atomic_t                    received;     /* hashes applied */
    ngx_atomic_t                    dropped;      /* ring full, or Redis */
    ngx_atomic_t                    refused;      /* messages */
    ngx_atomic_t                    messages_out;
    ngx_atomic_t                    messages_in;
} ngx_http_kv_aware_share_stats_t;


/* the share ring's slice of the zone, written under its lock */
typedef struct {
    uint64_t                        origin;       /* this instance's */
    ngx_uint_t                      head;         /* next to send */
    ngx_uint_t                      tail;         /* next free */
    ngx_http_kv_aware_share_stats_t  stats;
    uint64_t                        hashes[NGX_HTTP_KV_AWARE_SHARE_RING];
    uint16_t                        slots[NGX_HTTP_KV_AWARE_SHARE_RING];
} ngx_http_kv_aware_share_t;


/* what the zone grows by for it (kv_aware adds it to index_size) */
#define ngx_http_kv_aware_share_size()                                        \
    ngx_align(sizeof(ngx_http_kv_aware_share_t), ngx_pagesize)


#endif /* _NGX_HTTP_KV_AWARE_SHARE_SLICE_H_INCLUDED_ */
