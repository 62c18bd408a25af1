/*
 * ngx_http_kv_aware_module: request body -> prompt block hashes.
 *
 * Runs in the peer init, after proxy has read the whole body (request
 * buffering on).  The body may sit in one buffer, several, or a temp file.
 * Nothing here changes what is sent upstream: we read copies or in place.
 */

#include "ngx_http_kv_aware_module.h"
#include "ngx_http_kv_aware_prompt.h"

#include "kva_hash.h"
#include "kva_prompt.h"



static off_t ngx_http_kv_aware_body_size(ngx_chain_t *bufs,
    ngx_buf_t **only);
static u_char *ngx_http_kv_aware_read_body(ngx_http_request_t *r,
    size_t len, ngx_http_kv_aware_fallback_e *fallback);


const char  *ngx_http_kv_aware_fallback_names[] = {
    NGX_HTTP_KV_AWARE_FALLBACKS(NGX_HTTP_KV_AWARE_KEY2)
};


ngx_int_t
ngx_http_kv_aware_prompt_hashes(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx)
{
    off_t                      len;
    size_t                     max_blocks, nblocks;
    u_char                    *body, *out;
    ngx_buf_t                 *b;
    kva_prompt_t               prompt;
    kva_prompt_rc_e            rc;
    ngx_http_request_body_t   *rb;

    rb = r->request_body;

    if (r->request_body_no_buffering) {
        ctx->fallback = NGX_HTTP_KV_AWARE_UNBUFFERED;
        return NGX_DECLINED;
    }

    if (rb == NULL || rb->bufs == NULL) {
        ctx->fallback = NGX_HTTP_KV_AWARE_NO_BODY;
        return NGX_DECLINED;
    }

    len = ngx_http_kv_aware_body_size(rb->bufs, &b);

    if (len == 0) {
        ctx->fallback = NGX_HTTP_KV_AWARE_NO_BODY;
        return NGX_DECLINED;
    }

    if ((size_t) len > kcf->max_body) {
        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "kv_aware: body of %O bytes over max_body %uz",
                       len, kcf->max_body);
        ctx->fallback = NGX_HTTP_KV_AWARE_TOO_LARGE;
        return NGX_DECLINED;
    }

    if (b && ngx_buf_in_memory(b)) {
        /* one buffer holds it all: read it in place */
        body = b->pos;

    } else {
        body = ngx_http_kv_aware_read_body(r, (size_t) len, &ctx->fallback);
        if (body == NULL) {
            return NGX_DECLINED;
        }
    }

    max_blocks = kva_hash_body_max((size_t) len, kcf->block_size);

    out = ngx_pnalloc(r->pool, len + KVA_PROMPT_OUT_SLACK);

    if (max_blocks) {
        ctx->hashes = ngx_palloc(r->pool, max_blocks * sizeof(uint64_t));
        ctx->found = ngx_palloc(r->pool, max_blocks * sizeof(uint32_t));
    }

    if (out == NULL
        || (max_blocks && (ctx->hashes == NULL || ctx->found == NULL)))
    {
        ctx->fallback = NGX_HTTP_KV_AWARE_NO_MEMORY;
        return NGX_DECLINED;
    }

    rc = kva_hash_body(body, len, kcf->block_size, out, ctx->hashes,
                       &nblocks, &prompt);

    ngx_pfree(r->pool, out);

    if (b == NULL || body != b->pos) {
        ngx_pfree(r->pool, body);
    }

    switch (rc) {

    case KVA_PROMPT_OK:
        break;

    case KVA_PROMPT_BAD_UTF8:
        ctx->fallback = NGX_HTTP_KV_AWARE_BAD_UTF8;
        break;

    case KVA_PROMPT_TOO_DEEP:
        ctx->fallback = NGX_HTTP_KV_AWARE_TOO_DEEP;
        break;

    case KVA_PROMPT_NO_PROMPT:
        ctx->fallback = NGX_HTTP_KV_AWARE_NO_PROMPT;
        break;

    case KVA_PROMPT_EMPTY:
        ctx->fallback = NGX_HTTP_KV_AWARE_NO_BODY;
        break;

    default:
        ctx->fallback = NGX_HTTP_KV_AWARE_NOT_JSON;
        break;
    }

    if (rc != KVA_PROMPT_OK) {
        /* a client fault, not ours: routed by load, proxied as it came */
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "kv_aware: routing by load, request body: %s",
                      kva_prompt_strerror(rc));
        return NGX_DECLINED;
    }

    ctx->nblocks = (uint32_t) nblocks;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "kv_aware: prompt of %uz bytes, %uD blocks%s",
                   prompt.out_len, ctx->nblocks,
                   prompt.truncated ? ", truncated" : "");

    return NGX_OK;
}


/*
 * The bytes of the body, and in *only the buffer holding them all when
 * there is one.  Chunked and HTTP/2 bodies end with an empty special
 * buffer that is neither in memory nor in a file: it counts for nothing.
 */
static off_t
ngx_http_kv_aware_body_size(ngx_chain_t *bufs, ngx_buf_t **only)
{
    off_t         len, size;
    ngx_uint_t    n;
    ngx_chain_t  *cl;

    len = 0;
    n = 0;
    *only = NULL;

    for (cl = bufs; cl; cl = cl->next) {
        if (ngx_buf_in_memory(cl->buf)) {
            size = cl->buf->last - cl->buf->pos;

        } else if (cl->buf->in_file) {
            size = cl->buf->file_last - cl->buf->file_pos;

        } else {
            continue;
        }

        if (size) {
            len += size;
            *only = cl->buf;
            n++;
        }
    }

    if (n != 1) {
        *only = NULL;
    }

    return len;
}


/* one contiguous copy of a body spread over buffers and a temp file */
static u_char *
ngx_http_kv_aware_read_body(ngx_http_request_t *r, size_t len,
    ngx_http_kv_aware_fallback_e *fallback)
{
    u_char       *body, *p;
    size_t        size;
    ssize_t       n;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    body = ngx_pnalloc(r->pool, len);
    if (body == NULL) {
        *fallback = NGX_HTTP_KV_AWARE_NO_MEMORY;
        return NULL;
    }

    p = body;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;

        if (ngx_buf_in_memory(b)) {
            p = ngx_cpymem(p, b->pos, b->last - b->pos);
            continue;
        }

        if (!b->in_file || b->file == NULL || b->file_last == b->file_pos) {
            continue;
        }

        size = (size_t) (b->file_last - b->file_pos);

        /*
         * A synchronous read, as nginx's own ngx_output_chain() reads the
         * same temp file when proxy sends it on with aio off: the file is
         * local, this worker has just written it (so it is in the page
         * cache), and max_body bounds the read.  Threads or aio would add
         * a second wait to every long prompt for no gain.
         */
        n = ngx_read_file(b->file, p, size, b->file_pos);

        if (n != (ssize_t) size) {
            ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                          "kv_aware: routing by load, cannot read "
                          "request body from \"%V\"", &b->file->name);
            ngx_pfree(r->pool, body);
            *fallback = NGX_HTTP_KV_AWARE_FILE_ERROR;
            return NULL;
        }

        p += n;
    }

    return body;
}
