/*
 * ngx_http_kv_aware_module: the balancer.
 *
 * Wraps round-robin the way least_conn and hash do: round-robin keeps the
 * peer lists, the tried bitmap and failure accounting; we only choose.
 */

#include "ngx_http_kv_aware_module.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_prompt.h"
#include "ngx_http_kv_aware_events.h"
#include "ngx_http_kv_aware_share.h"
#include "ngx_http_kv_aware_members.h"
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


/* a candidate: a server, or one data-parallel rank of it */
typedef struct {
    ngx_http_upstream_rr_peer_t       *peer;
    ngx_uint_t                         number;  /* in its peer list */
    ngx_uint_t                         slot;
    ngx_uint_t                         rank;
} ngx_http_kv_aware_pick_t;


static ngx_int_t ngx_http_kv_aware_init_peer(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us);
static ngx_int_t ngx_http_kv_aware_get_peer(ngx_peer_connection_t *pc,
    void *data);
static void ngx_http_kv_aware_free_peer(ngx_peer_connection_t *pc,
    void *data, ngx_uint_t state);
static ngx_uint_t ngx_http_kv_aware_candidates(
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_upstream_rr_peers_t *peers,
    ngx_uint_t base, uintptr_t *tried, ngx_http_kv_aware_pick_t *picks,
    time_t now);
static ngx_uint_t ngx_http_kv_aware_planned(ngx_http_kv_aware_peer_data_t *kp,
    ngx_http_kv_aware_pick_t *picks, ngx_uint_t n);
static void ngx_http_kv_aware_hash_request(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx);
static void ngx_http_kv_aware_weigh_locked(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_kv_aware_ctx_t *ctx, ngx_http_kv_aware_pick_t *picks,
    ngx_uint_t n, kva_clock_t *clk, kva_candidate_t *cand);
static ngx_uint_t ngx_http_kv_aware_choose(ngx_http_kv_aware_peer_data_t *kp,
    ngx_http_kv_aware_pick_t *picks, ngx_uint_t n, ngx_log_t *log);
static void ngx_http_kv_aware_release(ngx_http_kv_aware_peer_data_t *kp,
    ngx_uint_t forget);
static ngx_int_t ngx_http_kv_aware_round_robin(ngx_peer_connection_t *pc,
    ngx_http_kv_aware_peer_data_t *kp);


ngx_int_t
ngx_http_kv_aware_init_upstream(ngx_conf_t *cf,
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

    kcf->slot_of = ngx_pcalloc(cf->pool, KVA_MAX_SLOTS);
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

    ctx = ngx_http_kv_aware_request_ctx(r);
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

    ngx_http_kv_aware_hash_request(r, kcf, ctx);

    return NGX_OK;
}


/* the prompt's keys, once a request (counted then) */
static void
ngx_http_kv_aware_hash_request(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx)
{
    /* the context may come from kv_aware_tokenize, with the ids */
    if (ctx->hashed) {
        return;
    }

    ctx->hashed = 1;

    /* a prompt we cannot read only costs the request its affinity */
    (void) ngx_http_kv_aware_prompt_hashes(r, kcf, ctx);

    (void) ngx_atomic_fetch_add(&kcf->sh->requests, 1);

    if (ctx->ids) {
        (void) ngx_atomic_fetch_add(&kcf->sh->tokenized, 1);
    }

    if (ctx->fallback != NGX_HTTP_KV_AWARE_ROUTED) {
        (void) ngx_atomic_fetch_add(&kcf->sh->fallbacks, 1);
        (void) ngx_atomic_fetch_add(&kcf->sh->fallback[ctx->fallback], 1);
    }
}


/*
 * $kv_aware_ranking_NAME: the servers of upstream NAME for this request,
 * best first, each with the cost kv_aware weighs (lower is better), for a
 * balancer of one's own (balancer_by_lua) to choose among.  Read-only:
 * nothing is charged or learned, since kv_aware does not choose.
 */
ngx_int_t
ngx_http_kv_aware_ranking(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_str_t *out)
{
    u_char                         *p;
    double                          cost[KVA_MAX_SLOTS];
    ngx_uint_t                      i, j, k, n, dp, order[KVA_MAX_SLOTS];
    kva_why_e                       why;
    kva_clock_t                     clk;
    kva_candidate_t                 cand[KVA_MAX_SLOTS];
    ngx_http_kv_aware_ctx_t        *ctx;
    ngx_http_kv_aware_pick_t        picks[KVA_MAX_SLOTS];
    ngx_http_upstream_rr_peers_t   *peers;

    ctx = ngx_http_kv_aware_request_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ngx_http_kv_aware_hash_request(r, kcf, ctx);

    if (kcf->dynamic) {
        ngx_http_kv_aware_members_sync(kcf);
    }

    dp = kcf->data_parallel;
    peers = kcf->uscf->peer.data;

    ngx_http_upstream_rr_peers_rlock(peers);

    if (!ngx_http_kv_aware_members_current(kcf, peers)
        || peers->number > kcf->npeers)
    {
        ngx_http_upstream_rr_peers_unlock(peers);
        return NGX_DECLINED;
    }

    /* the servers a first try could take: not down, failed, or full */
    n = ngx_http_kv_aware_candidates(kcf, peers, 0, NULL, picks, ngx_time());

    if (n == 0) {
        ngx_http_upstream_rr_peers_unlock(peers);
        return NGX_DECLINED;
    }

    ngx_http_kv_aware_clock(kcf, &clk);

    ngx_shmtx_lock(&kcf->shpool->mutex);
    ngx_http_kv_aware_weigh_locked(kcf, ctx, picks, n, &clk, cand);
    ngx_shmtx_unlock(&kcf->shpool->mutex);

    /* the one kv_aware would pick first (ties broken alike), then by cost */
    order[0] = kva_score_costs(&kcf->score, cand, n, ctx->nblocks, 0, cost,
                               &why);

    for (i = 0, k = 1; i < n; i++) {
        if (i == order[0]) {
            continue;
        }

        for (j = k; j > 1 && cost[order[j - 1]] > cost[i]; j--) {
            order[j] = order[j - 1];
        }

        order[j] = i;
        k++;
    }

    out->data = ngx_pnalloc(r->pool, n * (NGX_SOCKADDR_STRLEN
                                          + sizeof(" #63 ,") + 32));
    if (out->data == NULL) {
        ngx_http_upstream_rr_peers_unlock(peers);
        return NGX_ERROR;
    }

    p = out->data;

    for (i = 0; i < n; i++) {
        k = order[i];

        p = ngx_sprintf(p, "%s%V", i ? "," : "",
                        &picks[k].peer->name);

        if (dp > 1) {
            p = ngx_sprintf(p, "#%ui", picks[k].rank);
        }

        p = ngx_sprintf(p, " %.3f", cost[k] < 1e15 ? cost[k] : 1e15);
    }

    out->len = p - out->data;

    ngx_http_upstream_rr_peers_unlock(peers);

    return NGX_OK;
}


/*
 * $kv_aware_dp_rank: the rank of the server a data-parallel upstream
 * chooses, which has to be known while the request to the server is
 * built, before the balancer runs.  So the choice is made here, among
 * the servers the first try may take, and the first try takes it.  A
 * retry chooses anew but the request keeps this rank: any rank is one
 * every server has.
 */
ngx_int_t
ngx_http_kv_aware_plan_rank(ngx_http_request_t *r, ngx_uint_t *rank)
{
    time_t                          now;
    ngx_uint_t                      n, best;
    ngx_http_upstream_t            *u;
    ngx_http_kv_aware_ctx_t        *ctx;
    ngx_http_kv_aware_pick_t        picks[KVA_MAX_SLOTS];
    ngx_http_upstream_srv_conf_t   *us;
    ngx_http_upstream_rr_peers_t   *peers;
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_kv_aware_peer_data_t  *kp;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);

    if (ctx && ctx->decided) {
        *rank = ctx->rank;
        return NGX_OK;
    }

    u = r->upstream;

    /* proxy_pass with variables has no upstream{} to read yet */
    if (u == NULL || u->conf == NULL || u->conf->upstream == NULL
        || u->peer.connection != NULL)
    {
        return NGX_DECLINED;
    }

    us = u->conf->upstream;
    kcf = ngx_http_conf_upstream_srv_conf(us, ngx_http_kv_aware_module);

    if (kcf->shm_zone == NULL || kcf->data_parallel < 2
        || us->peer.data == NULL)
    {
        return NGX_DECLINED;
    }

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

    n = ngx_http_kv_aware_candidates(kcf, peers, 0, kp->rrp.tried, picks,
                                     now);

    if (n == 0) {
        ngx_http_upstream_rr_peers_unlock(peers);
        return NGX_DECLINED;
    }

    best = ngx_http_kv_aware_choose(kp, picks, n, r->connection->log);

    kp->planned = picks[best].peer;
    kp->planned_rank = picks[best].rank;

    ngx_http_upstream_rr_peers_unlock(peers);

    *rank = ctx->rank;

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
    ngx_http_kv_aware_pick_t        picks[KVA_MAX_SLOTS];
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
     * 64 servers (ranks): round-robin's own choice for this try.
     */
    if (!ngx_http_kv_aware_members_current(kp->kcf, peers)
        || base + peers->number > kp->kcf->npeers)
    {
        ngx_http_upstream_rr_peers_unlock(peers);
        return ngx_http_kv_aware_round_robin(pc, kp);
    }

    n = ngx_http_kv_aware_candidates(kp->kcf, peers, base, rrp->tried, picks,
                                     now);

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
                      "slot (64 ranks in all; a server gone frees its "
                      "slots once its requests finish), routing by "
                      "round-robin", &kcf->upstream);
    }

    return ngx_http_upstream_get_round_robin_peer(pc, &kp->rrp);
}


/*
 * The servers (ranks) a try may take, those of tried aside (NULL: none
 * tried, for the ranking); the peers' lock is held.
 */
static ngx_uint_t
ngx_http_kv_aware_candidates(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_upstream_rr_peers_t *peers, ngx_uint_t base, uintptr_t *tried,
    ngx_http_kv_aware_pick_t *picks, time_t now)
{
    uintptr_t                     m;
    ngx_uint_t                    i, n, r, dp;
    ngx_http_upstream_rr_peer_t  *peer;

    dp = kcf->data_parallel;
    n = 0;

    for (peer = peers->peer, i = 0; peer; peer = peer->next, i++) {

        m = (uintptr_t) 1 << i % (8 * sizeof(uintptr_t));

        if (tried && (tried[i / (8 * sizeof(uintptr_t))] & m)) {
            continue;
        }

        if (peer->down) {
            continue;
        }

        if (peer->max_fails
            && peer->fails >= peer->max_fails
            && now - peer->checked <= peer->fail_timeout)
        {
            continue;
        }

        if (peer->max_conns && peer->conns >= peer->max_conns) {
            continue;
        }

        /* init_upstream allowed at most KVA_MAX_SLOTS of these */
        for (r = 0; r < dp; r++) {
            picks[n].peer = peer;
            picks[n].number = i;
            picks[n].slot = kcf->slot_of[(base + i) * dp + r];
            picks[n].rank = r;
            n++;
        }
    }

    return n;
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
 * Looks the prompt up for the candidates and fills cand[]: the blocks
 * each holds, its load.  Called with the zone's lock held, and returns
 * with it held; a long prompt lets it go between pieces.
 */
static void
ngx_http_kv_aware_weigh_locked(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_kv_aware_ctx_t *ctx, ngx_http_kv_aware_pick_t *picks,
    ngx_uint_t n, kva_clock_t *clk, kva_candidate_t *cand)
{
    uint32_t                   depth[KVA_MAX_SLOTS], nblocks, from, piece;
    uint64_t                   mask;
    ngx_int_t                  reqs, blocks;
    ngx_uint_t                 i, slot;
    ngx_http_kv_aware_slot_t  *sl;

    nblocks = ctx->nblocks;

    ngx_memzero(depth, sizeof(depth));

    mask = 0;

    for (i = 0; i < n; i++) {
        mask |= 1ULL << picks[i].slot;
    }

    /* the lookup too goes a piece per hold of the lock */
    for (from = 0; from < nblocks && mask; from = piece) {
        if (from) {
            ngx_shmtx_unlock(&kcf->shpool->mutex);
            ngx_shmtx_lock(&kcf->shpool->mutex);
        }

        piece = kva_index_match_part(kcf->sh->index, ctx->hashes, from,
                                     ngx_min(nblocks, from + KVA_ADD_CHUNK),
                                     &mask, clk, depth, ctx->found);
    }

    (void) kva_index_match_done(nblocks, from, mask, depth, ctx->found);

    for (i = 0; i < n; i++) {
        slot = picks[i].slot;
        sl = &kcf->sh->slots[slot];

        /* other workers update these without the lock: never below zero */
        reqs = (ngx_int_t) kcf->load[slot].reqs;
        blocks = (ngx_int_t) kcf->load[slot].blocks;

        /* a server's own figures also count other routers' requests */
        if (sl->ev_has_load && sl->ev_state != NGX_HTTP_KV_AWARE_EV_STALE
            && (ngx_int_t) (sl->ev_waiting + sl->ev_running) > reqs)
        {
            reqs = sl->ev_waiting + sl->ev_running;
        }

        cand[i].matched = depth[slot];
        cand[i].weight = picks[i].peer->weight;
        cand[i].inflight_reqs = reqs > 0 ? reqs : 0;
        cand[i].inflight_blocks = blocks > 0 ? blocks : 0;
        cand[i].routed = sl->routed;
        cand[i].fill = kva_fill_get(&sl->fill, ngx_current_msec,
                                    kcf->learned_ttl);
    }
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
    uint32_t                       nblocks, matched, from, piece;
    ngx_uint_t                     best, slot;
    kva_clock_t                    clk;
    kva_candidate_t                cand[KVA_MAX_SLOTS];
    ngx_http_kv_aware_ctx_t       *ctx;
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = kp->kcf;
    ctx = kp->ctx;
    nblocks = ctx->nblocks;

    ngx_http_kv_aware_clock(kcf, &clk);

    ngx_shmtx_lock(&kcf->shpool->mutex);

    ngx_http_kv_aware_weigh_locked(kcf, ctx, picks, n, &clk, cand);

    best = kva_score_pick(&kcf->score, cand, n, nblocks,
                          (uint32_t) ngx_random(), &ctx->why);
    slot = picks[best].slot;
    matched = cand[best].matched;

    /* what the server is about to compute, it will cache */
    kva_fill_add(&kcf->sh->slots[slot].fill, ngx_current_msec,
                 kcf->learned_ttl, nblocks - matched);

    /*
     * Learned bits serve while the server's events cannot be trusted;
     * speculative ones bridge the time until its events confirm.  A long
     * new prompt evicts an entry a block: it is recorded a piece per hold
     * of the lock, so that other requests wait for one piece at most.
     */
    ngx_http_kv_aware_learn_budget(kcf, slot, &clk);

    for (from = 0; from < nblocks; from += piece) {
        if (from) {
            ngx_shmtx_unlock(&kcf->shpool->mutex);
            ngx_shmtx_lock(&kcf->shpool->mutex);
        }

        piece = ngx_min(nblocks - from, KVA_ADD_CHUNK);

        kva_index_add_found(kcf->sh->index, ctx->hashes + from, piece, slot,
                            (clk.precise & (1ULL << slot))
                            ? KVA_BIT_LEARNED | KVA_BIT_SPEC
                            : KVA_BIT_LEARNED,
                            &clk, ctx->found + from);
    }

    /* what the other instances do not know yet, of a server that is silent */
    if (kcf->events && kcf->events->share && matched < nblocks
        && !(clk.precise & (1ULL << slot)))
    {
        ngx_http_kv_aware_share_queue(kcf, slot, ctx->hashes + matched,
                                      nblocks - matched);
    }

    ngx_shmtx_unlock(&kcf->shpool->mutex);

    kp->slot = slot;
    kp->charged = &kcf->load[slot];
    kp->charged_blocks = nblocks - matched;

    (void) ngx_atomic_fetch_add(&kp->charged->reqs, 1);
    (void) ngx_atomic_fetch_add(&kp->charged->blocks, kp->charged_blocks);
    (void) ngx_atomic_fetch_add(&kcf->sh->slots[slot].routed, 1);
    (void) ngx_atomic_fetch_add(&kcf->sh->slots[slot].blocks, nblocks);
    (void) ngx_atomic_fetch_add(&kcf->sh->slots[slot].matched, matched);
    (void) ngx_atomic_fetch_add(&kcf->sh->chosen[ctx->why], 1);

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
