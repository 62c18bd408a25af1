/*
 * kvbridge: follows vLLM and SGLang engines' KV cache events on ZeroMQ
 * and publishes them, keyed as ngx_http_kv_aware_module keys token ids,
 * on the module's Redis channel (docs/events.md, README "With vLLM").
 *
 * One thread, one zmq_poll() loop over the engines' sockets, the replay
 * sockets, the Redis links and the metrics scrapes: nothing in it blocks,
 * so a dead Redis or a slow engine holds up nothing else.
 */

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "kvb_conf.h"
#include "kvb_engine.h"
#include "kvb_log.h"
#include "kvb_scrape.h"
#include "kvb_redis.h"
#include "kvb_vllm.h"
#include "kvb_zmsg.h"


/*
 * engines' SUB, monitor and replay sockets and metrics scrapes, the
 * collector,
 * Redis' two links
 */
#define KVB_ITEMS_MAX  (4 * KVB_ENGINES_MAX + 1 + 2)

/* a scrape gives up after this, whatever the interval */
#define KVB_SCRAPE_TIMEOUT_MS  2000


typedef enum {
    KVB_ITEM_SUB = 0,
    KVB_ITEM_REPLAY,
    KVB_ITEM_MONITOR,
    KVB_ITEM_SCRAPE,
    KVB_ITEM_COLLECT,
    KVB_ITEM_REDIS
} kvb_item_kind_e;


typedef struct {
    kvb_item_kind_e         kind;
    size_t                  engine;
} kvb_item_t;


static kvb_conf_t              kvb_conf;    /* lives as long as the process */
static kvb_engine_t           *kvb_engines[KVB_ENGINES_MAX];
static kvb_scrape_t           *kvb_scrapes[KVB_ENGINES_MAX];
static uint64_t                kvb_scraped[KVB_ENGINES_MAX];
/* the engine whose scrape gives this one's load: the ranks of a server
   share one /metrics */
static size_t                  kvb_scrape_of[KVB_ENGINES_MAX];
static volatile sig_atomic_t   kvb_stop;


static void kvb_on_signal(int signo);
static void kvb_on_resync(void *data, const char *server, size_t len,
    unsigned rank);
static int kvb_scrape_setup(size_t e, char *err, size_t errlen);
static int kvb_collect_bind(void *collect);
static kvb_engine_t *kvb_collected(zmq_msg_t *topic,
    zmq_msg_t *payload, int64_t *rank);
static void kvb_collect_io(void *collect, uint64_t now_ms);
static void kvb_scrape_done(size_t e, uint64_t now_ms);
static int kvb_daemonize(const char *pid_file);


int
main(int argc, char **argv)
{
    int                   rc, n, nredis, i, timeout, fd;
    short                 events;
    char                  err[512];
    void                 *zctx, *collect;
    size_t                e;
    uint64_t              now, deadline, d;
    kvb_redis_t          *redis;
    kvb_redis_conf_t      rconf;
    kvb_redis_handler_t   rh;
    struct sigaction      sa;
    zmq_pollitem_t        items[KVB_ITEMS_MAX];
    kvb_item_t            what[KVB_ITEMS_MAX];

    kvb_conf_defaults(&kvb_conf);

    rc = kvb_conf_args(&kvb_conf, argc, argv, err, sizeof(err));
    if (rc == 1) {
        return 0;
    }

    if (rc != 0 || kvb_conf_check(&kvb_conf, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvbridge: %s\n", err);
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

    rconf.host = kvb_conf.redis_host;
    rconf.port = kvb_conf.redis_port;
    rconf.user = kvb_conf.redis_user;
    rconf.password = kvb_conf.redis_password;
    rconf.channel = kvb_conf.channel;
    rconf.max_pending_bytes = kvb_conf.redis_max_pending;
    rconf.timeout_ms = kvb_conf.redis_timeout_ms;
    rh.resync = kvb_on_resync;
    rh.data = NULL;

    redis = kvb_redis_create(&rconf, &rh);
    if (redis == NULL) {
        kvb_log(KVB_LOG_ERR, "out of memory");
        return 1;
    }

    for (e = 0; e < kvb_conf.nengines; e++) {
        kvb_engines[e] = kvb_engine_create(zctx, &kvb_conf.engines[e].engine,
                                           &kvb_conf.lim, redis, err,
                                           sizeof(err));
        if (kvb_engines[e] == NULL) {
            kvb_log(KVB_LOG_ERR, "engine %s: %s",
                    kvb_conf.engines[e].engine.name, err);
            return 1;
        }

        if (kvb_scrape_setup(e, err, sizeof(err)) != 0) {
            kvb_log(KVB_LOG_ERR, "engine %s: metrics=%s: %s",
                    kvb_conf.engines[e].engine.name,
                    kvb_conf.engines[e].metrics, err);
            return 1;
        }

        kvb_log(KVB_LOG_INFO, "engine %s: model \"%s\", events %s%s%s",
                kvb_engine_label(kvb_engines[e]),
                kvb_conf.engines[e].engine.model,
                kvb_conf.engines[e].engine.events
                ? kvb_conf.engines[e].engine.events : "(collected)",
                kvb_conf.engines[e].engine.replay ? ", replay " : "",
                kvb_conf.engines[e].engine.replay
                ? kvb_conf.engines[e].engine.replay : "");
    }

    collect = NULL;

    if (kvb_conf.collect != NULL) {
        collect = zmq_socket(zctx, ZMQ_SUB);

        if (collect == NULL
            || zmq_setsockopt(collect, ZMQ_SUBSCRIBE, "", 0) != 0
            || zmq_bind(collect, kvb_conf.collect) != 0)
        {
            kvb_log(KVB_LOG_ERR, "collect %s: %s", kvb_conf.collect,
                    zmq_strerror(zmq_errno()));
            return 1;
        }

        if (kvb_collect_bind(collect) != 0) {
            return 1;
        }

        kvb_log(KVB_LOG_INFO, "collecting engines on %s", kvb_conf.collect);
    }

    while (!kvb_stop) {
        n = 0;

        now = kvb_now_ms();

        for (e = 0; e < kvb_conf.nengines; e++) {
            if (kvb_engine_sub(kvb_engines[e]) != NULL) {
                items[n].socket = kvb_engine_sub(kvb_engines[e]);
                items[n].events = ZMQ_POLLIN;
                what[n].kind = KVB_ITEM_SUB;
                what[n++].engine = e;
            }

            if (kvb_engine_monitor(kvb_engines[e]) != NULL) {
                items[n].socket = kvb_engine_monitor(kvb_engines[e]);
                items[n].events = ZMQ_POLLIN;
                what[n].kind = KVB_ITEM_MONITOR;
                what[n++].engine = e;
            }

            if (kvb_engine_replay(kvb_engines[e]) != NULL) {
                items[n].socket = kvb_engine_replay(kvb_engines[e]);
                items[n].events = ZMQ_POLLIN;
                what[n].kind = KVB_ITEM_REPLAY;
                what[n++].engine = e;
            }

            if (kvb_scrapes[e] != NULL) {
                fd = kvb_scrape_want(kvb_scrapes[e], now, &events);

                if (fd >= 0) {
                    items[n].socket = NULL;
                    items[n].fd = fd;
                    items[n].events = events;
                    what[n].kind = KVB_ITEM_SCRAPE;
                    what[n++].engine = e;
                }

                kvb_scrape_done(e, now);
            }
        }

        if (collect != NULL) {
            items[n].socket = collect;
            items[n].events = ZMQ_POLLIN;
            what[n++].kind = KVB_ITEM_COLLECT;
        }

        nredis = kvb_redis_watch(redis, &items[n]);

        for (i = n; i < n + nredis; i++) {
            what[i].kind = KVB_ITEM_REDIS;
        }

        /* until the nearest deadline, at most a second */

        deadline = now + 1000;

        d = kvb_redis_deadline(redis);
        deadline = (d < deadline) ? d : deadline;

        for (e = 0; e < kvb_conf.nengines; e++) {
            d = kvb_engine_deadline(kvb_engines[e]);
            deadline = (d < deadline) ? d : deadline;

            if (kvb_scrapes[e] != NULL) {
                d = kvb_scrape_deadline(kvb_scrapes[e]);
                deadline = (d < deadline) ? d : deadline;
            }
        }

        timeout = (deadline > now) ? (int) (deadline - now) : 0;

        rc = zmq_poll(items, n + nredis, timeout);

        if (rc < 0 && zmq_errno() != EINTR) {
            kvb_log(KVB_LOG_ERR, "zmq_poll: %s", zmq_strerror(zmq_errno()));
            break;
        }

        now = kvb_now_ms();

        for (i = 0; rc > 0 && i < n; i++) {
            if (items[i].revents == 0) {
                continue;
            }

            switch (what[i].kind) {
            case KVB_ITEM_SUB:
                kvb_engine_sub_io(kvb_engines[what[i].engine], now);
                break;
            case KVB_ITEM_REPLAY:
                kvb_engine_replay_io(kvb_engines[what[i].engine], now);
                break;
            case KVB_ITEM_MONITOR:
                kvb_engine_monitor_io(kvb_engines[what[i].engine], now);
                break;
            case KVB_ITEM_SCRAPE:
                kvb_scrape_io(kvb_scrapes[what[i].engine], items[i].revents,
                              now);
                kvb_scrape_done(what[i].engine, now);
                break;
            case KVB_ITEM_COLLECT:
                kvb_collect_io(collect, now);
                break;
            case KVB_ITEM_REDIS:
                break;
            }
        }

        if (rc > 0) {
            kvb_redis_io(redis, &items[n], nredis);
        }

        kvb_redis_tick(redis, now);

        for (e = 0; e < kvb_conf.nengines; e++) {
            if (kvb_scrapes[e] != NULL
                && now >= kvb_scrape_deadline(kvb_scrapes[e]))
            {
                /* a timeout, with no I/O to tell */
                kvb_scrape_io(kvb_scrapes[e], 0, now);
                kvb_scrape_done(e, now);
            }

            kvb_engine_tick(kvb_engines[e], now);
        }
    }

    kvb_log(KVB_LOG_INFO, "stopping");

    for (e = 0; e < kvb_conf.nengines; e++) {
        kvb_engine_destroy(kvb_engines[e]);
        kvb_scrape_destroy(kvb_scrapes[e]);
    }

    if (collect != NULL) {
        zmq_close(collect);
    }

    kvb_redis_destroy(redis);
    zmq_ctx_term(zctx);

    return 0;
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
    size_t       e;
    const char  *name;

    for (e = 0; e < kvb_conf.nengines; e++) {
        name = kvb_engine_name(kvb_engines[e]);

        if (strlen(name) == len && memcmp(name, server, len) == 0
            && kvb_engine_rank(kvb_engines[e]) == rank)
        {
            kvb_log(KVB_LOG_INFO, "engine %s: nginx asks for a resync",
                    kvb_engine_label(kvb_engines[e]));
            kvb_engine_resync(kvb_engines[e]);
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
kvb_scrape_setup(size_t e, char *err, size_t errlen)
{
    size_t       j;
    const char  *url;

    url = kvb_conf.engines[e].metrics;
    kvb_scrape_of[e] = e;

    if (url == NULL) {
        return 0;
    }

    for (j = 0; j < e; j++) {
        if (kvb_conf.engines[j].metrics != NULL
            && strcmp(kvb_conf.engines[j].metrics, url) == 0)
        {
            kvb_scrape_of[e] = kvb_scrape_of[j];
            return 0;
        }
    }

    kvb_scrapes[e] = kvb_scrape_create(url, kvb_conf.metrics_ms,
                                       KVB_SCRAPE_TIMEOUT_MS, err, errlen);

    kvb_scrape_label(kvb_scrapes[e], kvb_conf.engines[e].engine.name);

    return kvb_scrapes[e] != NULL ? 0 : -1;
}


/* a new load from the engine's metrics goes with its next message */

static void
kvb_scrape_done(size_t e, uint64_t now_ms)
{
    int                       rc;
    size_t                    k;
    uint64_t                  taken;
    kvb_load_t                load;
    const kvb_engine_conf_t  *c;

    if (kvb_scrape_load(kvb_scrapes[e], &load, &taken) != 0
        || taken == kvb_scraped[e])
    {
        return;
    }

    kvb_scraped[e] = taken;

    /* a rank takes its own series; an engine without ranks all of them */

    for (k = e; k < kvb_conf.nengines; k++) {
        if (kvb_scrape_of[k] != e) {
            continue;
        }

        c = &kvb_conf.engines[k].engine;
        rc = c->ranked ? kvb_scrape_rank_load(kvb_scrapes[e], c->rank,
                                              &load, &taken)
                       : kvb_scrape_load(kvb_scrapes[e], &load, &taken);

        if (rc == 0) {
            kvb_engine_load(kvb_engines[k], &load, taken);
        }
    }
}


/* engines that connect to one bound socket: the topic says whose */

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


/*
 * The engine a collected message is for: its topic names the server, and
 * for a data-parallel one the batch's data_parallel_rank the rank (its
 * own stream and seq; a batch that says none is rank 0's).  NULL when no
 * engine is configured for the pair: a rank's batches must never enter
 * another rank's stream, whose seqs they would scramble.  A payload
 * that does not decode goes to rank 0, which counts and logs it.
 */

static kvb_engine_t *
kvb_collected(zmq_msg_t *topic, zmq_msg_t *payload,
    int64_t *rank)
{
    size_t       e, len;
    const char  *t;

    *rank = -1;

    for (e = 0; e < kvb_conf.nengines; e++) {
        if (kvb_conf.engines[e].engine.events != NULL) {
            continue;
        }

        t = kvb_engine_topic(kvb_engines[e]);
        len = strlen(t);

        if (len != zmq_msg_size(topic)
            || memcmp(t, zmq_msg_data(topic), len) != 0)
        {
            continue;
        }

        if (!kvb_conf.engines[e].engine.ranked) {
            return kvb_engines[e];
        }

        if (*rank < 0
            && kvb_decode_rank(zmq_msg_data(payload), zmq_msg_size(payload),
                               &kvb_conf.lim.decode, rank) != 0)
        {
            *rank = 0;
        }

        if ((int64_t) kvb_engine_rank(kvb_engines[e]) == *rank) {
            return kvb_engines[e];
        }
    }

    return NULL;
}


static void
kvb_collect_io(void *collect, uint64_t now_ms)
{
    int                     n;
    int64_t                 rank;
    kvb_zmsg_t              m;
    kvb_engine_t           *engine;
    static kvb_log_limit_t  unknown_log;

    for (n = 0; n < 256 && kvb_zmsg_recv(collect, &m, 3); n++) {

        engine = NULL;
        rank = -1;

        if (m.n == 3 && !m.too_long) {
            engine = kvb_collected(&m.part[0], &m.part[2], &rank);
        }

        if (engine != NULL) {
            kvb_engine_frame(engine, zmq_msg_data(&m.part[1]),
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
