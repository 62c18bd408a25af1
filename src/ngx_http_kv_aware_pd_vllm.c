/*
 * ngx_http_kv_aware_module: kv_aware_prefill mode=vllm, nginx runs both
 * legs of vLLM's NIXL contract.
 *
 * In the precontent phase, once the body is read: the decision
 * (ngx_http_kv_aware_pd_decide_early()); on a split, leg 1 is a
 * subrequest to the location uri= names, which proxies to
 * $kv_aware_prefill_addr, with the body rewritten for a prefill
 * (kva_pd_prefill_body(): stream false, max_tokens 1, a remote decode
 * asked for) and its answer kept in memory.  The main request waits for
 * it (the proxy timeouts of that location bound it), then goes on to its
 * own proxy_pass, the decode leg, with the answer's kv_transfer_params
 * put first in the client's body (kva_pd_decode_body()).  Both legs
 * send $kv_aware_request_id as X-Request-Id.  A client that leaves during
 * leg 1 ends the request (499) and leg 1 with it; leg 2 never starts.
 *
 * A leg 1 that fails (the subrequest, a status other than 200, an answer
 * past subrequest_output_buffer_size, without a kv_transfer_params
 * object, or not JSON at all) costs the request its split, never the
 * request: the decode server gets the client's body as it came
 * (fallback:prefill_failed), logged at most once every 5 seconds per
 * location.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_prompt.h"
#include "ngx_http_kv_aware_pd.h"

#include "kva_prompt.h"
#include "kva_pd_body.h"




typedef enum {
    NGX_HTTP_KV_AWARE_LEG_READING = 0,
    NGX_HTTP_KV_AWARE_LEG_WAITING,
    NGX_HTTP_KV_AWARE_LEG_DONE
} ngx_http_kv_aware_leg_state_e;


typedef struct {
    ngx_http_request_t                 *request;
    ngx_http_kv_aware_pd_conf_t        *conf;
    ngx_http_kv_aware_pd_ctx_t         *pctx;
    ngx_http_kv_aware_leg_state_e       state;
    u_char                             *body;        /* the client's */
    size_t                              len;
    size_t                              answer;      /* its bytes kept */
    unsigned                            too_big:1;
} ngx_http_kv_aware_leg_t;


static ngx_int_t ngx_http_kv_aware_pd_vllm_handler(ngx_http_request_t *r);
static void ngx_http_kv_aware_pd_vllm_body(ngx_http_request_t *r);
static ngx_http_kv_aware_leg_state_e ngx_http_kv_aware_pd_vllm_start(
    ngx_http_request_t *r, ngx_http_kv_aware_leg_t *leg);
static ngx_int_t ngx_http_kv_aware_pd_vllm_done(ngx_http_request_t *sr,
    void *data, ngx_int_t rc);
static const char *ngx_http_kv_aware_pd_vllm_splice(ngx_http_request_t *sr,
    ngx_int_t rc, ngx_http_kv_aware_leg_t *leg);
static void ngx_http_kv_aware_pd_vllm_warn(ngx_http_kv_aware_leg_t *leg,
    const char *why, ngx_uint_t status);
static ngx_http_kv_aware_leg_t *ngx_http_kv_aware_pd_vllm_leg_of(
    ngx_http_request_t *r);
static ngx_int_t ngx_http_kv_aware_pd_vllm_header_filter(
    ngx_http_request_t *r);
static ngx_int_t ngx_http_kv_aware_pd_vllm_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


/*
 * The handler runs after the other precontent handlers (kv_aware_tokenize
 * among them, whose ids the decision counts): nginx runs a phase's
 * handlers from the last registered to the first, so it goes first in
 * the list.
 */
ngx_int_t
ngx_http_kv_aware_pd_vllm_init(ngx_conf_t *cf)
{
    ngx_array_t                *a;
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);
    a = &cmcf->phases[NGX_HTTP_PRECONTENT_PHASE].handlers;

    h = ngx_array_push(a);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h = a->elts;
    ngx_memmove(&h[1], &h[0], (a->nelts - 1) * sizeof(ngx_http_handler_pt));
    h[0] = ngx_http_kv_aware_pd_vllm_handler;

    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_kv_aware_pd_vllm_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_kv_aware_pd_vllm_body_filter;

    return NGX_OK;
}


/*
 * Leg 1's answer is kept in memory by nginx's postpone filter, which
 * fails an answer past subrequest_output_buffer_size and with it the
 * client's connection.  A prefill server's answer is small (one token and
 * the params): one past the buffer is a bad answer, which must cost the
 * request its split only.  So these filters, ahead of the postpone
 * filter, hide a Content-Length (else refused at the header), pass what
 * fits, and swallow the rest, the leg then counted as failed.
 */

static ngx_http_kv_aware_leg_t *
ngx_http_kv_aware_pd_vllm_leg_of(ngx_http_request_t *r)
{
    if (r == r->main || r->post_subrequest == NULL
        || r->post_subrequest->handler != ngx_http_kv_aware_pd_vllm_done)
    {
        return NULL;
    }

    return r->post_subrequest->data;
}


static ngx_int_t
ngx_http_kv_aware_pd_vllm_header_filter(ngx_http_request_t *r)
{
    if (ngx_http_kv_aware_pd_vllm_leg_of(r) != NULL) {
        r->headers_out.content_length_n = -1;
    }

    return ngx_http_next_header_filter(r);
}


static ngx_int_t
ngx_http_kv_aware_pd_vllm_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in)
{
    size_t                     len, room;
    ngx_chain_t               *cl;
    ngx_http_kv_aware_leg_t   *leg;
    ngx_http_core_loc_conf_t  *clcf;

    leg = ngx_http_kv_aware_pd_vllm_leg_of(r);

    if (leg == NULL || in == NULL) {
        return ngx_http_next_body_filter(r, in);
    }

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);
    room = clcf->subrequest_output_buffer_size;

    for (cl = in; cl && !leg->too_big; cl = cl->next) {
        if (ngx_buf_special(cl->buf)) {
            continue;
        }

        len = (size_t) ngx_buf_size(cl->buf);

        if (len > room - leg->answer) {
            leg->too_big = 1;
            break;
        }

        leg->answer += len;
    }

    if (!leg->too_big) {
        return ngx_http_next_body_filter(r, in);
    }

    /* taken, as far as the upstream can tell, and dropped */
    for (cl = in; cl; cl = cl->next) {
        cl->buf->pos = cl->buf->last;

        if (cl->buf->in_file) {
            cl->buf->file_pos = cl->buf->file_last;
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_kv_aware_pd_vllm_handler(ngx_http_request_t *r)
{
    ngx_int_t                     rc;
    ngx_http_kv_aware_leg_t      *leg;
    ngx_http_kv_aware_pd_ctx_t   *pctx;
    ngx_http_kv_aware_pd_conf_t  *pcf;

    if (r != r->main) {
        return NGX_DECLINED;
    }

    pcf = ngx_http_get_module_loc_conf(r, ngx_http_kv_aware_pd_module);

    if (pcf->decode == NULL || pcf->mode != NGX_HTTP_KV_AWARE_PD_VLLM) {
        return NGX_DECLINED;
    }

    pctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_pd_module);

    if (pctx && pctx->leg) {
        leg = pctx->leg;
        return (leg->state == NGX_HTTP_KV_AWARE_LEG_DONE) ? NGX_DECLINED
                                                           : NGX_AGAIN;
    }

    pctx = ngx_http_kv_aware_pd_request_ctx(r);
    leg = ngx_pcalloc(r->pool, sizeof(ngx_http_kv_aware_leg_t));

    if (pctx == NULL || leg == NULL) {
        return NGX_ERROR;
    }

    pctx->leg = leg;

    leg->request = r;
    leg->conf = pcf;
    leg->pctx = pctx;
    leg->state = NGX_HTTP_KV_AWARE_LEG_READING;

    rc = ngx_http_read_client_request_body(r, ngx_http_kv_aware_pd_vllm_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    ngx_http_finalize_request(r, NGX_DONE);

    return NGX_DONE;
}


static void
ngx_http_kv_aware_pd_vllm_body(ngx_http_request_t *r)
{
    ngx_http_kv_aware_pd_ctx_t  *pctx;
    ngx_http_kv_aware_leg_t     *leg;

    pctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_pd_module);
    leg = pctx->leg;

    /* proxy would close a temp file the subrequest may still send */
    r->preserve_body = 1;

    leg->state = ngx_http_kv_aware_pd_vllm_start(r, leg);

    /*
     * A client that leaves during leg 1 ends the request there (499),
     * and with it leg 1: leg 2 never starts.
     */
    if (leg->state == NGX_HTTP_KV_AWARE_LEG_WAITING) {
        r->read_event_handler = ngx_http_test_reading;
    }

    r->write_event_handler = ngx_http_core_run_phases;
    ngx_http_core_run_phases(r);
}


static ngx_http_kv_aware_leg_state_e
ngx_http_kv_aware_pd_vllm_start(ngx_http_request_t *r,
    ngx_http_kv_aware_leg_t *leg)
{
    size_t                         n;
    u_char                        *out;
    ngx_uint_t                     copied;
    kva_prompt_rc_e                rc;
    ngx_http_request_t            *sr;
    ngx_http_request_body_t       *rb;
    ngx_http_post_subrequest_t    *ps;
    ngx_http_kv_aware_pd_ctx_t    *pctx;
    ngx_http_kv_aware_fallback_e   why;

    /* the decode server estimated, the prefill server chosen, charged */
    pctx = ngx_http_kv_aware_pd_decide_early(r, leg->conf);

    if (pctx == NULL || pctx->outcome != NGX_HTTP_KV_AWARE_PD_SPLIT) {
        return NGX_HTTP_KV_AWARE_LEG_DONE;
    }

    copied = 0;
    leg->body = ngx_http_kv_aware_prompt_request_body(r,
                                              leg->conf->decode->max_body,
                                              &leg->len, &copied, &why);

    if (leg->body == NULL) {
        ngx_http_kv_aware_pd_vllm_warn(leg, "cannot read the body", 0);
        goto failed;
    }

    out = ngx_pnalloc(r->pool, leg->len + KVA_PD_BODY_EXTRA);
    if (out == NULL) {
        goto failed;
    }

    rc = kva_pd_prefill_body(leg->body, leg->len, out, &n);

    if (rc != KVA_PROMPT_OK) {
        ngx_http_kv_aware_pd_vllm_warn(leg, kva_prompt_strerror(rc), 0);
        goto failed;
    }

    ps = ngx_palloc(r->pool, sizeof(ngx_http_post_subrequest_t));
    rb = ngx_pcalloc(r->pool, sizeof(ngx_http_request_body_t));

    if (ps == NULL || rb == NULL) {
        goto failed;
    }

    rb->bufs = ngx_http_kv_aware_pd_body_chain(r, out, n);
    if (rb->bufs == NULL) {
        goto failed;
    }

    ps->handler = ngx_http_kv_aware_pd_vllm_done;
    ps->data = leg;

    /* in memory, for the answer; waited for, as auth_request's is */
    if (ngx_http_subrequest(r, &leg->conf->uri, NULL, &sr, ps,
                            NGX_HTTP_SUBREQUEST_IN_MEMORY
                            |NGX_HTTP_SUBREQUEST_WAITED)
        != NGX_OK)
    {
        goto failed;
    }

    sr->method = NGX_HTTP_POST;
    ngx_str_set(&sr->method_name, "POST");
    sr->request_body = rb;
    sr->headers_in.content_length_n = n;
    sr->headers_in.chunked = 0;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "kv_aware: prefill leg \"%V\" to %V, %uz bytes",
                   &leg->conf->uri, &pctx->addr, n);

    return NGX_HTTP_KV_AWARE_LEG_WAITING;

failed:

    ngx_http_kv_aware_pd_give_back(leg->pctx);
    leg->pctx->outcome = NGX_HTTP_KV_AWARE_PD_PREFILL_FAILED;
    ngx_http_kv_aware_pd_count(leg->conf, leg->pctx);

    return NGX_HTTP_KV_AWARE_LEG_DONE;
}


/* leg 1's end: the decode body with its params, or the client's */
static ngx_int_t
ngx_http_kv_aware_pd_vllm_done(ngx_http_request_t *sr, void *data,
    ngx_int_t rc)
{
    ngx_http_kv_aware_leg_t *leg = data;

    const char  *why;

    if (leg->state != NGX_HTTP_KV_AWARE_LEG_WAITING || rc == NGX_AGAIN) {
        return rc;
    }

    leg->state = NGX_HTTP_KV_AWARE_LEG_DONE;
    leg->request->read_event_handler = ngx_http_block_reading;

    /* nginx saw the prefill end: its server's load goes back now */
    ngx_http_kv_aware_pd_give_back(leg->pctx);

    /* ngx_http_test_reading() saw the client leave: the request ends */
    if (leg->request->connection->error) {
        leg->pctx->outcome = NGX_HTTP_KV_AWARE_PD_CLIENT_GONE;
        ngx_http_kv_aware_pd_count(leg->conf, leg->pctx);
        return rc;
    }

    why = ngx_http_kv_aware_pd_vllm_splice(sr, rc, leg);

    if (why) {
        leg->pctx->outcome = NGX_HTTP_KV_AWARE_PD_PREFILL_FAILED;
        ngx_http_kv_aware_pd_vllm_warn(leg, why, sr->headers_out.status);
    }

    ngx_http_kv_aware_pd_count(leg->conf, leg->pctx);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, sr->connection->log, 0,
                   "kv_aware: prefill leg done: %s, status %ui",
                   ngx_http_kv_aware_pd_texts[leg->pctx->outcome],
                   sr->headers_out.status);

    return rc;
}


/* NULL with the decode body in place, or why the split failed */
static const char *
ngx_http_kv_aware_pd_vllm_splice(ngx_http_request_t *sr, ngx_int_t rc,
    ngx_http_kv_aware_leg_t *leg)
{
    size_t                n, plen;
    u_char               *out;
    ngx_buf_t            *b;
    ngx_chain_t          *cl;
    const uint8_t        *params;
    kva_prompt_rc_e       prc;
    ngx_http_request_t   *r;

    r = leg->request;

    if (leg->too_big) {
        return "answered past subrequest_output_buffer_size";
    }

    if (rc != NGX_OK) {
        return "failed";
    }

    if (sr->headers_out.status != NGX_HTTP_OK) {
        return "answered";
    }

    if (sr->out == NULL || sr->out->buf == NULL) {
        return "answered nothing";
    }

    b = sr->out->buf;

    prc = kva_pd_answer_params(b->pos, b->last - b->pos, &params, &plen);

    if (prc == KVA_PROMPT_NO_PROMPT) {
        return "answered without a kv_transfer_params object";
    }

    if (prc != KVA_PROMPT_OK) {
        return kva_prompt_strerror(prc);
    }

    out = ngx_pnalloc(r->pool, leg->len + plen + KVA_PD_BODY_EXTRA);
    if (out == NULL) {
        return "no memory";
    }

    if (kva_pd_decode_body(leg->body, leg->len, params, plen, out, &n)
        != KVA_PROMPT_OK)
    {
        return "no decode body";
    }

    cl = ngx_http_kv_aware_pd_body_chain(r, out, n);
    if (cl == NULL) {
        return "no memory";
    }

    /* what proxy_pass sends: the new body, its length */
    r->request_body->bufs = cl;
    r->headers_in.content_length_n = n;

    return NULL;
}


static void
ngx_http_kv_aware_pd_vllm_warn(ngx_http_kv_aware_leg_t *leg,
    const char *why, ngx_uint_t status)
{
    ngx_http_kv_aware_pd_conf_t  *pcf;

    pcf = leg->conf;

    if (!ngx_http_kv_aware_pd_warn_due(pcf)) {
        return;
    }

    if (status) {
        ngx_log_error(NGX_LOG_WARN, leg->request->connection->log, 0,
                      "kv_aware: prefill leg \"%V\" to %V %s %ui, serving "
                      "the request on the decode server alone",
                      &pcf->uri, &leg->pctx->addr, why, status);

    } else {
        ngx_log_error(NGX_LOG_WARN, leg->request->connection->log, 0,
                      "kv_aware: prefill leg \"%V\" to %V %s, serving "
                      "the request on the decode server alone",
                      &pcf->uri, &leg->pctx->addr, why);
    }
}
