/*
 * ngx_http_kv_aware_module: the balancer.
 *
 * Wraps round-robin the way least_conn and hash do: round-robin keeps the
 * peer lists, the tried bitmap and failure accounting; we only choose,
 * among the candidates ngx_http_kv_aware_ranking.c finds and weighs.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_events.h"
#include "ngx_http_kv_aware_share.h"
#include "ngx_http_kv_aware_members.h"
#include "ngx_http_kv_aware_ranking.h"
#include "ngx_http_kv_aware_session.h"
#include "ngx_http_kv_aware_ttft.h"
#include "ngx_http_kv_aware_balancer.h"


typedef struct {
    /* first: round-robin's free and keepalive expect it here */
    ngx_http_upstream_rr_peer_data_t   rrp;

    ngx_http_kv_aware_srv_conf_t      *kcf;
    ngx_http_kv_aware_ctx_t           *ctx;
    ngx_http_upstream_rr_peers_t      *primary;

    ngx_http_kv_aware_load_t          *charged;  /* load of the current try */
    uint32_t                           charged_blocks;
    ngx_uint_t                         slot;

    /* chosen before the first try, for $kv_aware_dp_rank */
    ngx_http_upstream_rr_peer_t       *planned;
    ngx_uint_t                         planned_rank;
} ngx_http_kv_aware_peer_data_t;


static ngx_int_t ngx_http_kv_aware_init_peer(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us);
static ngx_int_t ngx_http_kv_aware_get_peer(ngx_peer_connection_t *pc,
    void *data);
static void ngx_http_kv_aware_free_peer(ngx_peer_connection_t *pc,
    void *data, ngx_uint_t state);
static ngx_uint_t ngx_http_kv_aware_planned(ngx_http_kv_aware_peer_data_t *kp,
    ngx_http_kv_aware_pick_t *picks, ngx_uint_t n);
static ngx_uint_t ngx_http_kv_aware_choose(ngx_http_kv_aware_peer_data_t *kp,
    ngx_http_kv_aware_pick_t *picks, ngx_uint_t n, ngx_log_t *log);
static void ngx_http_kv_aware_release(ngx_http_kv_aware_peer_data_t *kp,
    ngx_uint_t forget);
static ngx_int_t ngx_http_kv_aware_round_robin(ngx_peer_connection_t *pc,
    ngx_http_kv_aware_peer_data_t *kp);
static ngx_http_upstream_srv_conf_t *ngx_http_kv_aware_planned_upstream(
    ngx_http_request_t *r);
static ngx_int_t ngx_http_kv_aware_plan(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us);


ngx_int_t
ngx_http_kv_aware_balancer_init_upstream(ngx_conf_t *cf,
    ngx_http_upstream_srv_conf_t *us)
{
    ngx_str_t                     *name;
    ngx_uint_t                     n;
    ngx_http_upstream_rr_peer_t   *peer;
    ngx_http_upstream_rr_peers_t  *peers, *list;
    ngx_http_kv_aware_srv_conf_t  *kcf;

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, cf->log, 0, "kv_aware: init upstream");

    if (ngx_http_upstream_init_round_robin(cf, us) != NGX_OK) {
        return NGX_ERROR;
    }

    kcf = ngx_http_conf_upstream_srv_conf(us, ngx_http_kv_aware_module);
    peers = us->peer.data;

    n = peers->number + (peers->next ? peers->next->number : 0);

    if (n * kcf->data_parallel > KVA_MAX_SLOTS) {
        if (kcf->data_parallel > 1) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "kv_aware: upstream \"%V\" has %ui servers "
                               "of %ui ranks, at most %d ranks in all are "
                               "supported", &us->host, n,
                               kcf->data_parallel, KVA_MAX_SLOTS);
        } else {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "kv_aware: upstream \"%V\" has %ui servers, "
                               "at most %d are supported", &us->host, n,
                               KVA_MAX_SLOTS);
        }

        return NGX_ERROR;
    }

    kcf->nprimary = peers->number;
    kcf->npeers = n;

    kcf->peer_names = ngx_array_create(cf->pool, n, sizeof(ngx_str_t));
    if (kcf->peer_names == NULL) {
        return NGX_ERROR;
    }

    kcf->slot_of = ngx_pcalloc(cf->pool, KVA_MAX_SLOTS * sizeof(uint16_t));
    if (kcf->slot_of == NULL) {
        return NGX_ERROR;
    }

    for (list = peers; list; list = (list == peers) ? peers->next : NULL) {
        for (peer = list->peer; peer; peer = peer->next) {
            name = ngx_array_push(kcf->peer_names);
            if (name == NULL) {
                return NGX_ERROR;
            }

            *name = peer->name;

            if (name->len > NGX_HTTP_KV_AWARE_NAME_LEN) {
                name->len = NGX_HTTP_KV_AWARE_NAME_LEN;
            }
        }
    }

    us->peer.init = ngx_http_kv_aware_init_peer;

    kcf->uscf = us;

#if (NGX_HTTP_KV_AWARE_RESOLVE)
    /* in a zone the lists may change ("server ... resolve") */
    kcf->dynamic = (us->shm_zone != NULL);
#endif

    return NGX_OK;
}


static ngx_int_t
ngx_http_kv_aware_init_peer(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us)
{
    ngx_http_kv_aware_ctx_t        *ctx;
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_kv_aware_peer_data_t  *kp;

    kcf = ngx_http_conf_upstream_srv_conf(us, ngx_http_kv_aware_module);

    ctx = ngx_http_kv_aware_module_request_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    /*
     * $kv_aware_dp_rank, read while the request to the server was built,
     * already chose: the same data, so that the first try goes there
     */
    kp = ctx->peer_data;

    if (kp == NULL || kp->kcf != kcf) {
        kp = ngx_pcalloc(r->pool, sizeof(ngx_http_kv_aware_peer_data_t));
        if (kp == NULL) {
            return NGX_ERROR;
        }

        kp->kcf = kcf;
        kp->ctx = ctx;
        ctx->peer_data = kp;
    }

    r->upstream->peer.data = &kp->rrp;

    if (ngx_http_upstream_init_round_robin_peer(r, us) != NGX_OK) {
        return NGX_ERROR;
    }

    r->upstream->peer.get = ngx_http_kv_aware_get_peer;
    r->upstream->peer.free = ngx_http_kv_aware_free_peer;

    kp->primary = kp->rrp.peers;

    ngx_http_kv_aware_ranking_hash(r, kcf, ctx);
    ngx_http_kv_aware_session_key(r, kcf, ctx);

    return NGX_OK;
}


/*
 * $kv_aware_dp_rank: the rank of the server a data-parallel upstream
 * chooses, which has to be known while the request to the server is
 * built, before the balancer runs.  So the choice is made then (see
 * ngx_http_kv_aware_balancer_plan()).  A retry chooses anew but the
 * request keeps this rank: any rank is one every server has.
 */
ngx_int_t
ngx_http_kv_aware_balancer_plan_rank(ngx_http_request_t *r, ngx_uint_t *rank)
{
    ngx_int_t                       rc;
    ngx_http_kv_aware_ctx_t        *ctx;
    ngx_http_upstream_srv_conf_t   *us;
    ngx_http_kv_aware_srv_conf_t   *kcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);

    if (ctx && ctx->decided) {
        *rank = ctx->rank;
        return NGX_OK;
    }

    us = ngx_http_kv_aware_planned_upstream(r);

    if (us == NULL) {
        return NGX_DECLINED;
    }

    kcf = ngx_http_conf_upstream_srv_conf(us, ngx_http_kv_aware_module);

    if (kcf->data_parallel < 2) {
        return NGX_DECLINED;
    }

    rc = ngx_http_kv_aware_plan(r, us);

    if (rc != NGX_OK) {
        return rc;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);
    *rank = ctx->rank;

    return NGX_OK;
}


/*
 * The server of the request's kv_aware upstream, chosen while the request
 * to it is built, for what has to name it then ($kv_aware_dp_rank, the
 * split of ngx_http_kv_aware_pd.c): chosen among the servers the first
 * try may take, charged as the balancer charges, and the first try takes
 * it.  NGX_OK: ctx->decided, ctx->matched and ctx->rank are the choice's;
 * NGX_DECLINED: no kv_aware upstream, or no server to choose yet.
 */
ngx_int_t
ngx_http_kv_aware_balancer_plan(ngx_http_request_t *r)
{
    ngx_http_kv_aware_ctx_t        *ctx;
    ngx_http_upstream_srv_conf_t   *us;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);

    if (ctx && ctx->decided) {
        return NGX_OK;
    }

    us = ngx_http_kv_aware_planned_upstream(r);

    if (us == NULL) {
        return NGX_DECLINED;
    }

    return ngx_http_kv_aware_plan(r, us);
}


/* the request's kv_aware upstream, while its first try is to come */
static ngx_http_upstream_srv_conf_t *
ngx_http_kv_aware_planned_upstream(ngx_http_request_t *r)
{
    ngx_http_upstream_t            *u;
    ngx_http_upstream_srv_conf_t   *us;
    ngx_http_kv_aware_srv_conf_t   *kcf;

    u = r->upstream;

    /* proxy_pass with variables has no upstream{} to read yet */
    if (u == NULL || u->conf == NULL || u->conf->upstream == NULL
        || u->peer.connection != NULL)
    {
        return NULL;
    }

    us = u->conf->upstream;

    /* an implicit upstream (proxy_pass http://host) has no srv_conf */
    if (us->srv_conf == NULL || us->peer.data == NULL) {
        return NULL;
    }

    kcf = ngx_http_conf_upstream_srv_conf(us, ngx_http_kv_aware_module);

    if (kcf->shm_zone == NULL || kcf->uscf != us) {
        return NULL;
    }

    return us;
}


static ngx_int_t
ngx_http_kv_aware_plan(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us)
{
    time_t                          now;
    ngx_uint_t                      n, best;
    ngx_http_kv_aware_ctx_t        *ctx;
    ngx_http_kv_aware_pick_t       *picks;
    ngx_http_upstream_rr_peers_t   *peers;
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_kv_aware_peer_data_t  *kp;

    kcf = ngx_http_conf_upstream_srv_conf(us, ngx_http_kv_aware_module);

    if (ngx_http_kv_aware_init_peer(r, us) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);
    kp = ctx->peer_data;
    peers = kp->rrp.peers;
    now = ngx_time();

    if (kcf->dynamic) {
        ngx_http_kv_aware_members_sync(kcf);
    }

    ngx_http_upstream_rr_peers_wlock(peers);

    if (!ngx_http_kv_aware_members_current(kcf, peers)
        || peers->number > kcf->npeers)
    {
        ngx_http_upstream_rr_peers_unlock(peers);
        return NGX_DECLINED;
    }

    picks = kcf->scratch->picks;
    n = ngx_http_kv_aware_ranking_candidates(kcf, peers, 0, kp->rrp.tried,
                                             picks, now);

    if (n == 0) {
        ngx_http_upstream_rr_peers_unlock(peers);
        return NGX_DECLINED;
    }

    best = ngx_http_kv_aware_choose(kp, picks, n, r->connection->log);

    kp->planned = picks[best].peer;
    kp->planned_rank = picks[best].rank;

    ngx_http_upstream_rr_peers_unlock(peers);

    return NGX_OK;
}


static ngx_int_t
ngx_http_kv_aware_get_peer(ngx_peer_connection_t *pc, void *data)
{
    ngx_http_kv_aware_peer_data_t *kp = data;

    time_t                          now;
    ngx_int_t                       rc;
    ngx_uint_t                      i, n, base, best;
    ngx_http_upstream_rr_peer_t    *peer;
    ngx_http_upstream_rr_peers_t   *peers;
    ngx_http_kv_aware_pick_t       *picks;
    ngx_http_upstream_rr_peer_data_t  *rrp;

    rrp = &kp->rrp;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, pc->log, 0,
                   "kv_aware: get peer, try: %ui", pc->tries);

    pc->cached = 0;
    pc->connection = NULL;

    now = ngx_time();

    peers = rrp->peers;

    if (kp->kcf->dynamic) {
        ngx_http_kv_aware_members_sync(kp->kcf);
    }

    ngx_http_upstream_rr_peers_wlock(peers);

#if (NGX_HTTP_KV_AWARE_RESOLVE)
    /* as round-robin: the tried bitmap is of the lists as they were */
    if (peers->config && rrp->config != *peers->config) {
        ngx_http_upstream_rr_peers_unlock(peers);
        pc->name = peers->name;
        return NGX_BUSY;
    }
#endif

    base = (peers == kp->primary) ? 0 : kp->kcf->nprimary;

    /*
     * The lists changed again since the map was made, or hold more than
     * KVA_MAX_SLOTS servers (ranks), or the worker has no scratch arrays
     * (members_current() says): round-robin's own choice for this try.
     */
    if (!ngx_http_kv_aware_members_current(kp->kcf, peers)
        || base + peers->number > kp->kcf->npeers)
    {
        ngx_http_upstream_rr_peers_unlock(peers);
        return ngx_http_kv_aware_round_robin(pc, kp);
    }

    picks = kp->kcf->scratch->picks;
    n = ngx_http_kv_aware_ranking_candidates(kp->kcf, peers, base,
                                             rrp->tried, picks, now);

    if (n == 0) {
        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, pc->log, 0,
                       "kv_aware: no peer found");
        goto failed;
    }

    best = ngx_http_kv_aware_planned(kp, picks, n);

    if (best == n) {
        best = ngx_http_kv_aware_choose(kp, picks, n, pc->log);
    }

    peer = picks[best].peer;

    if (now - peer->checked > peer->fail_timeout) {
        peer->checked = now;
    }

    pc->sockaddr = peer->sockaddr;
    pc->socklen = peer->socklen;
    pc->name = &peer->name;

    peer->conns++;

    rrp->current = peer;

    i = picks[best].number;
    rrp->tried[i / (8 * sizeof(uintptr_t))] |=
                                 (uintptr_t) 1 << i % (8 * sizeof(uintptr_t));

    ngx_http_upstream_rr_peers_unlock(peers);

    return NGX_OK;

failed:

    if (peers->next) {
        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, pc->log, 0,
                       "kv_aware: backup servers");

        rrp->peers = peers->next;

        n = (rrp->peers->number + (8 * sizeof(uintptr_t) - 1))
                / (8 * sizeof(uintptr_t));

        for (i = 0; i < n; i++) {
            rrp->tried[i] = 0;
        }

        ngx_http_upstream_rr_peers_unlock(peers);

        rc = ngx_http_kv_aware_get_peer(pc, kp);

        if (rc != NGX_BUSY) {
            return rc;
        }

        ngx_http_upstream_rr_peers_wlock(peers);
    }

    /* all peers failed, mark them as live for quick recovery */

    for (peer = peers->peer; peer; peer = peer->next) {
        peer->fails = 0;
    }

    ngx_http_upstream_rr_peers_unlock(peers);

    pc->name = peers->name;

    return NGX_BUSY;
}


/*
 * The peer list holds more servers than have slots, or changed under the
 * map: round-robin's own choice, so that nothing is read past the table.
 */
static ngx_int_t
ngx_http_kv_aware_round_robin(ngx_peer_connection_t *pc,
    ngx_http_kv_aware_peer_data_t *kp)
{
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = kp->kcf;

    if (ngx_current_msec - kcf->logged_peer >= 60000
        || kcf->logged_peer == 0)
    {
        kcf->logged_peer = ngx_current_msec;

        ngx_log_error(NGX_LOG_WARN, pc->log, 0,
                      "kv_aware: upstream \"%V\" has servers without a "
                      "slot (%d ranks in all; a server gone frees its "
                      "slots once its requests finish) or no scratch, "
                      "routing by round-robin", &kcf->upstream, KVA_MAX_SLOTS);
    }

    return ngx_http_upstream_get_round_robin_peer(pc, &kp->rrp);
}


/*
 * The first try takes what $kv_aware_dp_rank chose, if that server may
 * still be taken (n if not: the choice is taken back and made again).
 */
static ngx_uint_t
ngx_http_kv_aware_planned(ngx_http_kv_aware_peer_data_t *kp,
    ngx_http_kv_aware_pick_t *picks, ngx_uint_t n)
{
    ngx_uint_t                    i;
    ngx_http_upstream_rr_peer_t  *planned;

    planned = kp->planned;

    if (planned == NULL) {
        return n;
    }

    kp->planned = NULL;

    for (i = 0; i < n; i++) {
        if (picks[i].peer == planned && picks[i].rank == kp->planned_rank) {
            return i;
        }
    }

    ngx_http_kv_aware_release(kp, 1);

    return n;
}


/*
 * Scores the eligible peers, charges the winner with the request's load
 * and records that it now holds the prompt's blocks, so that siblings of
 * a burst follow it before any of them has finished.
 */
static ngx_uint_t
ngx_http_kv_aware_choose(ngx_http_kv_aware_peer_data_t *kp,
    ngx_http_kv_aware_pick_t *picks, ngx_uint_t n, ngx_log_t *log)
{
    uint32_t                       nblocks, matched;
    ngx_uint_t                     best, slot;
    kva_clock_t                    clk;
    kva_candidate_t               *cand;
    ngx_http_kv_aware_ctx_t       *ctx;
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = kp->kcf;
    cand = kcf->scratch->cand;
    ctx = kp->ctx;
    nblocks = ctx->nblocks;

    ngx_http_kv_aware_zone_clock(kcf, &clk);

    ngx_shmtx_lock(&kcf->shpool->mutex);

    ngx_http_kv_aware_ranking_weigh_locked(kcf, ctx, picks, n, &clk, cand);

    best = ngx_http_kv_aware_session_pick_locked(kcf, ctx, picks, cand, n);
    slot = picks[best].slot;
    matched = cand[best].matched;

    ngx_http_kv_aware_balancer_learn_locked(kcf, ctx, slot, matched, &clk);
    ngx_http_kv_aware_ttft_charge_locked(kcf, ctx, slot, &cand[best],
                                         nblocks);

    ngx_shmtx_unlock(&kcf->shpool->mutex);

    kp->slot = slot;
    kp->charged = &kcf->load[slot];
    kp->charged_blocks = nblocks - matched;

    (void) ngx_atomic_fetch_add(&kp->charged->reqs, 1);
    (void) ngx_atomic_fetch_add(&kp->charged->blocks, kp->charged_blocks);
    (void) ngx_atomic_fetch_add(&kcf->sh->slots[slot].routing.routed, 1);
    (void) ngx_atomic_fetch_add(&kcf->sh->slots[slot].routing.blocks, nblocks);
    (void) ngx_atomic_fetch_add(&kcf->sh->slots[slot].routing.matched, matched);
    (void) ngx_atomic_fetch_add(&kcf->sh->routing.chosen[ctx->why], 1);

    ctx->matched = matched;
    ctx->rank = picks[best].rank;
    ctx->decided = 1;

    ngx_log_debug6(NGX_LOG_DEBUG_HTTP, log, 0,
                   "kv_aware: upstream \"%V\" chose slot %ui (%s), "
                   "%uD of %uD blocks held, %uL in flight",
                   &kcf->upstream, slot, kva_score_why(ctx->why), matched,
                   nblocks, cand[best].inflight_reqs);

    return best;
}


/*
 * The blocks of the prompt that slot, chosen, is about to compute and
 * will then hold, recorded in the index: so that siblings of a burst
 * follow it before any of them has finished.  Called with the zone's
 * lock held (ctx->found as the lookup left it), and returns with it
 * held; a long prompt lets it go between pieces.
 */
void
ngx_http_kv_aware_balancer_learn_locked(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_kv_aware_ctx_t *ctx, ngx_uint_t slot, uint32_t matched,
    kva_clock_t *clk)
{
    uint32_t  nblocks, from, piece;

    nblocks = ctx->nblocks;

    /* what the server is about to compute, it will cache */
    kva_fill_add(&kcf->sh->slots[slot].routing.fill, ngx_current_msec,
                 kcf->learned_ttl, nblocks - matched);

    /*
     * Learned bits serve while the server's events cannot be trusted;
     * speculative ones bridge the time until its events confirm.  A long
     * new prompt evicts an entry a block: it is recorded a piece per hold
     * of the lock, so that other requests wait for one piece at most.
     */
    ngx_http_kv_aware_zone_learn_budget(kcf, slot, clk);

    for (from = 0; from < nblocks; from += piece) {
        if (from) {
            ngx_shmtx_unlock(&kcf->shpool->mutex);
            ngx_shmtx_lock(&kcf->shpool->mutex);
        }

        piece = ngx_min(nblocks - from, KVA_ADD_CHUNK);

        kva_index_add_at(kcf->sh->index, ctx->hashes + from, piece, from,
                         slot, kva_slotset_has(&clk->precise, slot)
                               ? KVA_BIT_LEARNED | KVA_BIT_SPEC
                               : KVA_BIT_LEARNED,
                         clk, ctx->found + from);
    }

    /* what the other instances do not know yet, of a server that is silent */
    if (kcf->events && kcf->events->share && matched < nblocks
        && !kva_slotset_has(&clk->precise, slot))
    {
        ngx_http_kv_aware_share_queue(kcf, slot, ctx->hashes + matched,
                                      nblocks - matched);
    }
}


static void
ngx_http_kv_aware_free_peer(ngx_peer_connection_t *pc, void *data,
    ngx_uint_t state)
{
    ngx_http_kv_aware_peer_data_t *kp = data;

    /* the server did not take the prompt: do not send siblings there */
    ngx_http_kv_aware_release(kp, state & NGX_PEER_FAILED);

    ngx_http_upstream_free_round_robin_peer(pc, &kp->rrp, state);
}


/* gives back the load a try charged; forget: and what it taught */
static void
ngx_http_kv_aware_release(ngx_http_kv_aware_peer_data_t *kp,
    ngx_uint_t forget)
{
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = kp->kcf;

    /* an answer that began gave it back already */
    ngx_http_kv_aware_ttft_release(kp->ctx);

    if (kp->charged == NULL) {
        return;
    }

    (void) ngx_atomic_fetch_add(&kp->charged->reqs, -1);
    (void) ngx_atomic_fetch_add(&kp->charged->blocks,
                                -(ngx_atomic_int_t) kp->charged_blocks);
    kp->charged = NULL;

    if (forget && kp->ctx->nblocks) {
        ngx_shmtx_lock(&kcf->shpool->mutex);
        kva_index_del(kcf->sh->index, kp->ctx->hashes, kp->ctx->nblocks,
                      kp->slot, KVA_BIT_LEARNED | KVA_BIT_SPEC);
        ngx_shmtx_unlock(&kcf->shpool->mutex);
    }
}
