/*
 * ngx_http_kv_aware_module: placement by predicted time to first token.
 *
 * Each server (rank) prefills at its own rate.  When a try is routed, the
 * uncached blocks it brings are added to the server's queue (blocks
 * routed there whose answer has not begun); when the answer's first
 * bytes pass the body filter, they leave it, and the time since the
 * server's previous first bytes (or since the try began, if later)
 * teaches the server's rate: the blocks of the answers of one step over
 * that time, as kva_ttft_answer() averages it.  Not the header's
 * time: vLLM and SGLang stream through Starlette's StreamingResponse, and
 * uvicorn writes its headers before the first chunk exists, so their
 * header comes before the prefill (kvsim --early-headers does the same).
 * The first chunk comes after it (vLLM's role delta waits for the first
 * output).  With proxy_buffering on, nginx may hold that chunk back, and
 * every server then looks as much slower.  An answer that is not a 2xx
 * event stream teaches nothing (an error comes at once, a whole answer
 * after its decode).
 *
 * ngx_http_kv_aware_ranking.c predicts each candidate's time to first
 * token from it, (its queue + this request's uncached blocks) / its rate,
 * and cost=ttft divides the usual cost by the server's rate over the
 * pool's (kva_score.h).  Blocks, not tokens: the rate is in the index's
 * blocks, whatever keys= makes of them.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_conf.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_ttft.h"

#include "kva_ttft.h"


static ngx_int_t ngx_http_kv_aware_ttft_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_kv_aware_ttft_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static void ngx_http_kv_aware_ttft_qualify(ngx_http_request_t *r,
    ngx_http_kv_aware_ctx_t *ctx);
static void ngx_http_kv_aware_ttft_observe(ngx_http_request_t *r,
    ngx_http_kv_aware_ctx_t *ctx);
static ngx_uint_t ngx_http_kv_aware_ttft_streamed(ngx_http_upstream_t *u);


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


ngx_int_t
ngx_http_kv_aware_ttft_init(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_kv_aware_ttft_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_kv_aware_ttft_body_filter;

    return NGX_OK;
}


char *
ngx_http_kv_aware_ttft_conf_cost(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf)
{
    unsigned  *cp;

    cp = (unsigned *) ((u_char *) conf + p->offset);

    if (value->len == 4 && ngx_strncmp(value->data, "load", 4) == 0) {
        *cp = KVA_COST_LOAD;
        return NGX_CONF_OK;
    }

    if (value->len == 4 && ngx_strncmp(value->data, "ttft", 4) == 0) {
        *cp = KVA_COST_TTFT;
        return NGX_CONF_OK;
    }

    return "load or ttft";
}


void
ngx_http_kv_aware_ttft_charge_locked(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_kv_aware_ctx_t *ctx, ngx_uint_t slot, const kva_candidate_t *c,
    uint32_t nblocks)
{
    double                          work, predicted;
    uint32_t                        own;
    ngx_int_t                       queued;
    ngx_http_kv_aware_ttft_slot_t  *t;

    t = &kcf->sh->slots[slot].ttft;
    own = nblocks - c->matched + (uint32_t) (c->slow + 0.5);
    predicted = c->ttft;

    queued = (ngx_int_t) ngx_atomic_fetch_add(&t->queued, own);

    ctx->ttft_kcf = kcf;
    ctx->ttft_slot = slot;
    ctx->ttft_own = own;

    /* the rate it was predicted by: a first sample is clipped to it */
    work = (queued > 0 ? queued : 0) + own;
    ctx->ttft_rate = (predicted > 0.0 && work > 0.0)
                     ? work * 1000.0 / predicted
                     : (kcf->ttft_rate > 0.0) ? kcf->ttft_rate
                     : KVA_TTFT_RATE_DEFAULT;

    t->predicted_ms = (ngx_uint_t) (predicted + 0.5);
}


void
ngx_http_kv_aware_ttft_release(ngx_http_kv_aware_ctx_t *ctx)
{
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = ctx->ttft_kcf;

    if (kcf == NULL) {
        return;
    }

    ctx->ttft_kcf = NULL;
    ctx->ttft_body = 0;

    (void) ngx_atomic_fetch_add(&kcf->sh->slots[ctx->ttft_slot].ttft.queued,
                                -(ngx_atomic_int_t) ctx->ttft_own);
}


static ngx_int_t
ngx_http_kv_aware_ttft_header_filter(ngx_http_request_t *r)
{
    ngx_http_kv_aware_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);

    if (ctx && ctx->ttft_kcf) {
        ngx_http_kv_aware_ttft_qualify(r, ctx);
    }

    return ngx_http_next_header_filter(r);
}


static ngx_int_t
ngx_http_kv_aware_ttft_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_chain_t              *cl;
    ngx_http_kv_aware_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);

    if (ctx && ctx->ttft_kcf && ctx->ttft_body) {
        for (cl = in; cl; cl = cl->next) {
            if (ngx_buf_size(cl->buf) > 0) {
                ngx_http_kv_aware_ttft_observe(r, ctx);
                break;
            }
        }
    }

    return ngx_http_next_body_filter(r, in);
}


/*
 * The header: an answer that can teach waits for its first bytes, any
 * other leaves the queue now.  An error comes at once and a whole answer
 * after its decode: neither is a time to first token.  An answer without
 * work of its own still waits: its first bytes end the time the next
 * answer's work is measured from.
 */
static void
ngx_http_kv_aware_ttft_qualify(ngx_http_request_t *r,
    ngx_http_kv_aware_ctx_t *ctx)
{
    ngx_uint_t                      status;
    ngx_http_upstream_t            *u;
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_kv_aware_ttft_slot_t  *t;

    kcf = ctx->ttft_kcf;
    t = &kcf->sh->slots[ctx->ttft_slot].ttft;
    u = r->upstream;

    status = u ? u->headers_in.status_n : 0;

    if (u == NULL || status < 200 || status > 299
        || !ngx_http_kv_aware_ttft_streamed(u))
    {
        (void) ngx_atomic_fetch_add(&t->ignored, 1);

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "kv_aware: ttft: answer %ui not learned", status);

        ngx_http_kv_aware_ttft_release(ctx);
        return;
    }

    ctx->ttft_body = 1;
}


/*
 * The answer's first bytes: its blocks leave the queue and teach the
 * server's rate at once, with the other answers of the server's step
 * (kva_ttft_answer()).
 */
static void
ngx_http_kv_aware_ttft_observe(ngx_http_request_t *r,
    ngx_http_kv_aware_ctx_t *ctx)
{
    ngx_int_t                       learned;
    ngx_msec_t                      start;
    ngx_http_upstream_t            *u;
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_kv_aware_ttft_slot_t  *t;

    kcf = ctx->ttft_kcf;
    t = &kcf->sh->slots[ctx->ttft_slot].ttft;
    u = r->upstream;

    start = (u != NULL) ? u->start_time : ngx_current_msec;

    ngx_shmtx_lock(&kcf->shpool->mutex);

    learned = kva_ttft_answer(&t->est, ctx->ttft_own, start,
                              ngx_current_msec, ctx->ttft_rate);

    if (learned) {
        t->rate = (ngx_uint_t) (t->est.rate + 0.5);
    }

    t->observed_ms = ngx_current_msec - start;

    ngx_shmtx_unlock(&kcf->shpool->mutex);

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "kv_aware: ttft: slot %ui, %uD blocks, %M ms since the "
                   "try began, rate %ui a s", ctx->ttft_slot, ctx->ttft_own,
                   ngx_current_msec - start, t->rate);

    ngx_http_kv_aware_ttft_release(ctx);
}


/* a 2xx answer that streams: Content-Type text/event-stream */
static ngx_uint_t
ngx_http_kv_aware_ttft_streamed(ngx_http_upstream_t *u)
{
    ngx_str_t  *ct;

    if (u->headers_in.content_type == NULL) {
        return 0;
    }

    ct = &u->headers_in.content_type->value;

    return ct->len >= sizeof("text/event-stream") - 1
           && ngx_strncasecmp(ct->data, (u_char *) "text/event-stream",
                              sizeof("text/event-stream") - 1) == 0;
}
