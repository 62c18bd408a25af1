/*
 * ngx_http_kv_aware_module: kv_aware_status for Prometheus, in its text
 * exposition format 0.0.4: the counters of the JSON page under the names
 * of Prometheus' conventions (a kv_aware_ prefix, _total on counters,
 * ratios rather than per mille), labelled by upstream and server.
 *
 * The format wants each family whole: its HELP and TYPE, then all its
 * samples, of every upstream.  So the page is written family by family.
 *
 * The page is written twice by the same code: first measuring (every
 * value at its widest, every sample that may appear counted), then into
 * a buffer of the size measured.  The size is known before the
 * allocation, and counters that move between the two passes cannot
 * write past the buffer: the writes are bounded by its end too.
 */

#include "ngx_http_kv_aware_module.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_members.h"
#include "ngx_http_kv_aware_redis.h"
#include "ngx_http_kv_aware_events.h"
#include "ngx_http_kv_aware_prompt.h"
#include "ngx_http_kv_aware_status.h"
#include "ngx_http_kv_aware_prometheus.h"


/* which upstreams, and which of their servers, a family speaks of */
typedef enum {
    NGX_HTTP_KV_AWARE_PS_UPSTREAM = 0,
    NGX_HTTP_KV_AWARE_PS_TOKENS,          /* upstreams with keys=tokens */
    NGX_HTTP_KV_AWARE_PS_EVENTS,          /* with kv_aware_events */
    NGX_HTTP_KV_AWARE_PS_SERVER,          /* each server of an upstream */
    NGX_HTTP_KV_AWARE_PS_SERVER_EVENTS,   /* of an upstream with events */
    NGX_HTTP_KV_AWARE_PS_SERVER_LOAD      /* whose events carried load */
} ngx_http_kv_aware_prom_scope_e;


typedef enum {
    NGX_HTTP_KV_AWARE_PM_REQUESTS = 0,
    NGX_HTTP_KV_AWARE_PM_ROUTED,
    NGX_HTTP_KV_AWARE_PM_FALLBACKS,
    NGX_HTTP_KV_AWARE_PM_INDEX_ENTRIES,
    NGX_HTTP_KV_AWARE_PM_INDEX_CAPACITY,
    NGX_HTTP_KV_AWARE_PM_EVICTIONS,
    NGX_HTTP_KV_AWARE_PM_CHAIN_EVICTIONS,
    NGX_HTTP_KV_AWARE_PM_TOKENIZE,
    NGX_HTTP_KV_AWARE_PM_EV_MESSAGES,
    NGX_HTTP_KV_AWARE_PM_EV_HASHES,
    NGX_HTTP_KV_AWARE_PM_EV_REJECTS,
    NGX_HTTP_KV_AWARE_PM_RESYNCS,
    NGX_HTTP_KV_AWARE_PM_REDIS_STATE,
    NGX_HTTP_KV_AWARE_PM_REDIS_CONNECTS,
    NGX_HTTP_KV_AWARE_PM_REDIS_FAILURES,
    NGX_HTTP_KV_AWARE_PM_SRV_BACKUP,
    NGX_HTTP_KV_AWARE_PM_SRV_STATE,
    NGX_HTTP_KV_AWARE_PM_SRV_IN_FLIGHT,
    NGX_HTTP_KV_AWARE_PM_SRV_REQUESTS,
    NGX_HTTP_KV_AWARE_PM_SRV_BLOCKS,
    NGX_HTTP_KV_AWARE_PM_SRV_MATCHED,
    NGX_HTTP_KV_AWARE_PM_SRV_ENTRIES,
    NGX_HTTP_KV_AWARE_PM_SRV_EV_MESSAGES,
    NGX_HTTP_KV_AWARE_PM_SRV_EV_HASHES,
    NGX_HTTP_KV_AWARE_PM_SRV_EV_GAPS,
    NGX_HTTP_KV_AWARE_PM_SRV_WAITING,
    NGX_HTTP_KV_AWARE_PM_SRV_RUNNING,
    NGX_HTTP_KV_AWARE_PM_SRV_KV_USAGE
} ngx_http_kv_aware_prom_id_e;


typedef struct {
    ngx_http_kv_aware_prom_id_e     id;
    const char                     *name;
    const char                     *type;
    ngx_http_kv_aware_prom_scope_e  scope;
    const char                     *label;    /* its own, NULL: none */
    const char                    **keys;     /* NULL: kva_score_why() */
    ngx_uint_t                      first;    /* the keys it has */
    ngx_uint_t                      last;
    const char                     *help;
} ngx_http_kv_aware_prom_family_t;


/* where the page goes; pos NULL: measuring */
typedef struct {
    u_char                         *pos;
    u_char                         *end;
    size_t                          size;
} ngx_http_kv_aware_prom_out_t;


typedef struct {
    ngx_str_t                      *name;
    ngx_http_kv_aware_srv_conf_t   *kcf;
    kva_slot_count_t               *counts;   /* index entries per slot */
} ngx_http_kv_aware_prom_upstream_t;


static void ngx_http_kv_aware_prom_page(ngx_http_kv_aware_prom_out_t *o,
    ngx_http_kv_aware_prom_upstream_t *ups, ngx_uint_t nups);
static ngx_uint_t ngx_http_kv_aware_prom_in_scope(
    ngx_http_kv_aware_prom_family_t *f, ngx_http_kv_aware_prom_upstream_t *u);
static void ngx_http_kv_aware_prom_samples(ngx_http_kv_aware_prom_out_t *o,
    ngx_http_kv_aware_prom_family_t *f, ngx_http_kv_aware_prom_upstream_t *u,
    ngx_str_t *server, ngx_uint_t i, ngx_uint_t s);
static uint64_t ngx_http_kv_aware_prom_value(
    ngx_http_kv_aware_prom_family_t *f, ngx_http_kv_aware_prom_upstream_t *u,
    ngx_uint_t i, ngx_uint_t s, ngx_uint_t k);
static void ngx_http_kv_aware_prom_str(ngx_http_kv_aware_prom_out_t *o,
    const char *s);
static void ngx_http_kv_aware_prom_label(ngx_http_kv_aware_prom_out_t *o,
    const char *name, u_char *value, size_t len, ngx_uint_t first);
static void ngx_http_kv_aware_prom_number(ngx_http_kv_aware_prom_out_t *o,
    uint64_t v, ngx_uint_t milli);


/* kva_slot_count_t's entries, KVA_SRC_* */
static const char  *ngx_http_kv_aware_prom_sources[] = {
    "event", "learned", "speculative"
};

/* what became of a tokenizer call */
static const char  *ngx_http_kv_aware_prom_results[] = {
    "ok", "failed", "timeout"
};


static ngx_http_kv_aware_prom_family_t  ngx_http_kv_aware_prom_families[] = {

    { NGX_HTTP_KV_AWARE_PM_REQUESTS, "kv_aware_requests_total", "counter",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      "Requests balanced by kv_aware, once each whatever their tries." },

    { NGX_HTTP_KV_AWARE_PM_ROUTED, "kv_aware_routed_total", "counter",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, "reason", NULL,
      KVA_WHY_LOAD, KVA_WHY_LAST,
      "Servers chosen, one per try, by why: affinity (the cached blocks), "
      "load (no server held any), gate (load overruled affinity), "
      "capacity (a small match, placed where the cache has room)." },

    { NGX_HTTP_KV_AWARE_PM_FALLBACKS, "kv_aware_fallbacks_total", "counter",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, "reason",
      ngx_http_kv_aware_fallback_names,
      NGX_HTTP_KV_AWARE_ROUTED + 1, NGX_HTTP_KV_AWARE_FALLBACK_LAST,
      "Requests whose prompt could not be read, routed by load alone, "
      "by cause." },

    { NGX_HTTP_KV_AWARE_PM_INDEX_ENTRIES, "kv_aware_index_entries", "gauge",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      "Entries (prompt blocks) in the upstream's index." },

    { NGX_HTTP_KV_AWARE_PM_INDEX_CAPACITY, "kv_aware_index_capacity_entries",
      "gauge", NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      "Entries the index can hold (index_size)." },

    { NGX_HTTP_KV_AWARE_PM_EVICTIONS, "kv_aware_index_evictions_total",
      "counter", NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      "Least recently used entries evicted because the index was full." },

    { NGX_HTTP_KV_AWARE_PM_CHAIN_EVICTIONS,
      "kv_aware_index_chain_evictions_total", "counter",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      "Entries evicted to insert into a full hash chain." },

    { NGX_HTTP_KV_AWARE_PM_TOKENIZE, "kv_aware_tokenize_calls_total",
      "counter", NGX_HTTP_KV_AWARE_PS_TOKENS, "result",
      ngx_http_kv_aware_prom_results, 0, 3,
      "Requests to the upstream that asked the tokenizer (kv_aware_tokenize),"
      " by result." },

    { NGX_HTTP_KV_AWARE_PM_EV_MESSAGES, "kv_aware_event_messages_total",
      "counter", NGX_HTTP_KV_AWARE_PS_EVENTS, NULL, NULL, 0, 0,
      "Event messages applied to the index." },

    { NGX_HTTP_KV_AWARE_PM_EV_HASHES, "kv_aware_event_block_hashes_total",
      "counter", NGX_HTTP_KV_AWARE_PS_EVENTS, NULL, NULL, 0, 0,
      "Block hashes applied from event messages." },

    { NGX_HTTP_KV_AWARE_PM_EV_REJECTS, "kv_aware_event_rejects_total",
      "counter", NGX_HTTP_KV_AWARE_PS_EVENTS, "class",
      ngx_http_kv_aware_reject_keys, 0, NGX_HTTP_KV_AWARE_REJ_LAST,
      "Event messages rejected, by class." },

    { NGX_HTTP_KV_AWARE_PM_RESYNCS, "kv_aware_resyncs_total", "counter",
      NGX_HTTP_KV_AWARE_PS_EVENTS, NULL, NULL, 0, 0,
      "Snapshots asked of servers whose events were lost." },

    { NGX_HTTP_KV_AWARE_PM_REDIS_STATE, "kv_aware_redis_state", "gauge",
      NGX_HTTP_KV_AWARE_PS_EVENTS, "state",
      ngx_http_kv_aware_redis_state_names, 0, NGX_HTTP_KV_AWARE_REDIS_LAST,
      "The Redis link's state: 1 for the state it is in." },

    { NGX_HTTP_KV_AWARE_PM_REDIS_CONNECTS, "kv_aware_redis_connects_total",
      "counter", NGX_HTTP_KV_AWARE_PS_EVENTS, NULL, NULL, 0, 0,
      "Connections made to Redis." },

    { NGX_HTTP_KV_AWARE_PM_REDIS_FAILURES, "kv_aware_redis_failures_total",
      "counter", NGX_HTTP_KV_AWARE_PS_EVENTS, NULL, NULL, 0, 0,
      "Redis connections that failed or were lost." },

    { NGX_HTTP_KV_AWARE_PM_SRV_BACKUP, "kv_aware_server_backup", "gauge",
      NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      "1 for a backup server." },

    { NGX_HTTP_KV_AWARE_PM_SRV_STATE, "kv_aware_server_state", "gauge",
      NGX_HTTP_KV_AWARE_PS_SERVER, "state",
      ngx_http_kv_aware_ev_state_names, 0, NGX_HTTP_KV_AWARE_EV_LAST,
      "What is known of the server's cache: 1 for the state it is in." },

    { NGX_HTTP_KV_AWARE_PM_SRV_IN_FLIGHT, "kv_aware_server_in_flight_requests",
      "gauge", NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      "Requests this nginx has in flight on the server." },

    { NGX_HTTP_KV_AWARE_PM_SRV_REQUESTS, "kv_aware_server_requests_total",
      "counter", NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      "Requests routed to the server, one per try." },

    { NGX_HTTP_KV_AWARE_PM_SRV_BLOCKS, "kv_aware_server_prompt_blocks_total",
      "counter", NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      "Prompt blocks of the requests routed to the server." },

    { NGX_HTTP_KV_AWARE_PM_SRV_MATCHED,
      "kv_aware_server_matched_blocks_total", "counter",
      NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      "Of those, leading blocks the index said the server held." },

    { NGX_HTTP_KV_AWARE_PM_SRV_ENTRIES, "kv_aware_server_index_entries",
      "gauge", NGX_HTTP_KV_AWARE_PS_SERVER, "source",
      ngx_http_kv_aware_prom_sources, 0, KVA_SRC_COUNT,
      "Index entries of the server, by what put them there." },

    { NGX_HTTP_KV_AWARE_PM_SRV_EV_MESSAGES,
      "kv_aware_server_event_messages_total", "counter",
      NGX_HTTP_KV_AWARE_PS_SERVER_EVENTS, NULL, NULL, 0, 0,
      "Event messages of the server applied." },

    { NGX_HTTP_KV_AWARE_PM_SRV_EV_HASHES,
      "kv_aware_server_event_block_hashes_total", "counter",
      NGX_HTTP_KV_AWARE_PS_SERVER_EVENTS, NULL, NULL, 0, 0,
      "Block hashes of the server applied from its events." },

    { NGX_HTTP_KV_AWARE_PM_SRV_EV_GAPS, "kv_aware_server_event_gaps_total",
      "counter", NGX_HTTP_KV_AWARE_PS_SERVER_EVENTS, NULL, NULL, 0, 0,
      "Gaps in the server's event sequence numbers." },

    { NGX_HTTP_KV_AWARE_PM_SRV_WAITING,
      "kv_aware_server_engine_waiting_requests", "gauge",
      NGX_HTTP_KV_AWARE_PS_SERVER_LOAD, NULL, NULL, 0, 0,
      "Requests waiting in the engine, as its last events said." },

    { NGX_HTTP_KV_AWARE_PM_SRV_RUNNING,
      "kv_aware_server_engine_running_requests", "gauge",
      NGX_HTTP_KV_AWARE_PS_SERVER_LOAD, NULL, NULL, 0, 0,
      "Requests running in the engine, as its last events said." },

    { NGX_HTTP_KV_AWARE_PM_SRV_KV_USAGE,
      "kv_aware_server_engine_kv_cache_usage_ratio", "gauge",
      NGX_HTTP_KV_AWARE_PS_SERVER_LOAD, NULL, NULL, 0, 0,
      "The engine's KV cache in use, 0 to 1, as its last events said." }
};


ngx_buf_t *
ngx_http_kv_aware_prometheus(ngx_http_request_t *r)
{
    ngx_buf_t                          *b;
    ngx_uint_t                          i, n;
    ngx_http_kv_aware_srv_conf_t       *kcf;
    ngx_http_upstream_srv_conf_t      **uscfp;
    ngx_http_kv_aware_prom_out_t        out;
    ngx_http_upstream_main_conf_t      *umcf;
    ngx_http_kv_aware_prom_upstream_t  *ups;

    umcf = ngx_http_get_module_main_conf(r, ngx_http_upstream_module);
    uscfp = umcf->upstreams.elts;

    ups = ngx_palloc(r->pool, (umcf->upstreams.nelts + 1)
                              * sizeof(ngx_http_kv_aware_prom_upstream_t));
    if (ups == NULL) {
        return NULL;
    }

    n = 0;

    for (i = 0; i < umcf->upstreams.nelts; i++) {
        if (uscfp[i]->srv_conf == NULL) {
            continue;   /* an implicit upstream of a proxy_pass URL */
        }

        kcf = ngx_http_conf_upstream_srv_conf(uscfp[i],
                                              ngx_http_kv_aware_module);

        if (kcf->shm_zone == NULL || kcf->sh == NULL) {
            continue;
        }

        /* the servers as they are now, before both passes read them */
        if (kcf->dynamic) {
            ngx_http_kv_aware_members_sync(kcf);
        }

        ups[n].name = &uscfp[i]->host;
        ups[n].kcf = kcf;
        ups[n].counts = ngx_palloc(r->pool,
                                   KVA_MAX_SLOTS * sizeof(kva_slot_count_t));
        if (ups[n].counts == NULL) {
            return NULL;
        }

        ngx_http_kv_aware_status_count(kcf, ups[n].counts);
        n++;
    }

    ngx_memzero(&out, sizeof(ngx_http_kv_aware_prom_out_t));

    ngx_http_kv_aware_prom_page(&out, ups, n);

    b = ngx_create_temp_buf(r->pool, out.size);
    if (b == NULL) {
        return NULL;
    }

    out.pos = b->last;
    out.end = b->end;

    ngx_http_kv_aware_prom_page(&out, ups, n);

    b->last = out.pos;

    return b;
}


static void
ngx_http_kv_aware_prom_page(ngx_http_kv_aware_prom_out_t *o,
    ngx_http_kv_aware_prom_upstream_t *ups, ngx_uint_t nups)
{
    uint64_t                          seen, bit;
    ngx_str_t                         name;
    ngx_uint_t                        u, i, s, any, server;
    ngx_http_kv_aware_srv_conf_t     *kcf;
    ngx_http_kv_aware_prom_family_t  *f, *last;

    /* a page, never an empty body, even without a kv_aware upstream */
    ngx_http_kv_aware_prom_str(o, "# kv_aware_status\n");

    f = ngx_http_kv_aware_prom_families;
    last = f + sizeof(ngx_http_kv_aware_prom_families)
               / sizeof(ngx_http_kv_aware_prom_families[0]);

    for ( /* void */ ; f < last; f++) {

        any = 0;

        for (u = 0; u < nups; u++) {
            any |= ngx_http_kv_aware_prom_in_scope(f, &ups[u]);
        }

        if (!any) {
            continue;
        }

        ngx_http_kv_aware_prom_str(o, "# HELP ");
        ngx_http_kv_aware_prom_str(o, f->name);
        ngx_http_kv_aware_prom_str(o, " ");
        ngx_http_kv_aware_prom_str(o, f->help);
        ngx_http_kv_aware_prom_str(o, "\n# TYPE ");
        ngx_http_kv_aware_prom_str(o, f->name);
        ngx_http_kv_aware_prom_str(o, " ");
        ngx_http_kv_aware_prom_str(o, f->type);
        ngx_http_kv_aware_prom_str(o, "\n");

        server = (f->scope >= NGX_HTTP_KV_AWARE_PS_SERVER);

        for (u = 0; u < nups; u++) {
            if (!ngx_http_kv_aware_prom_in_scope(f, &ups[u])) {
                continue;
            }

            if (!server) {
                ngx_http_kv_aware_prom_samples(o, f, &ups[u], NULL, 0, 0);
                continue;
            }

            kcf = ups[u].kcf;
            seen = 0;

            /* entry i: rank i % data_parallel of peer i / data_parallel */
            for (i = 0; i < kcf->npeers * kcf->data_parallel; i++) {
                s = kcf->slot_of[i];
                bit = (uint64_t) 1 << s;

                /* a server listed twice has one slot: one set of samples,
                   as Prometheus refuses a series twice in a scrape */
                if (seen & bit) {
                    continue;
                }

                seen |= bit;

                /* measuring, a server may start to report load meanwhile */
                if (f->scope == NGX_HTTP_KV_AWARE_PS_SERVER_LOAD
                    && o->pos != NULL
                    && !kcf->sh->slots[s].ev.has_load)
                {
                    continue;
                }

                name.data = kcf->sh->slots[s].name;
                name.len = kcf->sh->slots[s].name_len;

                ngx_http_kv_aware_prom_samples(o, f, &ups[u], &name,
                                               i / kcf->data_parallel, s);
            }
        }
    }
}


static ngx_uint_t
ngx_http_kv_aware_prom_in_scope(ngx_http_kv_aware_prom_family_t *f,
    ngx_http_kv_aware_prom_upstream_t *u)
{
    switch (f->scope) {

    case NGX_HTTP_KV_AWARE_PS_TOKENS:
        return u->kcf->keys == NGX_HTTP_KV_AWARE_KEYS_TOKENS;

    case NGX_HTTP_KV_AWARE_PS_EVENTS:
    case NGX_HTTP_KV_AWARE_PS_SERVER_EVENTS:
    case NGX_HTTP_KV_AWARE_PS_SERVER_LOAD:
        return u->kcf->events != NULL;

    default:
        return 1;
    }
}


/* name{upstream="...",server="...",label="key"} value, a line per key */
static void
ngx_http_kv_aware_prom_samples(ngx_http_kv_aware_prom_out_t *o,
    ngx_http_kv_aware_prom_family_t *f, ngx_http_kv_aware_prom_upstream_t *u,
    ngx_str_t *server, ngx_uint_t i, ngx_uint_t s)
{
    u_char       rank[2];
    uint64_t     v;
    ngx_uint_t   k, r, first, last;
    const char  *key;

    first = f->label ? f->first : 0;
    last = f->label ? f->last : 1;

    for (k = first; k < last; k++) {
        ngx_http_kv_aware_prom_str(o, f->name);
        ngx_http_kv_aware_prom_label(o, "upstream", u->name->data,
                                     u->name->len, 1);

        if (server) {
            ngx_http_kv_aware_prom_label(o, "server", server->data,
                                         server->len, 0);

            /* each rank of a data-parallel server is a series of its own */
            if (u->kcf->data_parallel > 1) {
                r = u->kcf->sh->slots[s].rank;
                rank[0] = (u_char) ('0' + r / 10);
                rank[1] = (u_char) ('0' + r % 10);
                ngx_http_kv_aware_prom_label(o, "rank", rank + (r < 10),
                                             (r < 10) ? 1 : 2, 0);
            }
        }

        if (f->label) {
            key = f->keys ? f->keys[k] : kva_score_why((kva_why_e) k);
            ngx_http_kv_aware_prom_label(o, f->label, (u_char *) key,
                                         ngx_strlen(key), 0);
        }

        ngx_http_kv_aware_prom_str(o, "} ");

        v = ngx_http_kv_aware_prom_value(f, u, i, s, k);
        ngx_http_kv_aware_prom_number(o, v,
                                f->id == NGX_HTTP_KV_AWARE_PM_SRV_KV_USAGE);

        ngx_http_kv_aware_prom_str(o, "\n");
    }
}


/* i: the peer, s: its slot, k: the key of the family's label */
static uint64_t
ngx_http_kv_aware_prom_value(ngx_http_kv_aware_prom_family_t *f,
    ngx_http_kv_aware_prom_upstream_t *u, ngx_uint_t i, ngx_uint_t s,
    ngx_uint_t k)
{
    ngx_atomic_int_t               reqs;
    ngx_http_kv_aware_slot_t      *sl;
    ngx_http_kv_aware_shctx_t     *sh;
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = u->kcf;
    sh = kcf->sh;
    sl = &sh->slots[s];

    switch (f->id) {

    case NGX_HTTP_KV_AWARE_PM_REQUESTS:
        return sh->routing.requests;

    case NGX_HTTP_KV_AWARE_PM_ROUTED:
        return sh->routing.chosen[k];

    case NGX_HTTP_KV_AWARE_PM_FALLBACKS:
        return sh->routing.fallback[k];

    case NGX_HTTP_KV_AWARE_PM_INDEX_ENTRIES:
        return sh->index->used;

    case NGX_HTTP_KV_AWARE_PM_INDEX_CAPACITY:
        return sh->index->capacity;

    case NGX_HTTP_KV_AWARE_PM_EVICTIONS:
        return sh->index->evictions;

    case NGX_HTTP_KV_AWARE_PM_CHAIN_EVICTIONS:
        return sh->index->chain_evictions;

    case NGX_HTTP_KV_AWARE_PM_TOKENIZE:
        /* a call ends with ids, or in one of the two fallbacks */
        return (k == 0) ? sh->routing.tokenized
               : sh->routing.fallback[(k == 1) ? NGX_HTTP_KV_AWARE_TOKENIZE_FAILED
                                       : NGX_HTTP_KV_AWARE_TOKENIZE_TIMEOUT];

    case NGX_HTTP_KV_AWARE_PM_EV_MESSAGES:
        return sh->events.messages;

    case NGX_HTTP_KV_AWARE_PM_EV_HASHES:
        return sh->events.hashes;

    case NGX_HTTP_KV_AWARE_PM_EV_REJECTS:
        return sh->events.rejected[k];

    case NGX_HTTP_KV_AWARE_PM_RESYNCS:
        return sh->events.resyncs;

    case NGX_HTTP_KV_AWARE_PM_REDIS_STATE:
        return sh->redis.state == k;

    case NGX_HTTP_KV_AWARE_PM_REDIS_CONNECTS:
        return sh->redis.connects;

    case NGX_HTTP_KV_AWARE_PM_REDIS_FAILURES:
        return sh->redis.failures;

    case NGX_HTTP_KV_AWARE_PM_SRV_BACKUP:
        return i >= kcf->nprimary;

    case NGX_HTTP_KV_AWARE_PM_SRV_STATE:
        return sl->ev.state == k;

    case NGX_HTTP_KV_AWARE_PM_SRV_IN_FLIGHT:
        /* added and taken by other workers: a moment may read below 0 */
        reqs = (ngx_atomic_int_t) kcf->load[s].reqs;
        return reqs > 0 ? (uint64_t) reqs : 0;

    case NGX_HTTP_KV_AWARE_PM_SRV_REQUESTS:
        return sl->routing.routed;

    case NGX_HTTP_KV_AWARE_PM_SRV_BLOCKS:
        return sl->routing.blocks;

    case NGX_HTTP_KV_AWARE_PM_SRV_MATCHED:
        return sl->routing.matched;

    case NGX_HTTP_KV_AWARE_PM_SRV_ENTRIES:
        return u->counts[s].entries[k];

    case NGX_HTTP_KV_AWARE_PM_SRV_EV_MESSAGES:
        return sl->ev.messages;

    case NGX_HTTP_KV_AWARE_PM_SRV_EV_HASHES:
        return sl->ev.hashes;

    case NGX_HTTP_KV_AWARE_PM_SRV_EV_GAPS:
        return sl->ev.gaps;

    case NGX_HTTP_KV_AWARE_PM_SRV_WAITING:
        return sl->ev.waiting;

    case NGX_HTTP_KV_AWARE_PM_SRV_RUNNING:
        return sl->ev.running;

    case NGX_HTTP_KV_AWARE_PM_SRV_KV_USAGE:
        return sl->ev.kv_usage;
    }

    return 0;
}


static void
ngx_http_kv_aware_prom_str(ngx_http_kv_aware_prom_out_t *o, const char *s)
{
    size_t  len;

    len = ngx_strlen(s);

    if (o->pos == NULL) {
        o->size += len;
        return;
    }

    len = ngx_min(len, (size_t) (o->end - o->pos));
    o->pos = ngx_cpymem(o->pos, s, len);
}


/*
 * ,name="value" (or {name="value" for the first), the value escaped as
 * the format asks: backslash, double quote and line feed.  Names of
 * upstreams and servers come from the configuration, and may hold them.
 */
static void
ngx_http_kv_aware_prom_label(ngx_http_kv_aware_prom_out_t *o,
    const char *name, u_char *value, size_t len, ngx_uint_t first)
{
    u_char      c, esc[2];
    size_t      n, w;

    ngx_http_kv_aware_prom_str(o, first ? "{" : ",");
    ngx_http_kv_aware_prom_str(o, name);
    ngx_http_kv_aware_prom_str(o, "=\"");

    for (n = 0; n < len; n++) {
        c = value[n];

        esc[0] = '\\';
        esc[1] = (c == '\n') ? 'n' : c;
        w = (c == '\\' || c == '"' || c == '\n') ? 2 : 1;

        if (o->pos == NULL) {
            o->size += w;
            continue;
        }

        if ((size_t) (o->end - o->pos) < w) {
            o->pos = o->end;
            break;
        }

        o->pos = ngx_cpymem(o->pos, (w == 2) ? esc : &c, w);
    }

    ngx_http_kv_aware_prom_str(o, "\"");
}


/* an integer, or thousandths as a decimal fraction */
static void
ngx_http_kv_aware_prom_number(ngx_http_kv_aware_prom_out_t *o, uint64_t v,
    ngx_uint_t milli)
{
    if (o->pos == NULL) {
        o->size += NGX_INT64_LEN + (milli ? sizeof(".000") - 1 : 0);
        return;
    }

    if (milli) {
        o->pos = ngx_slprintf(o->pos, o->end, "%uL.%03uL",
                              v / 1000, v % 1000);

    } else {
        o->pos = ngx_slprintf(o->pos, o->end, "%uL", v);
    }
}
