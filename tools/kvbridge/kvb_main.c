/*
 * kvbridge: follows vLLM and SGLang engines' KV cache events on ZeroMQ
 * and publishes them, keyed as ngx_http_kv_aware_module keys token ids,
 * on the module's Redis channel (docs/events.md, docs/engines.md).
 *
 * One thread, one loop (kvb_loop.h) over the engines' sockets, the replay
 * sockets, the Redis links and the metrics scrapes: nothing in it blocks,
 * and each source reads within a budget a turn, so a dead Redis or a
 * flooding engine holds up nothing else.
 */

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>

#include <zmq.h>

#include "kva_cluster.h"
#include "kvb_conf.h"
#include "kvb_engine.h"
#include "kvb_guard.h"
#include "kvb_http.h"
#include "kvb_log.h"
#include "kvb_loop.h"
#include "kvb_prom.h"
#include "kvb_scrape.h"
#include "kvb_redis.h"
#include "kvb_vllm.h"
#include "kvb_zmsg.h"


/* a scrape gives up after this, whatever the interval */
#define KVB_SCRAPE_TIMEOUT_MS  2000

/* messages a collector peer may have queued, read or not */
#define KVB_COLLECT_HWM        1000

/* the loop waits at most this long, deadlines or not */
#define KVB_LOOP_WAIT_MS       1000

/* ZeroMQ sockets of the context: 4 an engine, and room for the rest */
#define KVB_ZMQ_SOCKETS        (4 * KVB_ENGINES_MAX + 64)

/* open files an engine may take (sockets, their ZeroMQ mailboxes) */
#define KVB_FILES_ENGINE       8


/* one engine as the bridge runs it: the engine, its scrape, its sources */

typedef struct kvb_eng_s  kvb_eng_t;

struct kvb_eng_s {
    kvb_engine_t           *engine;
    const kvb_engine_spec_t *spec;      /* its configuration */
    kvb_scrape_t           *scrape;     /* the one it runs, or NULL */
    kvb_eng_t              *scrape_of;  /* whose scrape gives its load:
                                           the ranks of a server share one
                                           /metrics */
    uint64_t                scraped;    /* the load last handed on */
    uint64_t                last_event; /* ms, 0: none yet */
    uint64_t                malformed;  /* messages not [topic, seq, data] */
    kvb_log_limit_t         bad_log;
    kvb_prom_bridge_t       prom;       /* read for the metrics page */
    kvb_scrape_stats_t      scrape_st;
};


static kvb_conf_t              kvb_conf;    /* lives as long as the process */
static kvb_eng_t               kvb_engs[KVB_ENGINES_MAX];
static void                   *kvb_collector;
static kvb_guard_t             *kvb_guard;
static kvb_loop_t              *kvb_loop;
static kvb_redis_t             *kvb_redis;
static kvb_http_t              *kvb_http;
static kvb_prom_engine_t        kvb_prom_engines[KVB_ENGINES_MAX];
static volatile sig_atomic_t   kvb_stop;


static void kvb_on_signal(int signo);
static void kvb_raise_nofile(size_t nengines);
static void kvb_on_resync(void *data, const char *server, size_t len,
    unsigned rank);
static int kvb_scrape_setup(kvb_eng_t *g, char *err, size_t errlen);
static int kvb_sources(kvb_loop_t *loop, kvb_redis_t *redis);
static int kvb_add(kvb_loop_t *loop, const char *name, const char *what,
    kvb_source_conf_t *sc);
static int kvb_events_watch(void *data, uint64_t now_ms,
    zmq_pollitem_t *items, int max);
static void kvb_events_io(void *data, const zmq_pollitem_t *items, int n,
    kvb_budget_t *b, uint64_t now_ms);
static uint64_t kvb_events_deadline(void *data);
static void kvb_events_tick(void *data, uint64_t now_ms);
static int kvb_replay_watch(void *data, uint64_t now_ms,
    zmq_pollitem_t *items, int max);
static void kvb_replay_io(void *data, const zmq_pollitem_t *items, int n,
    kvb_budget_t *b, uint64_t now_ms);
static int kvb_scrape_watch(void *data, uint64_t now_ms,
    zmq_pollitem_t *items, int max);
static void kvb_scrape_source_io(void *data, const zmq_pollitem_t *items,
    int n, kvb_budget_t *b, uint64_t now_ms);
static uint64_t kvb_scrape_source_deadline(void *data);
static void kvb_scrape_tick(void *data, uint64_t now_ms);
static void kvb_scrape_done(kvb_eng_t *g, uint64_t now_ms);
static int kvb_redis_source_watch(void *data, uint64_t now_ms,
    zmq_pollitem_t *items, int max);
static void kvb_redis_source_io(void *data, const zmq_pollitem_t *items,
    int n, kvb_budget_t *b, uint64_t now_ms);
static uint64_t kvb_redis_source_deadline(void *data);
static void kvb_redis_source_tick(void *data, uint64_t now_ms);
static int kvb_collect_open(void *zctx);
static int kvb_collect_bind(void *collect);
static int kvb_collect_watch(void *data, uint64_t now_ms,
    zmq_pollitem_t *items, int max);
static kvb_eng_t *kvb_collected(zmq_msg_t *topic, zmq_msg_t *payload,
    int64_t *rank);
static void kvb_collect_io(void *data, const zmq_pollitem_t *items, int n,
    kvb_budget_t *b, uint64_t now_ms);
static void kvb_metrics_render(void *data, kvb_buf_t *b);
static int kvb_daemonize(const char *pid_file);


int
main(int argc, char **argv)
{
    int                   rc;
    char                  err[512];
    void                 *zctx;
    size_t                e;
    kvb_eng_t            *g;
    kvb_loop_t           *loop;
    kvb_redis_t          *redis;
    kvb_redis_conf_t      rconf;
    kvb_redis_handler_t   rh;
    struct sigaction      sa;

    kvb_conf_defaults(&kvb_conf);

    rc = kvb_conf_args(&kvb_conf, argc, argv, err, sizeof(err));
    if (rc == 1) {
        return 0;
    }

    if (rc != 0 || kvb_conf_check(&kvb_conf, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvbridge: %s\n", err);
        return 2;
    }

    /* nginx's resync requests come on the channel's slot, not another */
    if (kvb_conf.redis_cluster
        && !kva_cluster_has_tag((const unsigned char *) kvb_conf.channel,
                                strlen(kvb_conf.channel)))
    {
        fprintf(stderr, "kvbridge: --redis-cluster needs a --channel with "
                "a hash tag, e.g. {kv_aware}:events\n");
        return 2;
    }

    kvb_log_level = (kvb_log_level_e) kvb_conf.log_level;

    if (kvb_conf.daemon && kvb_daemonize(kvb_conf.pid_file) != 0) {
        return 1;
    }

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = kvb_on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    zctx = zmq_ctx_new();
    if (zctx == NULL) {
        kvb_log(KVB_LOG_ERR, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        return 1;
    }

    /*
     * An engine takes up to four sockets (its SUB, the monitor's pair,
     * the replay DEALER): ZeroMQ's default of 1,023 a context ran out at
     * about 250 engines, short of KVB_ENGINES_MAX.
     */
    if (zmq_ctx_set(zctx, ZMQ_MAX_SOCKETS, KVB_ZMQ_SOCKETS) != 0) {
        kvb_log(KVB_LOG_WARN, "zmq_ctx_set(ZMQ_MAX_SOCKETS, %d): %s",
                KVB_ZMQ_SOCKETS, zmq_strerror(zmq_errno()));
    }

    kvb_raise_nofile(kvb_conf.nengines);

    rconf.host = kvb_conf.redis_host;
    rconf.port = kvb_conf.redis_port;
    rconf.user = kvb_conf.redis_user;
    rconf.password = kvb_conf.redis_password;
    rconf.channel = kvb_conf.channel;
    rconf.max_pending_bytes = kvb_conf.redis_max_pending;
    rconf.timeout_ms = kvb_conf.redis_timeout_ms;
    rconf.cluster = kvb_conf.redis_cluster;
    rconf.seed_hosts = kvb_conf.redis_hosts;
    rconf.seed_ports = kvb_conf.redis_ports;
    rconf.nseeds = kvb_conf.nredis;
    rh.resync = kvb_on_resync;
    rh.data = NULL;

    redis = kvb_redis_create(&rconf, &rh);
    loop = kvb_loop_create();

    if (redis == NULL || loop == NULL) {
        kvb_log(KVB_LOG_ERR, "out of memory");
        return 1;
    }

    for (e = 0; e < kvb_conf.nengines; e++) {
        g = &kvb_engs[e];
        g->spec = &kvb_conf.engines[e];
        g->engine = kvb_engine_create(zctx, &g->spec->engine, &kvb_conf.lim,
                                      redis, err, sizeof(err));
        if (g->engine == NULL) {
            kvb_log(KVB_LOG_ERR, "engine %s: %s", g->spec->engine.name, err);
            return 1;
        }

        if (kvb_scrape_setup(g, err, sizeof(err)) != 0) {
            kvb_log(KVB_LOG_ERR, "engine %s: metrics=%s: %s",
                    g->spec->engine.name, g->spec->metrics, err);
            return 1;
        }

        kvb_log(KVB_LOG_INFO, "engine %s: model \"%s\", events %s%s%s",
                kvb_engine_label(g->engine), g->spec->engine.model,
                g->spec->engine.events
                ? g->spec->engine.events : "(collected)",
                g->spec->engine.replay ? ", replay " : "",
                g->spec->engine.replay ? g->spec->engine.replay : "");
    }

    if ((kvb_conf.collect_allow != NULL || kvb_conf.collect_rate)
        && kvb_conf.collect == NULL)
    {
        fprintf(stderr, "kvbridge: collect-allow and collect-rate need "
                "--collect\n");
        return 2;
    }

    if (kvb_conf.collect != NULL) {
        kvb_guard = kvb_guard_create(zctx, kvb_conf.collect_allow,
                                     kvb_conf.collect_rate, err,
                                     sizeof(err));
        if (kvb_guard == NULL) {
            kvb_log(KVB_LOG_ERR, "%s", err);
            return 1;
        }

        if (kvb_collect_open(zctx) != 0) {
            return 1;
        }
    }

    kvb_loop = loop;
    kvb_redis = redis;

    if (kvb_conf.metrics_listen != NULL) {
        kvb_http = kvb_http_create(kvb_conf.metrics_listen,
                                   kvb_metrics_render, NULL, err,
                                   sizeof(err));
        if (kvb_http == NULL) {
            kvb_log(KVB_LOG_ERR, "metrics %s", err);
            return 1;
        }

        kvb_log(KVB_LOG_INFO, "metrics page on http://%s/metrics",
                kvb_conf.metrics_listen);
    }

    if (kvb_sources(loop, redis) != 0) {
        kvb_log(KVB_LOG_ERR, "out of memory");
        return 1;
    }

    while (!kvb_stop) {
        if (kvb_loop_turn(loop, KVB_LOOP_WAIT_MS) != 0) {
            break;
        }
    }

    kvb_log(KVB_LOG_INFO, "stopping");

    for (e = 0; e < kvb_conf.nengines; e++) {
        kvb_engine_destroy(kvb_engs[e].engine);
        kvb_scrape_destroy(kvb_engs[e].scrape);
    }

    if (kvb_collector != NULL) {
        zmq_close(kvb_collector);
    }

    kvb_guard_destroy(kvb_guard);

    kvb_http_destroy(kvb_http);
    kvb_loop_destroy(loop);
    kvb_redis_destroy(redis);
    zmq_ctx_term(zctx);

    return 0;
}


/*
 * Each engine is three sources: its events (SUB, the SUB's monitor, its
 * ticks), its replay socket while a replay runs, and its scrape; then the
 * collector and Redis.  Engines come first: what they publish in a turn
 * goes out in the same turn's Redis I/O.
 */

static int
kvb_sources(kvb_loop_t *loop, kvb_redis_t *redis)
{
    size_t              e;
    kvb_eng_t          *g;
    kvb_source_conf_t   sc;

    for (e = 0; e < kvb_conf.nengines; e++) {
        g = &kvb_engs[e];

        memset(&sc, 0, sizeof(sc));
        sc.watch = kvb_events_watch;
        sc.io = kvb_events_io;
        sc.deadline = kvb_events_deadline;
        sc.tick = kvb_events_tick;
        sc.data = g;
        sc.max_items = 2;

        if (kvb_add(loop, kvb_engine_label(g->engine), "events", &sc) != 0) {
            return -1;
        }

        if (g->spec->engine.replay != NULL) {
            memset(&sc, 0, sizeof(sc));
            sc.watch = kvb_replay_watch;
            sc.io = kvb_replay_io;
            sc.data = g;
            sc.max_items = 1;

            if (kvb_add(loop, kvb_engine_label(g->engine), "replay", &sc)
                != 0)
            {
                return -1;
            }
        }

        if (g->scrape != NULL) {
            memset(&sc, 0, sizeof(sc));
            sc.watch = kvb_scrape_watch;
            sc.io = kvb_scrape_source_io;
            sc.deadline = kvb_scrape_source_deadline;
            sc.tick = kvb_scrape_tick;
            sc.data = g;
            sc.max_items = 1;

            if (kvb_add(loop, kvb_engine_label(g->engine), "scrape", &sc)
                != 0)
            {
                return -1;
            }
        }
    }

    if (kvb_collector != NULL) {
        memset(&sc, 0, sizeof(sc));
        sc.watch = kvb_collect_watch;
        sc.io = kvb_collect_io;
        sc.data = kvb_collector;
        sc.max_items = 1;

        if (kvb_add(loop, "collector", NULL, &sc) != 0) {
            return -1;
        }

        if (kvb_conf.collect_allow != NULL) {
            memset(&sc, 0, sizeof(sc));
            sc.watch = kvb_guard_watch;
            sc.io = kvb_guard_io;
            sc.data = kvb_guard;
            sc.max_items = 1;

            if (kvb_add(loop, "collector zap", NULL, &sc) != 0) {
                return -1;
            }
        }
    }

    if (kvb_http != NULL) {
        memset(&sc, 0, sizeof(sc));
        sc.watch = kvb_http_watch;
        sc.io = kvb_http_io;
        sc.deadline = kvb_http_deadline;
        sc.tick = kvb_http_tick;
        sc.data = kvb_http;
        sc.max_items = 1 + KVB_HTTP_CONNS;

        if (kvb_add(loop, "metrics", NULL, &sc) != 0) {
            return -1;
        }
    }

    memset(&sc, 0, sizeof(sc));
    sc.watch = kvb_redis_source_watch;
    sc.io = kvb_redis_source_io;
    sc.deadline = kvb_redis_source_deadline;
    sc.tick = kvb_redis_source_tick;
    sc.data = redis;
    sc.max_items = 2;

    return kvb_add(loop, "redis", NULL, &sc);
}


/* a source named "LABEL WHAT" */

static int
kvb_add(kvb_loop_t *loop, const char *name, const char *what,
    kvb_source_conf_t *sc)
{
    char  buf[320];

    if (what != NULL) {
        snprintf(buf, sizeof(buf), "%s %s", name, what);
        name = buf;
    }

    sc->name = name;

    return kvb_loop_add(loop, sc) != NULL ? 0 : -1;
}


static int
kvb_events_watch(void *data, uint64_t now_ms, zmq_pollitem_t *items,
    int max)
{
    int         n;
    kvb_eng_t  *g = data;

    n = 0;

    if (kvb_engine_sub(g->engine) != NULL) {
        items[n].socket = kvb_engine_sub(g->engine);
        items[n++].events = ZMQ_POLLIN;
    }

    if (kvb_engine_monitor(g->engine) != NULL) {
        items[n].socket = kvb_engine_monitor(g->engine);
        items[n++].events = ZMQ_POLLIN;
    }

    return n;
}


/*
 * [topic, seq, payload] messages from the engine's SUB, within the turn's
 * budget: a flooding engine gets its share of the loop, not all of it
 */

static void
kvb_events_io(void *data, const zmq_pollitem_t *items, int n,
    kvb_budget_t *b, uint64_t now_ms)
{
    int          i;
    void        *sub;
    kvb_zmsg_t   m;
    kvb_eng_t   *g = data;

    sub = kvb_engine_sub(g->engine);

    for (i = 0; i < n; i++) {
        if (items[i].revents == 0) {
            continue;
        }

        if (items[i].socket != sub) {
            kvb_engine_monitor_io(g->engine, now_ms);
            continue;
        }

        while (kvb_budget_left(b) && kvb_zmsg_recv(sub, &m, 3)) {

            if (m.n == 3 && !m.too_long) {
                kvb_budget_spend(b, zmq_msg_size(&m.part[2]));
                g->last_event = now_ms;
                kvb_engine_frame(g->engine, zmq_msg_data(&m.part[1]),
                                 zmq_msg_size(&m.part[1]),
                                 zmq_msg_data(&m.part[2]),
                                 zmq_msg_size(&m.part[2]), now_ms);

            } else {
                kvb_budget_spend(b, 0);
                g->malformed++;
                kvb_log_limited(&g->bad_log, now_ms, KVB_LOG_WARN,
                                "engine %s: a message of %s%zu parts, "
                                "not 3", kvb_engine_label(g->engine),
                                m.too_long ? "more than " : "", m.n);
            }

            kvb_zmsg_close(&m);
        }
    }
}


static uint64_t
kvb_events_deadline(void *data)
{
    kvb_eng_t  *g = data;

    return kvb_engine_deadline(g->engine);
}


static void
kvb_events_tick(void *data, uint64_t now_ms)
{
    kvb_eng_t  *g = data;

    kvb_engine_tick(g->engine, now_ms);
}


static int
kvb_replay_watch(void *data, uint64_t now_ms, zmq_pollitem_t *items,
    int max)
{
    kvb_eng_t  *g = data;

    items[0].socket = kvb_engine_replay(g->engine);
    items[0].events = ZMQ_POLLIN;

    return items[0].socket != NULL;
}


/* the stream reads the replay's answers: its own bound (kvb_stream.c) */

static void
kvb_replay_io(void *data, const zmq_pollitem_t *items, int n,
    kvb_budget_t *b, uint64_t now_ms)
{
    kvb_eng_t  *g = data;

    kvb_engine_replay_io(g->engine, now_ms);
}


static int
kvb_scrape_watch(void *data, uint64_t now_ms, zmq_pollitem_t *items,
    int max)
{
    int         fd;
    short       events;
    kvb_eng_t  *g = data;

    fd = kvb_scrape_want(g->scrape, now_ms, &events);

    kvb_scrape_done(g, now_ms);

    if (fd < 0) {
        return 0;
    }

    items[0].socket = NULL;
    items[0].fd = fd;
    items[0].events = events;

    return 1;
}


static void
kvb_scrape_source_io(void *data, const zmq_pollitem_t *items, int n,
    kvb_budget_t *b, uint64_t now_ms)
{
    kvb_eng_t  *g = data;

    kvb_scrape_io(g->scrape, items[0].revents, now_ms);
    kvb_scrape_done(g, now_ms);
}


static uint64_t
kvb_scrape_source_deadline(void *data)
{
    kvb_eng_t  *g = data;

    return kvb_scrape_deadline(g->scrape);
}


/* a timeout, with no I/O to tell */

static void
kvb_scrape_tick(void *data, uint64_t now_ms)
{
    kvb_eng_t  *g = data;

    if (now_ms >= kvb_scrape_deadline(g->scrape)) {
        kvb_scrape_io(g->scrape, 0, now_ms);
        kvb_scrape_done(g, now_ms);
    }
}


static int
kvb_redis_source_watch(void *data, uint64_t now_ms, zmq_pollitem_t *items,
    int max)
{
    return kvb_redis_watch(data, items);
}


static void
kvb_redis_source_io(void *data, const zmq_pollitem_t *items, int n,
    kvb_budget_t *b, uint64_t now_ms)
{
    kvb_redis_io(data, items, n);
}


static uint64_t
kvb_redis_source_deadline(void *data)
{
    return kvb_redis_deadline(data);
}


static void
kvb_redis_source_tick(void *data, uint64_t now_ms)
{
    kvb_redis_tick(data, now_ms);
}


static void
kvb_on_signal(int signo)
{
    kvb_stop = 1;
}


/* a server's rank: one of its data-parallel ranks, or 0 for a server */

static void
kvb_on_resync(void *data, const char *server, size_t len, unsigned rank)
{
    size_t         e;
    const char    *name;
    kvb_engine_t  *en;

    for (e = 0; e < kvb_conf.nengines; e++) {
        en = kvb_engs[e].engine;
        name = kvb_engine_name(en);

        if (strlen(name) == len && memcmp(name, server, len) == 0
            && kvb_engine_rank(en) == rank)
        {
            kvb_log(KVB_LOG_INFO, "engine %s: nginx asks for a resync",
                    kvb_engine_label(en));
            kvb_engine_resync(en);
            return;
        }
    }

    /* another bridge's engine, or another publisher's, or no such rank */

    kvb_log(KVB_LOG_DEBUG, "a resync for %.*s rank %u, not ours",
            (int) len, server, rank);
}


/*
 * The ranks of a data-parallel server give one metrics URL: the first
 * engine with a URL scrapes it, the others with the same URL read its
 * result, each its own rank's series.
 */

static int
kvb_scrape_setup(kvb_eng_t *g, char *err, size_t errlen)
{
    kvb_eng_t   *o;
    const char  *url;

    url = g->spec->metrics;
    g->scrape_of = g;

    if (url == NULL) {
        return 0;
    }

    for (o = kvb_engs; o < g; o++) {
        if (o->spec->metrics != NULL && strcmp(o->spec->metrics, url) == 0) {
            g->scrape_of = o->scrape_of;
            return 0;
        }
    }

    g->scrape = kvb_scrape_create(url, kvb_conf.metrics_ms,
                                  KVB_SCRAPE_TIMEOUT_MS, err, errlen);

    kvb_scrape_label(g->scrape, g->spec->engine.name);

    return g->scrape != NULL ? 0 : -1;
}


/* a new load from the engine's metrics goes with its next message */

static void
kvb_scrape_done(kvb_eng_t *g, uint64_t now_ms)
{
    int                       rc;
    size_t                    k;
    uint64_t                  taken;
    kvb_load_t                load;
    const kvb_engine_conf_t  *c;

    if (kvb_scrape_load(g->scrape, &load, &taken) != 0
        || taken == g->scraped)
    {
        return;
    }

    g->scraped = taken;

    /* a rank takes its own series; an engine without ranks all of them */

    for (k = (size_t) (g - kvb_engs); k < kvb_conf.nengines; k++) {
        if (kvb_engs[k].scrape_of != g) {
            continue;
        }

        c = &kvb_engs[k].spec->engine;
        rc = c->ranked ? kvb_scrape_rank_load(g->scrape, c->rank, &load,
                                              &taken)
                       : kvb_scrape_load(g->scrape, &load, &taken);

        if (rc == 0) {
            kvb_engine_load(kvb_engs[k].engine, &load, taken);
        }
    }
}


/* engines that connect to one bound socket: the topic says whose */

/*
 * Anyone who reaches the port may send: a message is refused past
 * --max-batch (ZeroMQ drops the peer at the frame's header, before it
 * buffers a byte of it), and a peer may queue at most KVB_COLLECT_HWM of
 * them, so that what peers can make the bridge hold is bounded (about
 * peers x max-batch while they send, not what they claim).
 */

static int
kvb_collect_open(void *zctx)
{
    int       hwm;
    void     *collect;
    int64_t   max;

    collect = zmq_socket(zctx, ZMQ_SUB);

    /* the payload is the one large part; topic and seq fit in the slack */
    max = (int64_t) kvb_conf.lim.decode.max_bytes + 64;
    hwm = KVB_COLLECT_HWM;

    if (collect == NULL
        || kvb_guard_socket(kvb_guard, collect) != 0
        || zmq_setsockopt(collect, ZMQ_MAXMSGSIZE, &max, sizeof(max)) != 0
        || zmq_setsockopt(collect, ZMQ_RCVHWM, &hwm, sizeof(hwm)) != 0
        || zmq_setsockopt(collect, ZMQ_SUBSCRIBE, "", 0) != 0
        || zmq_bind(collect, kvb_conf.collect) != 0)
    {
        kvb_log(KVB_LOG_ERR, "collect %s: %s", kvb_conf.collect,
                zmq_strerror(zmq_errno()));
        return -1;
    }

    kvb_collector = collect;

    if (kvb_collect_bind(collect) != 0) {
        return -1;
    }

    kvb_log(KVB_LOG_INFO, "collecting engines on %s%s%s", kvb_conf.collect,
            kvb_conf.collect_allow ? " from " : "",
            kvb_conf.collect_allow ? kvb_conf.collect_allow : "");

    return 0;
}


/*
 * vLLM's rank r connects to the collector's port + r as it binds port + r
 * (offset_endpoint_port): the one SUB socket binds those ports too, for
 * the most ranks a collected server has.
 */

static int
kvb_collect_bind(void *collect)
{
    char      err[256], *ep;
    size_t    e;
    unsigned  r, ranks;

    ranks = 1;

    for (e = 0; e < kvb_conf.nengines; e++) {
        if (kvb_conf.engines[e].engine.events == NULL
            && kvb_conf.engines[e].engine.rank + 1 > ranks)
        {
            ranks = kvb_conf.engines[e].engine.rank + 1;
        }
    }

    for (r = 1; r < ranks; r++) {
        ep = kvb_conf_rank_endpoint(kvb_conf.collect, r, err, sizeof(err));

        if (ep == NULL) {
            kvb_log(KVB_LOG_ERR, "collect: %s", err);
            return -1;
        }

        if (zmq_bind(collect, ep) != 0) {
            kvb_log(KVB_LOG_ERR, "collect %s (rank %u): %s", ep, r,
                    zmq_strerror(zmq_errno()));
            free(ep);
            return -1;
        }

        kvb_log(KVB_LOG_INFO, "collecting rank %u on %s", r, ep);
        free(ep);
    }

    return 0;
}


static int
kvb_collect_watch(void *data, uint64_t now_ms, zmq_pollitem_t *items,
    int max)
{
    items[0].socket = data;
    items[0].events = ZMQ_POLLIN;

    return 1;
}


/*
 * The engine a collected message is for: its topic names the server, and
 * for a data-parallel one the batch's data_parallel_rank the rank (its
 * own stream and seq; a batch that says none is rank 0's).  NULL when no
 * engine is configured for the pair: a rank's batches must never enter
 * another rank's stream, whose seqs they would scramble.  A payload
 * that does not decode goes to rank 0, which counts and logs it.
 */

static kvb_eng_t *
kvb_collected(zmq_msg_t *topic, zmq_msg_t *payload, int64_t *rank)
{
    size_t       e, len;
    const char  *t;
    kvb_eng_t   *g;

    *rank = -1;

    for (e = 0; e < kvb_conf.nengines; e++) {
        g = &kvb_engs[e];

        if (g->spec->engine.events != NULL) {
            continue;
        }

        t = kvb_engine_topic(g->engine);
        len = strlen(t);

        if (len != zmq_msg_size(topic)
            || memcmp(t, zmq_msg_data(topic), len) != 0)
        {
            continue;
        }

        if (!g->spec->engine.ranked) {
            return g;
        }

        if (*rank < 0
            && kvb_decode_rank(zmq_msg_data(payload), zmq_msg_size(payload),
                               &kvb_conf.lim.decode, rank) != 0)
        {
            *rank = 0;
        }

        if ((int64_t) kvb_engine_rank(g->engine) == *rank) {
            return g;
        }
    }

    return NULL;
}


static void
kvb_collect_io(void *data, const zmq_pollitem_t *items, int n,
    kvb_budget_t *b, uint64_t now_ms)
{
    int64_t                 rank;
    kvb_eng_t              *g;
    kvb_zmsg_t              m;
    static kvb_log_limit_t  unknown_log;

    while (kvb_budget_left(b) && kvb_zmsg_recv(data, &m, 3)) {

        g = NULL;
        rank = -1;

        if (!kvb_guard_rate(kvb_guard, &m.part[0], now_ms)) {
            kvb_budget_spend(b, 0);
            kvb_zmsg_close(&m);
            continue;
        }

        if (m.n == 3 && !m.too_long) {
            kvb_budget_spend(b, zmq_msg_size(&m.part[2]));
            g = kvb_collected(&m.part[0], &m.part[2], &rank);

        } else {
            kvb_budget_spend(b, 0);
        }

        if (g != NULL) {
            g->last_event = now_ms;
            kvb_engine_frame(g->engine, zmq_msg_data(&m.part[1]),
                             zmq_msg_size(&m.part[1]),
                             zmq_msg_data(&m.part[2]),
                             zmq_msg_size(&m.part[2]), now_ms);

        } else if (m.n != 3 || m.too_long) {
            kvb_log_limited(&unknown_log, now_ms, KVB_LOG_WARN,
                            "collect: a message of %s%zu parts, not 3",
                            m.too_long ? "more than " : "", m.n);

        } else if (rank >= 0) {
            kvb_log_limited(&unknown_log, now_ms, KVB_LOG_WARN,
                            "collect: a batch of rank %lld on topic "
                            "\"%.*s\", a rank no engine names",
                            (long long) rank,
                            (int) (zmq_msg_size(&m.part[0]) > 64
                                   ? 64 : zmq_msg_size(&m.part[0])),
                            (char *) zmq_msg_data(&m.part[0]));

        } else {
            kvb_log_limited(&unknown_log, now_ms, KVB_LOG_WARN,
                            "collect: a message on topic \"%.*s\", which "
                            "no engine names",
                            (int) (zmq_msg_size(&m.part[0]) > 64
                                   ? 64 : zmq_msg_size(&m.part[0])),
                            (char *) zmq_msg_data(&m.part[0]));
        }

        kvb_zmsg_close(&m);
    }
}


/* the components' stats, read in this one place, then rendered */

static void
kvb_metrics_render(void *data, kvb_buf_t *b)
{
    size_t              e;
    uint64_t            now;
    kvb_eng_t          *g;
    kvb_prom_view_t     v;
    kvb_prom_engine_t  *pe;

    now = kvb_now_ms();

    for (e = 0; e < kvb_conf.nengines; e++) {
        g = &kvb_engs[e];
        pe = &kvb_prom_engines[e];

        pe->name = kvb_engine_name(g->engine);
        pe->rank = kvb_engine_rank(g->engine);
        pe->engine = kvb_engine_stats(g->engine);
        pe->stream = kvb_engine_stream_stats(g->engine);
        pe->mirror = kvb_engine_mirror_stats(g->engine);
        pe->scrape = NULL;
        pe->bridge = &g->prom;

        if (g->scrape_of->scrape != NULL) {
            kvb_scrape_stats(g->scrape_of->scrape, &g->scrape_st);
            pe->scrape = &g->scrape_st;
        }

        g->prom.scrape_failing = pe->scrape && g->scrape_st.last_failed;
        g->prom.malformed = g->malformed;
        g->prom.replaying = kvb_engine_replay(g->engine) != NULL;
        g->prom.blocks = kvb_engine_blocks(g->engine);
        g->prom.vouched = kvb_engine_vouched(g->engine) ? 1 : 0;
        g->prom.last_event_age = g->last_event
                                 ? (double) (now - g->last_event) / 1000
                                 : -1;
    }

    memset(&v, 0, sizeof(v));
    v.engines = kvb_prom_engines;
    v.nengines = kvb_conf.nengines;
    v.redis = kvb_redis_stats(kvb_redis);
    v.redis_up = kvb_redis_up(kvb_redis);
    v.loop = kvb_loop;

    if (kvb_guard != NULL) {
        v.collect_denied = kvb_guard_stats(kvb_guard)->denied;
        v.collect_limited = kvb_guard_stats(kvb_guard)->limited;
    }

    kvb_prom_render(b, &v);
}


static int
kvb_daemonize(const char *pid_file)
{
    FILE  *f;

    if (daemon(0, 1) != 0) {
        kvb_log(KVB_LOG_ERR, "daemon: %s", strerror(errno));
        return -1;
    }

    if (pid_file == NULL) {
        return 0;
    }

    f = fopen(pid_file, "w");
    if (f == NULL) {
        kvb_log(KVB_LOG_ERR, "pid file %s: %s", pid_file, strerror(errno));
        return -1;
    }

    fprintf(f, "%ld\n", (long) getpid());
    fclose(f);

    return 0;
}


/*
 * 256 engines held 1,037 descriptors (sockets, ZeroMQ's mailboxes):
 * past the 1,024 a process gets by default.  The soft limit goes up to
 * what the engines may need, as far as the hard limit allows.
 */
static void
kvb_raise_nofile(size_t nengines)
{
    rlim_t         want;
    struct rlimit  rl;

    want = (rlim_t) (KVB_FILES_ENGINE * nengines + 256);

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want) {
        return;
    }

    rl.rlim_cur = (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want)
                  ? want : rl.rlim_max;

    if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < want) {
        kvb_log(KVB_LOG_WARN, "open files limited to %llu: %zu engines may "
                "need %llu (LimitNOFILE= in the unit)",
                (unsigned long long) rl.rlim_cur, nengines,
                (unsigned long long) want);
    }
}
