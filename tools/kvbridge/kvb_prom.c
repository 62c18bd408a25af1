/*
 * kvbridge: its metrics page (kvb_prom.h).
 */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvb_prom.h"


typedef enum {
    KVB_PROM_ENGINE = 0,
    KVB_PROM_STREAM,
    KVB_PROM_MIRROR,
    KVB_PROM_SCRAPE,
    KVB_PROM_BRIDGE
} kvb_prom_src_e;


typedef struct {
    const char             *name;
    const char             *type;
    const char             *help;
    kvb_prom_src_e          src;
    size_t                  offset;     /* of a uint64_t, or a double */
    unsigned                real:1;
} kvb_prom_series_t;


typedef struct {
    const char             *name;
    const char             *type;
    const char             *help;
    size_t                  offset;     /* in kvb_redis_stats_t */
} kvb_prom_redis_t;


#define KVB_C(src, st, field, name, help)                                     \
    { "kvbridge_engine_" name "_total", "counter", help, KVB_PROM_##src,      \
      offsetof(st, field), 0 }
#define KVB_G(src, st, field, name, help)                                     \
    { "kvbridge_engine_" name, "gauge", help, KVB_PROM_##src,                 \
      offsetof(st, field), 0 }
#define KVB_R(src, st, field, name, help)                                     \
    { "kvbridge_engine_" name, "gauge", help, KVB_PROM_##src,                 \
      offsetof(st, field), 1 }


/* one line a series; labels engine and rank */

static const kvb_prom_series_t  kvb_prom_engine[] = {
    KVB_C(ENGINE, kvb_engine_stats_t, batches, "batches",
          "Batches of the engine handed on in order"),
    KVB_C(ENGINE, kvb_engine_stats_t, bad_batches, "bad_batches",
          "Batches the decoder refused"),
    KVB_C(ENGINE, kvb_engine_stats_t, bad_events, "bad_events",
          "Events skipped as malformed"),
    KVB_C(ENGINE, kvb_engine_stats_t, unknown_events, "unknown_events",
          "Events of a kind the bridge does not know"),
    KVB_C(ENGINE, kvb_engine_stats_t, messages, "messages",
          "Messages published to nginx"),
    KVB_C(ENGINE, kvb_engine_stats_t, snapshots, "snapshots",
          "Snapshots of the mirror started"),
    KVB_C(ENGINE, kvb_engine_stats_t, wrong_rank, "wrong_rank_batches",
          "Batches of another data-parallel rank"),

    KVB_C(ENGINE, kvb_engine_stats_t, disconnects, "disconnects",
          "Times the engine's event socket was disconnected"),
    KVB_C(ENGINE, kvb_engine_stats_t, forgotten, "forgotten",
          "Times events were lost for good: mirror cleared, nginx told"),
    KVB_C(ENGINE, kvb_engine_stats_t, rebuilds, "rebuilds",
          "Replays from seq 0 asked to rebuild the mirror"),
    KVB_C(ENGINE, kvb_engine_stats_t, resyncs_deferred, "resyncs_deferred",
          "Resyncs asked while the bridge could not vouch for the stream"),
    KVB_C(ENGINE, kvb_engine_stats_t, resyncs_coalesced, "resyncs_coalesced",
          "Resyncs asked while a snapshot was being sent"),
    KVB_C(ENGINE, kvb_engine_stats_t, snapshots_done, "snapshots_done",
          "Snapshots sent to the end"),

    KVB_C(STREAM, kvb_stream_stats_t, duplicates, "duplicate_batches",
          "Batches seen twice and dropped"),
    KVB_C(STREAM, kvb_stream_stats_t, gaps, "gaps",
          "Gaps in the engine's seq"),
    KVB_C(STREAM, kvb_stream_stats_t, replays_ok, "replays_ok",
          "Gaps closed by a replay"),
    KVB_C(STREAM, kvb_stream_stats_t, replays_failed, "replays_given_up",
          "Replays that failed or timed out: batches lost"),
    KVB_C(STREAM, kvb_stream_stats_t, restarts, "restarts",
          "Engine restarts seen (seq went back)"),
    KVB_C(STREAM, kvb_stream_stats_t, resets, "resets",
          "Times the engine's state was started again"),
    KVB_C(STREAM, kvb_stream_stats_t, bad_frames, "bad_frames",
          "Frames with a malformed seq"),
    KVB_C(STREAM, kvb_stream_stats_t, verifies, "verifies",
          "Reconnects checked against a replay"),
    KVB_C(STREAM, kvb_stream_stats_t, suspects, "suspect_seqs",
          "Seqs that went back or jumped too far: acted on once confirmed"),
    KVB_C(STREAM, kvb_stream_stats_t, strays, "stray_frames",
          "Suspect frames never confirmed: dropped as strays"),
    KVB_C(STREAM, kvb_stream_stats_t, io_yields, "replay_reads_yielded",
          "Replay reads ended by the turn's budget, the rest left queued"),

    KVB_C(MIRROR, kvb_mirror_stats_t, stored, "mirror_stored",
          "Blocks stored in the mirror"),
    KVB_C(MIRROR, kvb_mirror_stats_t, removed, "mirror_removed",
          "Blocks removed from the mirror"),
    KVB_C(MIRROR, kvb_mirror_stats_t, skipped_group, "mirror_skipped_group",
          "Blocks skipped: a group not of full attention"),
    KVB_C(MIRROR, kvb_mirror_stats_t, orphans, "mirror_orphans",
          "Blocks whose parent the mirror did not know"),
    KVB_C(MIRROR, kvb_mirror_stats_t, full, "mirror_full",
          "Blocks refused past --max-blocks"),
    KVB_C(MIRROR, kvb_mirror_stats_t, clears, "mirror_clears",
          "Times the mirror was cleared"),
    KVB_C(MIRROR, kvb_mirror_stats_t, skipped_sliding,
          "mirror_skipped_sliding",
          "Blocks skipped: a sliding-window or chunked local group"),
    KVB_C(MIRROR, kvb_mirror_stats_t, skipped_mamba, "mirror_skipped_mamba",
          "Blocks skipped: a mamba group"),
    KVB_C(MIRROR, kvb_mirror_stats_t, skipped_kind, "mirror_skipped_kind",
          "Blocks skipped: a group of another or unknown kind"),
    KVB_C(MIRROR, kvb_mirror_stats_t, untokened, "mirror_untokened",
          "Blocks without token ids whose engine hash the mirror did not "
          "know"),
    KVB_C(MIRROR, kvb_mirror_stats_t, holders_full, "mirror_holders_full",
          "Blocks skipped: past the holders (group, tier) the mirror tells "
          "apart"),
    KVB_C(MIRROR, kvb_mirror_stats_t, lora_unnamed, "mirror_lora_unnamed",
          "Blocks of a LoRA adapter named by id alone: held, not published"),
    KVB_C(MIRROR, kvb_mirror_stats_t, copies, "mirror_copies",
          "Stores of a block its holder already held (a second copy)"),
    KVB_C(MIRROR, kvb_mirror_stats_t, shared_keys, "mirror_shared_keys",
          "Stores of a key another engine block already had"),

    KVB_C(SCRAPE, kvb_scrape_stats_t, ok, "scrapes_ok",
          "Scrapes of the engine's /metrics that gave a load"),
    KVB_C(SCRAPE, kvb_scrape_stats_t, failed, "scrape_failures",
          "Scrapes of the engine's /metrics that failed"),

    KVB_G(BRIDGE, kvb_prom_bridge_t, blocks, "mirror_blocks",
          "Blocks the mirror holds"),
    KVB_G(BRIDGE, kvb_prom_bridge_t, vouched, "stream_vouched",
          "1 while the stream is connected, in order and its mirror "
          "rebuilt (heartbeats go out)"),
    KVB_G(BRIDGE, kvb_prom_bridge_t, replaying, "replaying",
          "1 while a replay runs (live batches are held)"),
    KVB_G(BRIDGE, kvb_prom_bridge_t, scrape_failing, "scrape_failing",
          "1 when the last scrape failed"),
    KVB_C(BRIDGE, kvb_prom_bridge_t, malformed, "malformed_messages",
          "Messages not of [topic, seq, payload]"),
    KVB_R(BRIDGE, kvb_prom_bridge_t, last_event_age, "last_event_age_seconds",
          "Seconds since the engine's last batch came (-1: none yet)"),
};


#define KVB_RS(field, name, type, help)                                       \
    { "kvbridge_redis_" name, type, help, offsetof(kvb_redis_stats_t, field) }

static const kvb_prom_redis_t  kvb_prom_redis[] = {
    KVB_RS(published, "published_total", "counter",
           "PUBLISHes sent to Redis"),
    KVB_RS(dropped, "dropped_total", "counter",
           "Messages dropped: Redis down or behind"),
    KVB_RS(resyncs, "resync_requests_total", "counter",
           "Resync requests heard from nginx"),
    KVB_RS(bad_requests, "bad_requests_total", "counter",
           "Resync requests that did not parse"),
    KVB_RS(reconnects, "reconnects_total", "counter",
           "Reconnects of the Redis links"),
    KVB_RS(dropped_bytes, "dropped_bytes_total", "counter",
           "Bytes of the messages dropped"),
    KVB_RS(lost, "lost_total", "counter",
           "Messages sent, then the link dropped before Redis answered"),
    KVB_RS(publish_errors, "publish_errors_total", "counter",
           "PUBLISHes Redis answered with an error"),
    KVB_RS(timeouts, "timeouts_total", "counter",
           "Links dropped for no reply in --redis-timeout (a hung Redis)"),
    KVB_RS(pending, "pending_messages", "gauge",
           "PUBLISHes sent and not yet answered"),
    KVB_RS(pending_bytes, "pending_bytes", "gauge",
           "Bytes sent and not yet answered, at most --redis-max-pending"),
};


static void kvb_prom_head(kvb_buf_t *b, const char *name, const char *type,
    const char *help);
static void kvb_prom_label(kvb_buf_t *b, const char *v);
static void kvb_prom_hist(kvb_buf_t *b, const char *name,
    const char *label, const kvb_loop_hist_t *h);
static const void *kvb_prom_struct(const kvb_prom_engine_t *e,
    kvb_prom_src_e src);


void
kvb_prom_render(kvb_buf_t *b, const kvb_prom_view_t *v)
{
    size_t                    i, k, n;
    const char               *name;
    const void               *st;
    const kvb_loop_hist_t    *h;
    const kvb_prom_series_t  *s;
    const kvb_prom_redis_t   *r;

    for (i = 0; i < sizeof(kvb_prom_engine) / sizeof(kvb_prom_engine[0]);
         i++)
    {
        s = &kvb_prom_engine[i];
        kvb_prom_head(b, s->name, s->type, s->help);

        for (k = 0; k < v->nengines; k++) {
            st = kvb_prom_struct(&v->engines[k], s->src);
            if (st == NULL) {
                continue;
            }

            kvb_buf_printf(b, "%s{engine=", s->name);
            kvb_prom_label(b, v->engines[k].name);
            kvb_buf_printf(b, ",rank=\"%u\"} ", v->engines[k].rank);

            if (s->real) {
                kvb_buf_printf(b, "%.3f\n",
                               *(const double *) ((const char *) st
                                                  + s->offset));
            } else {
                kvb_buf_printf(b, "%llu\n", (unsigned long long)
                               *(const uint64_t *) ((const char *) st
                                                    + s->offset));
            }
        }
    }

    kvb_prom_head(b, "kvbridge_engine_scrape_failures_by_kind_total",
                  "counter", "Failed scrapes of the engine's /metrics, "
                  "by kind");

    for (k = 0; k < v->nengines; k++) {
        if (v->engines[k].scrape == NULL) {
            continue;
        }

        for (i = 0; i < KVB_SCRAPE_ERR_KINDS; i++) {
            kvb_buf_printf(b, "kvbridge_engine_scrape_failures_by_kind_total"
                           "{engine=");
            kvb_prom_label(b, v->engines[k].name);
            kvb_buf_printf(b, ",rank=\"%u\",kind=\"%s\"} %llu\n",
                           v->engines[k].rank, kvb_scrape_err_name(i),
                           (unsigned long long)
                           v->engines[k].scrape->failures[i]);
        }
    }

    kvb_prom_head(b, "kvbridge_redis_up", "gauge",
                  "1 when the publishing link to Redis is up");
    kvb_buf_printf(b, "kvbridge_redis_up %llu\n",
                   (unsigned long long) v->redis_up);

    kvb_prom_head(b, "kvbridge_redis_link_up", "gauge",
                  "1 when the link is up, by link (publish, subscribe)");
    kvb_buf_printf(b, "kvbridge_redis_link_up{link=\"publish\"} %d\n"
                   "kvbridge_redis_link_up{link=\"subscribe\"} %d\n",
                   v->redis->publish_state == KVB_REDIS_UP,
                   v->redis->subscribe_state == KVB_REDIS_UP);

    for (i = 0; i < sizeof(kvb_prom_redis) / sizeof(kvb_prom_redis[0]);
         i++)
    {
        r = &kvb_prom_redis[i];
        kvb_prom_head(b, r->name, r->type, r->help);
        kvb_buf_printf(b, "%s %llu\n", r->name, (unsigned long long)
                       *(const uint64_t *) ((const char *) v->redis
                                            + r->offset));
    }

    kvb_prom_head(b, "kvbridge_collect_denied_total", "counter",
                  "Collector connections refused by --collect-allow");
    kvb_buf_printf(b, "kvbridge_collect_denied_total %llu\n",
                   (unsigned long long) v->collect_denied);
    kvb_prom_head(b, "kvbridge_collect_limited_total", "counter",
                  "Collector messages dropped past a peer's rate");
    kvb_buf_printf(b, "kvbridge_collect_limited_total %llu\n",
                   (unsigned long long) v->collect_limited);

    /* the loop: its turns, and each source's share of them */

    kvb_prom_head(b, "kvbridge_loop_turn_seconds", "histogram",
                  "Time of one loop turn's callbacks, not its wait");
    kvb_prom_hist(b, "kvbridge_loop_turn_seconds", NULL,
                  kvb_loop_turns(v->loop));

    n = kvb_loop_nsources(v->loop);

    kvb_prom_head(b, "kvbridge_source_seconds", "histogram",
                  "Time of one source's callbacks in a turn");

    for (k = 0; k < n; k++) {
        h = kvb_loop_source(v->loop, k, &name);
        kvb_prom_hist(b, "kvbridge_source_seconds", name, h);
    }

    kvb_prom_head(b, "kvbridge_source_max_seconds", "gauge",
                  "The longest a source's callbacks held one turn");

    for (k = 0; k < n; k++) {
        h = kvb_loop_source(v->loop, k, &name);
        kvb_buf_printf(b, "kvbridge_source_max_seconds{source=");
        kvb_prom_label(b, name);
        kvb_buf_printf(b, "} %.6f\n", (double) h->ns_max / 1e9);
    }

    kvb_prom_head(b, "kvbridge_source_cpu_max_seconds", "gauge",
                  "The most CPU time a source's callbacks used in one "
                  "turn (the bridge's main thread)");

    for (k = 0; k < n; k++) {
        h = kvb_loop_source(v->loop, k, &name);
        kvb_buf_printf(b, "kvbridge_source_cpu_max_seconds{source=");
        kvb_prom_label(b, name);
        kvb_buf_printf(b, "} %.6f\n", (double) h->cpu_ns_max / 1e9);
    }

    kvb_prom_head(b, "kvbridge_source_cpu_seconds_total", "counter",
                  "CPU time of a source's callbacks (the bridge's main "
                  "thread)");

    for (k = 0; k < n; k++) {
        h = kvb_loop_source(v->loop, k, &name);
        kvb_buf_printf(b, "kvbridge_source_cpu_seconds_total{source=");
        kvb_prom_label(b, name);
        kvb_buf_printf(b, "} %.6f\n", (double) h->cpu_ns_sum / 1e9);
    }

    kvb_prom_head(b, "kvbridge_source_budget_exhausted_total", "counter",
                  "Turns a source returned with input left, its budget "
                  "spent");

    for (k = 0; k < n; k++) {
        h = kvb_loop_source(v->loop, k, &name);
        kvb_buf_printf(b, "kvbridge_source_budget_exhausted_total{source=");
        kvb_prom_label(b, name);
        kvb_buf_printf(b, "} %llu\n", (unsigned long long) h->exhausted);
    }
}


static const void *
kvb_prom_struct(const kvb_prom_engine_t *e, kvb_prom_src_e src)
{
    switch (src) {
    case KVB_PROM_ENGINE:
        return e->engine;
    case KVB_PROM_STREAM:
        return e->stream;
    case KVB_PROM_MIRROR:
        return e->mirror;
    case KVB_PROM_SCRAPE:
        return e->scrape;
    case KVB_PROM_BRIDGE:
        return e->bridge;
    }

    return NULL;
}


static void
kvb_prom_head(kvb_buf_t *b, const char *name, const char *type,
    const char *help)
{
    kvb_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name,
                   type);
}


/* a quoted label value, escaped as the format asks */

static void
kvb_prom_label(kvb_buf_t *b, const char *v)
{
    kvb_buf_printf(b, "\"");

    for ( /* void */ ; *v; v++) {
        switch (*v) {
        case '\\':
            kvb_buf_printf(b, "\\\\");
            break;
        case '"':
            kvb_buf_printf(b, "\\\"");
            break;
        case '\n':
            kvb_buf_printf(b, "\\n");
            break;
        default:
            kvb_buf_printf(b, "%c", *v);
        }
    }

    kvb_buf_printf(b, "\"");
}


static void
kvb_prom_hist(kvb_buf_t *b, const char *name, const char *label,
    const kvb_loop_hist_t *h)
{
    unsigned  i;
    uint64_t  cum;

    cum = 0;

    for (i = 0; i < KVB_LOOP_BUCKETS; i++) {
        cum += h->buckets[i];
        kvb_buf_printf(b, "%s_bucket{", name);

        if (label != NULL) {
            kvb_buf_printf(b, "source=");
            kvb_prom_label(b, label);
            kvb_buf_printf(b, ",");
        }

        kvb_buf_printf(b, "le=\"%g\"} %llu\n", kvb_loop_bounds[i],
                       (unsigned long long) cum);
    }

    cum += h->over;
    kvb_buf_printf(b, "%s_bucket{", name);

    if (label != NULL) {
        kvb_buf_printf(b, "source=");
        kvb_prom_label(b, label);
        kvb_buf_printf(b, ",");
    }

    kvb_buf_printf(b, "le=\"+Inf\"} %llu\n", (unsigned long long) cum);

    kvb_buf_printf(b, "%s_sum", name);

    if (label != NULL) {
        kvb_buf_printf(b, "{source=");
        kvb_prom_label(b, label);
        kvb_buf_printf(b, "}");
    }

    kvb_buf_printf(b, " %.6f\n%s_count", (double) h->ns_sum / 1e9, name);

    if (label != NULL) {
        kvb_buf_printf(b, "{source=");
        kvb_prom_label(b, label);
        kvb_buf_printf(b, "}");
    }

    kvb_buf_printf(b, " %llu\n", (unsigned long long) cum);
}


void
kvb_buf_printf(kvb_buf_t *b, const char *fmt, ...)
{
    int       n;
    char     *p;
    size_t    cap;
    va_list   args;

    if (b->failed) {
        return;
    }

    for ( ;; ) {
        va_start(args, fmt);
        n = vsnprintf(b->data ? b->data + b->len : NULL,
                      b->data ? b->cap - b->len : 0, fmt, args);
        va_end(args);

        if (n < 0) {
            b->failed = 1;
            return;
        }

        if (b->data != NULL && b->len + (size_t) n < b->cap) {
            b->len += n;
            return;
        }

        cap = b->cap ? b->cap * 2 : 16384;

        while (cap <= b->len + (size_t) n) {
            cap *= 2;
        }

        p = realloc(b->data, cap);
        if (p == NULL) {
            b->failed = 1;
            return;
        }

        b->data = p;
        b->cap = cap;
    }
}


void
kvb_buf_free(kvb_buf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->failed = 0;
}
