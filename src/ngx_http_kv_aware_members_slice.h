/*
 * ngx_http_kv_aware_module: the members' slice of the zone, the slots
 * of servers gone from the upstream and the view that changed them.
 *
 * It has no .c of its own: ngx_http_kv_aware_zone.h composes the slices
 * and the concern's .c reads the zone, so the slice lives apart from
 * both and includes neither.
 */

#ifndef _NGX_HTTP_KV_AWARE_MEMBERS_SLICE_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_MEMBERS_SLICE_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"

#include "kva_slotset.h"


/* slot_of[] for a peer that has none (more than KVA_MAX_SLOTS ranks) */
#define NGX_HTTP_KV_AWARE_NO_SLOT  0xffff


/*
 * The slots by (name, rank), open addressing at half load at most: an
 * event's server found in O(1), not by a scan of every slot's name.
 */
#define NGX_HTTP_KV_AWARE_NAME_TABLE  (2 * KVA_MAX_SLOTS)


/* the upstream's */
typedef struct {
    kva_slotset_t                   reserved;     /* slots of servers gone */
    ngx_uint_t                      map_gen;      /* the view that last */
    ngx_uint_t                      map_config;   /* changed the slots */

    /* slot + 1, 0: empty; under the zone's lock (zone.c) */
    uint16_t                        by_name[NGX_HTTP_KV_AWARE_NAME_TABLE];
} ngx_http_kv_aware_members_sh_t;


#endif /* _NGX_HTTP_KV_AWARE_MEMBERS_SLICE_H_INCLUDED_ */
