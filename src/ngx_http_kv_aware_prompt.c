/*
 * ngx_http_kv_aware_module: request body -> prompt block hashes.
 *
 * Runs in the peer init, after proxy has read the whole body (request
 * buffering on).  The body may sit in one buffer, several, or a temp file.
 * Nothing here changes what is sent upstream: we read copies or in place.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_prompt.h"

#include "kva_keys.h"


static ngx_int_t ngx_http_kv_aware_text_hashes(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx,
    u_char *body, size_t len);
static ngx_int_t ngx_http_kv_aware_split_hashes(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx);
static ngx_int_t ngx_http_kv_aware_token_hashes(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx,
    u_char *body, size_t len);
static ngx_int_t ngx_http_kv_aware_hash_arrays(ngx_http_request_t *r,
    ngx_http_kv_aware_ctx_t *ctx, size_t max_blocks);
static ngx_int_t ngx_http_kv_aware_prompt_failed(ngx_http_request_t *r,
    ngx_http_kv_aware_ctx_t *ctx, kva_prompt_rc_e rc);
static off_t ngx_http_kv_aware_body_size(ngx_chain_t *bufs,
    ngx_buf_t **only);
static u_char *ngx_http_kv_aware_read_body(ngx_http_request_t *r,
    size_t len, ngx_http_kv_aware_fallback_e *fallback);


const char  *ngx_http_kv_aware_prompt_fallback_names[] = {
    NGX_HTTP_KV_AWARE_FALLBACKS(NGX_HTTP_KV_AWARE_KEY2)
};

/* a body the core refused: the fallback it counts under */
static const ngx_http_kv_aware_rc_map_t  ngx_http_kv_aware_body_fallback[] = {
    { KVA_PROMPT_BAD_UTF8, NGX_HTTP_KV_AWARE_BAD_UTF8 },
    { KVA_PROMPT_TOO_DEEP, NGX_HTTP_KV_AWARE_TOO_DEEP },
    { KVA_PROMPT_NO_PROMPT, NGX_HTTP_KV_AWARE_NO_PROMPT },
    { KVA_PROMPT_EMPTY, NGX_HTTP_KV_AWARE_NO_BODY }
};


ngx_int_t
ngx_http_kv_aware_prompt_hashes(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx)
{
    size_t      len;
    u_char     *body;
    ngx_int_t   rc;
    ngx_uint_t  copied;

    if (kcf->keys != NGX_HTTP_KV_AWARE_KEYS_TOKENS) {
        rc = ngx_http_kv_aware_split_hashes(r, kcf, ctx);

        if (rc != NGX_AGAIN) {
            return rc;
        }
    }

    body = ngx_http_kv_aware_prompt_request_body(r, kcf->max_body, &len,
                                                 &copied, &ctx->fallback);
    if (body == NULL) {
        return NGX_DECLINED;
    }

    if (kcf->keys == NGX_HTTP_KV_AWARE_KEYS_TOKENS) {
        rc = ngx_http_kv_aware_token_hashes(r, kcf, ctx, body, len);

    } else {
        rc = ngx_http_kv_aware_text_hashes(r, kcf, ctx, body, len);
    }

    if (copied) {
        ngx_pfree(r->pool, body);
    }

    return rc;
}


/*
 * The whole body in one piece: in place when one buffer holds it, else
 * a copy (*copied).  NULL, and why in *fallback, when there is none to
 * read: not buffered, empty, over max, unreadable.
 */
u_char *
ngx_http_kv_aware_prompt_request_body(ngx_http_request_t *r, size_t max,
    size_t *len, ngx_uint_t *copied, ngx_http_kv_aware_fallback_e *fallback)
{
    off_t                     size;
    ngx_buf_t                *b;
    ngx_http_request_body_t  *rb;

    rb = r->request_body;
    *copied = 0;

    if (r->request_body_no_buffering) {
        *fallback = NGX_HTTP_KV_AWARE_UNBUFFERED;
        return NULL;
    }

    if (rb == NULL || rb->bufs == NULL) {
        *fallback = NGX_HTTP_KV_AWARE_NO_BODY;
        return NULL;
    }

    size = ngx_http_kv_aware_body_size(rb->bufs, &b);

    if (size == 0) {
        *fallback = NGX_HTTP_KV_AWARE_NO_BODY;
        return NULL;
    }

    if ((size_t) size > max) {
        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "kv_aware: body of %O bytes over max_body %uz",
                       size, max);
        *fallback = NGX_HTTP_KV_AWARE_TOO_LARGE;
        return NULL;
    }

    *len = (size_t) size;

    if (b && ngx_buf_in_memory(b)) {
        /* one buffer holds it all: read it in place */
        return b->pos;
    }

    *copied = 1;

    return ngx_http_kv_aware_read_body(r, (size_t) size, fallback);
}


static ngx_int_t
ngx_http_kv_aware_text_hashes(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx,
    u_char *body, size_t len)
{
    size_t            max_blocks, nblocks;
    kva_prompt_t      prompt;
    kva_prompt_rc_e   rc;

    max_blocks = kva_hash_body_max(len, kcf->block_size);

    if (ngx_http_kv_aware_hash_arrays(r, ctx, max_blocks) != NGX_OK) {
        return NGX_DECLINED;
    }

    /* hashed as it is scanned: the canonical prompt is never written */
    rc = kva_hash_body(body, len, kcf->block_size, NULL, ctx->hashes,
                       &nblocks, &prompt);

    if (rc != KVA_PROMPT_OK) {
        return ngx_http_kv_aware_prompt_failed(r, ctx, rc);
    }

    ctx->nblocks = (uint32_t) nblocks;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "kv_aware: prompt of %uz bytes, %uD blocks",
                   prompt.len, ctx->nblocks);

    return NGX_OK;
}


/*
 * A body in exactly two memory buffers, which is how nginx holds one that
 * did not arrive with its headers: the part read with them, then the
 * rest.  Hashed where it lies (kva_hash_body2()), without the copy that
 * joining them costs (a 32 KB copy for an 8k-token prompt).  NGX_AGAIN:
 * another layout, or a number across the seam; the caller joins the body.
 */
static ngx_int_t
ngx_http_kv_aware_split_hashes(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx)
{
    size_t                    size[2], max_blocks, nblocks;
    u_char                   *win;
    ngx_buf_t                *b, *part[2];
    ngx_uint_t                n;
    ngx_chain_t              *cl;
    kva_prompt_t              prompt;
    kva_prompt_rc_e           rc;
    ngx_http_request_body_t  *rb;

    rb = r->request_body;

    if (r->request_body_no_buffering || rb == NULL) {
        return NGX_AGAIN;
    }

    n = 0;

    for (cl = rb->bufs; cl; cl = cl->next) {
        b = cl->buf;

        if (b->in_file) {
            return NGX_AGAIN;
        }

        if (!ngx_buf_in_memory(b) || b->last == b->pos) {
            continue;
        }

        if (n == 2) {
            return NGX_AGAIN;
        }

        part[n] = b;
        size[n] = (size_t) (b->last - b->pos);
        n++;
    }

    if (n != 2 || size[0] + size[1] > kcf->max_body) {
        return NGX_AGAIN;
    }

    max_blocks = kva_hash_body_max(size[0] + size[1], kcf->block_size);

    win = ngx_pnalloc(r->pool, size[0] + KVA_HASH_SEAM);
    if (win == NULL) {
        ctx->fallback = NGX_HTTP_KV_AWARE_NO_MEMORY;
        return NGX_DECLINED;
    }

    if (ngx_http_kv_aware_hash_arrays(r, ctx, max_blocks) != NGX_OK) {
        return NGX_DECLINED;
    }

    rc = kva_hash_body2(part[0]->pos, size[0], part[1]->pos, size[1],
                        kcf->block_size, win, ctx->hashes, &nblocks,
                        &prompt);

    ngx_pfree(r->pool, win);

    if (rc == KVA_PROMPT_SEAM) {
        return NGX_AGAIN;
    }

    if (rc != KVA_PROMPT_OK) {
        return ngx_http_kv_aware_prompt_failed(r, ctx, rc);
    }

    ctx->nblocks = (uint32_t) nblocks;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "kv_aware: prompt of %uz bytes in two buffers, %uD "
                   "blocks, the first buffer %uz bytes",
                   prompt.len, ctx->nblocks, size[0]);

    return NGX_OK;
}


/*
 * keys=tokens: the body's own token ids, or else the tokenizer's (ctx->ids),
 * keyed as the engines' blocks are; with neither, the text keys, so that
 * what this nginx learned keeps routing while no tokens come
 * (kva_token_body() in kva_keys.h).
 */
static ngx_int_t
ngx_http_kv_aware_token_hashes(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx,
    u_char *body, size_t len)
{
    size_t             max_blocks;
    u_char            *scratch;
    kva_prompt_rc_e    rc;
    kva_token_body_t   tb;

    tb.block_size = kcf->block_size;
    tb.block_tokens = kcf->block_tokens;
    tb.model = NULL;
    tb.model_len = 0;

    /* aligned: the body's ids are turned into uint32_t in place */
    scratch = ngx_palloc(r->pool, kva_token_body_scratch(len));
    if (scratch == NULL) {
        ctx->fallback = NGX_HTTP_KV_AWARE_NO_MEMORY;
        return NGX_DECLINED;
    }

    rc = kva_token_body(body, len, scratch, &tb);

    if (rc != KVA_PROMPT_OK) {
        return ngx_http_kv_aware_prompt_failed(r, ctx, rc);
    }

    /* ids asked of a tokenizer meanwhile would be the same or worse */
    if (tb.from_body
        && (ctx->fallback == NGX_HTTP_KV_AWARE_TOKENIZE_FAILED
            || ctx->fallback == NGX_HTTP_KV_AWARE_TOKENIZE_TIMEOUT))
    {
        ctx->fallback = NGX_HTTP_KV_AWARE_ROUTED;
    }

    max_blocks = kva_token_body_max(&tb, ctx->ids, ctx->nids);

    if (tb.ids == NULL && ctx->fallback == NGX_HTTP_KV_AWARE_ROUTED) {
        ctx->fallback = NGX_HTTP_KV_AWARE_NO_TOKENS;
    }

    if (ngx_http_kv_aware_hash_arrays(r, ctx, max_blocks) != NGX_OK) {
        return NGX_DECLINED;
    }

    ctx->nblocks = (uint32_t) kva_token_body_keys(&tb, ctx->hashes,
                                                  max_blocks);

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "kv_aware: prompt of %uz token ids, %uD blocks%s",
                   tb.ids ? tb.nids : 0, ctx->nblocks,
                   tb.ids ? "" : " (text keys)");

    return NGX_OK;
}


/* the one place the keys' and their lookups' arrays are allocated */
static ngx_int_t
ngx_http_kv_aware_hash_arrays(ngx_http_request_t *r,
    ngx_http_kv_aware_ctx_t *ctx, size_t max_blocks)
{
    if (max_blocks == 0) {
        return NGX_OK;
    }

    ctx->hashes = ngx_palloc(r->pool, max_blocks * sizeof(uint64_t));
    ctx->found = ngx_palloc(r->pool, max_blocks * sizeof(uint32_t));

    if (ctx->hashes == NULL || ctx->found == NULL) {
        ctx->fallback = NGX_HTTP_KV_AWARE_NO_MEMORY;
        return NGX_ERROR;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_kv_aware_prompt_failed(ngx_http_request_t *r,
    ngx_http_kv_aware_ctx_t *ctx, kva_prompt_rc_e rc)
{
    ctx->fallback = ngx_http_kv_aware_module_rc_reason(
                        ngx_http_kv_aware_body_fallback,
                        sizeof(ngx_http_kv_aware_body_fallback)
                        / sizeof(ngx_http_kv_aware_rc_map_t),
                        rc, NGX_HTTP_KV_AWARE_NOT_JSON);

    /* a client fault, not ours: routed by load, proxied as it came */
    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                  "kv_aware: routing by load, request body: %s",
                  kva_prompt_strerror(rc));

    return NGX_DECLINED;
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
