/*
 * ngx_http_kv_aware_module: kv_aware_status for Prometheus, in its text
 * exposition format 0.0.4: the counters of the JSON page under the names
 * of Prometheus' conventions (a kv_aware_ prefix, _total on counters,
 * ratios rather than per mille), labelled by upstream and server.  It
 * renders the snapshot (ngx_http_kv_aware_status_snapshot.c) from a
 * table of families, each finding its value there by offsetof().
 *
 * The format wants each family whole: its HELP and TYPE, then all its
 * samples, of every upstream.  So the page is written family by family.
 *
 * The page is written twice by the same code: first measuring (every
 * value at its widest), then into a buffer of the size measured.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_redis.h"
#include "ngx_http_kv_aware_events.h"
#include "ngx_http_kv_aware_prompt.h"
#include "ngx_http_kv_aware_status_snapshot.h"
#include "ngx_http_kv_aware_status_out.h"
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


/* how a sample's value is made of the field */
typedef enum {
    NGX_HTTP_KV_AWARE_PF_NUM = 0,         /* element k, or the field */
    NGX_HTTP_KV_AWARE_PF_IS,              /* 1 if the field is k */
    NGX_HTTP_KV_AWARE_PF_MILLI,           /* thousandths, as a ratio */
    NGX_HTTP_KV_AWARE_PF_LEVEL            /* the field: a rate, a time */
} ngx_http_kv_aware_prom_form_e;


/*
 * Past this many rows (ranks) an upstream's data-parallel servers have a
 * series each, not one per rank: 1,024 ranks of 19 series are 1.5 MB a
 * scrape.  Their ranks' counts are summed (IS: ranks in each state),
 * MILLI and LEVEL averaged.  ?ranks=all keeps the series per rank.
 */
#define NGX_HTTP_KV_AWARE_PROM_RANKS  64


typedef struct {
    const char                        *name;
    const char                        *type;
    ngx_http_kv_aware_prom_scope_e     scope;
    const char                        *label;    /* its own, NULL: none */
    const char *const                 *keys;
    ngx_uint_t                         first;    /* the keys it has */
    ngx_uint_t                         last;
    ngx_http_kv_aware_prom_form_e      form;
    ngx_http_kv_aware_status_value_e   value;
    size_t                             offset;   /* in the upstream's or
                                                    the server's snapshot */
    const char                        *help;
} ngx_http_kv_aware_prom_family_t;


static void ngx_http_kv_aware_prom_page(ngx_http_kv_aware_status_out_t *o,
    ngx_http_kv_aware_status_t *st);
static void ngx_http_kv_aware_prom_family(ngx_http_kv_aware_status_out_t *o,
    ngx_http_kv_aware_prom_family_t *f, ngx_http_kv_aware_status_t *st);
static ngx_uint_t ngx_http_kv_aware_prom_in_scope(
    ngx_http_kv_aware_prom_family_t *f,
    ngx_http_kv_aware_status_upstream_t *u);
static void ngx_http_kv_aware_prom_samples(ngx_http_kv_aware_status_out_t *o,
    ngx_http_kv_aware_prom_family_t *f,
    ngx_http_kv_aware_status_upstream_t *u,
    ngx_http_kv_aware_status_server_t *sv, ngx_uint_t nranks);
static uint64_t ngx_http_kv_aware_prom_value(
    ngx_http_kv_aware_prom_family_t *f, void *base, ngx_uint_t k);
static uint64_t ngx_http_kv_aware_prom_ranks(
    ngx_http_kv_aware_prom_family_t *f,
    ngx_http_kv_aware_status_server_t *sv, ngx_uint_t nranks, ngx_uint_t k);
static void ngx_http_kv_aware_prom_label(ngx_http_kv_aware_status_out_t *o,
    const char *name, u_char *value, size_t len, ngx_uint_t first);
static void ngx_http_kv_aware_prom_number(ngx_http_kv_aware_status_out_t *o,
    uint64_t v, ngx_uint_t milli);


/* where a family's value lies: form, how to read it, the field */
#define ngx_http_kv_aware_pu(form, value, field)                              \
    NGX_HTTP_KV_AWARE_PF_##form, NGX_HTTP_KV_AWARE_SV_##value,                \
    offsetof(ngx_http_kv_aware_status_upstream_t, field)
#define ngx_http_kv_aware_ps(form, value, field)                              \
    NGX_HTTP_KV_AWARE_PF_##form, NGX_HTTP_KV_AWARE_SV_##value,                \
    offsetof(ngx_http_kv_aware_status_server_t, field)


static ngx_http_kv_aware_prom_family_t  ngx_http_kv_aware_prom_families[] = {

    { "kv_aware_requests_total", "counter",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, UINT, routing.requests),
      "Requests balanced by kv_aware, once each whatever their tries." },

    { "kv_aware_routed_total", "counter",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, "reason", kva_why_names,
      0, KVA_WHY_LAST,
      ngx_http_kv_aware_pu(NUM, UINT, routing.chosen),
      "Servers chosen, one per try, by why: affinity (the cached blocks), "
      "load (no server held any), gate (load overruled affinity), "
      "capacity (a small match, placed where the cache has room)." },

    { "kv_aware_fallbacks_total", "counter",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, "reason",
      ngx_http_kv_aware_prompt_fallback_names,
      NGX_HTTP_KV_AWARE_ROUTED + 1, NGX_HTTP_KV_AWARE_FALLBACK_LAST,
      ngx_http_kv_aware_pu(NUM, UINT, routing.fallback),
      "Requests whose prompt could not be read, routed by load alone, "
      "by cause." },

    { "kv_aware_disaggregated_total", "counter",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, "decision", ngx_http_kv_aware_pd_keys,
      0, NGX_HTTP_KV_AWARE_PD_LAST,
      ngx_http_kv_aware_pu(NUM, UINT, pd.decided),
      "Requests to the decode upstream of a kv_aware_prefill location, by "
      "decision: split, short or cached (aggregated), or a fallback." },

    { "kv_aware_prefill_tokens_total", "counter",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, UINT, pd.prefill_tokens),
      "Prompt tokens the prefill servers chosen were to compute (what "
      "they did not hold), of the requests split." },

    { "kv_aware_session_requests_total", "counter",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, "outcome",
      ngx_http_kv_aware_session_keys,
      NGX_HTTP_KV_AWARE_SESS_NONE + 1, NGX_HTTP_KV_AWARE_SESS_LAST,
      ngx_http_kv_aware_pu(NUM, UINT, session.routed),
      "Tries of requests with a session (kv_aware session=), by outcome: "
      "bound (to its server), new (placed, then bound), or why the "
      "binding yielded: down, failed, full, gone, cold, overloaded." },

    { "kv_aware_session_entries", "gauge",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, U64, session.entries),
      "Sessions bound, of session_capacity." },

    { "kv_aware_session_capacity_entries", "gauge",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, U64, session.capacity),
      "Sessions the table can hold (session_capacity; 0: no session=)." },

    { "kv_aware_session_expired_total", "counter",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, U64, session.expired),
      "Sessions forgotten after session_timeout idle." },

    { "kv_aware_session_evicted_total", "counter",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, U64, session.evicted),
      "Sessions forgotten to make room for a new one, the least recently "
      "used first." },

    { "kv_aware_index_entries", "gauge",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, U32, index.used),
      "Entries (prompt blocks) in the upstream's index." },

    { "kv_aware_index_capacity_entries",
      "gauge", NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, U32, index.capacity),
      "Entries the index can hold (index_size)." },

    { "kv_aware_index_evictions_total",
      "counter", NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, U64, index.evictions),
      "Least recently used entries evicted because the index was full." },

    { "kv_aware_index_chain_evictions_total", "counter",
      NGX_HTTP_KV_AWARE_PS_UPSTREAM, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, U64, index.chain_evictions),
      "Entries evicted to insert into a full hash chain." },

    { "kv_aware_tokenize_calls_total",
      "counter", NGX_HTTP_KV_AWARE_PS_TOKENS, "result",
      kva_tokenize_names, 0, KVA_TOKENIZE_LAST,
      ngx_http_kv_aware_pu(NUM, UINT, tokenize),
      "Requests to the upstream that asked the tokenizer (kv_aware_tokenize),"
      " by result." },

    { "kv_aware_event_messages_total",
      "counter", NGX_HTTP_KV_AWARE_PS_EVENTS, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, UINT, ev.messages),
      "Event messages applied to the index." },

    { "kv_aware_event_block_hashes_total",
      "counter", NGX_HTTP_KV_AWARE_PS_EVENTS, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, UINT, ev.hashes),
      "Block hashes applied from event messages." },

    { "kv_aware_event_rejects_total",
      "counter", NGX_HTTP_KV_AWARE_PS_EVENTS, "class",
      ngx_http_kv_aware_zone_reject_keys, 0, NGX_HTTP_KV_AWARE_REJ_LAST,
      ngx_http_kv_aware_pu(NUM, UINT, ev.rejected),
      "Event messages rejected, by class." },

    { "kv_aware_resyncs_total", "counter",
      NGX_HTTP_KV_AWARE_PS_EVENTS, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, UINT, ev.resyncs),
      "Snapshots asked of servers whose events were lost." },

    { "kv_aware_redis_state", "gauge",
      NGX_HTTP_KV_AWARE_PS_EVENTS, "state",
      ngx_http_kv_aware_redis_state_names, 0, NGX_HTTP_KV_AWARE_REDIS_LAST,
      ngx_http_kv_aware_pu(IS, UINT, redis.state),
      "The Redis link's state: 1 for the state it is in." },

    { "kv_aware_redis_connects_total",
      "counter", NGX_HTTP_KV_AWARE_PS_EVENTS, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, UINT, redis.connects),
      "Connections made to Redis." },

    { "kv_aware_redis_failures_total",
      "counter", NGX_HTTP_KV_AWARE_PS_EVENTS, NULL, NULL, 0, 0,
      ngx_http_kv_aware_pu(NUM, UINT, redis.failures),
      "Redis connections that failed or were lost." },

    { "kv_aware_server_backup", "gauge",
      NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(LEVEL, UINT, backup),
      "1 for a backup server." },

    { "kv_aware_server_state", "gauge",
      NGX_HTTP_KV_AWARE_PS_SERVER, "state",
      ngx_http_kv_aware_zone_ev_state_names, 0, NGX_HTTP_KV_AWARE_EV_LAST,
      ngx_http_kv_aware_ps(IS, UINT, slot.ev.state),
      "What is known of the server's cache: 1 for the state it is in." },

    { "kv_aware_server_in_flight_requests",
      "gauge", NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(NUM, INT, in_flight),
      "Requests this nginx has in flight on the server." },

    { "kv_aware_server_requests_total",
      "counter", NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(NUM, UINT, slot.routing.routed),
      "Requests routed to the server, one per try." },

    { "kv_aware_server_prompt_blocks_total",
      "counter", NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(NUM, UINT, slot.routing.blocks),
      "Prompt blocks of the requests routed to the server." },

    { "kv_aware_server_matched_blocks_total", "counter",
      NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(NUM, UINT, slot.routing.matched),
      "Of those, leading blocks the index said the server held." },

    { "kv_aware_server_prefill_rate_blocks", "gauge",
      NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(LEVEL, UINT, slot.ttft.rate),
      "Prompt blocks a second the server prefills, as learned from its "
      "answers' time to first token (0: none learned yet)." },

    { "kv_aware_server_ttft_samples_total", "counter",
      NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(NUM, U64, slot.ttft.est.samples),
      "Answers the server's prefill rate was learned from." },

    { "kv_aware_server_ttft_ignored_total", "counter",
      NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(NUM, UINT, slot.ttft.ignored),
      "Answers not learned from: not a 2xx event stream, or no time." },

    { "kv_aware_server_ttft_queued_blocks", "gauge",
      NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(NUM, INT, slot.ttft.queued),
      "Uncached blocks routed to the server whose answer has not begun." },

    { "kv_aware_server_ttft_predicted_ms", "gauge",
      NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(LEVEL, UINT, slot.ttft.predicted_ms),
      "Time to first token predicted for the last request routed there." },

    { "kv_aware_server_ttft_observed_ms", "gauge",
      NGX_HTTP_KV_AWARE_PS_SERVER, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(LEVEL, UINT, slot.ttft.observed_ms),
      "Time to first token of the last answer learned from." },

    { "kv_aware_server_index_entries",
      "gauge", NGX_HTTP_KV_AWARE_PS_SERVER, "source",
      kva_src_names, 0, KVA_SRC_COUNT,
      ngx_http_kv_aware_ps(NUM, U64, count.entries),
      "Index entries of the server, by what put them there." },

    { "kv_aware_server_index_tier_entries",
      "gauge", NGX_HTTP_KV_AWARE_PS_SERVER, "tier",
      kva_tier_slow_names, 0, KVA_TIERS_SLOW,
      ngx_http_kv_aware_ps(NUM, U64, count.slow),
      "Event entries of the server whose fastest copy is past GPU memory." },

    { "kv_aware_server_event_messages_total", "counter",
      NGX_HTTP_KV_AWARE_PS_SERVER_EVENTS, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(NUM, UINT, slot.ev.messages),
      "Event messages of the server applied." },

    { "kv_aware_server_event_block_hashes_total", "counter",
      NGX_HTTP_KV_AWARE_PS_SERVER_EVENTS, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(NUM, UINT, slot.ev.hashes),
      "Block hashes of the server applied from its events." },

    { "kv_aware_server_event_gaps_total",
      "counter", NGX_HTTP_KV_AWARE_PS_SERVER_EVENTS, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(NUM, UINT, slot.ev.gaps),
      "Gaps in the server's event sequence numbers." },

    { "kv_aware_server_engine_waiting_requests", "gauge",
      NGX_HTTP_KV_AWARE_PS_SERVER_LOAD, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(NUM, U32, slot.ev.waiting),
      "Requests waiting in the engine, as its last events said." },

    { "kv_aware_server_engine_running_requests", "gauge",
      NGX_HTTP_KV_AWARE_PS_SERVER_LOAD, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(NUM, U32, slot.ev.running),
      "Requests running in the engine, as its last events said." },

    { "kv_aware_server_engine_kv_cache_usage_ratio", "gauge",
      NGX_HTTP_KV_AWARE_PS_SERVER_LOAD, NULL, NULL, 0, 0,
      ngx_http_kv_aware_ps(MILLI, U32, slot.ev.kv_usage),
      "The engine's KV cache in use, 0 to 1, as its last events said." }
};


ngx_buf_t *
ngx_http_kv_aware_prometheus(ngx_http_request_t *r,
    ngx_http_kv_aware_status_t *st)
{
    return ngx_http_kv_aware_status_out_page(r, st,
                                             ngx_http_kv_aware_prom_page);
}


static void
ngx_http_kv_aware_prom_page(ngx_http_kv_aware_status_out_t *o,
    ngx_http_kv_aware_status_t *st)
{
    ngx_uint_t                        u, any;
    ngx_http_kv_aware_prom_family_t  *f, *last;

    /* a page, never an empty body, even without a kv_aware upstream */
    ngx_http_kv_aware_status_out_str(o, "# kv_aware_status\n");

    f = ngx_http_kv_aware_prom_families;
    last = f + sizeof(ngx_http_kv_aware_prom_families)
               / sizeof(ngx_http_kv_aware_prom_families[0]);

    for ( /* void */ ; f < last; f++) {

        any = 0;

        for (u = 0; u < st->nupstreams; u++) {
            any |= ngx_http_kv_aware_prom_in_scope(f, &st->upstreams[u]);
        }

        if (!any) {
            continue;
        }

        ngx_http_kv_aware_status_out_str(o, "# HELP ");
        ngx_http_kv_aware_status_out_str(o, f->name);
        ngx_http_kv_aware_status_out_str(o, " ");
        ngx_http_kv_aware_status_out_str(o, f->help);
        ngx_http_kv_aware_status_out_str(o, "\n# TYPE ");
        ngx_http_kv_aware_status_out_str(o, f->name);
        ngx_http_kv_aware_status_out_str(o, " ");
        ngx_http_kv_aware_status_out_str(o, f->type);
        ngx_http_kv_aware_status_out_str(o, "\n");

        ngx_http_kv_aware_prom_family(o, f, st);
    }
}


/* the samples of a family, of every upstream in its scope */
static void
ngx_http_kv_aware_prom_family(ngx_http_kv_aware_status_out_t *o,
    ngx_http_kv_aware_prom_family_t *f, ngx_http_kv_aware_status_t *st)
{
    u_char                                seen[KVA_MAX_SLOTS];
    ngx_uint_t                            i, j, n, nr, whole, load;
    ngx_http_kv_aware_status_server_t    *sv;
    ngx_http_kv_aware_status_upstream_t  *u;

    for (n = 0; n < st->nupstreams; n++) {
        u = &st->upstreams[n];

        if (!ngx_http_kv_aware_prom_in_scope(f, u)) {
            continue;
        }

        if (f->scope < NGX_HTTP_KV_AWARE_PS_SERVER) {
            ngx_http_kv_aware_prom_samples(o, f, u, NULL, 0);
            continue;
        }

        ngx_memzero(seen, sizeof(seen));

        /* a server's ranks as one series (nr of them), or each its own */
        whole = !st->per_rank && u->listed > NGX_HTTP_KV_AWARE_PROM_RANKS;

        for (i = 0; i < u->nservers; i += nr) {
            sv = &u->servers[i];

            /* its rows are its ranks in order: the next server's is 0 */
            for (nr = 1; whole && sv->ranked && i + nr < u->nservers
                         && sv[nr].slot.rank > sv[nr - 1].slot.rank;
                 nr++)
            {
                /* void */
            }

            /* a server listed twice has one slot: one set of samples,
               as Prometheus refuses a series twice in a scrape */
            if (seen[sv->index]) {
                continue;
            }

            seen[sv->index] = 1;

            for (j = 0, load = 0; j < nr; j++) {
                load |= sv[j].slot.ev.has_load;
            }

            if (f->scope == NGX_HTTP_KV_AWARE_PS_SERVER_LOAD && !load) {
                continue;
            }

            ngx_http_kv_aware_prom_samples(o, f, u, sv,
                                           (whole && sv->ranked) ? nr : 0);
        }
    }
}


static ngx_uint_t
ngx_http_kv_aware_prom_in_scope(ngx_http_kv_aware_prom_family_t *f,
    ngx_http_kv_aware_status_upstream_t *u)
{
    switch (f->scope) {

    case NGX_HTTP_KV_AWARE_PS_TOKENS:
        return u->tokens;

    case NGX_HTTP_KV_AWARE_PS_EVENTS:
    case NGX_HTTP_KV_AWARE_PS_SERVER_EVENTS:
    case NGX_HTTP_KV_AWARE_PS_SERVER_LOAD:
        return u->events;

    default:
        return 1;
    }
}


/* name{upstream="...",server="...",label="key"} value, a line per key */
static void
ngx_http_kv_aware_prom_samples(ngx_http_kv_aware_status_out_t *o,
    ngx_http_kv_aware_prom_family_t *f,
    ngx_http_kv_aware_status_upstream_t *u,
    ngx_http_kv_aware_status_server_t *sv, ngx_uint_t nranks)
{
    void        *base;
    u_char       rank[NGX_INT_T_LEN];
    uint64_t     v;
    ngx_uint_t   k, first, last;

    base = sv ? (void *) sv : (void *) u;
    first = f->label ? f->first : 0;
    last = f->label ? f->last : 1;

    for (k = first; k < last; k++) {
        ngx_http_kv_aware_status_out_str(o, f->name);
        ngx_http_kv_aware_prom_label(o, "upstream", u->name.data,
                                     u->name.len, 1);

        if (sv) {
            ngx_http_kv_aware_prom_label(o, "server", sv->name.data,
                                         sv->name.len, 0);

            /* each rank of a data-parallel server is a series of its own */
            if (sv->ranked && nranks == 0) {
                ngx_http_kv_aware_prom_label(o, "rank", rank,
                                 ngx_sprintf(rank, "%ui", sv->slot.rank)
                                 - rank, 0);
            }
        }

        if (f->label) {
            ngx_http_kv_aware_prom_label(o, f->label, (u_char *) f->keys[k],
                                         ngx_strlen(f->keys[k]), 0);
        }

        ngx_http_kv_aware_status_out_str(o, "} ");

        v = nranks ? ngx_http_kv_aware_prom_ranks(f, sv, nranks, k)
                   : ngx_http_kv_aware_prom_value(f, base, k);

        ngx_http_kv_aware_prom_number(o, v,
                                      f->form == NGX_HTTP_KV_AWARE_PF_MILLI);

        ngx_http_kv_aware_status_out_str(o, "\n");
    }
}


/* sample k of the family, of the upstream's or a server's snapshot */
static uint64_t
ngx_http_kv_aware_prom_value(ngx_http_kv_aware_prom_family_t *f, void *base,
    ngx_uint_t k)
{
    uint64_t  v;

    if (f->form == NGX_HTTP_KV_AWARE_PF_IS) {
        return ngx_http_kv_aware_status_snapshot_value(base, f->offset,
                                                       f->value, 0)
               == k;
    }

    v = ngx_http_kv_aware_status_snapshot_value(base, f->offset, f->value,
                                                f->label ? k : 0);

    /* added and taken by other workers: a moment may read below 0 */
    if (f->value == NGX_HTTP_KV_AWARE_SV_INT && (int64_t) v < 0) {
        v = 0;
    }

    return v;
}


/*
 * Sample k of a server's nranks ranks as one: counts summed (IS: the
 * ranks in state k), ratios and levels averaged over the ranks that have
 * them (of an engine's load, those that reported one).
 */
static uint64_t
ngx_http_kv_aware_prom_ranks(ngx_http_kv_aware_prom_family_t *f,
    ngx_http_kv_aware_status_server_t *sv, ngx_uint_t nranks, ngx_uint_t k)
{
    uint64_t    sum;
    ngx_uint_t  j, n;

    sum = 0;
    n = 0;

    for (j = 0; j < nranks; j++) {
        if (f->scope == NGX_HTTP_KV_AWARE_PS_SERVER_LOAD
            && !sv[j].slot.ev.has_load)
        {
            continue;
        }

        sum += ngx_http_kv_aware_prom_value(f, &sv[j], k);
        n++;
    }

    if (n && (f->form == NGX_HTTP_KV_AWARE_PF_MILLI
              || f->form == NGX_HTTP_KV_AWARE_PF_LEVEL))
    {
        return sum / n;
    }

    return sum;
}


/*
 * ,name="value" (or {name="value" for the first), the value escaped as
 * the format asks: backslash, double quote and line feed.  Names of
 * upstreams and servers come from the configuration, and may hold them.
 */
static void
ngx_http_kv_aware_prom_label(ngx_http_kv_aware_status_out_t *o,
    const char *name, u_char *value, size_t len, ngx_uint_t first)
{
    u_char      c, esc[2];
    size_t      n, w;

    ngx_http_kv_aware_status_out_str(o, first ? "{" : ",");
    ngx_http_kv_aware_status_out_str(o, name);
    ngx_http_kv_aware_status_out_str(o, "=\"");

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

    ngx_http_kv_aware_status_out_str(o, "\"");
}


/* an integer, or thousandths as a decimal fraction */
static void
ngx_http_kv_aware_prom_number(ngx_http_kv_aware_status_out_t *o, uint64_t v,
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
