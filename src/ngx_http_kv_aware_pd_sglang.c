/*
 * ngx_http_kv_aware_module: kv_aware_prefill mode=sglang, nginx runs
 * both legs of SGLang's bootstrap contract, as its router does.
 *
 * In the precontent phase, once the body is read: the decision
 * (ngx_http_kv_aware_pd_decide_early()); on a split, the client's body
 * gets the three bootstrap fields (kva_pd_sglang_body()): the prefill
 * server's host, bootstrap_port= (the port of its bootstrap server, not
 * its HTTP port) and a random 63-bit room.  That one body goes to both:
 * to the prefill server in a background subrequest to the location uri=
 * names (which proxies to $kv_aware_prefill_addr), whose answer is read
 * to its end and dropped, and to the decode server by the request's own
 * proxy_pass, at once.  The client's answer is the decode server's and
 * never waits for the prefill leg: the decode server meets the prefill
 * server in the room and pulls the KV from it.
 *
 * A prefill leg that fails cannot be taken back: the decode server has
 * the room already.  It waits for the room a bounded time (SGLang's
 * SGLANG_DISAGGREGATION_WAITING_TIMEOUT; kvsim's --pd-wait-s), then
 * fails the request (SGLang) or computes the prompt itself (kvsim);
 * proxy_read_timeout of the decode location bounds it from nginx's side.
 * The leg is counted when it ends: split when the prefill server
 * answered 2xx, fallback:prefill_failed otherwise (logged at most once
 * every 5 seconds a location), client_gone when the request ended first.
 * A body that cannot take the fields (not one JSON object, a prefill
 * address that is no host and port) is never split: the decode server
 * gets the client's body as it came.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_prompt.h"
#include "ngx_http_kv_aware_pd.h"

#include "kva_prompt.h"
#include "kva_pd_body.h"




typedef struct {
    ngx_http_request_t                 *request;
    ngx_http_kv_aware_pd_conf_t        *conf;
    ngx_http_kv_aware_pd_ctx_t         *pctx;
    unsigned                            started:1;
    unsigned                            counted:1;
} ngx_http_kv_aware_sglang_t;


static ngx_int_t ngx_http_kv_aware_pd_sglang_handler(ngx_http_request_t *r);
static void ngx_http_kv_aware_pd_sglang_body(ngx_http_request_t *r);
static void ngx_http_kv_aware_pd_sglang_start(ngx_http_request_t *r,
    ngx_http_kv_aware_sglang_t *leg);
static ngx_int_t ngx_http_kv_aware_pd_sglang_host(ngx_str_t *addr,
    ngx_str_t *host);
static ngx_int_t ngx_http_kv_aware_pd_sglang_done(ngx_http_request_t *sr,
    void *data, ngx_int_t rc);
static void ngx_http_kv_aware_pd_sglang_cleanup(void *data);
static void ngx_http_kv_aware_pd_sglang_count(ngx_http_kv_aware_sglang_t *leg,
    ngx_http_kv_aware_pd_e outcome);
static void ngx_http_kv_aware_pd_sglang_warn(ngx_http_kv_aware_sglang_t *leg,
    const char *why, ngx_uint_t status);
static ngx_int_t ngx_http_kv_aware_pd_sglang_body_filter(
    ngx_http_request_t *r, ngx_chain_t *in);


static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


/*
 * The handler runs after the other precontent handlers (kv_aware_tokenize
 * among them, whose ids the decision counts): nginx runs a phase's
 * handlers from the last registered to the first, so it goes first.
 */
ngx_int_t
ngx_http_kv_aware_pd_sglang_init(ngx_conf_t *cf)
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
    h[0] = ngx_http_kv_aware_pd_sglang_handler;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_kv_aware_pd_sglang_body_filter;

    return NGX_OK;
}


/*
 * The prefill leg's answer (one token, or an error page) is nobody's:
 * taken, as far as the upstream can tell, and dropped, so that the
 * prefill server sees its request read to the end (a connection closed
 * early would abort it, and the room with it) and nothing waits in
 * memory behind the client's answer.
 */
static ngx_int_t
ngx_http_kv_aware_pd_sglang_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in)
{
    ngx_chain_t  *cl;

    if (r == r->main || r->post_subrequest == NULL
        || r->post_subrequest->handler != ngx_http_kv_aware_pd_sglang_done)
    {
        return ngx_http_next_body_filter(r, in);
    }

    for (cl = in; cl; cl = cl->next) {
        cl->buf->pos = cl->buf->last;

        if (cl->buf->in_file) {
            cl->buf->file_pos = cl->buf->file_last;
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_kv_aware_pd_sglang_handler(ngx_http_request_t *r)
{
    ngx_int_t                     rc;
    ngx_http_kv_aware_pd_ctx_t   *pctx;
    ngx_http_kv_aware_pd_conf_t  *pcf;
    ngx_http_kv_aware_sglang_t   *leg;

    if (r != r->main) {
        return NGX_DECLINED;
    }

    pcf = ngx_http_get_module_loc_conf(r, ngx_http_kv_aware_pd_module);

    if (pcf->decode == NULL || pcf->mode != NGX_HTTP_KV_AWARE_PD_SGLANG) {
        return NGX_DECLINED;
    }

    pctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_pd_module);

    /* the body read, the prefill leg started or not: the decode leg */
    if (pctx && pctx->leg) {
        return NGX_DECLINED;
    }

    pctx = ngx_http_kv_aware_pd_request_ctx(r);
    leg = ngx_pcalloc(r->pool, sizeof(ngx_http_kv_aware_sglang_t));

    if (pctx == NULL || leg == NULL) {
        return NGX_ERROR;
    }

    pctx->leg = leg;

    leg->request = r;
    leg->conf = pcf;
    leg->pctx = pctx;

    rc = ngx_http_read_client_request_body(r,
                                           ngx_http_kv_aware_pd_sglang_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    ngx_http_finalize_request(r, NGX_DONE);

    return NGX_DONE;
}


static void
ngx_http_kv_aware_pd_sglang_body(ngx_http_request_t *r)
{
    ngx_http_kv_aware_pd_ctx_t  *pctx;

    pctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_pd_module);

    ngx_http_kv_aware_pd_sglang_start(r, pctx->leg);

    /* the decode leg, at once: the phases go on to proxy_pass */
    r->write_event_handler = ngx_http_core_run_phases;
    ngx_http_core_run_phases(r);
}


static void
ngx_http_kv_aware_pd_sglang_start(ngx_http_request_t *r,
    ngx_http_kv_aware_sglang_t *leg)
{
    size_t                         len, n;
    u_char                        *body, *out;
    uint64_t                       room;
    ngx_str_t                      host;
    ngx_uint_t                     copied;
    kva_prompt_rc_e                rc;
    ngx_chain_t                   *decode;
    ngx_pool_cleanup_t            *cln;
    ngx_http_request_t            *sr;
    ngx_http_request_body_t       *rb;
    ngx_http_post_subrequest_t    *ps;
    ngx_http_kv_aware_pd_ctx_t    *pctx;
    ngx_http_kv_aware_fallback_e   why;

    /* the decode server estimated, the prefill server chosen, charged */
    pctx = ngx_http_kv_aware_pd_decide_early(r, leg->conf);

    if (pctx == NULL || pctx->outcome != NGX_HTTP_KV_AWARE_PD_SPLIT) {
        return;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        goto failed;
    }

    cln->handler = ngx_http_kv_aware_pd_sglang_cleanup;
    cln->data = leg;

    copied = 0;
    body = ngx_http_kv_aware_prompt_request_body(r,
                                                 leg->conf->decode->max_body,
                                                 &len, &copied, &why);

    if (body == NULL) {
        ngx_http_kv_aware_pd_sglang_warn(leg, "cannot read the body", 0);
        goto failed;
    }

    if (ngx_http_kv_aware_pd_sglang_host(&pctx->addr, &host) != NGX_OK) {
        ngx_http_kv_aware_pd_sglang_warn(leg, "has no host:port", 0);
        goto failed;
    }

    out = ngx_pnalloc(r->pool, len + KVA_PD_SGLANG_EXTRA);
    if (out == NULL) {
        goto failed;
    }

    /* 63 random bits, as SGLang's router draws them */
    room = ((uint64_t) (ngx_random() & 0x7fffffff) << 32)
           | ((uint64_t) (ngx_random() & 0x7fffffff) << 1)
           | (uint64_t) (ngx_random() & 1);

    rc = kva_pd_sglang_body(body, len, host.data, host.len,
                            leg->conf->bootstrap_port, room, out, &n);

    if (rc != KVA_PROMPT_OK) {
        ngx_http_kv_aware_pd_sglang_warn(leg, kva_prompt_strerror(rc), 0);
        goto failed;
    }

    ps = ngx_palloc(r->pool, sizeof(ngx_http_post_subrequest_t));
    rb = ngx_pcalloc(r->pool, sizeof(ngx_http_request_body_t));

    if (ps == NULL || rb == NULL) {
        goto failed;
    }

    /* each leg its own buffer over the same bytes: each proxy moves it */
    rb->bufs = ngx_http_kv_aware_pd_body_chain(r, out, n);
    decode = ngx_http_kv_aware_pd_body_chain(r, out, n);

    if (rb->bufs == NULL || decode == NULL) {
        goto failed;
    }

    ps->handler = ngx_http_kv_aware_pd_sglang_done;
    ps->data = leg;

    /* not waited for: the client's answer is the decode leg's */
    if (ngx_http_subrequest(r, &leg->conf->uri, NULL, &sr, ps,
                            NGX_HTTP_SUBREQUEST_BACKGROUND)
        != NGX_OK)
    {
        goto failed;
    }

    sr->method = NGX_HTTP_POST;
    ngx_str_set(&sr->method_name, "POST");
    sr->request_body = rb;
    sr->headers_in.content_length_n = n;
    sr->headers_in.chunked = 0;

    leg->started = 1;
    pctx->room = room;

    /* what proxy_pass sends: the same body, its length */
    r->request_body->bufs = decode;
    r->headers_in.content_length_n = n;

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "kv_aware: prefill leg \"%V\" to %V, room %uL, "
                   "%uz bytes", &leg->conf->uri, &pctx->addr, room, n);

    return;

failed:

    ngx_http_kv_aware_pd_give_back(pctx);
    ngx_http_kv_aware_pd_sglang_count(leg,
                                      NGX_HTTP_KV_AWARE_PD_PREFILL_FAILED);
}


/* "10.0.0.1:30000" -> "10.0.0.1", "[::1]:30000" -> "::1" */
static ngx_int_t
ngx_http_kv_aware_pd_sglang_host(ngx_str_t *addr, ngx_str_t *host)
{
    u_char  *colon;

    colon = NULL;

    for (host->len = 0; host->len < addr->len; host->len++) {
        if (addr->data[host->len] == ':') {
            colon = &addr->data[host->len];
        }
    }

    if (colon == NULL || colon == addr->data) {
        return NGX_ERROR;
    }

    host->data = addr->data;
    host->len = colon - addr->data;

    if (host->len > 2 && host->data[0] == '['
        && host->data[host->len - 1] == ']')
    {
        host->data++;
        host->len -= 2;
    }

    return NGX_OK;
}


/* the prefill leg's end, its answer dropped by the body filter */
static ngx_int_t
ngx_http_kv_aware_pd_sglang_done(ngx_http_request_t *sr, void *data,
    ngx_int_t rc)
{
    ngx_http_kv_aware_sglang_t *leg = data;

    ngx_uint_t  status;

    if (leg->counted || rc == NGX_AGAIN) {
        return rc;
    }

    /* nginx saw the prefill end: its server's load goes back now */
    ngx_http_kv_aware_pd_give_back(leg->pctx);

    status = sr->headers_out.status;

    if (rc == NGX_OK && status >= NGX_HTTP_OK
        && status < NGX_HTTP_SPECIAL_RESPONSE)
    {
        ngx_http_kv_aware_pd_sglang_count(leg, NGX_HTTP_KV_AWARE_PD_SPLIT);

    } else {
        ngx_http_kv_aware_pd_sglang_warn(leg, status ? "answered" : "failed",
                                         status);
        ngx_http_kv_aware_pd_sglang_count(leg,
                                          NGX_HTTP_KV_AWARE_PD_PREFILL_FAILED);
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, sr->connection->log, 0,
                   "kv_aware: prefill leg done: %s, status %ui",
                   ngx_http_kv_aware_pd_texts[leg->pctx->outcome], status);

    return rc;
}


/* the request ended before its prefill leg did */
static void
ngx_http_kv_aware_pd_sglang_cleanup(void *data)
{
    ngx_http_kv_aware_sglang_t *leg = data;

    if (!leg->counted) {
        ngx_http_kv_aware_pd_sglang_count(leg,
                                          NGX_HTTP_KV_AWARE_PD_CLIENT_GONE);
    }
}


static void
ngx_http_kv_aware_pd_sglang_count(ngx_http_kv_aware_sglang_t *leg,
    ngx_http_kv_aware_pd_e outcome)
{
    leg->counted = 1;
    leg->pctx->outcome = outcome;

    ngx_http_kv_aware_pd_count(leg->conf, leg->pctx);
}


static void
ngx_http_kv_aware_pd_sglang_warn(ngx_http_kv_aware_sglang_t *leg,
    const char *why, ngx_uint_t status)
{
    ngx_http_kv_aware_pd_conf_t  *pcf;

    pcf = leg->conf;

    if (!ngx_http_kv_aware_pd_warn_due(pcf)) {
        return;
    }

    if (status) {
        ngx_log_error(NGX_LOG_WARN, leg->request->connection->log, 0,
                      "kv_aware: sglang prefill leg \"%V\" to %V %s %ui, "
                      "the decode server waits for its bootstrap room, "
                      "then serves or fails the request alone",
                      &pcf->uri, &leg->pctx->addr, why, status);

    } else if (leg->started) {
        ngx_log_error(NGX_LOG_WARN, leg->request->connection->log, 0,
                      "kv_aware: sglang prefill leg \"%V\" to %V %s, "
                      "the decode server waits for its bootstrap room, "
                      "then serves or fails the request alone",
                      &pcf->uri, &leg->pctx->addr, why);

    } else {
        ngx_log_error(NGX_LOG_WARN, leg->request->connection->log, 0,
                      "kv_aware: sglang prefill leg to %V: the request %s, "
                      "serving it on the decode server alone, its body "
                      "as it came", &leg->pctx->addr, why);
    }
}
