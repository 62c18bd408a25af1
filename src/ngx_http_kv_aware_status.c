/*
 * ngx_http_kv_aware_module: kv_aware_status, a JSON view of every
 * kv_aware upstream: the index, each server's event sync state and
 * counters, the Redis link and routing statistics.
 */

#include "ngx_http_kv_aware_module.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_prompt.h"
#include "ngx_http_kv_aware_redis.h"
#include "ngx_http_kv_aware_events.h"
#include "ngx_http_kv_aware_share.h"
#include "ngx_http_kv_aware_members.h"
#include "ngx_http_kv_aware_status.h"


#define NGX_HTTP_KV_AWARE_STATUS_UPSTREAM  2048
#define NGX_HTTP_KV_AWARE_STATUS_SERVER    768
#define NGX_HTTP_KV_AWARE_STATUS_CHECK     128


static ngx_int_t ngx_http_kv_aware_status_handler(ngx_http_request_t *r);
static u_char *ngx_http_kv_aware_status_upstream(u_char *p,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_str_t *name, ngx_uint_t check);
static ngx_uint_t ngx_http_kv_aware_status_check_arg(ngx_http_request_t *r);




char *
ngx_http_kv_aware_status_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_kv_aware_status_handler;

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_kv_aware_status_handler(ngx_http_request_t *r)
{
    size_t                          size;
    u_char                         *p;
    ngx_int_t                       rc;
    ngx_buf_t                      *b;
    ngx_uint_t                      i, first, check;
    ngx_chain_t                     out;
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_upstream_srv_conf_t  **uscfp;
    ngx_http_upstream_main_conf_t  *umcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    umcf = ngx_http_get_module_main_conf(r, ngx_http_upstream_module);
    uscfp = umcf->upstreams.elts;

    check = ngx_http_kv_aware_status_check_arg(r);

    size = sizeof("{\"upstreams\":{}}\n");

    for (i = 0; i < umcf->upstreams.nelts; i++) {
        if (uscfp[i]->srv_conf == NULL) {
            continue;   /* an implicit upstream of a proxy_pass URL */
        }

        kcf = ngx_http_conf_upstream_srv_conf(uscfp[i],
                                              ngx_http_kv_aware_module);

        if (kcf->shm_zone) {
            /* escaped, a byte can take six: \u00XX */
            size += NGX_HTTP_KV_AWARE_STATUS_UPSTREAM + uscfp[i]->host.len
                    + ngx_escape_json(NULL, uscfp[i]->host.data,
                                      uscfp[i]->host.len)
                    + KVA_MAX_SLOTS * NGX_HTTP_KV_AWARE_STATUS_SERVER
                    + (check ? NGX_HTTP_KV_AWARE_STATUS_CHECK : 0);
        }
    }

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = ngx_cpymem(b->last, "{\"upstreams\":{",
                   sizeof("{\"upstreams\":{") - 1);
    first = 1;

    for (i = 0; i < umcf->upstreams.nelts; i++) {
        if (uscfp[i]->srv_conf == NULL) {
            continue;
        }

        kcf = ngx_http_conf_upstream_srv_conf(uscfp[i],
                                              ngx_http_kv_aware_module);

        if (kcf->shm_zone == NULL || kcf->sh == NULL) {
            continue;
        }

        if (!first) {
            *p++ = ',';
        }

        first = 0;
        p = ngx_http_kv_aware_status_upstream(p, kcf, &uscfp[i]->host,
                                              check);
    }

    p = ngx_cpymem(p, "}}\n", 3);
    b->last = p;
    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = b->last - b->pos;
    ngx_str_set(&r->headers_out.content_type, "application/json");
    r->headers_out.content_type_len = r->headers_out.content_type.len;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


/* "check" among the arguments, with or without a value */
static ngx_uint_t
ngx_http_kv_aware_status_check_arg(ngx_http_request_t *r)
{
    u_char  *p, *end, *arg;

    if (r->args.len == 0) {
        return 0;       /* no arguments: args.data may be NULL */
    }

    p = r->args.data;
    end = p + r->args.len;

    while (p < end) {
        arg = p;

        while (p < end && *p != '&') {
            p++;
        }

        if (p - arg >= 5 && ngx_strncmp(arg, "check", 5) == 0
            && (p - arg == 5 || arg[5] == '='))
        {
            return 1;
        }

        p++;
    }

    return 0;
}


static u_char *
ngx_http_kv_aware_status_upstream(u_char *p,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_str_t *name, ngx_uint_t check)
{
    int                          rc;
    char                         err[NGX_HTTP_KV_AWARE_STATUS_CHECK / 2];
    uint32_t                     from;
    ngx_uint_t                   i, n, s, state, why;
    kva_clock_t                  clk;
    kva_index_t                 *ix;
    kva_slot_count_t             counts[KVA_MAX_SLOTS];
    ngx_http_kv_aware_slot_t    *sl;
    ngx_http_kv_aware_shctx_t   *sh;
    ngx_http_kv_aware_share_t   *sr;

    sh = kcf->sh;
    ix = sh->index;

    ngx_http_kv_aware_clock(kcf, &clk);

    /*
     * A whole-index scan, a chunk per hold of the lock: however often the
     * page is asked for, routing waits for one chunk at most.
     */
    ngx_memzero(counts, sizeof(counts));
    from = 0;

    for ( ;; ) {
        ngx_shmtx_lock(&kcf->shpool->mutex);

        if (from >= ix->high_water) {
            ngx_shmtx_unlock(&kcf->shpool->mutex);
            break;
        }

        from = kva_index_count_range(ix, &clk, from, from + KVA_SCAN_CHUNK,
                                     counts);

        ngx_shmtx_unlock(&kcf->shpool->mutex);
    }

    *p++ = '"';
    p = (u_char *) ngx_escape_json(p, name->data, name->len);

    p = ngx_sprintf(p, "\":{\"requests\":%uA,\"fallbacks\":%uA,"
                    "\"fallback\":{", sh->requests, sh->fallbacks);

    for (why = NGX_HTTP_KV_AWARE_ROUTED + 1;
         why < NGX_HTTP_KV_AWARE_FALLBACK_LAST;
         why++)
    {
        p = ngx_sprintf(p, "%s\"%s\":%uA",
                        why == NGX_HTTP_KV_AWARE_ROUTED + 1 ? "" : ",",
                        ngx_http_kv_aware_fallback_names[why],
                        sh->fallback[why]);
    }

    p = ngx_sprintf(p, "},\"index\":{\"capacity\":%uD,\"used\":%uD,"
                    "\"evictions\":%uL,\"chain_evictions\":%uL",
                    ix->capacity, ix->used, (uint64_t) ix->evictions,
                    (uint64_t) ix->chain_evictions);

    if (check) {
        /*
         * A diagnostic: one whole scan of the index under the lock (tens
         * of milliseconds at a million entries), routing waits meanwhile.
         */
        ngx_shmtx_lock(&kcf->shpool->mutex);
        rc = kva_index_check(ix, err, sizeof(err));
        ngx_shmtx_unlock(&kcf->shpool->mutex);

        p = ngx_cpymem(p, ",\"check\":\"", sizeof(",\"check\":\"") - 1);

        if (rc == 0) {
            p = ngx_cpymem(p, "ok", 2);

        } else {
            p = (u_char *) ngx_escape_json(p, (u_char *) err,
                                           ngx_strlen(err));
        }

        *p++ = '"';
    }

    p = ngx_cpymem(p, "},", 2);

    if (kcf->events) {
        state = sh->redis.state;

        p = ngx_sprintf(p, "\"redis\":{\"address\":\"%V\",\"state\":\"%s\","
                        "\"connects\":%uA,\"failures\":%uA},"
                        "\"events\":{\"messages\":%uA,\"hashes\":%uA,"
                        "\"resyncs\":%uA,\"rejected\":{",
                        &kcf->events->link.addr_text,
                        ngx_http_kv_aware_redis_state_names[state],
                        sh->redis.connects, sh->redis.failures,
                        sh->ev_messages, sh->ev_hashes, sh->resyncs);

        for (why = 0; why < NGX_HTTP_KV_AWARE_REJ_LAST; why++) {
            p = ngx_sprintf(p, "%s\"%s\":%uA", why ? "," : "",
                            ngx_http_kv_aware_reject_keys[why],
                            sh->ev_rejected[why]);
        }

        p = ngx_cpymem(p, "}},", 3);

        if (kcf->events->share) {
            sr = sh->share;
            p = ngx_sprintf(p, "\"share\":{\"sent\":%uA,\"received\":%uA,"
                            "\"dropped\":%uA,\"refused\":%uA,"
                            "\"messages_out\":%uA,\"messages_in\":%uA},",
                            sr->sent, sr->received, sr->dropped, sr->refused,
                            sr->messages_out, sr->messages_in);
        }
    }

    p = ngx_cpymem(p, "\"servers\":[", sizeof("\"servers\":[") - 1);

    /* the servers as they are now; a data-parallel one a rank at a time */
    if (kcf->dynamic) {
        ngx_http_kv_aware_members_sync(kcf);
    }

    n = kcf->npeers * kcf->data_parallel;

    for (i = 0; i < n; i++) {
        s = kcf->slot_of[i];
        sl = &sh->slots[s];

        p = ngx_sprintf(p, "%s{\"name\":\"", i ? "," : "");
        p = (u_char *) ngx_escape_json(p, sl->name, sl->name_len);
        p = ngx_cpymem(p, "\",", 2);

        if (kcf->data_parallel > 1) {
            p = ngx_sprintf(p, "\"rank\":%ui,", sl->rank);
        }

        p = ngx_sprintf(p, "\"backup\":%s,"
                        "\"state\":\"%s\",\"seq\":%uL,"
                        "\"entries\":{\"event\":%uL,\"learned\":%uL,"
                        "\"speculative\":%uL},"
                        "\"events\":{\"messages\":%uA,\"hashes\":%uA,"
                        "\"gaps\":%uA},",
                        i / kcf->data_parallel >= kcf->nprimary
                        ? "true" : "false",
                        ngx_http_kv_aware_ev_state_names[sl->ev_state],
                        sl->ev_seq, counts[s].entries[KVA_SRC_EVENT],
                        counts[s].entries[KVA_SRC_LEARNED],
                        counts[s].entries[KVA_SRC_SPEC],
                        sl->ev_messages, sl->ev_hashes, sl->ev_gaps);

        if (sl->ev_has_load) {
            p = ngx_sprintf(p, "\"load\":{\"waiting\":%uD,\"running\":%uD,"
                            "\"kv_usage\":%uD.%03uD},",
                            sl->ev_waiting, sl->ev_running,
                            sl->ev_kv_usage / 1000, sl->ev_kv_usage % 1000);
        }

        p = ngx_sprintf(p, "\"in_flight\":%A,\"routed\":%uA,"
                        "\"blocks\":%uA,\"matched\":%uA}",
                        (ngx_atomic_int_t) kcf->load[s].reqs, sl->routed,
                        sl->blocks, sl->matched);
    }

    return ngx_cpymem(p, "]}", 2);
}
