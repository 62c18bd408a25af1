/*
 * ngx_http_kv_aware_module: kv_aware_status, a view of every kv_aware
 * upstream: the index, each server's event sync state and counters, the
 * Redis link and routing statistics.  JSON, or the Prometheus text format
 * (ngx_http_kv_aware_prometheus.c), chosen by the directive or the request.
 */

#include "ngx_http_kv_aware_module.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_prompt.h"
#include "ngx_http_kv_aware_redis.h"
#include "ngx_http_kv_aware_events.h"
#include "ngx_http_kv_aware_share.h"
#include "ngx_http_kv_aware_members.h"
#include "ngx_http_kv_aware_status.h"
#include "ngx_http_kv_aware_prometheus.h"


#define NGX_HTTP_KV_AWARE_STATUS_UPSTREAM  2048
#define NGX_HTTP_KV_AWARE_STATUS_SERVER    768
#define NGX_HTTP_KV_AWARE_STATUS_CHECK     128


typedef enum {
    NGX_HTTP_KV_AWARE_FORMAT_AUTO = 0,    /* JSON, unless asked otherwise */
    NGX_HTTP_KV_AWARE_FORMAT_JSON,
    NGX_HTTP_KV_AWARE_FORMAT_PROMETHEUS
} ngx_http_kv_aware_format_e;


static ngx_int_t ngx_http_kv_aware_status_auto(ngx_http_request_t *r);
static ngx_int_t ngx_http_kv_aware_status_json(ngx_http_request_t *r);
static ngx_int_t ngx_http_kv_aware_status_prometheus(ngx_http_request_t *r);
static ngx_int_t ngx_http_kv_aware_status_handler(ngx_http_request_t *r,
    ngx_http_kv_aware_format_e format);
static ngx_int_t ngx_http_kv_aware_status_format(ngx_http_request_t *r,
    ngx_http_kv_aware_format_e format);
static ngx_uint_t ngx_http_kv_aware_status_accepts(ngx_http_request_t *r);
static ngx_buf_t *ngx_http_kv_aware_status_page(ngx_http_request_t *r);
static u_char *ngx_http_kv_aware_status_upstream(u_char *p,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_str_t *name, ngx_uint_t check);
static ngx_uint_t ngx_http_kv_aware_status_check_arg(ngx_http_request_t *r);


/* kv_aware_status [json|prometheus]: a handler per format, no conf */
char *
ngx_http_kv_aware_status_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_str_t                 *value;
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (clcf->handler == ngx_http_kv_aware_status_auto
        || clcf->handler == ngx_http_kv_aware_status_json
        || clcf->handler == ngx_http_kv_aware_status_prometheus)
    {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (cf->args->nelts == 1) {
        clcf->handler = ngx_http_kv_aware_status_auto;

    } else if (ngx_strcmp(value[1].data, "json") == 0) {
        clcf->handler = ngx_http_kv_aware_status_json;

    } else if (ngx_strcmp(value[1].data, "prometheus") == 0) {
        clcf->handler = ngx_http_kv_aware_status_prometheus;

    } else {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%V: invalid format \"%V\", expected \"json\" "
                           "or \"prometheus\"", &value[0], &value[1]);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_kv_aware_status_auto(ngx_http_request_t *r)
{
    return ngx_http_kv_aware_status_handler(r, NGX_HTTP_KV_AWARE_FORMAT_AUTO);
}


static ngx_int_t
ngx_http_kv_aware_status_json(ngx_http_request_t *r)
{
    return ngx_http_kv_aware_status_handler(r, NGX_HTTP_KV_AWARE_FORMAT_JSON);
}


static ngx_int_t
ngx_http_kv_aware_status_prometheus(ngx_http_request_t *r)
{
    return ngx_http_kv_aware_status_handler(r,
                                       NGX_HTTP_KV_AWARE_FORMAT_PROMETHEUS);
}


static ngx_int_t
ngx_http_kv_aware_status_handler(ngx_http_request_t *r,
    ngx_http_kv_aware_format_e format)
{
    ngx_int_t     rc;
    ngx_buf_t    *b;
    ngx_chain_t   out;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    rc = ngx_http_kv_aware_status_format(r, format);

    if (rc == NGX_ERROR) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "kv_aware_status: unknown format in \"%V\", "
                      "expected json or prometheus", &r->args);
        return NGX_HTTP_BAD_REQUEST;
    }

    if (rc == NGX_HTTP_KV_AWARE_FORMAT_PROMETHEUS) {
        b = ngx_http_kv_aware_prometheus(r);
        ngx_str_set(&r->headers_out.content_type,
                    NGX_HTTP_KV_AWARE_PROMETHEUS_TYPE);

    } else {
        b = ngx_http_kv_aware_status_page(r);
        ngx_str_set(&r->headers_out.content_type, "application/json");
    }

    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = b->last - b->pos;
    r->headers_out.content_type_len = r->headers_out.content_type.len;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


/*
 * The request chooses first: ?format=json|prometheus, or a URI that ends
 * in /format/json or /format/prometheus (nginx-module-vts' spelling).
 * Then the directive's argument; without one, a scraper that asks for
 * the Prometheus text format or OpenMetrics in Accept gets Prometheus',
 * anyone else JSON.
 */
static ngx_int_t
ngx_http_kv_aware_status_format(ngx_http_request_t *r,
    ngx_http_kv_aware_format_e format)
{
    ngx_str_t  value;

    if (ngx_http_arg(r, (u_char *) "format", sizeof("format") - 1, &value)
        == NGX_OK)
    {
        if (value.len == sizeof("json") - 1
            && ngx_strncmp(value.data, "json", value.len) == 0)
        {
            return NGX_HTTP_KV_AWARE_FORMAT_JSON;
        }

        if (value.len == sizeof("prometheus") - 1
            && ngx_strncmp(value.data, "prometheus", value.len) == 0)
        {
            return NGX_HTTP_KV_AWARE_FORMAT_PROMETHEUS;
        }

        return NGX_ERROR;
    }

    value.len = sizeof("/format/prometheus") - 1;

    if (r->uri.len >= value.len
        && ngx_strncmp(r->uri.data + r->uri.len - value.len,
                       "/format/prometheus", value.len) == 0)
    {
        return NGX_HTTP_KV_AWARE_FORMAT_PROMETHEUS;
    }

    value.len = sizeof("/format/json") - 1;

    if (r->uri.len >= value.len
        && ngx_strncmp(r->uri.data + r->uri.len - value.len,
                       "/format/json", value.len) == 0)
    {
        return NGX_HTTP_KV_AWARE_FORMAT_JSON;
    }

    if (format != NGX_HTTP_KV_AWARE_FORMAT_AUTO) {
        return format;
    }

    return ngx_http_kv_aware_status_accepts(r)
           ? NGX_HTTP_KV_AWARE_FORMAT_PROMETHEUS
           : NGX_HTTP_KV_AWARE_FORMAT_JSON;
}


/*
 * Prometheus' scraper sends "Accept: application/openmetrics-text;...,
 * text/plain;version=0.0.4;q=0.5" and any type at q=0.1; a browser or
 * curl names neither.  headers_in.accept exists only in some builds, so
 * the header is looked up in the list.
 */
static ngx_uint_t
ngx_http_kv_aware_status_accepts(ngx_http_request_t *r)
{
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len != sizeof("Accept") - 1
            || ngx_strncasecmp(h[i].key.data, (u_char *) "Accept",
                               sizeof("Accept") - 1) != 0)
        {
            continue;
        }

        if (ngx_strlcasestrn(h[i].value.data, h[i].value.data + h[i].value.len,
                             (u_char *) "openmetrics-text",
                             sizeof("openmetrics-text") - 2)
            != NULL
            || ngx_strlcasestrn(h[i].value.data,
                                h[i].value.data + h[i].value.len,
                                (u_char *) "version=0.0.4",
                                sizeof("version=0.0.4") - 2)
               != NULL)
        {
            return 1;
        }
    }

    return 0;
}


/* the JSON page, its size bounded before it is written */
static ngx_buf_t *
ngx_http_kv_aware_status_page(ngx_http_request_t *r)
{
    size_t                          size;
    u_char                         *p;
    ngx_buf_t                      *b;
    ngx_uint_t                      i, first, check;
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_upstream_srv_conf_t  **uscfp;
    ngx_http_upstream_main_conf_t  *umcf;

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
        return NULL;
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

    return b;
}


/*
 * Index entries per slot and source: a whole-index scan, a chunk per
 * hold of the lock, so that however often the page is asked for, routing
 * waits for one chunk at most.
 */
void
ngx_http_kv_aware_status_count(ngx_http_kv_aware_srv_conf_t *kcf,
    kva_slot_count_t counts[KVA_MAX_SLOTS])
{
    uint32_t      from;
    kva_clock_t   clk;
    kva_index_t  *ix;

    ix = kcf->sh->index;

    ngx_http_kv_aware_clock(kcf, &clk);

    ngx_memzero(counts, KVA_MAX_SLOTS * sizeof(kva_slot_count_t));
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
    ngx_uint_t                   i, n, s, state, why;
    kva_index_t                 *ix;
    kva_slot_count_t             counts[KVA_MAX_SLOTS];
    ngx_http_kv_aware_slot_t    *sl;
    ngx_http_kv_aware_shctx_t   *sh;
    ngx_http_kv_aware_share_t   *sr;

    sh = kcf->sh;
    ix = sh->index;

    ngx_http_kv_aware_status_count(kcf, counts);

    *p++ = '"';
    p = (u_char *) ngx_escape_json(p, name->data, name->len);

    p = ngx_sprintf(p, "\":{\"requests\":%uA,\"routed\":{\"%s\":%uA,"
                    "\"%s\":%uA,\"%s\":%uA,\"%s\":%uA},\"tokenized\":%uA,"
                    "\"fallbacks\":%uA,\"fallback\":{",
                    sh->routing.requests,
                    kva_score_why(KVA_WHY_AFFINITY),
                    sh->routing.chosen[KVA_WHY_AFFINITY],
                    kva_score_why(KVA_WHY_LOAD), sh->routing.chosen[KVA_WHY_LOAD],
                    kva_score_why(KVA_WHY_GATE), sh->routing.chosen[KVA_WHY_GATE],
                    kva_score_why(KVA_WHY_CAPACITY),
                    sh->routing.chosen[KVA_WHY_CAPACITY],
                    sh->routing.tokenized, sh->routing.fallbacks);

    for (why = NGX_HTTP_KV_AWARE_ROUTED + 1;
         why < NGX_HTTP_KV_AWARE_FALLBACK_LAST;
         why++)
    {
        p = ngx_sprintf(p, "%s\"%s\":%uA",
                        why == NGX_HTTP_KV_AWARE_ROUTED + 1 ? "" : ",",
                        ngx_http_kv_aware_fallback_names[why],
                        sh->routing.fallback[why]);
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
                        sh->events.messages, sh->events.hashes, sh->events.resyncs);

        for (why = 0; why < NGX_HTTP_KV_AWARE_REJ_LAST; why++) {
            p = ngx_sprintf(p, "%s\"%s\":%uA", why ? "," : "",
                            ngx_http_kv_aware_reject_keys[why],
                            sh->events.rejected[why]);
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
                        ngx_http_kv_aware_ev_state_names[sl->ev.state],
                        sl->ev.seq, counts[s].entries[KVA_SRC_EVENT],
                        counts[s].entries[KVA_SRC_LEARNED],
                        counts[s].entries[KVA_SRC_SPEC],
                        sl->ev.messages, sl->ev.hashes, sl->ev.gaps);

        if (sl->ev.has_load) {
            p = ngx_sprintf(p, "\"load\":{\"waiting\":%uD,\"running\":%uD,"
                            "\"kv_usage\":%uD.%03uD},",
                            sl->ev.waiting, sl->ev.running,
                            sl->ev.kv_usage / 1000, sl->ev.kv_usage % 1000);
        }

        p = ngx_sprintf(p, "\"in_flight\":%A,\"routed\":%uA,"
                        "\"blocks\":%uA,\"matched\":%uA}",
                        (ngx_atomic_int_t) kcf->load[s].reqs, sl->routing.routed,
                        sl->routing.blocks, sl->routing.matched);
    }

    return ngx_cpymem(p, "]}", 2);
}
