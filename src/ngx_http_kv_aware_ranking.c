/*
 * ngx_http_kv_aware_module: the candidates of a choice and what each
 * weighs, for the balancer and for $kv_aware_ranking_NAME.
 *
 * A choice is among the servers (ranks) a try may take; each weighs the
 * blocks of the prompt it holds, by the index, and its load.  The
 * balancer scores them to pick one (ngx_http_kv_aware_balancer.c); the
 * ranking variable orders them all by the same costs.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_prompt.h"
#include "ngx_http_kv_aware_members.h"
#include "ngx_http_kv_aware_ranking.h"



static void ngx_http_kv_aware_ranking_ttft_locked(
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx,
    ngx_http_kv_aware_pick_t *picks, ngx_uint_t n, kva_candidate_t *cand);

/* the prompt's keys, once a request (counted then) */
void
ngx_http_kv_aware_ranking_hash(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx)
{
    /* the context may come from kv_aware_tokenize, with the ids */
    if (ctx->hashed) {
        return;
    }

    ctx->hashed = 1;

    /* a prompt we cannot read only costs the request its affinity */
    (void) ngx_http_kv_aware_prompt_hashes(r, kcf, ctx);

    (void) ngx_atomic_fetch_add(&kcf->sh->routing.requests, 1);

    if (ctx->ids) {
        (void) ngx_atomic_fetch_add(&kcf->sh->routing.tokenized, 1);
    }

    if (ctx->fallback != NGX_HTTP_KV_AWARE_ROUTED) {
        (void) ngx_atomic_fetch_add(&kcf->sh->routing.fallbacks, 1);
        (void) ngx_atomic_fetch_add(
                               &kcf->sh->routing.fallback[ctx->fallback], 1);
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
    double                         *cost;
    ngx_uint_t                      i, j, k, n, dp;
    ngx_uint_t                      order[NGX_HTTP_KV_AWARE_RANKING_TOP];
    kva_why_e                       why;
    kva_clock_t                     clk;
    kva_candidate_t                *cand;
    ngx_http_kv_aware_ctx_t        *ctx;
    ngx_http_kv_aware_pick_t       *picks;
    ngx_http_upstream_rr_peers_t   *peers;

    ctx = ngx_http_kv_aware_module_request_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ngx_http_kv_aware_ranking_hash(r, kcf, ctx);

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

    /* members_current() saw the scratch arrays */
    cost = kcf->scratch->cost;
    cand = kcf->scratch->cand;
    picks = kcf->scratch->picks;

    /* the servers a first try could take: not down, failed, or full */
    n = ngx_http_kv_aware_ranking_candidates(kcf, peers, 0, NULL, picks,
                                             ngx_time());

    if (n == 0) {
        ngx_http_upstream_rr_peers_unlock(peers);
        return NGX_DECLINED;
    }

    ngx_http_kv_aware_zone_clock(kcf, &clk);

    ngx_shmtx_lock(&kcf->shpool->mutex);
    ngx_http_kv_aware_ranking_weigh_locked(kcf, ctx, picks, n, &clk, cand);
    ngx_shmtx_unlock(&kcf->shpool->mutex);

    /* the one kv_aware would pick first (ties broken alike), then by cost */
    order[0] = kva_score_costs(&kcf->score, cand, n, ctx->nblocks, 0, cost,
                               &why);

    /*
     * The first NGX_HTTP_KV_AWARE_RANKING_TOP only, by a bounded insertion:
     * O(C x top) at worst, where sorting all of 1,024 candidates was
     * O(C^2) and a value of 30 KB.
     */
    for (i = 0, k = 1; i < n; i++) {
        if (i == order[0]
            || (k == NGX_HTTP_KV_AWARE_RANKING_TOP
                && cost[order[k - 1]] <= cost[i]))
        {
            continue;
        }

        j = (k < NGX_HTTP_KV_AWARE_RANKING_TOP) ? k++ : k - 1;

        for ( /* void */ ; j > 1 && cost[order[j - 1]] > cost[i]; j--) {
            order[j] = order[j - 1];
        }

        order[j] = i;
    }

    n = k;

    out->data = ngx_pnalloc(r->pool, n * (NGX_SOCKADDR_STRLEN
                                          + sizeof(" #1023 ,") + 32));
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
 * The servers (ranks) a try may take, those of tried aside (NULL: none
 * tried, for the ranking); the peers' lock is held.
 */
ngx_uint_t
ngx_http_kv_aware_ranking_candidates(ngx_http_kv_aware_srv_conf_t *kcf,
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
 * Looks the prompt up for the candidates and fills cand[]: the blocks
 * each holds, its load.  Called with the zone's lock held, and returns
 * with it held; a long prompt lets it go between pieces.
 */
void
ngx_http_kv_aware_ranking_weigh_locked(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_kv_aware_ctx_t *ctx, ngx_http_kv_aware_pick_t *picks,
    ngx_uint_t n, kva_clock_t *clk, kva_candidate_t *cand)
{
    uint32_t                  *depth, nblocks, from, piece;
    ngx_int_t                  reqs, blocks;
    ngx_uint_t                 i, slot;
    kva_slotset_t              mask;
    kva_tier_count_t          *tiers;
    ngx_http_kv_aware_slot_t  *sl;

    /* by slot: the scratch holds the upstream's highest (scratch.c) */
    depth = kcf->scratch->depth;
    tiers = kcf->scratch->tiers;
    nblocks = ctx->nblocks;

    kva_slotset_zero(&mask);

    /* the lookup sets the depth of the candidates only: O(C), not O(slots) */
    for (i = 0; i < n; i++) {
        kva_slotset_add(&mask, picks[i].slot);
        depth[picks[i].slot] = 0;
        ngx_memzero(&tiers[picks[i].slot], sizeof(kva_tier_count_t));
    }

    /* the lookup too goes a piece per hold of the lock */
    for (from = 0; from < nblocks && !kva_slotset_empty(&mask);
         from = piece)
    {
        if (from) {
            /* not handed over: the peers lock may be held (zone.c) */
            ngx_shmtx_unlock(&kcf->shpool->mutex);
            ngx_shmtx_lock(&kcf->shpool->mutex);
        }

        piece = kva_index_match_part(kcf->sh->index, ctx->hashes, from,
                                     ngx_min(nblocks, from + KVA_ADD_CHUNK),
                                     &mask, clk, depth, ctx->found, tiers);
    }

    (void) kva_index_match_done(nblocks, from, &mask, depth, ctx->found);

    for (i = 0; i < n; i++) {
        slot = picks[i].slot;
        sl = &kcf->sh->slots[slot];

        /* other workers update these without the lock: never below zero */
        reqs = (ngx_int_t) kcf->load[slot].reqs;
        blocks = (ngx_int_t) kcf->load[slot].blocks;

        /* a server's own figures also count other routers' requests */
        if (sl->ev.has_load && sl->ev.state != NGX_HTTP_KV_AWARE_EV_STALE
            && (ngx_int_t) (sl->ev.waiting + sl->ev.running) > reqs)
        {
            reqs = sl->ev.waiting + sl->ev.running;
        }

        cand[i].matched = depth[slot];
        cand[i].slow = kva_score_slow(&kcf->score, tiers[slot].n);
        cand[i].weight = picks[i].peer->weight;
        cand[i].inflight_reqs = reqs > 0 ? reqs : 0;
        cand[i].inflight_blocks = blocks > 0 ? blocks : 0;
        cand[i].routed = sl->routing.routed;
        cand[i].fill = kva_fill_get(&sl->routing.fill, ngx_current_msec,
                                    kcf->learned_ttl);
    }

    ngx_http_kv_aware_ranking_ttft_locked(kcf, ctx, picks, n, cand);
}


/*
 * Each candidate's speed (its prefill rate over the pool's median, which
 * cost=ttft divides its cost by; kva_ttft_speed()) and predicted time to
 * first token: its queue and the request's uncached blocks at its rate (a
 * block in a slower tier as its share of a miss), the pool's rate
 * for a server not learned yet (ngx_http_kv_aware_ttft.c learns them).
 */
static void
ngx_http_kv_aware_ranking_ttft_locked(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_kv_aware_ctx_t *ctx, ngx_http_kv_aware_pick_t *picks,
    ngx_uint_t n, kva_candidate_t *cand)
{
    double                          pool, rate, *rates;
    ngx_int_t                       queued;
    ngx_uint_t                      i, k;
    ngx_http_kv_aware_ttft_slot_t  *t;

    rates = kcf->scratch->rates;
    k = 0;

    for (i = 0; i < n; i++) {
        t = &kcf->sh->slots[picks[i].slot].ttft;

        if (kva_ttft_learned(&t->est)) {
            rates[k++] = t->est.rate;
        }
    }

    pool = kva_ttft_pool(rates, k, kcf->ttft_rate);

    for (i = 0; i < n; i++) {
        t = &kcf->sh->slots[picks[i].slot].ttft;

        /* other workers update it without the lock: never below zero */
        queued = (ngx_int_t) t->queued;

        rate = kva_ttft_rate(&t->est, pool);

        cand[i].speed = kva_ttft_speed(rate, pool);
        cand[i].ttft = kva_ttft_predict(queued > 0 ? queued : 0,
                                        ctx->nblocks - cand[i].matched
                                        + cand[i].slow, rate);
    }
}
