/*
 * ngx_http_kv_aware_module: a channel's budgets a second; see the header.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_budget.h"


/* a flood is cut off before it costs a parse */
ngx_uint_t
ngx_http_kv_aware_budget_rate(ngx_http_kv_aware_budget_t *bg,
    ngx_http_kv_aware_budget_conf_t *conf)
{
    if (ngx_current_msec - bg->start >= 1000) {
        bg->start = ngx_current_msec;
        bg->messages = 0;
        bg->scanned = 0;
        ngx_memzero(bg->bytes, sizeof(bg->bytes));
        ngx_memzero(bg->hashes, sizeof(bg->hashes));
    }

    return ++bg->messages > conf->max_rate;
}


/*
 * A server's own budgets, in bytes and in hashes: max_rate counts
 * messages whatever they cost, so one publisher could still take the
 * subscribing worker and the zone lock for itself.  Refused messages
 * count too, so that a flood stays cut off for the rest of its second.
 */
const char *
ngx_http_kv_aware_budget_server(ngx_http_kv_aware_budget_t *bg,
    ngx_http_kv_aware_budget_conf_t *conf, ngx_uint_t slot, size_t len,
    ngx_uint_t hashes)
{
    bg->bytes[slot] += len;
    bg->hashes[slot] += hashes;

    if (bg->bytes[slot] > conf->server_bytes) {
        return "server_bytes";
    }

    if (bg->hashes[slot] > conf->server_hashes) {
        return "server_hashes";
    }

    return NULL;
}
