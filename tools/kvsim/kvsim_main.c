/*
 * kvsim: the program: its arguments, the servers' set-up, the loop.
 */

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <event2/event.h>

#include "kvsim.h"
#include "kvsim_events.h"
#include "kvsim_server.h"


static int kvs_parse_args(kvs_conf_t *conf, int argc, char **argv);
static int kvs_number(const char *s, double min, double max, double *v);
static void kvs_usage(void);
static void kvs_fd_limit(kvs_conf_t *conf);
static void kvs_signal_handler(evutil_socket_t fd, short what, void *arg);
static void kvs_die_handler(evutil_socket_t fd, short what, void *arg);


static struct option  kvs_options[] = {
    { "servers",            required_argument, NULL, 'n' },
    { "base-port",          required_argument, NULL, 'p' },
    { "block-tokens",       required_argument, NULL, 'b' },
    { "num-blocks",         required_argument, NULL, 'k' },
    { "time-scale",         required_argument, NULL, 's' },
    { "max-seqs",           required_argument, NULL, 'm' },
    { "token-budget",       required_argument, NULL, 't' },
    { "max-conns",          required_argument, NULL, 'c' },
    { "model",              required_argument, NULL, 'M' },
    { "redis",              required_argument, NULL, 'r' },
    { "channel",            required_argument, NULL, 'C' },
    { "heartbeat-ms",       required_argument, NULL, 'h' },
    { "drop-events",        required_argument, NULL, 'd' },
    { "pause-publish-after-ms", required_argument, NULL, 'P' },
    { "pause-ms",           required_argument, NULL, 'Q' },
    { "die-after-ms",       required_argument, NULL, 'D' },
    { "seed",               required_argument, NULL, 'S' },
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
    sim.servers = calloc(sim.conf.servers, sizeof(kvs_server_t));
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

    for (i = 0; i < sim.conf.servers; i++) {
        if (kvs_server_init(&sim, &sim.servers[i], i) != 0) {
            goto done;
        }
    }

    if (sim.conf.redis_host[0]) {
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

    if (!sim.conf.quiet) {
        fprintf(stderr, "kvsim: %u servers on 127.0.0.1:%u..%u, %u blocks "
                "of %u tokens, time scale %g, events %s\n",
                sim.conf.servers, sim.conf.base_port,
                sim.conf.base_port + sim.conf.servers - 1,
                sim.conf.num_blocks, sim.conf.block_tokens,
                sim.conf.time_scale,
                sim.conf.redis_host[0] ? sim.conf.channel : "off");
    }

    rc = (event_base_dispatch(sim.base) < 0);

done:

    if (sim.events) {
        kvs_events_destroy(sim.events);
    }

    for (i = 0; sim.servers && i < sim.conf.servers; i++) {
        kvs_server_free(&sim.servers[i]);
    }

    free(sim.servers);

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
    const char      *redis;
    struct in_addr   addr;

    conf->servers = 8;
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
    redis = "127.0.0.1:6379";

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
        case 'q':
            conf->quiet = 1;
            continue;
        case 'H':
            kvs_usage();
            exit(0);
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
        case 'p': conf->base_port = v; break;
        case 'b': conf->block_tokens = v; break;
        case 'k': conf->num_blocks = v; break;
        case 'm': conf->max_seqs = v; break;
        case 't': conf->token_budget = v; break;
        case 'c': conf->max_conns = v; break;
        case 'h': conf->heartbeat_ms = v; break;
        case 'P': conf->pause_after_ms = v; break;
        case 'Q': conf->pause_ms = v; break;
        case 'D': conf->die_after_ms = v; break;
        case 'S': conf->seed = v; break;
        }
    }

    if (optind < argc || conf->servers < 1 || conf->servers > 256
        || conf->base_port < 1 || conf->base_port + conf->servers > 65536
        || conf->block_tokens < 1 || conf->block_tokens > 65536
        || conf->num_blocks < 1 || conf->num_blocks > (1u << 26)
        || conf->max_seqs < 1 || conf->max_seqs > 65536
        || conf->token_budget < 1 || conf->max_conns < 1
        || conf->heartbeat_ms < 10 || strlen(conf->channel) > 200)
    {
        fprintf(stderr, "kvsim: invalid arguments\n");
        kvs_usage();
        return -1;
    }

    if (strcmp(redis, "off") == 0) {
        return 0;
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
        "    [--num-blocks 4802] [--time-scale 1] [--max-seqs 256]\n"
        "    [--token-budget 8192] [--max-conns 1024] [--model kvsim]\n"
        "    [--redis 127.0.0.1:6379|off] [--channel kv_aware:events]\n"
        "    [--heartbeat-ms 1000] [--drop-events 0.0]\n"
        "    [--pause-publish-after-ms N --pause-ms M] [--die-after-ms N]\n"
        "    [--seed 1] [--quiet]\n");
}
