/*
 * ngx_http_kv_aware_module: the upstream's servers as they are now; see
 * the header.
 *
 * Workers make their maps on their own, so the zone remembers which view
 * of the peer list last changed the slots (the cycle's generation and the
 * list's counter): a worker holding an older view only reads the slots,
 * or it could free the slot of a server another worker just took in.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_members.h"


#if (NGX_HTTP_KV_AWARE_RESOLVE)

typedef struct {
    u_char                          name[NGX_HTTP_KV_AWARE_NAME_LEN];
    size_t                          len;
} ngx_http_kv_aware_member_t;


static ngx_uint_t ngx_http_kv_aware_members_read(
    ngx_http_upstream_rr_peers_t *primary, ngx_http_kv_aware_member_t *m,
    ngx_uint_t max, ngx_uint_t *nprimary);
static ngx_uint_t ngx_http_kv_aware_members_place(
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_member_t *m,
    ngx_uint_t n, const kva_slotset_t *skip);
static ngx_uint_t ngx_http_kv_aware_slot_in_flight(
    ngx_http_kv_aware_shctx_t *sh, ngx_uint_t slot);


void
ngx_http_kv_aware_members_sync(ngx_http_kv_aware_srv_conf_t *kcf)
{
    kva_slotset_t                  used, gone, freed;
    ngx_uint_t                     config, n, nprimary, i, s, dp, newest,
                                   mapped, missing;
    ngx_http_kv_aware_slot_t      *sl;
    ngx_http_kv_aware_shctx_t     *sh;
    ngx_http_kv_aware_member_t    *m;
    ngx_http_upstream_rr_peers_t  *primary;

    primary = kcf->uscf->peer.data;

    /* no scratch (scratch.c): no map, and round-robin routes */
    if (primary->config == NULL || kcf->member_names == NULL) {
        return;
    }

    m = kcf->member_names;

    sh = kcf->sh;

    /* read first: a change while the lists are read shows next time */
    config = *primary->config;

    /*
     * Made again once a second while slots wait for their requests to
     * finish, or while a server still has none: it may take one freed
     * since, without waiting for DNS to change again.
     */
    if (kcf->mapped && kcf->map_config == config
        && ((kva_slotset_empty(&sh->members.reserved) && kcf->map_whole)
            || ngx_current_msec - kcf->map_time < 1000))
    {
        return;
    }

    dp = kcf->data_parallel;

    n = ngx_http_kv_aware_members_read(primary, m, KVA_MAX_SLOTS / dp,
                                       &nprimary);

    ngx_shmtx_lock(&kcf->shpool->mutex);

    /* generations only grow: an old cycle's worker never changes slots */
    newest = (kcf->generation > sh->members.map_gen
              || (kcf->generation == sh->members.map_gen
                  && config >= sh->members.map_config));
    kva_slotset_zero(&used);

    for (i = 0; i < n * dp; i++) {
        s = ngx_http_kv_aware_zone_slot_by_name(sh, m[i / dp].name,
                                           m[i / dp].len, i % dp);

        if (s < KVA_MAX_SLOTS) {
            kcf->slot_of[i] = (uint16_t) s;
            kva_slotset_add(&used, s);

        } else {
            kcf->slot_of[i] = NGX_HTTP_KV_AWARE_NO_SLOT;
        }
    }

    kva_slotset_zero(&gone);
    kva_slotset_zero(&freed);
    missing = 0;

    if (newest) {
        /*
         * A server gone from the list is forgotten at once; its slot is
         * reserved (no name answers to it) until what it was given has
         * finished, so that those requests do not count against a
         * newcomer's load.
         */
        for (s = 0; s < KVA_MAX_SLOTS; s++) {
            sl = &sh->slots[s];

            if (sl->name_len == 0 || kva_slotset_has(&used, s)) {
                continue;
            }

            if (!kva_slotset_has(&sh->members.reserved, s)) {
                kva_slotset_add(&gone, s);
                kva_slotset_add(&sh->members.reserved, s);
            }

            if (ngx_http_kv_aware_slot_in_flight(sh, s) == 0) {
                kva_slotset_add(&freed, s);
                kva_slotset_del(&sh->members.reserved, s);
                ngx_memzero(sl, sizeof(ngx_http_kv_aware_slot_t));
            }
        }

        if (!kva_slotset_empty(&freed)) {
            ngx_http_kv_aware_zone_names_rebuild(sh);
        }

        /* newcomers: slots free before this round first */
        missing = ngx_http_kv_aware_members_place(kcf, m, n, &freed);

        sh->members.map_gen = kcf->generation;
        sh->members.map_config = config;
    }

    ngx_shmtx_unlock(&kcf->shpool->mutex);

    if (!kva_slotset_empty(&gone)) {
        ngx_log_error(NGX_LOG_NOTICE, ngx_cycle->log, 0,
                      "kv_aware: upstream \"%V\" lost %ui servers (ranks), "
                      "what they held is forgotten", &kcf->upstream,
                      (ngx_uint_t) kva_slotset_count(&gone));

        ngx_http_kv_aware_zone_forget_slots(kcf, &gone);
    }

    /*
     * Then those freed in this round, now that what their servers held is
     * forgotten (the index is cleared a chunk per hold of the lock, so it
     * cannot be done above): left to a later round, a newcomer would wait
     * for the list to change again, and the upstream be routed by
     * round-robin meanwhile.
     */
    if (missing && !kva_slotset_empty(&freed)) {
        ngx_shmtx_lock(&kcf->shpool->mutex);

        if (sh->members.map_gen == kcf->generation
            && sh->members.map_config == config)
        {
            kva_slotset_zero(&freed);
            (void) ngx_http_kv_aware_members_place(kcf, m, n, &freed);
        }

        ngx_shmtx_unlock(&kcf->shpool->mutex);
    }

    /* the peers before the first without a slot are the ones routed */
    for (mapped = 0; mapped < n; mapped++) {
        for (i = 0; i < dp; i++) {
            if (kcf->slot_of[mapped * dp + i] == NGX_HTTP_KV_AWARE_NO_SLOT) {
                break;
            }
        }

        if (i < dp) {
            break;
        }
    }

    kcf->nprimary = nprimary;
    kcf->npeers = mapped;
    kcf->map_config = config;
    kcf->map_time = ngx_current_msec;
    kcf->map_whole = (mapped == n);
    kcf->mapped = 1;
}


/* the bytes of the names members_sync() reads, for the scratch */
size_t
ngx_http_kv_aware_members_scratch_size(ngx_http_kv_aware_srv_conf_t *kcf)
{
    return KVA_MAX_SLOTS / kcf->data_parallel
           * sizeof(ngx_http_kv_aware_member_t);
}


ngx_uint_t
ngx_http_kv_aware_members_current(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_upstream_rr_peers_t *peers)
{
    /* a worker without its scratch arrays has no usable map */
    if (kcf->scratch == NULL) {
        return 0;
    }

    if (peers->config == NULL) {
        return 1;
    }

    return kcf->mapped && kcf->map_config == *peers->config;
}


/* the names of the primary peers, then of the backups: max at most */
static ngx_uint_t
ngx_http_kv_aware_members_read(ngx_http_upstream_rr_peers_t *primary,
    ngx_http_kv_aware_member_t *m, ngx_uint_t max, ngx_uint_t *nprimary)
{
    ngx_uint_t                     n;
    ngx_http_upstream_rr_peer_t   *peer;
    ngx_http_upstream_rr_peers_t  *list;

    n = 0;
    *nprimary = 0;

    for (list = primary; list; list = (list == primary) ? primary->next
                                                        : NULL)
    {
        ngx_http_upstream_rr_peers_rlock(list);

        for (peer = list->peer; peer && n < max; peer = peer->next) {
            m[n].len = ngx_min(peer->name.len, NGX_HTTP_KV_AWARE_NAME_LEN);
            ngx_memcpy(m[n].name, peer->name.data, m[n].len);
            n++;
        }

        ngx_http_upstream_rr_peers_unlock(list);

        if (list == primary) {
            *nprimary = n;
        }
    }

    return n;
}


/*
 * Gives the ranks of m without a slot one: the one another worker gave
 * them since, else a free slot not in skip.  The zone is locked.  Returns
 * how many are left without.
 */
static ngx_uint_t
ngx_http_kv_aware_members_place(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_kv_aware_member_t *m, ngx_uint_t n, const kva_slotset_t *skip)
{
    ngx_uint_t                  i, s, dp, left;
    ngx_http_kv_aware_slot_t   *sl;
    ngx_http_kv_aware_shctx_t  *sh;

    sh = kcf->sh;
    dp = kcf->data_parallel;
    left = 0;

    for (i = 0; i < n * dp; i++) {
        if (kcf->slot_of[i] != NGX_HTTP_KV_AWARE_NO_SLOT) {
            continue;
        }

        s = ngx_http_kv_aware_zone_slot_by_name(sh, m[i / dp].name,
                                           m[i / dp].len, i % dp);

        if (s == KVA_MAX_SLOTS) {
            for (s = 0; s < KVA_MAX_SLOTS; s++) {
                if (sh->slots[s].name_len == 0
                    && !kva_slotset_has(&sh->members.reserved, s)
                    && !kva_slotset_has(skip, s))
                {
                    break;
                }
            }

            if (s == KVA_MAX_SLOTS) {
                left++;
                continue;
            }

            sl = &sh->slots[s];
            ngx_memcpy(sl->name, m[i / dp].name, m[i / dp].len);
            sl->name_len = m[i / dp].len;
            sl->rank = i % dp;
            ngx_http_kv_aware_zone_name_add(sh, s);
        }

        kcf->slot_of[i] = (uint16_t) s;
    }

    return left;
}


/* requests this slot was given and has not finished, in any cycle */
static ngx_uint_t
ngx_http_kv_aware_slot_in_flight(ngx_http_kv_aware_shctx_t *sh,
    ngx_uint_t slot)
{
    ngx_uint_t  g;

    for (g = 0; g < NGX_HTTP_KV_AWARE_GENERATIONS; g++) {
        if (sh->load[g][slot].reqs != 0) {
            return 1;
        }
    }

    return 0;
}


#else

/* before nginx 1.27.3 the peer list never changes at run time */

void
ngx_http_kv_aware_members_sync(ngx_http_kv_aware_srv_conf_t *kcf)
{
}


size_t
ngx_http_kv_aware_members_scratch_size(ngx_http_kv_aware_srv_conf_t *kcf)
{
    return 0;
}


ngx_uint_t
ngx_http_kv_aware_members_current(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_upstream_rr_peers_t *peers)
{
    /* a worker without its scratch arrays has no usable map */
    return kcf->scratch != NULL;
}

#endif
