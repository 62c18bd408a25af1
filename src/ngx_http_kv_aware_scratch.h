/*
 * ngx_http_kv_aware_module: a worker's scratch arrays for the choices of
 * one upstream.
 *
 * A choice among 1,024 ranks needs about 150 KB of arrays (the picks,
 * what each candidate weighs, their costs, the lookup's depths, the
 * names read from a changing list, which members.c keeps in the
 * upstream's configuration).  On the stack that is more than a
 * small thread or musl stack has; they are made once a worker, at its
 * start, sized by the upstream's own slots.
 */

#ifndef _NGX_HTTP_KV_AWARE_SCRATCH_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_SCRATCH_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"
#include "kva_index.h"


struct ngx_http_kv_aware_scratch_s {
    ngx_uint_t                      ncand;    /* candidates the arrays hold */
    ngx_http_kv_aware_pick_t       *picks;
    kva_candidate_t                *cand;
    double                         *cost;
    double                         *rates;

    ngx_uint_t                      nslots;   /* by slot, < nslots: */
    uint32_t                       *depth;
    kva_tier_count_t               *tiers;    /* matched in slower tiers */
};


/* every kv_aware upstream's scratch, in the worker's cycle pool */
ngx_int_t ngx_http_kv_aware_scratch_init_process(ngx_cycle_t *cycle);


#endif /* _NGX_HTTP_KV_AWARE_SCRATCH_H_INCLUDED_ */
