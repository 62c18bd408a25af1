/*
 * ngx_http_kv_aware_module: the status pages' one reader of shared
 * memory.  Each upstream's slices of the zone and its servers' slots are
 * copied under the zone's lock, held for the copy alone; the index's
 * entries per server are counted a chunk per hold of the lock, as the
 * whole-index scans go, so that however often a page is asked for,
 * routing waits for one chunk at most.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_members.h"
#include "ngx_http_kv_aware_events.h"
#include "ngx_http_kv_aware_status_snapshot.h"


#define NGX_HTTP_KV_AWARE_CHECK_ERR     64     /* what failed, in words */


/* NGX_HTTP_KV_AWARE_SV_UINT reads ngx_uint_t and ngx_atomic_t alike */
typedef char  ngx_http_kv_aware_sv_uint_t[
    (sizeof(ngx_uint_t) == sizeof(ngx_atomic_uint_t)) ? 1 : -1];


static ngx_int_t ngx_http_kv_aware_status_upstream(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_uint_t check,
    ngx_http_kv_aware_status_upstream_t *u);
static void ngx_http_kv_aware_status_count(ngx_http_kv_aware_srv_conf_t *kcf,
    kva_slot_count_t counts[KVA_MAX_SLOTS]);
static void ngx_http_kv_aware_status_servers(
    ngx_http_kv_aware_srv_conf_t *kcf, kva_slot_count_t *counts,
    ngx_http_kv_aware_status_upstream_t *u);
static ngx_int_t ngx_http_kv_aware_status_check(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_status_upstream_t *u);


ngx_int_t
ngx_http_kv_aware_status_snapshot(ngx_http_request_t *r, ngx_uint_t check,
    ngx_http_kv_aware_status_t *st)
{
    ngx_uint_t                      i;
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_upstream_srv_conf_t  **uscfp;
    ngx_http_upstream_main_conf_t  *umcf;

    umcf = ngx_http_get_module_main_conf(r, ngx_http_upstream_module);
    uscfp = umcf->upstreams.elts;

    st->nupstreams = 0;
    st->upstreams = ngx_pcalloc(r->pool, (umcf->upstreams.nelts + 1)
                                * sizeof(ngx_http_kv_aware_status_upstream_t));
    if (st->upstreams == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < umcf->upstreams.nelts; i++) {
        if (uscfp[i]->srv_conf == NULL) {
            continue;   /* an implicit upstream of a proxy_pass URL */
        }

        kcf = ngx_http_conf_upstream_srv_conf(uscfp[i],
                                              ngx_http_kv_aware_module);

        if (kcf->shm_zone == NULL || kcf->sh == NULL) {
            continue;
        }

        st->upstreams[st->nupstreams].name = uscfp[i]->host;

        if (ngx_http_kv_aware_status_upstream(r, kcf, check,
                                     &st->upstreams[st->nupstreams])
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        st->nupstreams++;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_kv_aware_status_upstream(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_uint_t check,
    ngx_http_kv_aware_status_upstream_t *u)
{
    kva_slot_count_t            *counts;
    ngx_http_kv_aware_shctx_t   *sh;

    sh = kcf->sh;

    u->tokens = (kcf->keys == NGX_HTTP_KV_AWARE_KEYS_TOKENS);
    u->events = (kcf->events != NULL);
    u->share = (kcf->events && kcf->events->share && sh->share);

    if (kcf->events) {
        u->redis_address = kcf->events->link.addr_text;
    }

    /* the servers as they are now; a data-parallel one a rank at a time */
    if (kcf->dynamic) {
        ngx_http_kv_aware_members_sync(kcf);
    }

    u->servers = ngx_pcalloc(r->pool, (kcf->npeers * kcf->data_parallel + 1)
                               * sizeof(ngx_http_kv_aware_status_server_t));
    counts = ngx_palloc(r->pool, KVA_MAX_SLOTS * sizeof(kva_slot_count_t));

    if (u->servers == NULL || counts == NULL) {
        return NGX_ERROR;
    }

    ngx_http_kv_aware_status_count(kcf, counts);

    ngx_shmtx_lock(&kcf->shpool->mutex);

    u->routing = sh->routing;
    u->ev = sh->events;
    u->redis = sh->redis;
    u->pd = sh->pd;
    u->session = sh->session;
    /* the counters only: the budgets behind them are 150 KB at 1,024 slots */
    ngx_memcpy(&u->index, sh->index, offsetof(kva_index_t, learn_active));

    if (u->share) {
        u->shared = sh->share->stats;
    }

    ngx_http_kv_aware_status_servers(kcf, counts, u);

    ngx_shmtx_unlock(&kcf->shpool->mutex);

    /* what keys the buckets stays in the zone */
    u->index.secret = 0;
    ngx_memzero(u->index.bucket_key, sizeof(u->index.bucket_key));

    /* a call ends with ids, or in one of the two fallbacks */
    u->tokenize[KVA_TOKENIZE_OK] = u->routing.tokenized;
    u->tokenize[KVA_TOKENIZE_FAILED] =
                   u->routing.fallback[NGX_HTTP_KV_AWARE_TOKENIZE_FAILED];
    u->tokenize[KVA_TOKENIZE_TIMEOUT] =
                   u->routing.fallback[NGX_HTTP_KV_AWARE_TOKENIZE_TIMEOUT];

    if (check) {
        return ngx_http_kv_aware_status_check(r, kcf, u);
    }

    return NGX_OK;
}


/* index entries per slot and source, a chunk per hold of the lock */
static void
ngx_http_kv_aware_status_count(ngx_http_kv_aware_srv_conf_t *kcf,
    kva_slot_count_t counts[KVA_MAX_SLOTS])
{
    uint32_t      from;
    kva_clock_t   clk;
    kva_index_t  *ix;

    ix = kcf->sh->index;

    ngx_http_kv_aware_zone_clock(kcf, &clk);

    ngx_memzero(counts, KVA_MAX_SLOTS * sizeof(kva_slot_count_t));
    from = 0;

    for ( ;; ) {
        ngx_shmtx_lock(&kcf->shpool->mutex);

        if (from >= ix->high_water) {
            ngx_shmtx_unlock(&kcf->shpool->mutex);
            break;
        }

        from = kva_index_count_range(ix, &clk, from, from + KVA_COUNT_CHUNK,
                                     counts);

        ngx_http_kv_aware_zone_unlock_between(kcf);
    }
}


/* entry i: rank i % data_parallel of peer i / data_parallel; lock held */
static void
ngx_http_kv_aware_status_servers(ngx_http_kv_aware_srv_conf_t *kcf,
    kva_slot_count_t *counts, ngx_http_kv_aware_status_upstream_t *u)
{
    ngx_uint_t                          i, s, n;
    ngx_http_kv_aware_status_server_t  *sv;

    n = kcf->npeers * kcf->data_parallel;

    for (i = 0; i < n; i++) {
        s = kcf->slot_of[i];
        sv = &u->servers[i];

        sv->slot = kcf->sh->slots[s];
        sv->name.data = sv->slot.name;
        sv->name.len = sv->slot.name_len;
        sv->index = s;
        sv->backup = (i / kcf->data_parallel >= kcf->nprimary);
        sv->ranked = (kcf->data_parallel > 1);
        sv->in_flight = (ngx_atomic_int_t) kcf->load[s].reqs;
        sv->count = counts[s];
    }

    u->nservers = n;
}


/*
 * A diagnostic: one whole scan of the index under the lock (tens of
 * milliseconds at a million entries), routing waits meanwhile.
 */
static ngx_int_t
ngx_http_kv_aware_status_check(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_status_upstream_t *u)
{
    int     rc;
    char   *err;

    err = ngx_pnalloc(r->pool, NGX_HTTP_KV_AWARE_CHECK_ERR);
    if (err == NULL) {
        return NGX_ERROR;
    }

    ngx_shmtx_lock(&kcf->shpool->mutex);
    rc = kva_index_check(kcf->sh->index, err, NGX_HTTP_KV_AWARE_CHECK_ERR);
    ngx_shmtx_unlock(&kcf->shpool->mutex);

    u->checked = 1;

    if (rc == 0) {
        ngx_str_set(&u->check, "ok");

    } else {
        u->check.data = (u_char *) err;
        u->check.len = ngx_strlen(err);
    }

    return NGX_OK;
}


uint64_t
ngx_http_kv_aware_status_snapshot_value(void *base, size_t offset,
    ngx_http_kv_aware_status_value_e type, ngx_uint_t k)
{
    u_char  *p;

    p = (u_char *) base + offset;

    switch (type) {

    case NGX_HTTP_KV_AWARE_SV_INT:
        return (uint64_t) ((ngx_atomic_int_t *) p)[k];

    case NGX_HTTP_KV_AWARE_SV_U32:
        return ((uint32_t *) p)[k];

    case NGX_HTTP_KV_AWARE_SV_U64:
        return ((uint64_t *) p)[k];

    default:
        return ((ngx_atomic_uint_t *) p)[k];
    }
}
