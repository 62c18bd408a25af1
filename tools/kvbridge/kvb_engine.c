/*
 * kvbridge: one engine, from its socket to nginx (kvb_engine.h).
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "kva_event.h"
#include "kvb_engine.h"
#include "kvb_log.h"
#include "kvb_mirror.h"
#include "kvb_stream.h"
#include "kvb_zmsg.h"


/* a load older than this is not sent: nginx falls back to its own count */
#define KVB_LOAD_FRESH_MS   5000

/* a hash costs about 19 bytes in a message: 16 hex digits, quotes, comma */
#define KVB_HASH_BYTES      19

/*
 * Pacing towards nginx: a bucket of bytes that fills at --snapshot-rate
 * and that every message empties, so that whatever window of a second
 * nginx counts holds at most the rate, this much saved up, and one part
 * sent on credit.
 */
#define KVB_CREDIT_SAVE_MS  100
/* a slice sends at most this many parts, however small */
#define KVB_SLICE_PARTS     64

/* a disconnected SUB socket is connected anew after this (ms) */
#define KVB_RECONNECT_MS    200

/*
 * What the event socket may queue in the bridge: at most this many bytes
 * of batches (each at most --max-batch), but never fewer than
 * KVB_QUEUE_MIN batches.  Past it ZeroMQ stops reading the connection, and
 * the engine's PUB socket queues (vLLM's holds 100,000 batches) or drops,
 * which the bridge sees as a gap.  Unbounded (high-water mark 0), a flood
 * of 40 KB batches grew the bridge to 284 MB in 4 s; with the bound it
 * stayed at 33-40 MB (bench/bench_loop.sh).
 */
#define KVB_QUEUE_BYTES     (64 * 1024 * 1024)
#define KVB_QUEUE_MIN       16
#define KVB_QUEUE_MAX       1000


struct kvb_engine_s {
    kvb_engine_conf_t       conf;
    kvb_engine_limits_t     lim;
    char                   *name;
    char                   *label;          /* name, and rank if ranked */
    char                   *model;
    char                   *topic;
    void                   *sub;
    void                   *mon;            /* the SUB's connects */
    kvb_stream_t           *stream;
    kvb_mirror_t           *mirror;
    kvb_redis_t            *redis;

    uint64_t                seq;            /* the last one published */
    uint64_t                last_pub;       /* ms */
    int64_t                 credit;         /* bytes nginx may take now */
    uint64_t                credit_at;      /* ms, when it was filled */

    unsigned                connected:1;    /* its SUB, by the monitor */
    unsigned                rebuilding:1;   /* replayed from 0, unsaid */
    unsigned                resync_asked:1; /* answered once vouched */
    uint64_t                reconnect_at;   /* ms, 0: none due */

    unsigned                has_load:1;
    uint32_t                waiting, running;
    double                  kv_usage;
    uint64_t                kv_tokens;      /* the pool, 0: unsaid */
    uint64_t                load_at;

    unsigned                snapshotting:1;
    unsigned                snapshot_again:1; /* asked during this one */
    unsigned                snapshot_parts;
    size_t                  cursor;
    uint64_t                next_slice;     /* ms */
    uint64_t               *keys;           /* one part's */
    uint8_t                *tiers;          /* and their tiers */

    uint64_t                now;
    uint64_t                replays_seen;   /* ok + failed, logged */
    kvb_engine_stats_t      st;
    kvb_log_limit_t         bad_log;        /* batches refused */
    kvb_log_limit_t         skip_log;       /* events skipped */
    kvb_log_limit_t         rank_log;       /* batches of another rank */
    kvb_log_limit_t         conn_log;       /* disconnects */
    kvb_log_limit_t         defer_log;      /* resyncs not answered yet */
    kvb_log_limit_t         starve_log;     /* snapshots waiting */
};


static void kvb_engine_on_batch(void *data, uint64_t seq, const char *payload,
    size_t len);
static void kvb_engine_on_reset(void *data, kvb_reset_e why,
    const char *detail);
static void kvb_engine_publish(kvb_engine_t *e, kva_batch_t *b);
static void kvb_engine_send(kvb_engine_t *e, kva_batch_t *m);
static uint64_t kvb_engine_origin(void);
static void kvb_engine_slice(kvb_engine_t *e);
static size_t kvb_engine_by_tier(kvb_engine_t *e, size_t n, kva_ev_t *ev);
static void kvb_engine_snapshot(kvb_engine_t *e);
static void kvb_engine_forget(kvb_engine_t *e, const char *detail);
static void kvb_engine_credit(kvb_engine_t *e);
static void kvb_engine_rebuilt(kvb_engine_t *e);
static void kvb_engine_reconnect(kvb_engine_t *e);
static int kvb_engine_watch(kvb_engine_t *e, void *zctx);


kvb_engine_t *
kvb_engine_create(void *zctx, const kvb_engine_conf_t *conf,
    const kvb_engine_limits_t *lim, kvb_redis_t *redis, char *err,
    size_t errlen)
{
    int                    hwm;
    int64_t                max;
    kvb_engine_t          *e;
    kvb_stream_handler_t   h;

    e = calloc(1, sizeof(kvb_engine_t));
    if (e == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }

    e->conf = *conf;
    e->lim = *lim;
    e->redis = redis;
    e->name = strdup(conf->name);
    e->label = malloc(strlen(conf->name) + sizeof(" rank 4294967295"));
    e->model = strdup(conf->model);
    e->topic = strdup(conf->topic ? conf->topic : "");
    e->keys = malloc(lim->max_hashes * sizeof(uint64_t));
    e->tiers = malloc(lim->max_hashes);
    e->mirror = kvb_mirror_create(conf->model, lim->max_blocks);

    h.batch = kvb_engine_on_batch;
    h.reset = kvb_engine_on_reset;
    h.data = e;
    e->stream = kvb_stream_create(zctx, conf->replay, lim->replay_ms,
                                  lim->replay_hold, &h);

    if (e->label != NULL && conf->ranked) {
        sprintf(e->label, "%s rank %u", conf->name, conf->rank);

    } else if (e->label != NULL) {
        strcpy(e->label, conf->name);
    }

    if (e->stream != NULL) {
        kvb_stream_set_max_batch(e->stream, lim->decode.max_bytes);
        kvb_stream_set_own_socket(e->stream, conf->events != NULL);
    }

    if (e->name == NULL || e->label == NULL || e->model == NULL
        || e->topic == NULL
        || e->keys == NULL || e->tiers == NULL || e->mirror == NULL
        || e->stream == NULL)
    {
        snprintf(err, errlen, "out of memory");
        kvb_engine_destroy(e);
        return NULL;
    }

    e->now = kvb_now_ms();
    e->credit_at = e->now;

    /*
     * What the engine held before the bridge started is in its replay
     * buffer: the mirror is rebuilt from there before nginx is told
     * anything, or nginx would hear that an idle engine holds nothing.
     */
    if (kvb_stream_rebuild(e->stream, e->now) == 0) {
        e->rebuilding = 1;
        e->st.rebuilds++;
    }

    if (conf->events == NULL) {
        return e;
    }

    e->sub = zmq_socket(zctx, ZMQ_SUB);
    if (e->sub == NULL) {
        snprintf(err, errlen, "zmq_socket: %s", zmq_strerror(zmq_errno()));
        kvb_engine_destroy(e);
        return NULL;
    }

    /*
     * A batch past max_bytes would be refused anyway: ZeroMQ drops the
     * peer that sends it before it is buffered.  The queue is bounded
     * in batches so that it is in bytes (KVB_QUEUE_BYTES).
     */
    max = (int64_t) lim->decode.max_bytes + 64;
    hwm = KVB_QUEUE_BYTES / (lim->decode.max_bytes ? lim->decode.max_bytes
                                                   : 1);
    hwm = (hwm < KVB_QUEUE_MIN) ? KVB_QUEUE_MIN
          : (hwm > KVB_QUEUE_MAX) ? KVB_QUEUE_MAX : hwm;
    zmq_setsockopt(e->sub, ZMQ_MAXMSGSIZE, &max, sizeof(max));
    zmq_setsockopt(e->sub, ZMQ_RCVHWM, &hwm, sizeof(hwm));

    if (zmq_setsockopt(e->sub, ZMQ_SUBSCRIBE, e->topic, strlen(e->topic))
        != 0
        || kvb_engine_watch(e, zctx) != 0
        || zmq_connect(e->sub, conf->events) != 0)
    {
        snprintf(err, errlen, "events=%s: %s", conf->events,
                 zmq_strerror(zmq_errno()));
        kvb_engine_destroy(e);
        return NULL;
    }

    return e;
}


/*
 * The SUB socket's connects, from ZeroMQ's monitor: a reconnect may be
 * to a new engine process that has already published past the seq the
 * bridge saw, which no seq going back would tell (kvb_stream_verify()).
 */

static int
kvb_engine_watch(kvb_engine_t *e, void *zctx)
{
    char  ep[64];

    snprintf(ep, sizeof(ep), "inproc://kvb-monitor-%p", (void *) e);

    /*
     * Disconnects too: whether anything is connected is what heartbeats
     * tell nginx, and a peer dropped for a message over ZMQ_MAXMSGSIZE
     * (a protocol error to libzmq) is never reconnected by libzmq.
     */
    if (zmq_socket_monitor(e->sub, ep,
                           ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED)
        != 0)
    {
        return -1;
    }

    e->mon = zmq_socket(zctx, ZMQ_PAIR);

    if (e->mon == NULL || zmq_connect(e->mon, ep) != 0) {
        return -1;
    }

    return 0;
}


void *
kvb_engine_monitor(const kvb_engine_t *e)
{
    return e->mon;
}


void
kvb_engine_monitor_io(kvb_engine_t *e, uint64_t now_ms)
{
    int         n;
    uint16_t    event;
    kvb_zmsg_t  m;

    /* [event (2 bytes) and value (4), endpoint] */

    for (n = 0; n < 64 && kvb_zmsg_recv(e->mon, &m, 2); n++) {
        if (m.n >= 1 && zmq_msg_size(&m.part[0]) >= 2) {
            memcpy(&event, zmq_msg_data(&m.part[0]), 2);

            e->now = now_ms;

            if (event == ZMQ_EVENT_CONNECTED) {
                e->connected = 1;
                e->reconnect_at = 0;

                if (kvb_stream_verify(e->stream, now_ms) == 0) {
                    kvb_log(KVB_LOG_INFO, "engine %s: reconnected, "
                            "checking it is the same process", e->label);

                } else if (kvb_stream_rebuild(e->stream, now_ms) == 0) {
                    /* nothing seen of it yet: all it still buffers */
                    e->rebuilding = 1;
                    e->st.rebuilds++;
                    kvb_log(KVB_LOG_INFO, "engine %s: connected, replaying "
                            "it from its start", e->label);

                } else if (e->st.disconnects) {
                    kvb_log(KVB_LOG_INFO, "engine %s: reconnected",
                            e->label);
                }

            } else if (event == ZMQ_EVENT_DISCONNECTED) {
                e->connected = 0;
                e->st.disconnects++;
                kvb_log_limited(&e->conn_log, now_ms, KVB_LOG_WARN,
                                "engine %s: its events socket %s "
                                "disconnected (the engine stopped, or sent "
                                "a batch over --max-batch): no heartbeats "
                                "until it is back, reconnecting",
                                e->label, e->conf.events);

                /*
                 * A new session unless libzmq reconnects first: it gives
                 * one ended by a protocol error up for good.  Not at once:
                 * a peer that drops every connection would spin the loop.
                 */
                e->reconnect_at = now_ms + KVB_RECONNECT_MS;
            }
        }

        kvb_zmsg_close(&m);
    }
}


void
kvb_engine_destroy(kvb_engine_t *e)
{
    if (e == NULL) {
        return;
    }

    if (e->mon != NULL) {
        zmq_close(e->mon);
    }

    if (e->sub != NULL) {
        zmq_close(e->sub);
    }

    kvb_stream_destroy(e->stream);
    kvb_mirror_destroy(e->mirror);
    free(e->keys);
    free(e->tiers);
    free(e->topic);
    free(e->model);
    free(e->label);
    free(e->name);
    free(e);
}


/* what was lost meanwhile shows as a gap in seq */

static void
kvb_engine_reconnect(kvb_engine_t *e)
{
    e->reconnect_at = 0;

    if (zmq_disconnect(e->sub, e->conf.events) != 0
        && zmq_errno() != ENOENT)
    {
        kvb_log(KVB_LOG_ERR, "engine %s: zmq_disconnect: %s", e->label,
                zmq_strerror(zmq_errno()));
    }

    if (zmq_connect(e->sub, e->conf.events) != 0) {
        kvb_log(KVB_LOG_ERR, "engine %s: zmq_connect %s: %s", e->label,
                e->conf.events, zmq_strerror(zmq_errno()));
    }
}


const char *
kvb_engine_name(const kvb_engine_t *e)
{
    return e->name;
}


const char *
kvb_engine_label(const kvb_engine_t *e)
{
    return e->label;
}


const char *
kvb_engine_topic(const kvb_engine_t *e)
{
    return e->topic;
}


unsigned
kvb_engine_rank(const kvb_engine_t *e)
{
    return e->conf.rank;
}


void *
kvb_engine_sub(const kvb_engine_t *e)
{
    return e->sub;
}


void *
kvb_engine_replay(const kvb_engine_t *e)
{
    return kvb_stream_socket(e->stream);
}


void
kvb_engine_sub_io(kvb_engine_t *e, uint64_t now_ms)
{
    int         n;
    kvb_zmsg_t  m;

    /* [topic, seq, payload]; a bounded number a call, others wait */

    for (n = 0; n < 256 && kvb_zmsg_recv(e->sub, &m, 3); n++) {

        if (m.n == 3 && !m.too_long) {
            kvb_engine_frame(e, zmq_msg_data(&m.part[1]),
                             zmq_msg_size(&m.part[1]),
                             zmq_msg_data(&m.part[2]),
                             zmq_msg_size(&m.part[2]), now_ms);

        } else {
            e->st.bad_batches++;
            kvb_log_limited(&e->bad_log, now_ms, KVB_LOG_WARN,
                            "engine %s: a message of %s%zu parts, not 3",
                            e->label, m.too_long ? "more than " : "", m.n);
        }

        kvb_zmsg_close(&m);
    }
}


void
kvb_engine_replay_io(kvb_engine_t *e, uint64_t now_ms)
{
    e->now = now_ms;
    kvb_stream_io(e->stream, now_ms);
}


void
kvb_engine_frame(kvb_engine_t *e, const void *seq, size_t seq_len,
    const char *payload, size_t len, uint64_t now_ms)
{
    e->now = now_ms;
    kvb_stream_frame(e->stream, seq, seq_len, payload, len, now_ms);
}


void
kvb_engine_resync(kvb_engine_t *e)
{
    if (!kvb_engine_vouched(e)) {
        /* nginx keeps routing by what it learned meanwhile */
        e->resync_asked = 1;
        e->st.resyncs_deferred++;
        kvb_log_limited(&e->defer_log, e->now, KVB_LOG_INFO,
                        "engine %s: a resync waits until its stream is "
                        "%s", e->label,
                        (e->sub != NULL && !e->connected) ? "connected"
                        : e->rebuilding ? "replayed from its start"
                        : "replayed");
        return;
    }

    if (e->snapshotting) {
        /* not restarted: a snapshot restarted on every ask never ends */
        if (e->snapshot_parts) {
            e->snapshot_again = 1;
        }

        e->st.resyncs_coalesced++;
        return;
    }

    kvb_engine_snapshot(e);
}


int
kvb_engine_vouched(const kvb_engine_t *e)
{
    if (e->sub != NULL && !e->connected) {
        return 0;
    }

    /* a replay catching up (a gap, a reconnect) or rebuilding the mirror */
    return !e->rebuilding && kvb_stream_socket(e->stream) == NULL;
}


static void
kvb_engine_snapshot(kvb_engine_t *e)
{
    e->snapshotting = 1;
    e->snapshot_again = 0;
    e->snapshot_parts = 0;
    e->cursor = 0;
    e->next_slice = 0;
    e->st.snapshots++;
}


void
kvb_engine_load(kvb_engine_t *e, const kvb_load_t *load, uint64_t now_ms)
{
    e->has_load = 1;
    e->waiting = load->waiting;
    e->running = load->running;
    e->kv_usage = load->kv_usage;
    e->load_at = now_ms;

    /* the pool outlives a missed scrape: it changes with a restart only */
    if (load->have_tokens) {
        e->kv_tokens = load->kv_tokens;
    }
}


uint64_t
kvb_engine_deadline(const kvb_engine_t *e)
{
    uint64_t  d;

    d = e->last_pub + e->lim.heartbeat_ms;

    if (e->resync_asked && !e->snapshotting && kvb_engine_vouched(e)) {
        d = 0;
    }

    if (e->reconnect_at && e->reconnect_at < d) {
        d = e->reconnect_at;
    }

    if (e->snapshotting && e->next_slice < d) {
        d = e->next_slice;
    }

    if (kvb_stream_deadline(e->stream) < d) {
        d = kvb_stream_deadline(e->stream);
    }

    return d;
}


void
kvb_engine_tick(kvb_engine_t *e, uint64_t now_ms)
{
    kva_batch_t                hb;
    const kvb_stream_stats_t  *ss;

    e->now = now_ms;
    kvb_stream_tick(e->stream, now_ms);

    ss = kvb_stream_stats(e->stream);

    if (ss->replays_ok + ss->replays_failed != e->replays_seen) {
        e->replays_seen = ss->replays_ok + ss->replays_failed;
        kvb_log(KVB_LOG_INFO, "engine %s: gaps %llu, replayed %llu, "
                "lost %llu, duplicates %llu, restarts %llu, strays %llu, "
                "longest replay read %llu us", e->label,
                (unsigned long long) ss->gaps,
                (unsigned long long) ss->replays_ok,
                (unsigned long long) ss->replays_failed,
                (unsigned long long) ss->duplicates,
                (unsigned long long) ss->restarts,
                (unsigned long long) ss->strays,
                (unsigned long long) ss->io_max_us);
    }

    if (e->reconnect_at && now_ms >= e->reconnect_at) {
        kvb_engine_reconnect(e);
    }

    if (e->rebuilding && kvb_stream_socket(e->stream) == NULL) {
        kvb_engine_rebuilt(e);
    }

    if (e->resync_asked && !e->snapshotting && kvb_engine_vouched(e)) {
        e->resync_asked = 0;
        kvb_engine_snapshot(e);
    }

    if (e->snapshotting && now_ms >= e->next_slice) {
        kvb_engine_slice(e);
    }

    if (now_ms >= e->last_pub + e->lim.heartbeat_ms) {

        if (!kvb_redis_up(e->redis) || !kvb_engine_vouched(e)) {
            /*
             * A heartbeat lost changes nothing nginx knows: it does not
             * spend a seq, which would make nginx ask for a resync.  One
             * withheld lets nginx see that the stream is not alive or
             * not in order, and route by what it learned meanwhile.
             */
            e->last_pub = now_ms;
            return;
        }

        memset(&hb, 0, sizeof(hb));
        hb.heartbeat = 1;
        kvb_engine_send(e, &hb);
    }
}


const kvb_engine_stats_t *
kvb_engine_stats(const kvb_engine_t *e)
{
    return &e->st;
}


const kvb_stream_stats_t *
kvb_engine_stream_stats(const kvb_engine_t *e)
{
    return kvb_stream_stats(e->stream);
}


const kvb_mirror_stats_t *
kvb_engine_mirror_stats(const kvb_engine_t *e)
{
    return kvb_mirror_stats(e->mirror);
}


size_t
kvb_engine_blocks(const kvb_engine_t *e)
{
    return kvb_mirror_size(e->mirror);
}


static void
kvb_engine_on_batch(void *data, uint64_t seq, const char *payload,
    size_t len)
{
    char           err[160];
    kvb_rc_e       rc;
    kvb_batch_t    in;
    kva_batch_t    out;
    kvb_engine_t  *e = data;

    e->st.batches++;

    rc = kvb_decode(payload, len, &e->lim.decode, &in, err, sizeof(err));

    if (rc != KVB_OK) {
        /* its events are lost: the mirror can no longer be vouched for */
        e->st.bad_batches++;
        kvb_log_limited(&e->bad_log, e->now, KVB_LOG_WARN,
                        "engine %s: batch %llu refused (%s): %s", e->label,
                        (unsigned long long) seq, kvb_strerror(rc), err);
        kvb_batch_free(&in);
        kvb_engine_forget(e, "a batch refused");
        return;
    }

    if (in.has_rank && (uint64_t) in.rank != e->conf.rank) {
        /*
         * The socket says whose batch this is; a rank that disagrees is
         * a port given to the wrong rank, or ports crossed: the batch is
         * kept (the socket's engine holds those blocks), the operator
         * told.
         */
        e->st.wrong_rank++;
        kvb_log_limited(&e->rank_log, e->now, KVB_LOG_WARN,
                        "engine %s: batch %llu says data_parallel_rank "
                        "%lld (%llu so far): check its events= port",
                        e->label,
                        (unsigned long long) seq, (long long) in.rank,
                        (unsigned long long) e->st.wrong_rank);
    }

    e->st.bad_events += in.malformed;
    e->st.unknown_events += in.unknown;

    if (in.malformed) {
        kvb_log_limited(&e->skip_log, e->now, KVB_LOG_WARN,
                        "engine %s: batch %llu: %u malformed events skipped",
                        e->label, (unsigned long long) seq, in.malformed);
    }

    memset(&out, 0, sizeof(out));

    if (kvb_mirror_apply(e->mirror, &in, &out) != 0) {
        kvb_log(KVB_LOG_ERR, "engine %s: out of memory applying batch %llu",
                e->label, (unsigned long long) seq);
    }

    kvb_batch_free(&in);

    /* while rebuilding nginx hears nothing: a snapshot follows */
    if (out.nevents && !e->rebuilding) {
        kvb_engine_publish(e, &out);
    }

    kva_batch_free(&out);
}


static void
kvb_engine_on_reset(void *data, kvb_reset_e why, const char *detail)
{
    kva_batch_t    m;
    kva_ev_t       cleared;
    kvb_engine_t  *e = data;

    if (why == KVB_RESET_RESTART) {
        kvb_log(KVB_LOG_INFO, "engine %s restarted (%s): its cache is empty",
                e->label, detail);
        kvb_mirror_clear(e->mirror);

        if (e->rebuilding) {
            return;                     /* nginx heard nothing of it yet */
        }

        if (e->snapshotting) {
            /* the snapshot starts again, now of nothing */
            kvb_engine_snapshot(e);
            return;
        }

        memset(&m, 0, sizeof(m));
        memset(&cleared, 0, sizeof(cleared));
        cleared.type = KVA_EV_CLEARED;
        m.events = &cleared;
        m.nevents = 1;
        kvb_engine_send(e, &m);
        return;
    }

    kvb_engine_forget(e, detail);
}


/*
 * Events lost for good (no replay endpoint, or a replay that failed, or
 * a batch refused): a BlockRemoved among them would leave a block in
 * the mirror for good, and a snapshot of the mirror would announce it
 * to nginx as precise.  So the mirror is emptied, nginx hears "cleared",
 * and both are rebuilt from what the engine says next: the blocks the
 * engine still holds from before are unknown (routed by nginx as any
 * unknown prefix) rather than blocks it no longer holds announced.
 */

static void
kvb_engine_forget(kvb_engine_t *e, const char *detail)
{
    size_t       n;
    kva_ev_t     cleared;
    kva_batch_t  m;

    n = kvb_mirror_size(e->mirror);
    kvb_mirror_clear(e->mirror);

    if (e->rebuilding) {
        /* the replay from the start failed: nginx heard nothing yet */
        return;
    }

    e->st.forgotten++;
    kvb_log(KVB_LOG_WARN, "engine %s: events lost (%s): its %zu blocks "
            "forgotten, rebuilt from what it says next", e->label, detail,
            n);

    if (e->snapshotting) {
        /* parts already sent hold what is forgotten: again, of nothing */
        kvb_engine_snapshot(e);
        return;
    }

    if (n == 0) {
        return;                         /* nginx holds nothing of it */
    }

    memset(&m, 0, sizeof(m));
    memset(&cleared, 0, sizeof(cleared));
    cleared.type = KVA_EV_CLEARED;
    m.events = &cleared;
    m.nevents = 1;
    kvb_engine_send(e, &m);
}


/* the replay from seq 0 ended: nginx gets the mirror in a snapshot */

static void
kvb_engine_rebuilt(kvb_engine_t *e)
{
    e->rebuilding = 0;
    kvb_log(KVB_LOG_INFO, "engine %s: %zu blocks from its replay buffer",
            e->label, kvb_mirror_size(e->mirror));

    e->resync_asked = 1;
}


/* a batch of changes, cut into messages within nginx's caps */

static void
kvb_engine_publish(kvb_engine_t *e, kva_batch_t *b)
{
    size_t       i, off, take, nhashes;
    kva_ev_t     evs[64], *ev;
    kva_batch_t  m;

    memset(&m, 0, sizeof(m));
    m.events = evs;
    nhashes = 0;

    for (i = 0; i < b->nevents; i++) {
        ev = &b->events[i];
        off = 0;

        do {
            if (m.nevents == 64 || m.nevents == e->lim.max_events
                || (nhashes == e->lim.max_hashes && ev->nhashes))
            {
                kvb_engine_send(e, &m);
                m.nevents = 0;
                nhashes = 0;
            }

            take = ev->nhashes - off;
            take = (take < e->lim.max_hashes - nhashes)
                   ? take : e->lim.max_hashes - nhashes;

            evs[m.nevents] = *ev;
            evs[m.nevents].hashes = ev->nhashes ? ev->hashes + off : NULL;
            evs[m.nevents].nhashes = take;
            evs[m.nevents].has_parent = ev->has_parent && off == 0;
            m.nevents++;
            nhashes += take;
            off += take;

        } while (off < ev->nhashes);
    }

    if (m.nevents) {
        kvb_engine_send(e, &m);
    }
}


/*
 * Random per bridge process and sent in every message: with two bridges
 * following one engine for redundancy, nginx follows one of them by it
 * and ignores the other until the first goes silent (docs/engines.md).
 */
static uint64_t
kvb_engine_origin(void)
{
    static uint64_t  origin;

    while (origin == 0) {
        if (getrandom(&origin, sizeof(origin), 0) != (ssize_t) sizeof(origin))
        {
            origin = (uint64_t) time(NULL) * 2654435761u ^ (uint64_t) getpid();
        }

        if (origin) {
            kvb_log(KVB_LOG_INFO, "publishing as origin %016llx",
                    (unsigned long long) origin);
        }
    }

    return origin;
}


static void
kvb_engine_send(kvb_engine_t *e, kva_batch_t *m)
{
    char    *msg;
    size_t   len, i;

    m->server_len = strlen(e->name);
    memcpy(m->server, e->name, m->server_len + 1);
    m->has_rank = e->conf.ranked;
    m->rank = e->conf.rank;
    m->seq = ++e->seq;
    m->has_origin = 1;
    m->origin = kvb_engine_origin();
    m->keyspace = KVA_KEYSPACE_TOKEN_KEYS;
    m->hash_count = 0;

    for (i = 0; i < m->nevents; i++) {
        m->hash_count += m->events[i].nhashes;
    }

    if (e->has_load && e->now < e->load_at + KVB_LOAD_FRESH_MS) {
        m->has_load = 1;
        m->waiting = e->waiting;
        m->running = e->running;
        m->kv_usage = e->kv_usage;
        m->kv_tokens = e->kv_tokens;
    }

    msg = kva_event_encode(m, &len);
    if (msg == NULL) {
        kvb_log(KVB_LOG_ERR, "engine %s: out of memory encoding", e->label);
        return;
    }

    /* dropped or not, the seq is spent: nginx sees the gap and asks */
    (void) kvb_redis_publish(e->redis, msg, len);
    free(msg);

    kvb_engine_credit(e);
    e->credit -= (int64_t) len;

    /* a burst of live batches delays a snapshot by a second at most */
    if (e->credit < -(int64_t) e->lim.snapshot_bytes) {
        e->credit = -(int64_t) e->lim.snapshot_bytes;
    }

    e->st.messages++;
    e->last_pub = e->now;
}


/*
 * The bucket fills at --snapshot-rate, up to a tenth of a second's worth
 * saved up: a second of messages then stays within the rate, that much
 * and one part, whatever window nginx counts it in.
 */

static void
kvb_engine_credit(kvb_engine_t *e)
{
    int64_t  rate, save;

    rate = (int64_t) e->lim.snapshot_bytes;
    save = rate * KVB_CREDIT_SAVE_MS / 1000;

    if (e->now > e->credit_at) {
        e->credit += (int64_t) (e->now - e->credit_at) * rate / 1000;
        e->credit_at = e->now;
    }

    if (e->credit > save) {
        e->credit = save;
    }
}


/* parts of the snapshot while the bucket has credit; then a wait */

/*
 * A part's n keys as stored events, one a tier (KVA_EVENT_TIERS at most):
 * the keys ordered by tier in place, a three-way partition.  Returns how
 * many events.
 */

static size_t
kvb_engine_by_tier(kvb_engine_t *e, size_t n, kva_ev_t *ev)
{
    size_t    lo, mid, hi, i, nev;
    uint8_t   t;
    uint64_t  k;

#define kvb_swap(a, b)                                                        \
    k = e->keys[a]; e->keys[a] = e->keys[b]; e->keys[b] = k;                  \
    t = e->tiers[a]; e->tiers[a] = e->tiers[b]; e->tiers[b] = t

    lo = 0;
    mid = 0;
    hi = n;

    while (mid < hi) {
        if (e->tiers[mid] == KVA_EVENT_TIER_GPU) {
            kvb_swap(lo, mid);
            lo++;
            mid++;

        } else if (e->tiers[mid] == KVA_EVENT_TIER_CPU) {
            mid++;

        } else {
            hi--;
            kvb_swap(mid, hi);
        }
    }

#undef kvb_swap

    nev = 0;

    for (i = 0; i < n; i += ev[nev++].nhashes) {
        memset(&ev[nev], 0, sizeof(kva_ev_t));
        ev[nev].type = KVA_EV_STORED;
        ev[nev].tier = e->tiers[i];
        ev[nev].hashes = e->keys + i;
        ev[nev].nhashes = (i < lo) ? lo - i : (i < mid) ? mid - i : n - i;
    }

    return nev;
}


static void
kvb_engine_slice(kvb_engine_t *e)
{
    size_t       n, parts;
    int64_t      rate;
    kva_ev_t     ev[KVA_EVENT_TIERS];
    kva_batch_t  m;

    kvb_engine_credit(e);

    for (parts = 0;
         parts < KVB_SLICE_PARTS && e->snapshotting && e->credit >= 0;
         parts++)
    {
        n = kvb_mirror_keys_tiered(e->mirror, &e->cursor, e->keys,
                                   e->tiers, e->lim.max_hashes);

        memset(&m, 0, sizeof(m));

        if (n) {
            m.nevents = kvb_engine_by_tier(e, n, ev);
            m.events = ev;
        }

        /* fewer than a part's worth: the mirror is walked to its end */

        if (n < e->lim.max_hashes) {
            m.snapshot = e->snapshot_parts ? KVA_SNAP_END : KVA_SNAP_FULL;
            e->snapshotting = 0;

        } else {
            m.snapshot = e->snapshot_parts ? KVA_SNAP_MORE : KVA_SNAP_BEGIN;
        }

        e->snapshot_parts++;
        kvb_engine_send(e, &m);

        if (!e->snapshotting) {
            e->st.snapshots_done++;

            if (e->snapshot_again) {
                /* asked meanwhile by one that may have missed its begin */
                kvb_engine_snapshot(e);
            }
        }
    }

    if (!e->snapshotting) {
        return;
    }

    if (parts == 0) {
        kvb_log_limited(&e->starve_log, e->now, KVB_LOG_WARN,
                        "engine %s: its snapshot waits, live messages "
                        "take --snapshot-rate (%zu bytes a second)",
                        e->label, e->lim.snapshot_bytes);
    }

    /* when the bucket is back to empty, not in debt */

    rate = (int64_t) e->lim.snapshot_bytes;
    e->next_slice = e->now
                    + (e->credit < 0 ? (uint64_t) (-e->credit * 1000 / rate)
                                       + 1
                                     : 0);
}
