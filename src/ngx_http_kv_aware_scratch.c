/*
 * ngx_http_kv_aware_module: a worker's scratch arrays; see the header.
 *
 * One set an upstream: a worker makes one choice at a time, and the
 * balancer, $kv_aware_ranking_NAME and the prefill choice of one
 * upstream never nest.  An upstream whose scratch could not be made is
 * routed by round-robin (the balancer logs why once a minute).
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_members.h"
#include "ngx_http_kv_aware_scratch.h"


static ngx_http_kv_aware_scratch_t *ngx_http_kv_aware_scratch_make(
    ngx_pool_t *pool, ngx_http_kv_aware_srv_conf_t *kcf);


ngx_int_t
ngx_http_kv_aware_scratch_init_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                      i;
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_upstream_srv_conf_t  **uscfp;
    ngx_http_upstream_main_conf_t  *umcf;

    umcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_upstream_module);
    if (umcf == NULL) {
        return NGX_OK;
    }

    uscfp = umcf->upstreams.elts;

    for (i = 0; i < umcf->upstreams.nelts; i++) {
        if (uscfp[i]->srv_conf == NULL) {
            continue;
        }

        kcf = ngx_http_conf_upstream_srv_conf(uscfp[i],
                                              ngx_http_kv_aware_module);

        if (kcf->sh == NULL || kcf->uscf != uscfp[i]) {
            continue;
        }

        kcf->scratch = ngx_http_kv_aware_scratch_make(cycle->pool, kcf);

        /* not fatal: the upstream is still served, by round-robin */
        if (kcf->scratch == NULL) {
            ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                          "kv_aware: upstream \"%V\": no memory for this "
                          "worker's scratch arrays, routing it by "
                          "round-robin", &kcf->upstream);
        }
    }

    return NGX_OK;
}


/*
 * Sized by the upstream's slots: its servers times their ranks, and the
 * highest slot they hold (a reload keeps a server's slot, which may lie
 * past the count).  Where servers come and go at run time any slot may
 * be taken: those are sized for all.
 */
static ngx_http_kv_aware_scratch_t *
ngx_http_kv_aware_scratch_make(ngx_pool_t *pool,
    ngx_http_kv_aware_srv_conf_t *kcf)
{
    size_t                        members;
    ngx_uint_t                    i, n;
    ngx_http_kv_aware_scratch_t  *s;

    s = ngx_pcalloc(pool, sizeof(ngx_http_kv_aware_scratch_t));
    if (s == NULL) {
        return NULL;
    }

    members = 0;

    if (kcf->dynamic && NGX_HTTP_KV_AWARE_RESOLVE) {
        s->ncand = KVA_MAX_SLOTS;
        s->nslots = KVA_MAX_SLOTS;
        members = ngx_http_kv_aware_members_scratch_size(kcf);

    } else {
        n = kcf->npeers * kcf->data_parallel;
        s->ncand = n;

        for (i = 0; i < n; i++) {
            if (kcf->slot_of[i] != NGX_HTTP_KV_AWARE_NO_SLOT
                && kcf->slot_of[i] >= s->nslots)
            {
                s->nslots = kcf->slot_of[i] + 1;
            }
        }
    }

    /* an empty upstream still gets arrays: no NULL to test for later */
    s->ncand = ngx_max(s->ncand, 1);
    s->nslots = ngx_max(s->nslots, 1);

    s->picks = ngx_palloc(pool, s->ncand * sizeof(ngx_http_kv_aware_pick_t));
    s->cand = ngx_palloc(pool, s->ncand * sizeof(kva_candidate_t));
    s->cost = ngx_palloc(pool, s->ncand * sizeof(double));
    s->rates = ngx_palloc(pool, s->ncand * sizeof(double));
    s->depth = ngx_palloc(pool, s->nslots * sizeof(uint32_t));
    s->tiers = ngx_palloc(pool, s->nslots * sizeof(kva_tier_count_t));

    if (s->picks == NULL || s->cand == NULL || s->cost == NULL
        || s->rates == NULL || s->depth == NULL || s->tiers == NULL)
    {
        return NULL;
    }

    if (members) {
        kcf->member_names = ngx_palloc(pool, members);
        if (kcf->member_names == NULL) {
            return NULL;
        }
    }

    return s;
}
