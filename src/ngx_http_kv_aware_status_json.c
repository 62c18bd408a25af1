/*
 * ngx_http_kv_aware_module: kv_aware_status as JSON, rendered from the
 * snapshot (ngx_http_kv_aware_status_snapshot.c) by two tables, one for
 * an upstream and one for each of its servers.  An entry names its key,
 * where its value lies in the snapshot and how to write it; an object
 * entry opens a nested object that its closing entry ends, and both are
 * left out with what they hold when their condition fails.
 *
 * The page is written twice by the same code, first measuring (every
 * number at its widest), then into a buffer of the size measured.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_events.h"
#include "ngx_http_kv_aware_redis.h"
#include "ngx_http_kv_aware_prompt.h"
#include "ngx_http_kv_aware_status_snapshot.h"
#include "ngx_http_kv_aware_status_out.h"
#include "ngx_http_kv_aware_status_json.h"


typedef enum {
    NGX_HTTP_KV_AWARE_JF_NUM = 0,         /* "key":1 */
    NGX_HTTP_KV_AWARE_JF_MILLI,           /* "key":0.001, of thousandths */
    NGX_HTTP_KV_AWARE_JF_BOOL,            /* "key":true */
    NGX_HTTP_KV_AWARE_JF_NAME,            /* "key":"names[value]" */
    NGX_HTTP_KV_AWARE_JF_STR,             /* "key":"ngx_str_t" */
    NGX_HTTP_KV_AWARE_JF_KEYED,           /* "key":{"names[k]":value[k]} */
    NGX_HTTP_KV_AWARE_JF_OPEN,            /* "key":{ */
    NGX_HTTP_KV_AWARE_JF_CLOSE            /* } */
} ngx_http_kv_aware_json_form_e;


/* what an entry needs to be written */
typedef enum {
    NGX_HTTP_KV_AWARE_JW_ALWAYS = 0,
    NGX_HTTP_KV_AWARE_JW_EVENTS,          /* the upstream has events */
    NGX_HTTP_KV_AWARE_JW_SHARE,           /* and share=on */
    NGX_HTTP_KV_AWARE_JW_CHECKED,         /* ?check was asked */
    NGX_HTTP_KV_AWARE_JW_RANKED,          /* data_parallel > 1 */
    NGX_HTTP_KV_AWARE_JW_LOADED           /* the server's events had load */
} ngx_http_kv_aware_json_when_e;


typedef struct {
    ngx_http_kv_aware_json_form_e      form;
    ngx_http_kv_aware_json_when_e      when;
    const char                        *key;
    ngx_http_kv_aware_status_value_e   type;
    size_t                             offset;
    const char *const                 *names;
    ngx_uint_t                         first;    /* JF_KEYED: the keys */
    ngx_uint_t                         last;
    const ngx_uint_t                  *order;    /* NULL: first to last */
} ngx_http_kv_aware_json_field_t;


static void ngx_http_kv_aware_json_page(ngx_http_kv_aware_status_out_t *o,
    ngx_http_kv_aware_status_t *st);
static void ngx_http_kv_aware_json_object(ngx_http_kv_aware_status_out_t *o,
    ngx_http_kv_aware_json_field_t *f, ngx_uint_t n, void *base,
    ngx_http_kv_aware_status_upstream_t *u,
    ngx_http_kv_aware_status_server_t *sv);
static void ngx_http_kv_aware_json_value(ngx_http_kv_aware_status_out_t *o,
    ngx_http_kv_aware_json_field_t *f, void *base, ngx_uint_t k);
static ngx_uint_t ngx_http_kv_aware_json_when(
    ngx_http_kv_aware_json_when_e when,
    ngx_http_kv_aware_status_upstream_t *u,
    ngx_http_kv_aware_status_server_t *sv);
static void ngx_http_kv_aware_json_string(ngx_http_kv_aware_status_out_t *o,
    u_char *s, size_t len);


#define ngx_http_kv_aware_ju(field)                                           \
    offsetof(ngx_http_kv_aware_status_upstream_t, field)
#define ngx_http_kv_aware_js(field)                                           \
    offsetof(ngx_http_kv_aware_status_server_t, field)

/* the table's entries: when, key, and for values where and how to read */
#define ngx_http_kv_aware_jnum(w, k, t, off)                                  \
    { NGX_HTTP_KV_AWARE_JF_NUM, NGX_HTTP_KV_AWARE_JW_##w, k,                  \
      NGX_HTTP_KV_AWARE_SV_##t, off, NULL, 0, 0, NULL }
#define ngx_http_kv_aware_jmilli(w, k, t, off)                                \
    { NGX_HTTP_KV_AWARE_JF_MILLI, NGX_HTTP_KV_AWARE_JW_##w, k,                \
      NGX_HTTP_KV_AWARE_SV_##t, off, NULL, 0, 0, NULL }
#define ngx_http_kv_aware_jbool(w, k, off)                                    \
    { NGX_HTTP_KV_AWARE_JF_BOOL, NGX_HTTP_KV_AWARE_JW_##w, k,                 \
      NGX_HTTP_KV_AWARE_SV_UINT, off, NULL, 0, 0, NULL }
#define ngx_http_kv_aware_jname(w, k, off, names)                             \
    { NGX_HTTP_KV_AWARE_JF_NAME, NGX_HTTP_KV_AWARE_JW_##w, k,                 \
      NGX_HTTP_KV_AWARE_SV_UINT, off, names, 0, 0, NULL }
#define ngx_http_kv_aware_jstr(w, k, off)                                     \
    { NGX_HTTP_KV_AWARE_JF_STR, NGX_HTTP_KV_AWARE_JW_##w, k,                  \
      NGX_HTTP_KV_AWARE_SV_UINT, off, NULL, 0, 0, NULL }
#define ngx_http_kv_aware_jkeyed(w, k, t, off, names, first, last, order)     \
    { NGX_HTTP_KV_AWARE_JF_KEYED, NGX_HTTP_KV_AWARE_JW_##w, k,                \
      NGX_HTTP_KV_AWARE_SV_##t, off, names, first, last, order }
#define ngx_http_kv_aware_jopen(w, k)                                         \
    { NGX_HTTP_KV_AWARE_JF_OPEN, NGX_HTTP_KV_AWARE_JW_##w, k,                 \
      NGX_HTTP_KV_AWARE_SV_UINT, 0, NULL, 0, 0, NULL }
#define ngx_http_kv_aware_jclose()                                            \
    { NGX_HTTP_KV_AWARE_JF_CLOSE, NGX_HTTP_KV_AWARE_JW_ALWAYS, NULL,          \
      NGX_HTTP_KV_AWARE_SV_UINT, 0, NULL, 0, 0, NULL }


/* the page's order of the reasons, older than the enum's */
static const ngx_uint_t  ngx_http_kv_aware_json_why_order[] = {
    KVA_WHY_AFFINITY, KVA_WHY_LOAD, KVA_WHY_GATE, KVA_WHY_CAPACITY
};


static ngx_http_kv_aware_json_field_t  ngx_http_kv_aware_json_upstream[] = {

    ngx_http_kv_aware_jnum(ALWAYS, "requests", UINT,
                           ngx_http_kv_aware_ju(routing.requests)),
    ngx_http_kv_aware_jkeyed(ALWAYS, "routed", UINT,
                             ngx_http_kv_aware_ju(routing.chosen),
                             kva_why_names, 0, KVA_WHY_LAST,
                             ngx_http_kv_aware_json_why_order),
    ngx_http_kv_aware_jnum(ALWAYS, "tokenized", UINT,
                           ngx_http_kv_aware_ju(routing.tokenized)),
    ngx_http_kv_aware_jnum(ALWAYS, "servers_total", UINT,
                           ngx_http_kv_aware_ju(servers_total)),
    ngx_http_kv_aware_jnum(ALWAYS, "fallbacks", UINT,
                           ngx_http_kv_aware_ju(routing.fallbacks)),
    ngx_http_kv_aware_jkeyed(ALWAYS, "fallback", UINT,
                             ngx_http_kv_aware_ju(routing.fallback),
                             ngx_http_kv_aware_prompt_fallback_names,
                             NGX_HTTP_KV_AWARE_ROUTED + 1,
                             NGX_HTTP_KV_AWARE_FALLBACK_LAST, NULL),

    ngx_http_kv_aware_jopen(ALWAYS, "disaggregated"),
    ngx_http_kv_aware_jkeyed(ALWAYS, "decided", UINT,
                             ngx_http_kv_aware_ju(pd.decided),
                             ngx_http_kv_aware_pd_keys, 0,
                             NGX_HTTP_KV_AWARE_PD_LAST, NULL),
    ngx_http_kv_aware_jnum(ALWAYS, "prefill_tokens", UINT,
                           ngx_http_kv_aware_ju(pd.prefill_tokens)),
    ngx_http_kv_aware_jclose(),

    ngx_http_kv_aware_jopen(ALWAYS, "sessions"),
    ngx_http_kv_aware_jkeyed(ALWAYS, "routed", UINT,
                             ngx_http_kv_aware_ju(session.routed),
                             ngx_http_kv_aware_session_keys,
                             NGX_HTTP_KV_AWARE_SESS_NONE + 1,
                             NGX_HTTP_KV_AWARE_SESS_LAST, NULL),
    ngx_http_kv_aware_jnum(ALWAYS, "entries", U64,
                           ngx_http_kv_aware_ju(session.entries)),
    ngx_http_kv_aware_jnum(ALWAYS, "capacity", U64,
                           ngx_http_kv_aware_ju(session.capacity)),
    ngx_http_kv_aware_jnum(ALWAYS, "expired", U64,
                           ngx_http_kv_aware_ju(session.expired)),
    ngx_http_kv_aware_jnum(ALWAYS, "evicted", U64,
                           ngx_http_kv_aware_ju(session.evicted)),
    ngx_http_kv_aware_jclose(),

    ngx_http_kv_aware_jopen(ALWAYS, "index"),
    ngx_http_kv_aware_jnum(ALWAYS, "capacity", U32,
                           ngx_http_kv_aware_ju(index.capacity)),
    ngx_http_kv_aware_jnum(ALWAYS, "used", U32,
                           ngx_http_kv_aware_ju(index.used)),
    ngx_http_kv_aware_jnum(ALWAYS, "evictions", U64,
                           ngx_http_kv_aware_ju(index.evictions)),
    ngx_http_kv_aware_jnum(ALWAYS, "chain_evictions", U64,
                           ngx_http_kv_aware_ju(index.chain_evictions)),
    ngx_http_kv_aware_jstr(CHECKED, "check", ngx_http_kv_aware_ju(check)),
    ngx_http_kv_aware_jclose(),

    ngx_http_kv_aware_jopen(EVENTS, "redis"),
    ngx_http_kv_aware_jstr(ALWAYS, "address",
                           ngx_http_kv_aware_ju(redis_address)),
    ngx_http_kv_aware_jname(ALWAYS, "state", ngx_http_kv_aware_ju(redis.state),
                            ngx_http_kv_aware_redis_state_names),
    ngx_http_kv_aware_jnum(ALWAYS, "connects", UINT,
                           ngx_http_kv_aware_ju(redis.connects)),
    ngx_http_kv_aware_jnum(ALWAYS, "failures", UINT,
                           ngx_http_kv_aware_ju(redis.failures)),
    ngx_http_kv_aware_jclose(),

    ngx_http_kv_aware_jopen(EVENTS, "events"),
    ngx_http_kv_aware_jnum(ALWAYS, "messages", UINT,
                           ngx_http_kv_aware_ju(ev.messages)),
    ngx_http_kv_aware_jnum(ALWAYS, "hashes", UINT,
                           ngx_http_kv_aware_ju(ev.hashes)),
    ngx_http_kv_aware_jnum(ALWAYS, "resyncs", UINT,
                           ngx_http_kv_aware_ju(ev.resyncs)),
    ngx_http_kv_aware_jkeyed(ALWAYS, "rejected", UINT,
                             ngx_http_kv_aware_ju(ev.rejected),
                             ngx_http_kv_aware_zone_reject_keys, 0,
                             NGX_HTTP_KV_AWARE_REJ_LAST, NULL),
    ngx_http_kv_aware_jclose(),

    ngx_http_kv_aware_jopen(SHARE, "share"),
    ngx_http_kv_aware_jnum(ALWAYS, "sent", UINT,
                           ngx_http_kv_aware_ju(shared.sent)),
    ngx_http_kv_aware_jnum(ALWAYS, "received", UINT,
                           ngx_http_kv_aware_ju(shared.received)),
    ngx_http_kv_aware_jnum(ALWAYS, "dropped", UINT,
                           ngx_http_kv_aware_ju(shared.dropped)),
    ngx_http_kv_aware_jnum(ALWAYS, "refused", UINT,
                           ngx_http_kv_aware_ju(shared.refused)),
    ngx_http_kv_aware_jnum(ALWAYS, "messages_out", UINT,
                           ngx_http_kv_aware_ju(shared.messages_out)),
    ngx_http_kv_aware_jnum(ALWAYS, "messages_in", UINT,
                           ngx_http_kv_aware_ju(shared.messages_in)),
    ngx_http_kv_aware_jclose()
};


static ngx_http_kv_aware_json_field_t  ngx_http_kv_aware_json_server[] = {

    ngx_http_kv_aware_jstr(ALWAYS, "name", ngx_http_kv_aware_js(name)),
    ngx_http_kv_aware_jnum(RANKED, "rank", UINT,
                           ngx_http_kv_aware_js(slot.rank)),
    ngx_http_kv_aware_jbool(ALWAYS, "backup", ngx_http_kv_aware_js(backup)),
    ngx_http_kv_aware_jname(ALWAYS, "state",
                            ngx_http_kv_aware_js(slot.ev.state),
                            ngx_http_kv_aware_zone_ev_state_names),
    ngx_http_kv_aware_jnum(ALWAYS, "seq", U64,
                           ngx_http_kv_aware_js(slot.ev.seq)),
    ngx_http_kv_aware_jkeyed(ALWAYS, "entries", U64,
                             ngx_http_kv_aware_js(count.entries),
                             kva_src_names, 0, KVA_SRC_COUNT, NULL),
    ngx_http_kv_aware_jkeyed(ALWAYS, "tiers", U64,
                             ngx_http_kv_aware_js(count.slow),
                             kva_tier_slow_names, 0, KVA_TIERS_SLOW, NULL),

    ngx_http_kv_aware_jopen(ALWAYS, "events"),
    ngx_http_kv_aware_jnum(ALWAYS, "messages", UINT,
                           ngx_http_kv_aware_js(slot.ev.messages)),
    ngx_http_kv_aware_jnum(ALWAYS, "hashes", UINT,
                           ngx_http_kv_aware_js(slot.ev.hashes)),
    ngx_http_kv_aware_jnum(ALWAYS, "gaps", UINT,
                           ngx_http_kv_aware_js(slot.ev.gaps)),
    ngx_http_kv_aware_jclose(),

    ngx_http_kv_aware_jopen(LOADED, "load"),
    ngx_http_kv_aware_jnum(ALWAYS, "waiting", U32,
                           ngx_http_kv_aware_js(slot.ev.waiting)),
    ngx_http_kv_aware_jnum(ALWAYS, "running", U32,
                           ngx_http_kv_aware_js(slot.ev.running)),
    ngx_http_kv_aware_jmilli(ALWAYS, "kv_usage", U32,
                             ngx_http_kv_aware_js(slot.ev.kv_usage)),
    ngx_http_kv_aware_jclose(),

    ngx_http_kv_aware_jnum(ALWAYS, "in_flight", INT,
                           ngx_http_kv_aware_js(in_flight)),
    ngx_http_kv_aware_jnum(ALWAYS, "routed", UINT,
                           ngx_http_kv_aware_js(slot.routing.routed)),
    ngx_http_kv_aware_jnum(ALWAYS, "blocks", UINT,
                           ngx_http_kv_aware_js(slot.routing.blocks)),
    ngx_http_kv_aware_jnum(ALWAYS, "matched", UINT,
                           ngx_http_kv_aware_js(slot.routing.matched)),

    /* its prefill rate as learned, and the time to first token predicted */
    ngx_http_kv_aware_jopen(ALWAYS, "ttft"),
    ngx_http_kv_aware_jnum(ALWAYS, "rate", UINT,
                           ngx_http_kv_aware_js(slot.ttft.rate)),
    ngx_http_kv_aware_jnum(ALWAYS, "samples", U64,
                           ngx_http_kv_aware_js(slot.ttft.est.samples)),
    ngx_http_kv_aware_jnum(ALWAYS, "ignored", UINT,
                           ngx_http_kv_aware_js(slot.ttft.ignored)),
    ngx_http_kv_aware_jnum(ALWAYS, "queued_blocks", INT,
                           ngx_http_kv_aware_js(slot.ttft.queued)),
    ngx_http_kv_aware_jnum(ALWAYS, "predicted_ms", UINT,
                           ngx_http_kv_aware_js(slot.ttft.predicted_ms)),
    ngx_http_kv_aware_jnum(ALWAYS, "observed_ms", UINT,
                           ngx_http_kv_aware_js(slot.ttft.observed_ms)),
    ngx_http_kv_aware_jclose()
};


ngx_buf_t *
ngx_http_kv_aware_status_json_page(ngx_http_request_t *r,
    ngx_http_kv_aware_status_t *st)
{
    return ngx_http_kv_aware_status_out_page(r, st,
                                             ngx_http_kv_aware_json_page);
}


static void
ngx_http_kv_aware_json_page(ngx_http_kv_aware_status_out_t *o,
    ngx_http_kv_aware_status_t *st)
{
    ngx_uint_t                            i, s;
    ngx_http_kv_aware_status_upstream_t  *u;

    ngx_http_kv_aware_status_out_str(o, "{\"upstreams\":{");

    for (i = 0; i < st->nupstreams; i++) {
        u = &st->upstreams[i];

        ngx_http_kv_aware_status_out_str(o, i ? ",\"" : "\"");
        ngx_http_kv_aware_json_string(o, u->name.data, u->name.len);
        ngx_http_kv_aware_status_out_str(o, "\":{");

        ngx_http_kv_aware_json_object(o, ngx_http_kv_aware_json_upstream,
                      sizeof(ngx_http_kv_aware_json_upstream)
                      / sizeof(ngx_http_kv_aware_json_field_t), u, u, NULL);

        ngx_http_kv_aware_status_out_str(o, ",\"servers\":[");

        for (s = 0; s < u->nservers; s++) {
            ngx_http_kv_aware_status_out_str(o, s ? ",{" : "{");

            ngx_http_kv_aware_json_object(o, ngx_http_kv_aware_json_server,
                          sizeof(ngx_http_kv_aware_json_server)
                          / sizeof(ngx_http_kv_aware_json_field_t),
                          &u->servers[s], u, &u->servers[s]);

            ngx_http_kv_aware_status_out_str(o, "}");
        }

        ngx_http_kv_aware_status_out_str(o, "]}");
    }

    ngx_http_kv_aware_status_out_str(o, "}}\n");
}


/* the members of an object, without its braces */
static void
ngx_http_kv_aware_json_object(ngx_http_kv_aware_status_out_t *o,
    ngx_http_kv_aware_json_field_t *f, ngx_uint_t n, void *base,
    ngx_http_kv_aware_status_upstream_t *u,
    ngx_http_kv_aware_status_server_t *sv)
{
    ngx_uint_t  i, k, j, depth, comma;

    comma = 0;

    for (i = 0; i < n; i++) {

        if (f[i].form == NGX_HTTP_KV_AWARE_JF_CLOSE) {
            ngx_http_kv_aware_status_out_str(o, "}");
            comma = 1;
            continue;
        }

        if (!ngx_http_kv_aware_json_when(f[i].when, u, sv)) {

            /* an object left out is left out whole */
            if (f[i].form == NGX_HTTP_KV_AWARE_JF_OPEN) {
                for (depth = 1; depth && i + 1 < n; /* void */ ) {
                    i++;
                    depth += (f[i].form == NGX_HTTP_KV_AWARE_JF_OPEN);
                    depth -= (f[i].form == NGX_HTTP_KV_AWARE_JF_CLOSE);
                }
            }

            continue;
        }

        ngx_http_kv_aware_status_out_str(o, comma ? ",\"" : "\"");
        ngx_http_kv_aware_status_out_str(o, f[i].key);
        ngx_http_kv_aware_status_out_str(o, "\":");

        if (f[i].form == NGX_HTTP_KV_AWARE_JF_OPEN) {
            ngx_http_kv_aware_status_out_str(o, "{");
            comma = 0;
            continue;
        }

        comma = 1;

        if (f[i].form != NGX_HTTP_KV_AWARE_JF_KEYED) {
            ngx_http_kv_aware_json_value(o, &f[i], base, 0);
            continue;
        }

        ngx_http_kv_aware_status_out_str(o, "{");

        for (j = f[i].first; j < f[i].last; j++) {
            k = f[i].order ? f[i].order[j - f[i].first] : j;

            ngx_http_kv_aware_status_out_str(o, (j == f[i].first) ? "\""
                                                                  : ",\"");
            ngx_http_kv_aware_status_out_str(o, f[i].names[k]);
            ngx_http_kv_aware_status_out_str(o, "\":");
            ngx_http_kv_aware_json_value(o, &f[i], base, k);
        }

        ngx_http_kv_aware_status_out_str(o, "}");
    }
}


static void
ngx_http_kv_aware_json_value(ngx_http_kv_aware_status_out_t *o,
    ngx_http_kv_aware_json_field_t *f, void *base, ngx_uint_t k)
{
    uint64_t    v;
    ngx_str_t  *s;

    if (f->form == NGX_HTTP_KV_AWARE_JF_STR) {
        s = (ngx_str_t *) ((u_char *) base + f->offset);

        ngx_http_kv_aware_status_out_str(o, "\"");
        ngx_http_kv_aware_json_string(o, s->data, s->len);
        ngx_http_kv_aware_status_out_str(o, "\"");
        return;
    }

    v = ngx_http_kv_aware_status_snapshot_value(base, f->offset, f->type, k);

    switch (f->form) {

    case NGX_HTTP_KV_AWARE_JF_BOOL:
        ngx_http_kv_aware_status_out_str(o, v ? "true" : "false");
        return;

    case NGX_HTTP_KV_AWARE_JF_NAME:
        ngx_http_kv_aware_status_out_str(o, "\"");
        ngx_http_kv_aware_status_out_str(o, f->names[v]);
        ngx_http_kv_aware_status_out_str(o, "\"");
        return;

    default:
        break;
    }

    if (o->pos == NULL) {
        o->size += NGX_INT64_LEN + sizeof(".000");
        return;
    }

    if (f->form == NGX_HTTP_KV_AWARE_JF_MILLI) {
        o->pos = ngx_slprintf(o->pos, o->end, "%uL.%03uL",
                              v / 1000, v % 1000);

    } else if (f->type == NGX_HTTP_KV_AWARE_SV_INT) {
        o->pos = ngx_slprintf(o->pos, o->end, "%L", (int64_t) v);

    } else {
        o->pos = ngx_slprintf(o->pos, o->end, "%uL", v);
    }
}


static ngx_uint_t
ngx_http_kv_aware_json_when(ngx_http_kv_aware_json_when_e when,
    ngx_http_kv_aware_status_upstream_t *u,
    ngx_http_kv_aware_status_server_t *sv)
{
    switch (when) {

    case NGX_HTTP_KV_AWARE_JW_EVENTS:
        return u->events;

    case NGX_HTTP_KV_AWARE_JW_SHARE:
        return u->share;

    case NGX_HTTP_KV_AWARE_JW_CHECKED:
        return u->checked;

    case NGX_HTTP_KV_AWARE_JW_RANKED:
        return sv && sv->ranked;

    case NGX_HTTP_KV_AWARE_JW_LOADED:
        return sv && sv->slot.ev.has_load;

    default:
        return 1;
    }
}


/* escaped, a byte can take six: \u00XX */
static void
ngx_http_kv_aware_json_string(ngx_http_kv_aware_status_out_t *o, u_char *s,
    size_t len)
{
    size_t  size;

    size = len + ngx_escape_json(NULL, s, len);

    if (o->pos == NULL) {
        o->size += size;
        return;
    }

    if ((size_t) (o->end - o->pos) < size) {
        o->pos = o->end;
        return;
    }

    o->pos = (u_char *) ngx_escape_json(o->pos, s, len);
}
