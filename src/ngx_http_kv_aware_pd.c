/*
 * ngx_http_kv_aware_module: the decision of disaggregated serving, made
 * for kv_aware_prefill when $kv_aware_prefill_addr or $kv_aware_pd is
 * first read, which is while the request to the decode server is built
 * (proxy_set_header), before the balancer runs:
 *
 *   1. the decode server is chosen first, by its load and the prefix it
 *      holds, as the balancer chooses (ngx_http_kv_aware_balancer_plan();
 *      the first try takes it);
 *   2. the tokens it lacks are counted: the prompt's blocks less those it
 *      holds, in tokens (block_tokens each with keys=tokens; with text
 *      keys, block_size bytes at about 4 bytes a token);
 *   3. fewer than min_uncached: aggregated, the decode server computes
 *      them itself (short: the whole prompt is under min_uncached;
 *      cached: the decode server holds the rest);
 *   4. else a prefill server is chosen in the prefill upstream by the
 *      prefix it holds and its load, the uncached blocks it is computing
 *      (tokens, not requests: that is a prefill server's work), with the
 *      same core scoring; it is charged, and credited with the prompt's
 *      blocks, as the balancer does for the servers it chooses.
 *
 * In mode=header nginx never sees the prefill leg: the decode server's
 * sidecar runs it before it sends the decode leg.  So the decode server's
 * response header means the prefill is over; the load is given back
 * then, or when the request ends, whichever comes first.
 *
 * mode=vllm decides earlier, before its leg 1 (ngx_http_kv_aware_pd_vllm.c),
 * when no request to the decode server exists yet: step 1 reads what the
 * server the balancer would choose holds, without choosing it.  So does
 * mode=sglang (ngx_http_kv_aware_pd_sglang.c), whose body both legs get.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_members.h"
#include "ngx_http_kv_aware_ranking.h"
#include "ngx_http_kv_aware_balancer.h"
#include "ngx_http_kv_aware_pd.h"


/* text keys: tokens are counted at about this many bytes each */
#define NGX_HTTP_KV_AWARE_PD_TEXT_BYTES  4


static ngx_http_kv_aware_pd_e ngx_http_kv_aware_pd_outcome(
    ngx_http_request_t *r, ngx_http_kv_aware_pd_conf_t *pcf,
    ngx_http_kv_aware_pd_ctx_t *pctx, ngx_int_t planned, uint32_t matched);
static ngx_int_t ngx_http_kv_aware_pd_estimate(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx,
    uint32_t *matched);
static ngx_int_t ngx_http_kv_aware_pd_prefill(ngx_http_request_t *r,
    ngx_http_kv_aware_pd_conf_t *pcf, ngx_http_kv_aware_ctx_t *ctx,
    ngx_http_kv_aware_pd_ctx_t *pctx, uint64_t *tokens);
static void ngx_http_kv_aware_pd_cleanup(void *data);
static ngx_int_t ngx_http_kv_aware_pd_header_filter(ngx_http_request_t *r);


const char  *ngx_http_kv_aware_pd_keys[] = {
    NGX_HTTP_KV_AWARE_PD_OUTCOMES(NGX_HTTP_KV_AWARE_KEY3)
};

const char  *ngx_http_kv_aware_pd_texts[] = {
    NGX_HTTP_KV_AWARE_PD_OUTCOMES(NGX_HTTP_KV_AWARE_TEXT3)
};


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;


ngx_int_t
ngx_http_kv_aware_pd_init_filter(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_kv_aware_pd_header_filter;

    return NGX_OK;
}


ngx_int_t
ngx_http_kv_aware_pd_decide(ngx_http_request_t *r,
    ngx_http_kv_aware_pd_e *outcome, ngx_str_t *addr)
{
    ngx_int_t                      planned;
    ngx_http_upstream_t           *u;
    ngx_http_kv_aware_ctx_t       *ctx;
    ngx_http_kv_aware_pd_ctx_t    *pctx;
    ngx_http_kv_aware_pd_conf_t   *pcf;

    pctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_pd_module);

    if (pctx && pctx->decided) {
        *outcome = pctx->outcome;
        *addr = pctx->addr;
        return NGX_OK;
    }

    pcf = ngx_http_get_module_loc_conf(r, ngx_http_kv_aware_pd_module);
    u = r->upstream;

    /*
     * Only while the request to the decode upstream is built: read later
     * (an access log of a request that never asked), there is nothing to
     * decide any more.  mode=vllm decided before, or not at all.
     */
    if (pcf->decode == NULL || pcf->mode != NGX_HTTP_KV_AWARE_PD_HEADER
        || u == NULL || u->conf == NULL
        || u->conf->upstream != pcf->decode->uscf
        || u->peer.connection != NULL
        || (r->upstream_states && r->upstream_states->nelts))
    {
        return NGX_DECLINED;
    }

    pctx = ngx_http_kv_aware_pd_request_ctx(r);
    if (pctx == NULL) {
        return NGX_ERROR;
    }

    planned = ngx_http_kv_aware_balancer_plan(r);

    if (planned == NGX_ERROR) {
        return NGX_ERROR;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);

    pctx->outcome = ngx_http_kv_aware_pd_outcome(r, pcf, pctx,
                        (planned == NGX_OK && ctx && ctx->decided)
                        ? NGX_OK : NGX_DECLINED,
                        ctx ? ctx->matched : 0);

    if (pctx->outcome == NGX_HTTP_KV_AWARE_PD_LAST) {
        return NGX_ERROR;
    }

    pctx->decided = 1;

    ngx_http_kv_aware_pd_count(pcf, pctx);

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "kv_aware: %s, prefill \"%V\", %uL tokens",
                   ngx_http_kv_aware_pd_texts[pctx->outcome], &pctx->addr,
                   pctx->tokens);

    *outcome = pctx->outcome;
    *addr = pctx->addr;

    return NGX_OK;
}


/*
 * mode=vllm, before the content phase: the decode server is not chosen
 * yet (the balancer chooses it once leg 1 is over, by the load then), so
 * what it holds is what the server the balancer would choose now holds.
 */
ngx_http_kv_aware_pd_ctx_t *
ngx_http_kv_aware_pd_decide_early(ngx_http_request_t *r,
    ngx_http_kv_aware_pd_conf_t *pcf)
{
    uint32_t                      matched;
    ngx_int_t                     rc;
    ngx_http_kv_aware_ctx_t      *ctx;
    ngx_http_kv_aware_pd_ctx_t   *pctx;

    pctx = ngx_http_kv_aware_pd_request_ctx(r);
    ctx = ngx_http_kv_aware_module_request_ctx(r);

    if (pctx == NULL || ctx == NULL) {
        return NULL;
    }

    matched = 0;
    rc = ngx_http_kv_aware_pd_estimate(r, pcf->decode, ctx, &matched);

    pctx->outcome = ngx_http_kv_aware_pd_outcome(r, pcf, pctx, rc, matched);

    if (pctx->outcome == NGX_HTTP_KV_AWARE_PD_LAST) {
        return NULL;
    }

    pctx->decided = 1;

    /* a split is counted once its leg 1 says how it went */
    if (pctx->outcome != NGX_HTTP_KV_AWARE_PD_SPLIT) {
        ngx_http_kv_aware_pd_count(pcf, pctx);
    }

    return pctx;
}


void
ngx_http_kv_aware_pd_count(ngx_http_kv_aware_pd_conf_t *pcf,
    ngx_http_kv_aware_pd_ctx_t *pctx)
{
    ngx_http_kv_aware_shctx_t  *sh;

    sh = pcf->decode->sh;

    (void) ngx_atomic_fetch_add(&sh->pd.decided[pctx->outcome], 1);

    if (pctx->outcome == NGX_HTTP_KV_AWARE_PD_SPLIT) {
        (void) ngx_atomic_fetch_add(&sh->pd.prefill_tokens, pctx->tokens);
    }
}


ngx_http_kv_aware_pd_ctx_t *
ngx_http_kv_aware_pd_request_ctx(ngx_http_request_t *r)
{
    ngx_http_kv_aware_pd_ctx_t  *pctx;

    pctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_pd_module);

    if (pctx == NULL) {
        pctx = ngx_pcalloc(r->pool, sizeof(ngx_http_kv_aware_pd_ctx_t));
        if (pctx == NULL) {
            return NULL;
        }

        ngx_http_set_ctx(r, pctx, ngx_http_kv_aware_pd_module);
    }

    return pctx;
}


/* NGX_HTTP_KV_AWARE_PD_LAST: an error */
static ngx_http_kv_aware_pd_e
ngx_http_kv_aware_pd_outcome(ngx_http_request_t *r,
    ngx_http_kv_aware_pd_conf_t *pcf, ngx_http_kv_aware_pd_ctx_t *pctx,
    ngx_int_t planned, uint32_t matched)
{
    uint64_t                       per_block, prompt, uncached;
    ngx_int_t                      rc;
    ngx_http_kv_aware_ctx_t       *ctx;
    ngx_http_kv_aware_srv_conf_t  *kcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);

    if (planned != NGX_OK || ctx == NULL) {
        return NGX_HTTP_KV_AWARE_PD_NO_DECODE;
    }

    /* keys=tokens without ids still has the text keys to count */
    if (ctx->fallback != NGX_HTTP_KV_AWARE_ROUTED
        && ctx->fallback != NGX_HTTP_KV_AWARE_NO_TOKENS)
    {
        return NGX_HTTP_KV_AWARE_PD_NO_PROMPT;
    }

    kcf = pcf->decode;

    if (kcf->keys == NGX_HTTP_KV_AWARE_KEYS_TOKENS
        && ctx->fallback == NGX_HTTP_KV_AWARE_ROUTED)
    {
        per_block = kcf->block_tokens;

    } else {
        per_block = kcf->block_size / NGX_HTTP_KV_AWARE_PD_TEXT_BYTES;
    }

    prompt = (uint64_t) ctx->nblocks * per_block;
    uncached = (uint64_t) (ctx->nblocks - matched) * per_block;

    if (uncached < pcf->min_uncached) {
        return (prompt < pcf->min_uncached) ? NGX_HTTP_KV_AWARE_PD_SHORT
                                            : NGX_HTTP_KV_AWARE_PD_CACHED;
    }

    rc = ngx_http_kv_aware_pd_prefill(r, pcf, ctx, pctx, &pctx->tokens);

    if (rc == NGX_ERROR) {
        return NGX_HTTP_KV_AWARE_PD_LAST;
    }

    if (rc == NGX_DECLINED) {
        return NGX_HTTP_KV_AWARE_PD_NO_PREFILL;
    }

    pctx->tokens *= per_block;

    return NGX_HTTP_KV_AWARE_PD_SPLIT;
}


/*
 * The blocks of the prompt the decode server the balancer would choose
 * now holds, read without choosing (as $kv_aware_ranking_NAME reads);
 * NGX_DECLINED: no server to choose.
 */
static ngx_int_t
ngx_http_kv_aware_pd_estimate(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx,
    uint32_t *matched)
{
    ngx_uint_t                      n, best;
    kva_why_e                       why;
    kva_clock_t                     clk;
    kva_candidate_t                *cand;
    ngx_http_kv_aware_pick_t       *picks;
    ngx_http_upstream_rr_peers_t   *peers;

    /* counted once: the balancer finds the keys made */
    ngx_http_kv_aware_ranking_hash(r, kcf, ctx);

    if (kcf->dynamic) {
        ngx_http_kv_aware_members_sync(kcf);
    }

    peers = kcf->uscf->peer.data;

    ngx_http_upstream_rr_peers_rlock(peers);

    if (!ngx_http_kv_aware_members_current(kcf, peers)
        || peers->number > kcf->npeers)
    {
        ngx_http_upstream_rr_peers_unlock(peers);
        return NGX_DECLINED;
    }

    /* members_current() saw the scratch arrays */
    picks = kcf->scratch->picks;
    cand = kcf->scratch->cand;

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

    ngx_http_upstream_rr_peers_unlock(peers);

    best = kva_score_costs(&kcf->score, cand, n, ctx->nblocks, 0,
                           kcf->scratch->cost, &why);
    *matched = cand[best].matched;

    return NGX_OK;
}


/*
 * The prefill server, among those of the prefill upstream's primary list
 * a request could take now; NGX_DECLINED: none.  tokens: the blocks it
 * is to compute.
 */
static ngx_int_t
ngx_http_kv_aware_pd_prefill(ngx_http_request_t *r,
    ngx_http_kv_aware_pd_conf_t *pcf, ngx_http_kv_aware_ctx_t *ctx,
    ngx_http_kv_aware_pd_ctx_t *pctx, uint64_t *tokens)
{
    uint32_t                        matched;
    ngx_uint_t                      i, n, best, slot;
    kva_why_e                       why;
    kva_clock_t                     clk;
    kva_candidate_t                *cand;
    ngx_pool_cleanup_t             *cln;
    ngx_http_kv_aware_pick_t       *picks;
    ngx_http_upstream_rr_peers_t   *peers;
    ngx_http_kv_aware_srv_conf_t   *kcf;

    kcf = pcf->prefill;
    peers = kcf->uscf->peer.data;

    /* made first: nothing is charged that could not be given back */
    cln = ngx_pool_cleanup_add(r->pool, 0);
    pctx->addr.data = ngx_pnalloc(r->pool, NGX_HTTP_KV_AWARE_NAME_LEN);

    if (cln == NULL || pctx->addr.data == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_kv_aware_pd_cleanup;
    cln->data = pctx;

    if (kcf->dynamic) {
        ngx_http_kv_aware_members_sync(kcf);
    }

    ngx_http_upstream_rr_peers_rlock(peers);

    if (!ngx_http_kv_aware_members_current(kcf, peers)
        || peers->number > kcf->npeers)
    {
        ngx_http_upstream_rr_peers_unlock(peers);
        return NGX_DECLINED;
    }

    /* members_current() saw the scratch arrays */
    picks = kcf->scratch->picks;
    cand = kcf->scratch->cand;

    /* not down, failed (max_fails) or full (max_conns) */
    n = ngx_http_kv_aware_ranking_candidates(kcf, peers, 0, NULL, picks,
                                             ngx_time());

    if (n == 0) {
        ngx_http_upstream_rr_peers_unlock(peers);
        return NGX_DECLINED;
    }

    ngx_http_kv_aware_zone_clock(kcf, &clk);

    ngx_shmtx_lock(&kcf->shpool->mutex);

    ngx_http_kv_aware_ranking_weigh_locked(kcf, ctx, picks, n, &clk, cand);

    /* a prefill server's load is the tokens it computes, not requests */
    for (i = 0; i < n; i++) {
        cand[i].inflight_reqs = 0;
    }

    best = kva_score_costs(&kcf->score, cand, n, ctx->nblocks,
                           (uint32_t) ngx_random(), kcf->scratch->cost, &why);
    slot = picks[best].slot;
    matched = cand[best].matched;

    ngx_http_kv_aware_balancer_learn_locked(kcf, ctx, slot, matched, &clk);

    ngx_shmtx_unlock(&kcf->shpool->mutex);

    pctx->addr.len = ngx_min(picks[best].peer->name.len,
                             NGX_HTTP_KV_AWARE_NAME_LEN);
    ngx_memcpy(pctx->addr.data, picks[best].peer->name.data, pctx->addr.len);

    ngx_http_upstream_rr_peers_unlock(peers);

    pctx->charged = &kcf->load[slot];
    pctx->charged_blocks = ctx->nblocks - matched;

    (void) ngx_atomic_fetch_add(&pctx->charged->reqs, 1);
    (void) ngx_atomic_fetch_add(&pctx->charged->blocks, pctx->charged_blocks);

    (void) ngx_atomic_fetch_add(&kcf->sh->routing.requests, 1);
    (void) ngx_atomic_fetch_add(&kcf->sh->routing.chosen[why], 1);
    (void) ngx_atomic_fetch_add(&kcf->sh->slots[slot].routing.routed, 1);
    (void) ngx_atomic_fetch_add(&kcf->sh->slots[slot].routing.blocks,
                                ctx->nblocks);
    (void) ngx_atomic_fetch_add(&kcf->sh->slots[slot].routing.matched,
                                matched);

    *tokens = pctx->charged_blocks;

    return NGX_OK;
}


void
ngx_http_kv_aware_pd_release(ngx_http_request_t *r)
{
    ngx_http_kv_aware_pd_ctx_t  *pctx;

    pctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_pd_module);

    if (pctx) {
        ngx_http_kv_aware_pd_give_back(pctx);
    }
}


static void
ngx_http_kv_aware_pd_cleanup(void *data)
{
    ngx_http_kv_aware_pd_give_back(data);
}


void
ngx_http_kv_aware_pd_give_back(ngx_http_kv_aware_pd_ctx_t *pctx)
{
    if (pctx->charged == NULL) {
        return;
    }

    (void) ngx_atomic_fetch_add(&pctx->charged->reqs, -1);
    (void) ngx_atomic_fetch_add(&pctx->charged->blocks,
                                -(ngx_atomic_int_t) pctx->charged_blocks);
    pctx->charged = NULL;
}


/*
 * The decode server answered: its sidecar's prefill leg is over.  Not so
 * in mode=sglang, whose prefill leg runs beside the decode leg and gives
 * the load back when it ends.
 */
static ngx_int_t
ngx_http_kv_aware_pd_header_filter(ngx_http_request_t *r)
{
    ngx_http_kv_aware_pd_conf_t  *pcf;

    pcf = ngx_http_get_module_loc_conf(r, ngx_http_kv_aware_pd_module);

    if (r == r->main && pcf->mode != NGX_HTTP_KV_AWARE_PD_SGLANG) {
        ngx_http_kv_aware_pd_release(r);
    }

    return ngx_http_next_header_filter(r);
}


ngx_chain_t *
ngx_http_kv_aware_pd_body_chain(ngx_http_request_t *r, u_char *data,
    size_t len)
{
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    b = ngx_calloc_buf(r->pool);
    cl = ngx_alloc_chain_link(r->pool);

    if (b == NULL || cl == NULL) {
        return NULL;
    }

    b->pos = data;
    b->last = data + len;
    b->start = data;
    b->end = data + len;
    b->memory = 1;
    b->last_buf = 1;
    b->last_in_chain = 1;

    cl->buf = b;
    cl->next = NULL;

    return cl;
}


ngx_uint_t
ngx_http_kv_aware_pd_warn_due(ngx_http_kv_aware_pd_conf_t *pcf)
{
    if (pcf->logged
        && ngx_current_msec - pcf->logged < NGX_HTTP_KV_AWARE_PD_LOG)
    {
        return 0;
    }

    pcf->logged = ngx_current_msec;

    return 1;
}
