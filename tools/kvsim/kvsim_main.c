/*
 * kvsim: the program: its arguments, the servers' set-up, the loop.
 */

#include <errno.h>
#include <limits.h>
#include <getopt.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <event2/event.h>
#include <event2/http.h>

#include "kva_cluster.h"
#include "kvsim.h"
#include "kvsim_events.h"
#include "kvsim_pd.h"
#include "kvsim_server.h"
#include "kvsim_vllm.h"
#include "kvsim_zmq.h"


/* options without a one-letter code */
enum {
    KVS_OPT_KEYSPACE = 256,
    KVS_OPT_EVENTS,
    KVS_OPT_ZMQ_PORT,
    KVS_OPT_ZMQ_TOPIC,
    KVS_OPT_ZMQ_ENCODING,
    KVS_OPT_ZMQ_HASH,
    KVS_OPT_ZMQ_BUFFER,
    KVS_OPT_ZMQ_DROP,
    KVS_OPT_ZMQ_REPLAY_TOPIC,
    KVS_OPT_LORA,
    KVS_OPT_TOKENIZE_DELAY,
    KVS_OPT_TOKENIZE_FAIL,
    KVS_OPT_DATA_PARALLEL,
    KVS_OPT_CALIBRATION,
    KVS_OPT_ROLE,
    KVS_OPT_SIDECAR,
    KVS_OPT_KV_HOLD,
    KVS_OPT_KV_BANDWIDTH,
    KVS_OPT_KV_TOKEN_BYTES,
    KVS_OPT_PD_WAIT,
    KVS_OPT_BOOTSTRAP_PORT,
    KVS_OPT_REDIS_CLUSTER,
    KVS_OPT_SLOW_SERVERS,
    KVS_OPT_EARLY_HEADERS,
    KVS_OPT_SLOW_FACTOR
};


static int kvs_parse_args(kvs_conf_t *conf, int argc, char **argv);
static int kvs_parse_word(int c, const char *arg, kvs_conf_t *conf);
static int kvs_parse_lora(kvs_conf_t *conf, const char *arg);
static int kvs_parse_slow(kvs_conf_t *conf, const char *arg);
static uint64_t kvs_random_seed(void);
static int kvs_number(const char *s, double min, double max, double *v);
static void kvs_usage(void);
static void kvs_fd_limit(kvs_conf_t *conf);
static void kvs_signal_handler(evutil_socket_t fd, short what, void *arg);
static void kvs_die_handler(evutil_socket_t fd, short what, void *arg);


static struct option  kvs_options[] = {
    { "servers",            required_argument, NULL, 'n' },
    { "data-parallel",      required_argument, NULL, KVS_OPT_DATA_PARALLEL },
    { "base-port",          required_argument, NULL, 'p' },
    { "block-tokens",       required_argument, NULL, 'b' },
    { "num-blocks",         required_argument, NULL, 'k' },
    { "time-scale",         required_argument, NULL, 's' },
    { "calibration",        required_argument, NULL, KVS_OPT_CALIBRATION },
    { "max-seqs",           required_argument, NULL, 'm' },
    { "token-budget",       required_argument, NULL, 't' },
    { "max-conns",          required_argument, NULL, 'c' },
    { "model",              required_argument, NULL, 'M' },
    { "redis",              required_argument, NULL, 'r' },
    { "channel",            required_argument, NULL, 'C' },
    { "redis-cluster",      no_argument,       NULL, KVS_OPT_REDIS_CLUSTER },
    { "heartbeat-ms",       required_argument, NULL, 'h' },
    { "drop-events",        required_argument, NULL, 'd' },
    { "pause-publish-after-ms", required_argument, NULL, 'P' },
    { "pause-ms",           required_argument, NULL, 'Q' },
    { "die-after-ms",       required_argument, NULL, 'D' },
    { "seed",               required_argument, NULL, 'S' },
    { "keyspace",           required_argument, NULL, KVS_OPT_KEYSPACE },
    { "events",             required_argument, NULL, KVS_OPT_EVENTS },
    { "zmq-port",           required_argument, NULL, KVS_OPT_ZMQ_PORT },
    { "zmq-topic",          required_argument, NULL, KVS_OPT_ZMQ_TOPIC },
    { "zmq-encoding",       required_argument, NULL, KVS_OPT_ZMQ_ENCODING },
    { "zmq-hash",           required_argument, NULL, KVS_OPT_ZMQ_HASH },
    { "zmq-buffer",         required_argument, NULL, KVS_OPT_ZMQ_BUFFER },
    { "zmq-drop",           required_argument, NULL, KVS_OPT_ZMQ_DROP },
    { "zmq-replay-topic",   no_argument,       NULL,
      KVS_OPT_ZMQ_REPLAY_TOPIC },
    { "lora",               required_argument, NULL, KVS_OPT_LORA },
    { "tokenize-delay-ms",  required_argument, NULL, KVS_OPT_TOKENIZE_DELAY },
    { "tokenize-fail",      no_argument,       NULL, KVS_OPT_TOKENIZE_FAIL },
    { "role",               required_argument, NULL, KVS_OPT_ROLE },
    { "sidecar",            no_argument,       NULL, KVS_OPT_SIDECAR },
    { "kv-hold-s",          required_argument, NULL, KVS_OPT_KV_HOLD },
    { "kv-bandwidth",       required_argument, NULL, KVS_OPT_KV_BANDWIDTH },
    { "kv-token-bytes",     required_argument, NULL,
      KVS_OPT_KV_TOKEN_BYTES },
    { "pd-wait-s",          required_argument, NULL, KVS_OPT_PD_WAIT },
    { "bootstrap-port",     required_argument, NULL,
      KVS_OPT_BOOTSTRAP_PORT },
    { "slow-servers",       required_argument, NULL, KVS_OPT_SLOW_SERVERS },
    { "early-headers",      no_argument,       NULL, KVS_OPT_EARLY_HEADERS },
    { "slow-factor",        required_argument, NULL, KVS_OPT_SLOW_FACTOR },
    { "quiet",              no_argument,       NULL, 'q' },
    { "help",               no_argument,       NULL, 'H' },
    { NULL, 0, NULL, 0 }
};


int
main(int argc, char **argv)
{
    int                  rc;
    unsigned             i;
    kvs_sim_t            sim;
    struct timeval       tv;
    struct event        *sigint, *sigterm, *die;
    struct event_config *cfg;

    memset(&sim, 0, sizeof(kvs_sim_t));

    if (kvs_parse_args(&sim.conf, argc, argv) != 0) {
        return 2;
    }

    signal(SIGPIPE, SIG_IGN);
    kvs_fd_limit(&sim.conf);

    /* timerfd: steps at S = 50 are well under a millisecond */
    cfg = event_config_new();
    if (cfg == NULL) {
        return 1;
    }

    event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
    sim.base = event_base_new_with_config(cfg);
    event_config_free(cfg);

    if (sim.base == NULL) {
        fprintf(stderr, "kvsim: event_base_new() failed\n");
        return 1;
    }

    sim.t0 = kvs_now_ms();
    sim.rng = sim.conf.seed;
    sim.engine_seed = kvs_random_seed();
    sim.nranks = sim.conf.servers * sim.conf.data_parallel;
    sim.servers = calloc(sim.nranks, sizeof(kvs_server_t));
    sigint = evsignal_new(sim.base, SIGINT, kvs_signal_handler, &sim);
    sigterm = evsignal_new(sim.base, SIGTERM, kvs_signal_handler, &sim);
    die = evtimer_new(sim.base, kvs_die_handler, &sim);

    rc = 1;

    if (sim.servers == NULL || sigint == NULL || sigterm == NULL
        || die == NULL || evsignal_add(sigint, NULL) != 0
        || evsignal_add(sigterm, NULL) != 0)
    {
        fprintf(stderr, "kvsim: out of memory\n");
        goto done;
    }

    for (i = 0; i < sim.nranks; i++) {
        if (kvs_server_init(&sim, &sim.servers[i], i) != 0) {
            goto done;
        }
    }

    if (kvs_pd_bootstrap_init(&sim) != 0) {
        goto done;
    }

    if (sim.conf.events == KVS_EVENTS_ZMQ) {
        sim.zmq = kvs_zmq_create(&sim);
        if (sim.zmq == NULL) {
            goto done;
        }

    } else if (sim.conf.redis_host[0]) {
        sim.events = kvs_events_create(&sim);
        if (sim.events == NULL) {
            fprintf(stderr, "kvsim: events: out of memory\n");
            goto done;
        }
    }

    if (sim.conf.die_after_ms >= 0) {
        tv.tv_sec = sim.conf.die_after_ms / 1000;
        tv.tv_usec = (sim.conf.die_after_ms % 1000) * 1000;
        evtimer_add(die, &tv);
    }

    if (!sim.conf.quiet && sim.zmq) {
        fprintf(stderr, "kvsim: %u servers on 127.0.0.1:%u..%u, %u blocks "
                "of %u tokens, time scale %g, events zmq tcp://127.0.0.1:"
                "%u..%u\n",
                sim.conf.servers, sim.conf.base_port,
                sim.conf.base_port + sim.conf.servers - 1,
                sim.conf.num_blocks, sim.conf.block_tokens,
                sim.conf.time_scale, sim.conf.zmq_port,
                sim.conf.zmq_port + 2 * sim.nranks - 1);

    } else if (!sim.conf.quiet) {
        fprintf(stderr, "kvsim: %u servers on 127.0.0.1:%u..%u, %u blocks "
                "of %u tokens, time scale %g, events %s\n",
                sim.conf.servers, sim.conf.base_port,
                sim.conf.base_port + sim.conf.servers - 1,
                sim.conf.num_blocks, sim.conf.block_tokens,
                sim.conf.time_scale,
                sim.conf.redis_host[0] ? sim.conf.channel : "off");
    }

    if (!sim.conf.quiet && (sim.conf.role != KVS_ROLE_BOTH
                            || sim.conf.sidecar))
    {
        fprintf(stderr, "kvsim: role %s%s, blocks held %g s, pulls at "
                "%g GB/s of %g bytes a token\n",
                kvs_role_name(sim.conf.role),
                sim.conf.sidecar ? " with a sidecar" : "",
                sim.conf.kv_hold_s, sim.conf.kv_bandwidth,
                sim.conf.kv_token_bytes);
    }

    if (!sim.conf.quiet && sim.conf.data_parallel > 1) {
        fprintf(stderr, "kvsim: %u data-parallel ranks a server, each its "
                "own cache and scheduler (X-data-parallel-rank)\n",
                sim.conf.data_parallel);
    }

    rc = (event_base_dispatch(sim.base) < 0);

done:

    if (sim.bootstrap) {
        evhttp_free(sim.bootstrap);
    }

    if (sim.events) {
        kvs_events_destroy(sim.events);
    }

    if (sim.zmq) {
        kvs_zmq_destroy(sim.zmq);
    }

    for (i = 0; sim.servers && i < sim.nranks; i++) {
        kvs_server_free(&sim.servers[i]);
    }

    free(sim.servers);

    if (sim.conf.lora) {
        free(sim.conf.lora[0]);
        free(sim.conf.lora);
    }

    if (sigint) {
        event_free(sigint);
    }

    if (sigterm) {
        event_free(sigterm);
    }

    if (die) {
        event_free(die);
    }

    event_base_free(sim.base);

    return rc;
}


static void
kvs_signal_handler(evutil_socket_t fd, short what, void *arg)
{
    kvs_sim_t  *sim = arg;

    event_base_loopexit(sim->base, NULL);
}


static void
kvs_die_handler(evutil_socket_t fd, short what, void *arg)
{
    fprintf(stderr, "kvsim: dying as asked (--die-after-ms)\n");
    _exit(0);
}


/* every server's connections, and some for Redis and the listeners */
static void
kvs_fd_limit(kvs_conf_t *conf)
{
    rlim_t         want;
    struct rlimit  rl;

    want = (rlim_t) conf->servers * (conf->max_conns + 1) + 64;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want) {
        return;
    }

    rl.rlim_cur = (rl.rlim_max < want) ? rl.rlim_max : want;
    setrlimit(RLIMIT_NOFILE, &rl);

    if (rl.rlim_cur < want) {
        conf->max_conns = (rl.rlim_cur > 64 + 2 * conf->servers)
                          ? (rl.rlim_cur - 64) / conf->servers - 1 : 1;
        fprintf(stderr, "kvsim: open files limited to %lu: --max-conns %u\n",
                (unsigned long) rl.rlim_cur, conf->max_conns);
    }
}


static int
kvs_parse_args(kvs_conf_t *conf, int argc, char **argv)
{
    int              c, li = 0;
    char            *colon;
    double           v;
    unsigned         block_tokens;
    const char      *redis;
    struct in_addr   addr;

    conf->servers = 8;
    conf->data_parallel = 1;
    conf->base_port = 8001;
    conf->block_tokens = 64;
    conf->num_blocks = 4802;
    conf->time_scale = 1.0;
    conf->max_seqs = 256;
    conf->token_budget = 8192;
    conf->max_conns = 1024;
    conf->model = "kvsim";
    conf->channel = "kv_aware:events";
    conf->heartbeat_ms = 1000;
    conf->pause_after_ms = -1;
    conf->die_after_ms = -1;
    conf->seed = 1;
    conf->zmq_port = 5557;
    conf->zmq_topic = "";
    conf->zmq_buffer = 10000;
    conf->kv_hold_s = 480;              /* VLLM_NIXL_ABORT_REQUEST_TIMEOUT */
    conf->kv_bandwidth = 25;            /* GB/s, a 200 Gb/s RDMA link */
    conf->kv_token_bytes = 262144;      /* Qwen3-32B: kvsim_sched.c */
    conf->pd_wait_s = 30;
    conf->slow_factor = 2.0;
    conf->slow_last = -1;
    redis = "127.0.0.1:6379";
    block_tokens = UINT_MAX;            /* not given */

    while ((c = getopt_long(argc, argv, "", kvs_options, &li)) != -1) {
        v = 0;

        switch (c) {
        case 'M':
            conf->model = optarg;
            continue;
        case 'r':
            redis = optarg;
            continue;
        case 'C':
            conf->channel = optarg;
            continue;
        case KVS_OPT_REDIS_CLUSTER:
            conf->redis_cluster = 1;
            continue;
        case 'q':
            conf->quiet = 1;
            continue;
        case 'H':
            kvs_usage();
            exit(0);
        case KVS_OPT_SIDECAR:
            conf->sidecar = 1;
            continue;
        case KVS_OPT_KV_HOLD:
        case KVS_OPT_KV_BANDWIDTH:
        case KVS_OPT_KV_TOKEN_BYTES:
        case KVS_OPT_PD_WAIT:
            if (kvs_number(optarg, c == KVS_OPT_KV_TOKEN_BYTES ? 1 : 1e-3,
                           1e9, &v) != 0)
            {
                goto invalid;
            }

            *(c == KVS_OPT_KV_HOLD ? &conf->kv_hold_s
              : c == KVS_OPT_KV_BANDWIDTH ? &conf->kv_bandwidth
              : c == KVS_OPT_KV_TOKEN_BYTES ? &conf->kv_token_bytes
              : &conf->pd_wait_s) = v;
            continue;
        case KVS_OPT_ROLE:
        case KVS_OPT_KEYSPACE:
        case KVS_OPT_CALIBRATION:
        case KVS_OPT_EVENTS:
        case KVS_OPT_ZMQ_ENCODING:
        case KVS_OPT_ZMQ_HASH:
            if (kvs_parse_word(c, optarg, conf) != 0) {
                goto invalid;
            }

            continue;
        case KVS_OPT_ZMQ_TOPIC:
            conf->zmq_topic = optarg;
            continue;
        case KVS_OPT_ZMQ_REPLAY_TOPIC:
            conf->zmq_replay_topic = 1;
            continue;
        case KVS_OPT_TOKENIZE_FAIL:
            conf->tokenize_fail = 1;
            continue;
        case KVS_OPT_LORA:
            if (kvs_parse_lora(conf, optarg) != 0) {
                goto invalid;
            }

            continue;
        case KVS_OPT_SLOW_SERVERS:
            if (kvs_parse_slow(conf, optarg) != 0) {
                goto invalid;
            }

            continue;
        case KVS_OPT_EARLY_HEADERS:
            conf->early_headers = 1;
            continue;
        case KVS_OPT_SLOW_FACTOR:
            if (kvs_number(optarg, 1e-3, 1e3, &conf->slow_factor) != 0) {
                goto invalid;
            }

            continue;
        case KVS_OPT_ZMQ_DROP:
            if (kvs_number(optarg, 0, 1, &conf->zmq_drop) != 0) {
                goto invalid;
            }

            continue;
        case 'd':
        case 's':
            if (kvs_number(optarg, c == 's' ? 1e-3 : 0, c == 's' ? 1e6 : 1,
                           &v) != 0)
            {
                goto invalid;
            }

            *(c == 's' ? &conf->time_scale : &conf->drop_events) = v;
            continue;
        case '?':
            kvs_usage();
            return -1;
        }

        if (kvs_number(optarg, 0, 4294967295.0, &v) != 0 || v != (long) v) {
            goto invalid;
        }

        switch (c) {
        case 'n': conf->servers = v; break;
        case KVS_OPT_DATA_PARALLEL: conf->data_parallel = v; break;
        case 'p': conf->base_port = v; break;
        case 'b': block_tokens = v; break;
        case 'k': conf->num_blocks = v; break;
        case 'm': conf->max_seqs = v; break;
        case 't': conf->token_budget = v; break;
        case 'c': conf->max_conns = v; break;
        case 'h': conf->heartbeat_ms = v; break;
        case 'P': conf->pause_after_ms = v; break;
        case 'Q': conf->pause_ms = v; break;
        case 'D': conf->die_after_ms = v; break;
        case 'S': conf->seed = v; break;
        case KVS_OPT_ZMQ_PORT: conf->zmq_port = v; break;
        case KVS_OPT_ZMQ_BUFFER: conf->zmq_buffer = v; break;
        case KVS_OPT_TOKENIZE_DELAY: conf->tokenize_delay_ms = v; break;
        case KVS_OPT_BOOTSTRAP_PORT: conf->bootstrap_port = v; break;
        }
    }

    /* an engine's --block-size is 16 by default */
    conf->block_tokens = (block_tokens != UINT_MAX) ? block_tokens
                         : conf->tokens ? 16 : 64;

    if (optind < argc || conf->servers < 1 || conf->servers > 256
        || conf->base_port < 1 || conf->base_port + conf->servers > 65536
        || conf->block_tokens < 1 || conf->block_tokens > 65536
        || conf->num_blocks < 1 || conf->num_blocks > (1u << 26)
        || conf->max_seqs < 1 || conf->max_seqs > 65536
        || conf->token_budget < 1 || conf->max_conns < 1
        || conf->heartbeat_ms < 10 || strlen(conf->channel) > 200
        || conf->data_parallel < 1 || conf->data_parallel > 64
        || conf->servers * conf->data_parallel > 1024
        || conf->zmq_port < 1
        || conf->zmq_port + 2 * conf->servers * conf->data_parallel > 65536
        || conf->zmq_buffer < 1 || conf->zmq_buffer > (1u << 24)
        || conf->tokenize_delay_ms > 600000 || strlen(conf->zmq_topic) > 200
        || conf->bootstrap_port > 65535
        || conf->slow_last >= (int) conf->servers)
    {
        fprintf(stderr, "kvsim: invalid arguments\n");
        kvs_usage();
        return -1;
    }

    /* the bridge keys engine events by token ids: so must the servers */
    if (conf->events == KVS_EVENTS_ZMQ && !conf->tokens) {
        fprintf(stderr, "kvsim: --events zmq needs --keyspace tokens\n");
        return -1;
    }

    if (strcmp(redis, "off") == 0) {
        return 0;
    }

    /* the resync channel must be on the same master as the channel */
    if (conf->redis_cluster
        && !kva_cluster_has_tag((const unsigned char *) conf->channel,
                                strlen(conf->channel)))
    {
        fprintf(stderr, "kvsim: --redis-cluster needs a --channel with a "
                "hash tag, e.g. {kv_aware}:events\n");
        return -1;
    }

    colon = strrchr(redis, ':');

    if (colon == NULL || colon == redis
        || (size_t) (colon - redis) >= sizeof(conf->redis_host)
        || kvs_number(colon + 1, 1, 65535, &v) != 0)
    {
        fprintf(stderr, "kvsim: --redis wants IP:PORT or \"off\"\n");
        return -1;
    }

    memcpy(conf->redis_host, redis, colon - redis);
    conf->redis_port = v;

    /* hiredis would resolve a name, blocking the loop */
    if (inet_pton(AF_INET, conf->redis_host, &addr) != 1) {
        fprintf(stderr, "kvsim: --redis wants an IPv4 address\n");
        return -1;
    }

    return 0;

invalid:

    fprintf(stderr, "kvsim: invalid value \"%s\" for --%s\n", optarg,
            kvs_options[li].name);
    return -1;
}


static int
kvs_parse_word(int c, const char *arg, kvs_conf_t *conf)
{
    unsigned  i;

    switch (c) {

    case KVS_OPT_ROLE:
        for (i = KVS_ROLE_BOTH; i <= KVS_ROLE_DECODE; i++) {
            if (strcmp(arg, kvs_role_name(i)) == 0) {
                conf->role = i;
                return 0;
            }
        }

        return -1;

    case KVS_OPT_KEYSPACE:
        if (strcmp(arg, "text") == 0 || strcmp(arg, "tokens") == 0) {
            conf->tokens = (arg[0] == 't' && arg[1] == 'o');
            return 0;
        }

        return -1;

    case KVS_OPT_CALIBRATION:
        for (i = 0; kvs_step_costs[i].name; i++) {
            if (strcmp(arg, kvs_step_costs[i].name) == 0) {
                conf->calibration = i;
                return 0;
            }
        }

        return -1;

    case KVS_OPT_EVENTS:
        if (strcmp(arg, "redis") == 0) {
            conf->events = KVS_EVENTS_REDIS;

        } else if (strcmp(arg, "zmq") == 0) {
            conf->events = KVS_EVENTS_ZMQ;

        } else {
            return -1;
        }

        return 0;

    case KVS_OPT_ZMQ_ENCODING:
        if (strcmp(arg, "map") == 0) {
            conf->zmq_encoding = KVS_VENC_MAP;

        } else if (strcmp(arg, "array") == 0) {
            conf->zmq_encoding = KVS_VENC_ARRAY;

        } else {
            return -1;
        }

        return 0;

    case KVS_OPT_ZMQ_HASH:
        if (strcmp(arg, "uint64") == 0) {
            conf->zmq_hash = KVS_VHASH_UINT64;

        } else if (strcmp(arg, "int64") == 0) {
            conf->zmq_hash = KVS_VHASH_INT64;

        } else if (strcmp(arg, "bytes") == 0) {
            conf->zmq_hash = KVS_VHASH_BYTES;

        } else {
            return -1;
        }

        return 0;
    }

    return -1;
}


/* NAME[,NAME]: one copy of the list, the names pointing into it */
static int
kvs_parse_lora(kvs_conf_t *conf, const char *arg)
{
    char      *s, *p, **names;
    unsigned   n;

    if (conf->lora) {
        free(conf->lora[0]);
        free(conf->lora);
        conf->lora = NULL;
        conf->nlora = 0;
    }

    for (n = 1, p = (char *) arg; *p; p++) {
        n += (*p == ',');
    }

    s = strdup(arg);
    names = calloc(n, sizeof(char *));

    if (s == NULL || names == NULL) {
        free(s);
        free(names);
        return -1;
    }

    conf->lora = names;

    for (p = s; p != NULL; /* void */ ) {
        names[conf->nlora++] = p;
        p = strchr(p, ',');

        if (p != NULL) {
            *p++ = '\0';
        }
    }

    for (n = 0; n < conf->nlora; n++) {
        if (names[n][0] == '\0') {
            return -1;
        }
    }

    return 0;
}


/* a new one each run, as a vLLM process's hash seed */
/* --slow-servers 0,3: servers (0-based) whose prefill is slower */
static int
kvs_parse_slow(kvs_conf_t *conf, const char *arg)
{
    char           *end;
    unsigned long   i;

    for ( ;; ) {
        errno = 0;
        i = strtoul(arg, &end, 10);

        if (errno || end == arg || i >= KVS_SERVERS_MAX) {
            return -1;
        }

        conf->slow[i] = 1;

        if ((int) i > conf->slow_last) {
            conf->slow_last = (int) i;
        }

        if (*end == '\0') {
            return 0;
        }

        if (*end != ',') {
            return -1;
        }

        arg = end + 1;
    }
}


static uint64_t
kvs_random_seed(void)
{
    FILE            *f;
    uint64_t         v;
    struct timespec  ts;

    v = 0;
    f = fopen("/dev/urandom", "r");

    if (f != NULL) {
        if (fread(&v, sizeof(v), 1, f) != 1) {
            v = 0;
        }

        fclose(f);
    }

    if (v == 0) {
        clock_gettime(CLOCK_REALTIME, &ts);
        v = ((uint64_t) ts.tv_sec << 32) ^ ts.tv_nsec ^ getpid();
    }

    return v;
}


static int
kvs_number(const char *s, double min, double max, double *v)
{
    char  *end;

    errno = 0;
    *v = strtod(s, &end);

    if (errno || end == s || *end != '\0' || *v < min || *v > max) {
        return -1;
    }

    return 0;
}


static void
kvs_usage(void)
{
    fprintf(stderr,
        "usage: kvsim [--servers 8] [--base-port 8001] [--block-tokens 64]\n"
        "    [--num-blocks 4802] [--time-scale 1] [--calibration 0.1|llm-d]\n"
        "    [--max-seqs 256]\n"
        "    [--token-budget 8192] [--max-conns 1024] [--model kvsim]\n"
        "    [--redis 127.0.0.1:6379|off] [--channel kv_aware:events]\n"
        "    [--redis-cluster]\n"
        "    [--heartbeat-ms 1000] [--drop-events 0.0]\n"
        "    [--pause-publish-after-ms N --pause-ms M] [--die-after-ms N]\n"
        "    [--seed 1] [--quiet] [--data-parallel 1]\n"
        "    [--keyspace text|tokens] [--lora NAME[,NAME]]\n"
        "    [--events redis|zmq] [--zmq-port 5557] [--zmq-topic \"\"]\n"
        "    [--zmq-encoding map|array] [--zmq-hash uint64|int64|bytes]\n"
        "    [--zmq-buffer 10000] [--zmq-drop 0.0] [--zmq-replay-topic]\n"
        "    [--tokenize-delay-ms 0] [--tokenize-fail]\n"
        "    [--role both|prefill|decode] [--sidecar] [--kv-hold-s 480]\n"
        "    [--kv-bandwidth 25] [--kv-token-bytes 262144] [--pd-wait-s 30]\n"
        "    [--bootstrap-port P] [--slow-servers I[,I]] [--slow-factor 2]\n"
        "    [--early-headers]\n"
        "--block-tokens defaults to 16 with --keyspace tokens\n"
        "--data-parallel N: N ranks a server behind its one port, picked by "
        "X-data-parallel-rank\n  (else the least loaded); with --events zmq"
        " server s rank r publishes on\n  P + 2Ns + r, replays on "
        "P + 2Ns + N + r (P: --zmq-port)\n"
        "--early-headers: a streamed answer's headers go out when the request "
        "is admitted,\n  before its prefill, as vLLM and SGLang (uvicorn) "
        "send them\n");
}
