/*
 * kvsim: a server's life, from its set-up to its free, and the step timer
 * that advances its scheduler in simulated time.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#include "kvsim_events.h"
#include "kvsim_http.h"
#include "kvsim_pd.h"
#include "kvsim_server.h"
#include "kvsim_zmq.h"


static void kvs_step_start(kvs_server_t *srv, double start);
static void kvs_step_handler(evutil_socket_t fd, short what, void *arg);
static void kvs_step_lag(kvs_server_t *srv, double lag);


int
kvs_server_init(kvs_sim_t *sim, kvs_server_t *srv, unsigned i)
{
    kvs_sched_conf_t  sc;

    srv->sim = sim;
    srv->index = i;
    srv->rank = i % sim->conf.data_parallel;
    srv->port = sim->conf.base_port + i / sim->conf.data_parallel;
    srv->id_len = snprintf(srv->id, KVS_ID_MAX, "127.0.0.1:%u", srv->port);

    sc.block_tokens = sim->conf.block_tokens;
    sc.max_seqs = sim->conf.max_seqs;
    sc.token_budget = sim->conf.token_budget;
    sc.time_scale = sim->conf.time_scale;
    sc.calibration = sim->conf.calibration;
    sc.prefill_factor = sim->conf.slow[i / sim->conf.data_parallel]
                        ? sim->conf.slow_factor : 1.0;

    if (kvs_cache_init(&srv->cache, sim->conf.num_blocks) != 0
        || kvs_sched_init(&srv->sched, &sc, &srv->cache) != 0)
    {
        fprintf(stderr, "kvsim: %s: out of memory\n", srv->id);
        return -1;
    }

    srv->step_ev = evtimer_new(sim->base, kvs_step_handler, srv);
    if (srv->step_ev == NULL) {
        return -1;
    }

    /* one HTTP port a server: its rank 0 listens for all its ranks */
    return srv->rank == 0 ? kvs_http_init(srv) : 0;
}


void
kvs_server_free(kvs_server_t *srv)
{
    if (srv->sched.step) {
        /* in-flight requests are answered, then evhttp frees them */
        kvs_sched_free(&srv->sched, kvs_http_seq_event, srv);
    }

    if (srv->http) {
        kvs_http_free(srv);
    }

    kvs_pd_free(srv);

    if (srv->step_ev) {
        event_free(srv->step_ev);
    }

    kvs_cache_free(&srv->cache);
}


void
kvs_server_kick(kvs_server_t *srv)
{
    if (!srv->stepping) {
        kvs_step_start(srv, kvs_now_ms());
    }
}


kvs_server_t *
kvs_server_find(kvs_sim_t *sim, const char *id, size_t len, unsigned rank)
{
    unsigned  i;

    if (rank >= sim->conf.data_parallel) {
        return NULL;
    }

    for (i = 0; i < sim->nranks; i += sim->conf.data_parallel) {
        if (sim->servers[i].id_len == len
            && memcmp(sim->servers[i].id, id, len) == 0)
        {
            return &sim->servers[i + rank];
        }
    }

    return NULL;
}


/*
 * The rank a request runs on: the one X-data-parallel-rank names, as
 * vLLM's API server takes it; without one (or with one out of range,
 * counted and logged) the least loaded, as vLLM's own balancer picks
 * (its score: waiting * 4 + running), the lowest rank on a tie.
 */
kvs_server_t *
kvs_server_rank(kvs_server_t *srv, const char *header)
{
    char           *end;
    unsigned        r, best;
    kvs_sim_t      *sim = srv->sim;
    unsigned long   v;
    uint64_t        score, least;
    kvs_server_t   *first = srv - srv->rank;

    if (sim->conf.data_parallel == 1 && header == NULL) {
        return srv;
    }

    if (header != NULL) {
        v = strtoul(header, &end, 10);

        if (end != header && *end == '\0' && header[0] >= '0'
            && header[0] <= '9' && v < sim->conf.data_parallel)
        {
            return first + v;
        }

        first->bad_rank++;

        if (!sim->conf.quiet
            && (first->bad_rank & (first->bad_rank - 1)) == 0)
        {
            fprintf(stderr, "kvsim: %s: X-data-parallel-rank \"%.16s\" is "
                    "not a rank of 0..%u (%llu so far): balanced instead\n",
                    srv->id, header, sim->conf.data_parallel - 1,
                    (unsigned long long) first->bad_rank);
        }
    }

    best = 0;
    least = UINT64_MAX;

    for (r = 0; r < sim->conf.data_parallel; r++) {
        score = 4 * (uint64_t) first[r].sched.nwaiting
                + first[r].sched.nrunning;

        if (score < least) {
            least = score;
            best = r;
        }
    }

    return first + best;
}


static void
kvs_step_start(kvs_server_t *srv, double start)
{
    double          now, t, delay;
    struct timeval  tv;

    now = kvs_now_ms();
    t = kvs_sched_plan(&srv->sched, now) * 1000.0;

    if (t <= 0.0) {
        return;
    }

    srv->step_end = start + t;
    delay = (srv->step_end > now) ? srv->step_end - now : 0.0;

    tv.tv_sec = (time_t) (delay / 1000.0);
    tv.tv_usec = (suseconds_t) ((delay - tv.tv_sec * 1000.0) * 1000.0);

    evtimer_add(srv->step_ev, &tv);
    srv->stepping = 1;
}


static void
kvs_step_handler(evutil_socket_t fd, short what, void *arg)
{
    double         now;
    kvs_server_t  *srv = arg;

    srv->stepping = 0;
    kvs_sched_complete(&srv->sched, kvs_http_seq_event, srv);

    if (srv->sim->events) {
        kvs_events_step(srv->sim->events, srv);

    } else if (srv->sim->zmq) {
        kvs_zmq_step(srv->sim->zmq, srv);

    } else {
        kvs_cache_ops_clear(&srv->cache);
    }

    /*
     * The next step starts when this one ended in simulated time, not
     * when the CPU got here; a lag over a second is given up.
     */
    now = kvs_now_ms();
    kvs_step_lag(srv, now - srv->step_end);
    kvs_step_start(srv, srv->lag_ms < 1000.0 ? srv->step_end : now);
}


/*
 * How far the CPU runs behind the simulated clock, per step and over the
 * run (its largest and its sum, /metrics): a benchmark whose servers lag
 * measures the machine, not the servers.
 */
static void
kvs_step_lag(kvs_server_t *srv, double lag)
{
    srv->lag_ms = lag;

    if (lag > srv->lag_max_ms) {
        srv->lag_max_ms = lag;
    }

    if (lag > 0.0) {
        srv->lag_sum_ms += lag;
    }

    srv->lag_steps++;
}
