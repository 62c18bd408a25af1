/*
 * ngx_http_kv_aware_module: kv_aware_tokenize.
 *
 * An upstream with keys=tokens keys blocks by token ids, as the engines
 * do.  When the body is text, the ids come from a tokenizer (vLLM's
 * /tokenize), asked in the precontent phase, before proxy_pass chooses a
 * server: the body is read (as mirror does), then a subrequest POSTs it
 * to the configured uri and the answer's ids wait in the module's
 * request context for the balancer.
 *
 * The subrequest is a background one: the main request never waits for
 * it past the timeout, and its output is never held behind it.  Whatever
 * comes first, the answer or the timer, wakes the main request; what
 * comes later finds the state done and changes nothing.  The main
 * request's pool holds the state, and a background subrequest holds a
 * reference on the main request, so a late answer still finds it.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_conf.h"
#include "ngx_http_kv_aware_prompt.h"
#include "ngx_http_kv_aware_tokenize.h"

#include "kva_prompt.h"
#include "kva_token_answer.h"


/* one warning per location at most this often, per worker */
#define NGX_HTTP_KV_AWARE_TOKENIZE_LOG  5000


typedef struct {
    ngx_str_t                       uri;          /* len 0: off */
    ngx_msec_t                      timeout;
    size_t                          max_body;
    ngx_msec_t                      logged;
} ngx_http_kv_aware_tokenize_conf_t;


typedef enum {
    NGX_HTTP_KV_AWARE_TK_READING = 0,
    NGX_HTTP_KV_AWARE_TK_WAITING,
    NGX_HTTP_KV_AWARE_TK_DONE
} ngx_http_kv_aware_tk_state_e;


typedef struct {
    ngx_http_request_t                 *request;
    ngx_http_kv_aware_ctx_t            *ctx;
    ngx_http_kv_aware_tokenize_conf_t  *conf;
    ngx_event_t                         timer;
    ngx_http_kv_aware_tk_state_e        state;
    size_t                              answer;     /* bytes kept */
    unsigned                            too_big:1;
} ngx_http_kv_aware_tokenize_t;


static ngx_int_t ngx_http_kv_aware_tokenize_handler(ngx_http_request_t *r);
static ngx_http_kv_aware_tokenize_t *ngx_http_kv_aware_tokenize_of(
    ngx_http_request_t *r);
static ngx_int_t ngx_http_kv_aware_tokenize_header_filter(
    ngx_http_request_t *r);
static ngx_int_t ngx_http_kv_aware_tokenize_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;
static void ngx_http_kv_aware_tokenize_body(ngx_http_request_t *r);
static ngx_http_kv_aware_tk_state_e ngx_http_kv_aware_tokenize_start(
    ngx_http_request_t *r, ngx_http_kv_aware_tokenize_t *tk);
static ngx_int_t ngx_http_kv_aware_tokenize_done(ngx_http_request_t *sr,
    void *data, ngx_int_t rc);
static const char *ngx_http_kv_aware_tokenize_ids(ngx_http_request_t *sr,
    ngx_int_t rc, ngx_http_kv_aware_tokenize_t *tk);
static void ngx_http_kv_aware_tokenize_timeout(ngx_event_t *ev);
static void ngx_http_kv_aware_tokenize_cleanup(void *data);
static void ngx_http_kv_aware_tokenize_warn(ngx_http_kv_aware_tokenize_t *tk,
    const char *why, ngx_uint_t status);


/* see docs/reference.md, "kv_aware_tokenize" */
static ngx_http_kv_aware_param_t  ngx_http_kv_aware_tokenize_params[] = {

    { ngx_string("timeout"),
      ngx_http_kv_aware_conf_msec,
      offsetof(ngx_http_kv_aware_tokenize_conf_t, timeout),
      1, 60 * 1000, "50ms" },

    { ngx_string("max_body"),
      ngx_http_kv_aware_conf_size,
      offsetof(ngx_http_kv_aware_tokenize_conf_t, max_body),
      1024, NGX_HTTP_KV_AWARE_NO_MAX, "4m" },

    ngx_http_kv_aware_null_param
};


char *
ngx_http_kv_aware_tokenize_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_kv_aware_tokenize_conf_t *tcf = conf;

    ngx_str_t  *value;

    if (tcf->uri.data != NULL) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        if (cf->args->nelts != 2) {
            return "takes no parameters with \"off\"";
        }

        ngx_str_set(&tcf->uri, "");
        return NGX_CONF_OK;
    }

    if (value[1].len == 0 || value[1].data[0] != '/') {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%V: invalid uri \"%V\", expected one that "
                           "starts with \"/\", or \"off\"",
                           &value[0], &value[1]);
        return NGX_CONF_ERROR;
    }

    tcf->uri = value[1];

    if (ngx_http_kv_aware_conf_defaults(cf, &value[0],
                                        ngx_http_kv_aware_tokenize_params,
                                        tcf)
        != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    /* after the uri */
    return ngx_http_kv_aware_conf_params_from(cf,
               ngx_http_kv_aware_tokenize_params, tcf, 2);
}


void *
ngx_http_kv_aware_tokenize_create_conf(ngx_conf_t *cf)
{
    ngx_http_kv_aware_tokenize_conf_t  *tcf;

    tcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_kv_aware_tokenize_conf_t));
    if (tcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     tcf->uri = { 0, NULL };
     *     tcf->logged = 0;
     */

    return tcf;
}


char *
ngx_http_kv_aware_tokenize_merge_conf(ngx_conf_t *cf, void *parent,
    void *child)
{
    ngx_http_kv_aware_tokenize_conf_t *prev = parent;
    ngx_http_kv_aware_tokenize_conf_t *conf = child;

    if (conf->uri.data == NULL) {
        conf->uri = prev->uri;
        conf->timeout = prev->timeout;
        conf->max_body = prev->max_body;
    }

    return NGX_CONF_OK;
}


ngx_int_t
ngx_http_kv_aware_tokenize_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    /* after access: a client turned away costs no tokenizer call */
    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PRECONTENT_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_kv_aware_tokenize_handler;

    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_kv_aware_tokenize_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_kv_aware_tokenize_body_filter;

    return NGX_OK;
}


/*
 * The tokenizer's answer goes into memory through nginx's postpone
 * filter, which fails a subrequest whose answer outgrows
 * subrequest_output_buffer_size, and marks the connection, the client's
 * too, in error: the client's request would die of its tokenizer's long
 * answer.  These two filters, ahead of it, pass on only what fits (a
 * Content-Length over the buffer is hidden, so that it does not refuse
 * at the header) and swallow the rest; the answer is then counted as a
 * failure, and the request goes on keyed by text.
 */

static ngx_http_kv_aware_tokenize_t *
ngx_http_kv_aware_tokenize_of(ngx_http_request_t *r)
{
    if (r == r->main || r->post_subrequest == NULL
        || r->post_subrequest->handler != ngx_http_kv_aware_tokenize_done)
    {
        return NULL;
    }

    return r->post_subrequest->data;
}


static ngx_int_t
ngx_http_kv_aware_tokenize_header_filter(ngx_http_request_t *r)
{
    if (ngx_http_kv_aware_tokenize_of(r) != NULL) {
        r->headers_out.content_length_n = -1;
    }

    return ngx_http_next_header_filter(r);
}


static ngx_int_t
ngx_http_kv_aware_tokenize_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in)
{
    size_t                         len, room;
    ngx_chain_t                   *cl;
    ngx_http_core_loc_conf_t      *clcf;
    ngx_http_kv_aware_tokenize_t  *tk;

    tk = ngx_http_kv_aware_tokenize_of(r);

    if (tk == NULL || in == NULL) {
        return ngx_http_next_body_filter(r, in);
    }

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);
    room = clcf->subrequest_output_buffer_size;

    /* in memory or in a proxy temp file alike: the postpone filter takes
       last - pos of each, which is the size of a buffer it can copy */

    for (cl = in; cl && !tk->too_big; cl = cl->next) {
        if (ngx_buf_special(cl->buf)) {
            continue;
        }

        len = ngx_buf_in_memory(cl->buf) ? (size_t) (cl->buf->last
                                                     - cl->buf->pos)
                                         : (size_t) ngx_buf_size(cl->buf);

        if (len > room - tk->answer) {
            tk->too_big = 1;
            break;
        }

        tk->answer += len;
    }

    if (!tk->too_big) {
        return ngx_http_next_body_filter(r, in);
    }

    /* consumed, as far as the upstream can tell */

    for (cl = in; cl; cl = cl->next) {
        cl->buf->pos = cl->buf->last;

        if (cl->buf->in_file) {
            cl->buf->file_pos = cl->buf->file_last;
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_kv_aware_tokenize_handler(ngx_http_request_t *r)
{
    ngx_int_t                           rc;
    ngx_http_kv_aware_ctx_t            *ctx;
    ngx_http_kv_aware_tokenize_t       *tk;
    ngx_http_kv_aware_tokenize_conf_t  *tcf;

    if (r != r->main) {
        return NGX_DECLINED;
    }

    tcf = ngx_http_get_module_loc_conf(r, ngx_http_kv_aware_module);

    if (tcf->uri.len == 0) {
        return NGX_DECLINED;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);

    if (ctx && ctx->tokenize) {
        tk = ctx->tokenize;
        return (tk->state == NGX_HTTP_KV_AWARE_TK_DONE) ? NGX_DECLINED
                                                         : NGX_AGAIN;
    }

    if (ctx == NULL) {
        ctx = ngx_http_kv_aware_module_request_ctx(r);
        if (ctx == NULL) {
            return NGX_ERROR;
        }
    }

    tk = ngx_pcalloc(r->pool, sizeof(ngx_http_kv_aware_tokenize_t));
    if (tk == NULL) {
        return NGX_ERROR;
    }

    tk->request = r;
    tk->ctx = ctx;
    tk->conf = tcf;
    tk->state = NGX_HTTP_KV_AWARE_TK_READING;
    ctx->tokenize = tk;

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "kv_aware: tokenize, reading the body");

    rc = ngx_http_read_client_request_body(r, ngx_http_kv_aware_tokenize_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    ngx_http_finalize_request(r, NGX_DONE);

    return NGX_DONE;
}


static void
ngx_http_kv_aware_tokenize_body(ngx_http_request_t *r)
{
    ngx_http_kv_aware_ctx_t       *ctx;
    ngx_http_kv_aware_tokenize_t  *tk;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);
    tk = ctx->tokenize;

    /* proxy would close a temp file the subrequest may still send */
    r->preserve_body = 1;

    tk->state = ngx_http_kv_aware_tokenize_start(r, tk);

    r->write_event_handler = ngx_http_core_run_phases;
    ngx_http_core_run_phases(r);
}


static ngx_http_kv_aware_tk_state_e
ngx_http_kv_aware_tokenize_start(ngx_http_request_t *r,
    ngx_http_kv_aware_tokenize_t *tk)
{
    size_t                         len;
    u_char                        *body;
    ngx_uint_t                     copied;
    kva_prompt_t                   prompt;
    kva_prompt_rc_e                rc;
    ngx_pool_cleanup_t            *cln;
    ngx_http_request_t            *sr;
    ngx_http_post_subrequest_t    *ps;
    ngx_http_kv_aware_fallback_e   why;

    body = ngx_http_kv_aware_prompt_request_body(r, tk->conf->max_body, &len,
                                          &copied, &why);

    /* no body to read: the balancer finds the same and says why */
    if (body == NULL) {
        return NGX_HTTP_KV_AWARE_TK_DONE;
    }

    /* validation only: is there a prompt, and is it token ids already */
    rc = kva_prompt_extract(body, len, NULL, 0, &prompt);

    if (copied) {
        ngx_pfree(r->pool, body);
    }

    if (rc != KVA_PROMPT_OK || prompt.token_ids) {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "kv_aware: tokenize, no call: %s",
                       rc == KVA_PROMPT_OK ? "token ids in the body"
                                           : kva_prompt_strerror(rc));
        return NGX_HTTP_KV_AWARE_TK_DONE;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        goto failed;
    }

    cln->handler = ngx_http_kv_aware_tokenize_cleanup;
    cln->data = tk;

    ps = ngx_palloc(r->pool, sizeof(ngx_http_post_subrequest_t));
    if (ps == NULL) {
        goto failed;
    }

    ps->handler = ngx_http_kv_aware_tokenize_done;
    ps->data = tk;

    /*
     * In memory, for the answer; in the background, so that the main
     * request's output never waits behind it after a timeout.
     */
    if (ngx_http_subrequest(r, &tk->conf->uri, NULL, &sr, ps,
                            NGX_HTTP_SUBREQUEST_IN_MEMORY
                            |NGX_HTTP_SUBREQUEST_BACKGROUND)
        != NGX_OK)
    {
        goto failed;
    }

    /* the body goes as it is: sr->request_body is the main request's */
    sr->method = NGX_HTTP_POST;
    ngx_str_set(&sr->method_name, "POST");

    tk->timer.handler = ngx_http_kv_aware_tokenize_timeout;
    tk->timer.data = tk;
    tk->timer.log = r->connection->log;

    ngx_add_timer(&tk->timer, tk->conf->timeout);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "kv_aware: tokenize \"%V\", timeout %M",
                   &tk->conf->uri, tk->conf->timeout);

    return NGX_HTTP_KV_AWARE_TK_WAITING;

failed:

    tk->ctx->fallback = NGX_HTTP_KV_AWARE_TOKENIZE_FAILED;
    ngx_http_kv_aware_tokenize_warn(tk, "no subrequest", 0);

    return NGX_HTTP_KV_AWARE_TK_DONE;
}


/* the subrequest's end: ids for the balancer, or a fallback */
static ngx_int_t
ngx_http_kv_aware_tokenize_done(ngx_http_request_t *sr, void *data,
    ngx_int_t rc)
{
    ngx_http_kv_aware_tokenize_t *tk = data;

    ngx_uint_t   failed;
    const char  *why;

    failed = 0;

    /* an answer past the buffer, cut off by our filter */
    failed = tk->too_big;

    /* late: the main request went on without it */
    if (tk->state != NGX_HTTP_KV_AWARE_TK_WAITING || rc == NGX_AGAIN) {
        return rc;
    }

    tk->state = NGX_HTTP_KV_AWARE_TK_DONE;

    if (tk->timer.timer_set) {
        ngx_del_timer(&tk->timer);
    }

    why = failed ? "answer past subrequest_output_buffer_size"
                 : ngx_http_kv_aware_tokenize_ids(sr, rc, tk);

    if (why) {
        tk->ctx->fallback = NGX_HTTP_KV_AWARE_TOKENIZE_FAILED;
        ngx_http_kv_aware_tokenize_warn(tk, why, sr->headers_out.status);
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, sr->connection->log, 0,
                   "kv_aware: tokenize done: %uz ids, status %ui",
                   tk->ctx->nids, sr->headers_out.status);

    /* a background subrequest does not wake its parent: we do */
    if (ngx_http_post_request(tk->request, NULL) != NGX_OK) {
        /* the timer wakes it instead, at once */
        ngx_add_timer(&tk->timer, 1);
    }

    return rc;
}


/* NULL with the ids in the context, or why there are none */
static const char *
ngx_http_kv_aware_tokenize_ids(ngx_http_request_t *sr, ngx_int_t rc,
    ngx_http_kv_aware_tokenize_t *tk)
{
    size_t            len, max, n;
    uint32_t         *ids;
    ngx_buf_t        *b;
    kva_prompt_rc_e   prc;

    if (rc != NGX_OK) {
        return "subrequest failed";
    }

    if (sr->headers_out.status != NGX_HTTP_OK) {
        return "answered";
    }

    if (sr->out == NULL || sr->out->buf == NULL) {
        return "empty answer";
    }

    b = sr->out->buf;
    len = b->last - b->pos;

    /*
     * An id takes a digit and a comma: the answer, which
     * subrequest_output_buffer_size bounds, bounds the ids.
     */
    max = len / 2 + 1;

    ids = ngx_palloc(tk->request->pool, max * sizeof(uint32_t));
    if (ids == NULL) {
        return "no memory";
    }

    prc = kva_prompt_token_answer(b->pos, len, ids, max, &n);

    if (prc == KVA_PROMPT_NO_PROMPT || (prc == KVA_PROMPT_OK && n == 0)) {
        return "no token ids in the answer";
    }

    if (prc != KVA_PROMPT_OK) {
        return kva_prompt_strerror(prc);
    }

    tk->ctx->ids = ids;
    tk->ctx->nids = n;

    return NULL;
}


static void
ngx_http_kv_aware_tokenize_timeout(ngx_event_t *ev)
{
    ngx_http_kv_aware_tokenize_t *tk = ev->data;

    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    r = tk->request;
    c = r->connection;

    if (tk->state == NGX_HTTP_KV_AWARE_TK_WAITING) {
        tk->state = NGX_HTTP_KV_AWARE_TK_DONE;
        tk->ctx->fallback = NGX_HTTP_KV_AWARE_TOKENIZE_TIMEOUT;
        ngx_http_kv_aware_tokenize_warn(tk, "timed out", 0);
    }

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "kv_aware: tokenize, the request goes on");

    r->write_event_handler(r);
    ngx_http_run_posted_requests(c);
}


/* the request ends before the timer: it must not fire into freed memory */
static void
ngx_http_kv_aware_tokenize_cleanup(void *data)
{
    ngx_http_kv_aware_tokenize_t *tk = data;

    if (tk->timer.timer_set) {
        ngx_del_timer(&tk->timer);
    }
}


static void
ngx_http_kv_aware_tokenize_warn(ngx_http_kv_aware_tokenize_t *tk,
    const char *why, ngx_uint_t status)
{
    ngx_http_kv_aware_tokenize_conf_t  *tcf;

    tcf = tk->conf;

    if (tcf->logged
        && ngx_current_msec - tcf->logged < NGX_HTTP_KV_AWARE_TOKENIZE_LOG)
    {
        return;
    }

    tcf->logged = ngx_current_msec;

    if (status) {
        ngx_log_error(NGX_LOG_WARN, tk->request->connection->log, 0,
                      "kv_aware: tokenize \"%V\" %s %ui, routing by text "
                      "keys", &tcf->uri, why, status);

    } else {
        ngx_log_error(NGX_LOG_WARN, tk->request->connection->log, 0,
                      "kv_aware: tokenize \"%V\" %s, routing by text keys",
                      &tcf->uri, why);
    }
}
