/*
 * kvsim: simulated OpenAI-compatible model servers with a paged KV cache
 * model, publishing KV events (docs/events.md) to Redis, or as vLLM does
 * on ZeroMQ (kvsim_zmq.h).
 *
 * One process, one libevent loop, N servers on consecutive loopback ports.
 */

#ifndef _KVSIM_H_INCLUDED_
#define _KVSIM_H_INCLUDED_


#include <stdint.h>
#include <time.h>

#include <event2/event.h>

#include "kvsim_cache.h"
#include "kvsim_sched.h"


#define KVS_ID_MAX          32          /* "127.0.0.1:65535" */
#define KVS_BODY_MAX        (8 * 1024 * 1024)
#define KVS_SERVERS_MAX     256


typedef struct kvs_sim_s     kvs_sim_t;
typedef struct kvs_events_s  kvs_events_t;
typedef struct kvs_http_s    kvs_http_t;
typedef struct kvs_zmq_s     kvs_zmq_t;


typedef struct kvs_hold_s    kvs_hold_t;

struct evhttp;


typedef enum {
    KVS_ROLE_BOTH = 0,                  /* aggregated, and either leg */
    KVS_ROLE_PREFILL,
    KVS_ROLE_DECODE
} kvs_role_e;


/* what one rank counts of disaggregation (/metrics: kvsim_pd_*) */
typedef struct {
    uint64_t            prefill_legs;   /* leg 1s answered, blocks held */
    uint64_t            holds_expired;  /* never pulled in --kv-hold-s */
    uint64_t            pulls_served;
    uint64_t            pulls_refused;  /* unknown, expired, not ready */
    uint64_t            blocks_served;

    uint64_t            pulls;          /* decode: pulls that worked */
    uint64_t            pull_failures;  /* refused, unreachable, bad */
    uint64_t            pull_timeouts;  /* no answer in --pd-wait-s */
    uint64_t            blocks_pulled;
    uint64_t            bytes_pulled;
    uint64_t            fallbacks;      /* served aggregated instead */
    uint64_t            sidecar_legs;   /* leg 1s run for a client */
    uint64_t            bootstrap_retries;  /* a room not ready yet */
} kvs_pd_stats_t;


typedef enum {
    KVS_EVENTS_REDIS = 0,               /* the module's JSON */
    KVS_EVENTS_ZMQ                      /* vLLM's ZeroMQ and msgpack */
} kvs_events_e;


typedef struct {
    unsigned            servers;
    unsigned            data_parallel;  /* ranks a server, 1: none */
    unsigned            base_port;
    unsigned            block_tokens;
    unsigned            num_blocks;
    double              time_scale;
    unsigned            calibration;    /* kvs_calibration_e */
    unsigned            max_seqs;
    unsigned            token_budget;
    unsigned            max_conns;      /* per server */
    const char         *model;
    char                redis_host[64]; /* "": events off */
    unsigned            redis_port;
    const char         *channel;
    unsigned            heartbeat_ms;
    double              drop_events;
    long                pause_after_ms; /* -1: never */
    long                pause_ms;
    long                die_after_ms;   /* -1: never */
    uint64_t            seed;
    unsigned            quiet:1;
    unsigned            redis_cluster:1; /* sharded, on the slot's master */
    unsigned            early_headers:1; /* as uvicorn: before the prefill */

    /* a heterogeneous pool: these servers' prefill tokens cost more */
    unsigned char       slow[KVS_SERVERS_MAX];
    int                 slow_last;      /* the highest index, -1: none */
    double              slow_factor;

    /* the token key space, vLLM's wire format, /tokenize */
    unsigned            tokens:1;       /* --keyspace tokens */
    unsigned            zmq_replay_topic:1;
    unsigned            tokenize_fail:1;
    kvs_events_e        events;
    unsigned            zmq_port;
    const char         *zmq_topic;
    unsigned            zmq_encoding;   /* kvs_venc_e */
    unsigned            zmq_hash;       /* kvs_vhash_e */
    unsigned            zmq_buffer;
    double              zmq_drop;
    char              **lora;           /* adapters' names */
    unsigned            nlora;
    unsigned            tokenize_delay_ms;

    /* disaggregated prefill and decode (kvsim_pd.h) */
    kvs_role_e          role;
    unsigned            sidecar:1;      /* honour x-prefiller-host-port */
    double              kv_hold_s;      /* simulated s a leg 1 is held */
    double              kv_bandwidth;   /* GB/s, a pull */
    double              kv_token_bytes; /* KV bytes of one token */
    double              pd_wait_s;      /* real s, the decode's waits */
    unsigned            bootstrap_port; /* 0: none, the HTTP ports only */
} kvs_conf_t;


/*
 * One rank of one server (a server without data parallelism is its rank
 * 0): its own cache, scheduler and events; rank 0 holds the server's
 * HTTP side and hands each request to a rank.
 */
typedef struct {
    kvs_sim_t          *sim;
    unsigned            index;          /* in sim->servers: s * dp + r */
    unsigned            rank;
    unsigned            port;
    char                id[KVS_ID_MAX];
    size_t              id_len;

    kvs_cache_t         cache;
    kvs_sched_t         sched;
    struct event       *step_ev;
    double              step_end;       /* ms, when the last step ends */
    double              lag_ms;         /* the CPU behind the simulation */
    double              lag_max_ms;     /* ... at most, since the start */
    double              lag_sum_ms;     /* ... in all, late steps */
    uint64_t            lag_steps;      /* steps whose lag was measured */
    unsigned            stepping:1;

    kvs_http_t         *http;

    /* events */
    uint64_t            seq;            /* last seq used */
    uint64_t            published;
    uint64_t            dropped;
    unsigned            announced:1;    /* the first message says cleared */

    /* requests */
    uint64_t            requests;
    uint64_t            rejected;       /* 4xx, 5xx */
    uint64_t            bad_rank;       /* rank 0: headers out of range */

    /* disaggregation: leg 1s' blocks held for a decode, and the counts */
    kvs_hold_t         *holds;
    kvs_pd_stats_t      pd;
} kvs_server_t;


struct kvs_sim_s {
    kvs_conf_t          conf;
    struct event_base  *base;
    kvs_server_t       *servers;        /* every rank of every server */
    unsigned            nranks;         /* servers * data_parallel */
    kvs_events_t       *events;
    kvs_zmq_t          *zmq;
    struct evhttp      *bootstrap;      /* --bootstrap-port, kvsim_pd.c */
    uint64_t            rng;            /* kva_rand.h */
    uint64_t            engine_seed;    /* random per process, as vLLM's */
    double              t0;             /* ms, monotonic */
    uint64_t            req_ids;
};


/* the simulation's clock: steps, queue times and pauses are measured on it */

static inline double
kvs_now_ms(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);

    return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}


#endif /* _KVSIM_H_INCLUDED_ */
