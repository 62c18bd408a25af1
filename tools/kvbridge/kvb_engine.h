/*
 * kvbridge: one engine (one data-parallel rank of one model server) as
 * nginx sees it: a server of the upstream, whose cached blocks and load
 * the bridge publishes in the module's protocol (docs/events.md).
 *
 * Its batches come from its SUB socket (the bridge connects to an engine
 * that binds), or from the bridge's collector (engines that connect to
 * one bound socket, told apart by topic).  Each batch runs through the
 * stream (order, replay), the decoder, the mirror, and out to Redis as
 * one or more messages within the module's caps.  A restart, or events
 * lost for good, empty the mirror and nginx hears "cleared"; a resync
 * request from nginx is answered with a snapshot of the mirror once the
 * stream can be vouched for, everything paced so that nginx's per-server
 * budget is not exceeded.  Heartbeats go out only while the stream can
 * be vouched for: connected, in order, the mirror rebuilt.
 */

#ifndef _KVB_ENGINE_H_INCLUDED_
#define _KVB_ENGINE_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kvb_metrics.h"
#include "kvb_mirror.h"
#include "kvb_redis.h"
#include "kvb_stream.h"
#include "kvb_vllm.h"


typedef struct {
    const char             *name;       /* the upstream's server address */
    const char             *model;      /* the base model's served name */
    const char             *events;     /* NULL: fed by the collector */
    const char             *replay;     /* NULL: no replay */
    const char             *topic;      /* "" subscribes to all */
    unsigned                rank;       /* its data-parallel rank */
    unsigned                ranked:1;   /* messages say "rank" */
} kvb_engine_conf_t;


typedef struct {
    kvb_limits_t            decode;     /* one engine batch */
    size_t                  max_hashes; /* one message to nginx */
    size_t                  max_events;
    size_t                  max_blocks; /* the mirror */
    unsigned                heartbeat_ms;
    unsigned                replay_ms;
    size_t                  replay_hold;
    /*
     * What one engine's messages to nginx may take a second, live ones
     * included: a snapshot gets what live traffic leaves (nginx refuses
     * past its server_bytes and asks again).
     */
    size_t                  snapshot_bytes;
} kvb_engine_limits_t;


typedef struct {
    uint64_t                batches;
    uint64_t                bad_batches;    /* refused by the decoder */
    uint64_t                bad_events;     /* skipped: malformed */
    uint64_t                unknown_events;
    uint64_t                messages;       /* published to nginx */
    uint64_t                snapshots;
    uint64_t                wrong_rank;     /* batches of another rank */
    uint64_t                disconnects;    /* of its SUB socket */
    uint64_t                forgotten;      /* lost events: mirror cleared */
    uint64_t                rebuilds;       /* replays from seq 0 asked */
    uint64_t                resyncs_deferred;  /* asked while unvouched */
    uint64_t                resyncs_coalesced; /* asked during a snapshot */
    uint64_t                snapshots_done;
} kvb_engine_stats_t;


typedef struct kvb_engine_s  kvb_engine_t;


kvb_engine_t *kvb_engine_create(void *zctx, const kvb_engine_conf_t *conf,
    const kvb_engine_limits_t *lim, kvb_redis_t *redis, char *err,
    size_t errlen);
void kvb_engine_destroy(kvb_engine_t *e);

const char *kvb_engine_name(const kvb_engine_t *e);
const char *kvb_engine_topic(const kvb_engine_t *e);
/* for log lines: "NAME", or "NAME rank R" for a data-parallel rank */
const char *kvb_engine_label(const kvb_engine_t *e);
unsigned kvb_engine_rank(const kvb_engine_t *e);

/* sockets to poll: its SUB (if it has one) and a replay in progress */
void *kvb_engine_sub(const kvb_engine_t *e);
void *kvb_engine_replay(const kvb_engine_t *e);
void kvb_engine_sub_io(kvb_engine_t *e, uint64_t now_ms);
void kvb_engine_replay_io(kvb_engine_t *e, uint64_t now_ms);
/* the SUB socket's connects and disconnects (NULL when collected) */
void *kvb_engine_monitor(const kvb_engine_t *e);
void kvb_engine_monitor_io(kvb_engine_t *e, uint64_t now_ms);

/* a [topic, seq, payload] message from the collector */
void kvb_engine_frame(kvb_engine_t *e, const void *seq, size_t seq_len,
    const char *payload, size_t len, uint64_t now_ms);

/*
 * nginx asked for a snapshot.  Answered once the engine's stream can be
 * vouched for (connected, in order, its mirror rebuilt); asked during a
 * snapshot, one more follows it (the asker may have missed its begin).
 */
void kvb_engine_resync(kvb_engine_t *e);

/*
 * 1 while the bridge vouches for the engine's stream: its SUB socket is
 * connected, no replay is catching up, the mirror is rebuilt.  Only then
 * does it heartbeat, so that nginx's heartbeat means the same.
 */
int kvb_engine_vouched(const kvb_engine_t *e);

/* the engine's load (and its pool, kv_tokens), from its metrics */
void kvb_engine_load(kvb_engine_t *e, const kvb_load_t *load,
    uint64_t now_ms);

uint64_t kvb_engine_deadline(const kvb_engine_t *e);
void kvb_engine_tick(kvb_engine_t *e, uint64_t now_ms);

const kvb_engine_stats_t *kvb_engine_stats(const kvb_engine_t *e);
/* its stream's and its mirror's, for the metrics page */
const kvb_stream_stats_t *kvb_engine_stream_stats(const kvb_engine_t *e);
const kvb_mirror_stats_t *kvb_engine_mirror_stats(const kvb_engine_t *e);
size_t kvb_engine_blocks(const kvb_engine_t *e);    /* in the mirror */


#endif /* _KVB_ENGINE_H_INCLUDED_ */
