/*
 * ngx_http_kv_aware_module: the per-upstream shared memory zone, its
 * layout and the index clock.  Each concern declares its slice of the
 * zone in a header of its own with no .c (balancer_slice.h, events_slice.h,
 * share_slice.h, members_slice.h, pd_slice.h, session_slice.h,
 * ttft_slice.h; the Redis
 * link's stats in
 * redis.h); this header composes them, with the index, the server slots
 * and the load tables, and includes no concern whose .c includes it back.
 */

#ifndef _NGX_HTTP_KV_AWARE_ZONE_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_ZONE_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_balancer_slice.h"
#include "ngx_http_kv_aware_events_slice.h"
#include "ngx_http_kv_aware_redis.h"
#include "ngx_http_kv_aware_share_slice.h"
#include "ngx_http_kv_aware_members_slice.h"
#include "ngx_http_kv_aware_pd_slice.h"
#include "ngx_http_kv_aware_session_slice.h"
#include "ngx_http_kv_aware_ttft_slice.h"

#include "kva_index.h"
#include "kva_session.h"


#define NGX_HTTP_KV_AWARE_NAME_LEN      64     /* "ip:port", room for IPv6 */
#define NGX_HTTP_KV_AWARE_GENERATIONS   8      /* load tables kept on reload */

/* index clock: 16 ms ticks, wraps after 2.2 years, compared unsigned */
#define NGX_HTTP_KV_AWARE_TICK_SHIFT    4
#define ngx_http_kv_aware_ticks(ms)                                           \
    ((uint32_t) ((ms) >> NGX_HTTP_KV_AWARE_TICK_SHIFT))


/*
 * one server of the upstream (or one data-parallel rank of it: each has
 * its own cache), kept across reloads by its name and rank
 */
typedef struct {
    u_char                          name[NGX_HTTP_KV_AWARE_NAME_LEN];
    size_t                          name_len;
    ngx_uint_t                      rank;         /* data_parallel > 1 */
    ngx_http_kv_aware_routing_slot_t  routing;    /* the balancer's */
    ngx_http_kv_aware_events_slot_t   ev;         /* the event path's */
    ngx_http_kv_aware_ttft_slot_t     ttft;       /* its prefill rate */
} ngx_http_kv_aware_slot_t;


/* the zone header, in shpool->data */
struct ngx_http_kv_aware_shctx_s {
    size_t                          block_size;   /* hashes depend on it */
    ngx_uint_t                      keys;         /* and on these */
    ngx_uint_t                      block_tokens;
    ngx_uint_t                      generation;   /* bumped on each reload */

    ngx_http_kv_aware_routing_sh_t   routing;     /* balancer.h */
    ngx_http_kv_aware_events_sh_t    events;      /* events.h */
    ngx_http_kv_aware_redis_stats_t  redis;       /* redis.h: the link */
    ngx_http_kv_aware_share_t       *share;       /* share.h: its ring */
    ngx_http_kv_aware_members_sh_t   members;     /* members.h */
    ngx_http_kv_aware_pd_sh_t        pd;          /* pd_slice.h */
    ngx_http_kv_aware_session_sh_t   session;     /* session_slice.h */
    kva_session_t                   *sessions;    /* NULL: no session= */

    ngx_http_kv_aware_slot_t        slots[KVA_MAX_SLOTS];
    ngx_http_kv_aware_load_t        load[NGX_HTTP_KV_AWARE_GENERATIONS]
                                        [KVA_MAX_SLOTS];

    kva_index_t                    *index;
    size_t                          index_size;
};


ngx_int_t ngx_http_kv_aware_zone_init(ngx_shm_zone_t *shm_zone, void *data);
void ngx_http_kv_aware_zone_clock(ngx_http_kv_aware_srv_conf_t *kcf,
    kva_clock_t *clk);
void ngx_http_kv_aware_zone_learn_budget(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_uint_t slot, kva_clock_t *clk);
void ngx_http_kv_aware_zone_unlock_between(
    ngx_http_kv_aware_srv_conf_t *kcf);
void ngx_http_kv_aware_zone_drop_slots(ngx_http_kv_aware_srv_conf_t *kcf,
    const kva_slotset_t *set, unsigned srcs);
void ngx_http_kv_aware_zone_forget_slots(ngx_http_kv_aware_srv_conf_t *kcf,
    const kva_slotset_t *set);
void ngx_http_kv_aware_zone_set_precise(ngx_http_kv_aware_shctx_t *sh,
    const kva_slotset_t *set, ngx_uint_t on);
/*
 * The slot of (name, rank), not reserved, or KVA_MAX_SLOTS; a slot named
 * goes into the table, and after slots are wiped it is made again.  All
 * three with the zone's lock held (or before any worker runs).
 */
ngx_uint_t ngx_http_kv_aware_zone_slot_by_name(ngx_http_kv_aware_shctx_t *sh,
    u_char *name, size_t len, ngx_uint_t rank);
void ngx_http_kv_aware_zone_name_add(ngx_http_kv_aware_shctx_t *sh,
    ngx_uint_t slot);
void ngx_http_kv_aware_zone_names_rebuild(ngx_http_kv_aware_shctx_t *sh);


/* whether the events of slot's server are in sync: its bits are the truth */
#define ngx_http_kv_aware_zone_precise(sh, slot)                              \
    ((sh)->events.precise[(slot) / 64] >> ((slot) % 64) & 1)


#endif /* _NGX_HTTP_KV_AWARE_ZONE_H_INCLUDED_ */
