/*
 * ngx_http_kv_aware_module: kv_aware_status, a view of every kv_aware
 * upstream: the index, each server's event sync state and counters, the
 * Redis link and routing statistics.  This file is the handler and the
 * choice of format; the state is read in one place
 * (ngx_http_kv_aware_status_snapshot.c) and rendered as JSON
 * (ngx_http_kv_aware_status_json.c) or in the Prometheus text format
 * (ngx_http_kv_aware_prometheus.c).
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_status.h"
#include "ngx_http_kv_aware_status_snapshot.h"
#include "ngx_http_kv_aware_status_json.h"
#include "ngx_http_kv_aware_prometheus.h"


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
static ngx_uint_t ngx_http_kv_aware_status_check_arg(ngx_http_request_t *r);
static ngx_int_t ngx_http_kv_aware_status_page(ngx_http_request_t *r,
    ngx_http_kv_aware_status_t *st);
static void ngx_http_kv_aware_status_only(
    ngx_http_kv_aware_status_upstream_t *u, ngx_str_t *name);


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
    ngx_int_t                    rc;
    ngx_buf_t                   *b;
    ngx_chain_t                  out;
    ngx_http_kv_aware_status_t   st;

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

    /* ?check, a whole-index diagnostic, is the JSON page's alone */
    if (ngx_http_kv_aware_status_snapshot(r,
                          rc == NGX_HTTP_KV_AWARE_FORMAT_JSON
                          && ngx_http_kv_aware_status_check_arg(r), &st)
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_kv_aware_status_page(r, &st) != NGX_OK) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "kv_aware_status: invalid offset, limit or ranks in "
                      "\"%V\", expected numbers and ranks=all", &r->args);
        return NGX_HTTP_BAD_REQUEST;
    }

    if (rc == NGX_HTTP_KV_AWARE_FORMAT_PROMETHEUS) {
        b = ngx_http_kv_aware_prometheus(r, &st);
        ngx_str_set(&r->headers_out.content_type,
                    NGX_HTTP_KV_AWARE_PROMETHEUS_TYPE);

    } else {
        b = ngx_http_kv_aware_status_json_page(r, &st);
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


/*
 * The page's rows (a server, or a rank of one), for upstreams too large
 * for one page (0.5 MB at 1,024 ranks): ?server=NAME keeps that
 * server's, then ?offset=N skips N and ?limit=N keeps N at most, in
 * every upstream.  servers_total says how many rows ?server= kept, for
 * the next offset.  ?ranks=all: Prometheus' series per rank whatever the
 * upstream's size (ngx_http_kv_aware_prometheus.c).  NGX_ERROR: an
 * argument is not a number, or not "all".
 */
static ngx_int_t
ngx_http_kv_aware_status_page(ngx_http_request_t *r,
    ngx_http_kv_aware_status_t *st)
{
    u_char                               *dst, *src;
    ngx_int_t                             offset, limit;
    ngx_str_t                             v, name;
    ngx_uint_t                            i, only;
    ngx_http_kv_aware_status_upstream_t  *u;

    offset = 0;
    limit = NGX_MAX_INT_T_VALUE;
    only = 0;
    st->per_rank = 0;

    if (ngx_http_arg(r, (u_char *) "offset", 6, &v) == NGX_OK) {
        offset = ngx_atoi(v.data, v.len);
    }

    if (ngx_http_arg(r, (u_char *) "limit", 5, &v) == NGX_OK) {
        limit = ngx_atoi(v.data, v.len);
    }

    if (offset == NGX_ERROR || limit == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (ngx_http_arg(r, (u_char *) "ranks", 5, &v) == NGX_OK) {
        if (v.len != 3 || ngx_strncmp(v.data, "all", 3) != 0) {
            return NGX_ERROR;
        }

        st->per_rank = 1;
    }

    /* a scraper may write 127.0.0.1%3A8001 */
    if (ngx_http_arg(r, (u_char *) "server", 6, &v) == NGX_OK) {
        name.data = ngx_pnalloc(r->pool, v.len + 1);
        if (name.data == NULL) {
            return NGX_ERROR;
        }

        dst = name.data;
        src = v.data;
        ngx_unescape_uri(&dst, &src, v.len, 0);
        name.len = dst - name.data;
        only = 1;
    }

    for (i = 0; i < st->nupstreams; i++) {
        u = &st->upstreams[i];
        u->listed = u->nservers;

        if (only) {
            ngx_http_kv_aware_status_only(u, &name);
        }

        u->servers_total = u->nservers;

        if ((ngx_uint_t) offset >= u->nservers) {
            u->nservers = 0;
            continue;
        }

        u->servers += offset;
        u->nservers = ngx_min(u->nservers - offset, (ngx_uint_t) limit);
    }

    return NGX_OK;
}


/* the rows of the server named, moved to the front */
static void
ngx_http_kv_aware_status_only(ngx_http_kv_aware_status_upstream_t *u,
    ngx_str_t *name)
{
    ngx_uint_t                          j, k;
    ngx_http_kv_aware_status_server_t  *sv;

    for (j = 0, k = 0; j < u->nservers; j++) {
        sv = &u->servers[j];

        if (sv->name.len != name->len
            || ngx_strncmp(sv->name.data, name->data, name->len) != 0)
        {
            continue;
        }

        if (k != j) {
            u->servers[k] = *sv;

            /* the name lives in the row's own copy of the slot */
            u->servers[k].name.data = u->servers[k].slot.name;
        }

        k++;
    }

    u->nservers = k;
}
