/*
 * kvbridge: its configuration, from the command line or a file of the
 * same directives (one a line, the option's name without its dashes):
 *
 *   redis 127.0.0.1:6379
 *   engine 127.0.0.1:8001 model=llama events=tcp://127.0.0.1:5557
 *          replay=tcp://127.0.0.1:5558 metrics=http://127.0.0.1:8001/metrics
 *
 * A data-parallel server (data_parallel=N) becomes N engines, one a rank,
 * each with its own endpoints (rank 0's port + r) and its own state.
 *
 * Errors name the directive, the value and what was expected, as nginx -t
 * does, and stop the bridge before it starts.
 */

#ifndef _KVB_CONF_H_INCLUDED_
#define _KVB_CONF_H_INCLUDED_


#include <stddef.h>

#include "kvb_engine.h"


/* one engine a data-parallel rank: ranks count */
#define KVB_ENGINES_MAX  256
/* ranks of one server, as the module's "rank" (0 .. 63) */
#define KVB_RANKS_MAX    1024


typedef struct {
    kvb_engine_conf_t       engine;
    const char             *metrics;    /* NULL: no load from it */
} kvb_engine_spec_t;


/* --redis more than once: a Redis Cluster's seeds, tried in turn */
#define KVB_REDIS_SEEDS         8


typedef struct {
    char                   *redis_host;     /* the first seed */
    int                     redis_port;
    const char             *redis_hosts[KVB_REDIS_SEEDS];
    int                     redis_ports[KVB_REDIS_SEEDS];
    size_t                  nredis;         /* --redis given */
    const char             *redis_user;
    const char             *redis_password;
    const char             *channel;
    size_t                  redis_max_pending;  /* bytes not yet answered */
    unsigned                redis_timeout_ms;   /* a reply within this */
    int                     redis_cluster;      /* sharded, slot's master */
    const char             *collect;    /* a bound SUB for engines that
                                           connect, told apart by topic */
    const char             *collect_allow;  /* peers' IPs, or NULL */
    size_t                  collect_rate;   /* a peer's messages/s, 0 */
    const char             *metrics_listen; /* the bridge's own page */

    kvb_engine_spec_t       engines[KVB_ENGINES_MAX];
    size_t                  nengines;

    kvb_engine_limits_t     lim;
    unsigned                metrics_ms;
    unsigned                daemon:1;
    const char             *pid_file;
    int                     log_level;
} kvb_conf_t;


void kvb_conf_defaults(kvb_conf_t *c);

/*
 * 0 and c filled, 1 when --help or --version was answered, -1 with err
 * set on a mistake.  The strings in c point into argv or into memory
 * that lives as long as the process.
 */
int kvb_conf_args(kvb_conf_t *c, int argc, char **argv, char *err,
    size_t errlen);
int kvb_conf_file(kvb_conf_t *c, const char *path, char *err,
    size_t errlen);

/* what can only be judged once everything is read */
int kvb_conf_check(kvb_conf_t *c, char *err, size_t errlen);

void kvb_conf_usage(void);

/*
 * The endpoint vLLM's rank r binds or connects to, given rank 0's: a
 * malloc'ed string; NULL with err set when ep has no port to offset or
 * the port would pass 65535.  NULL ep gives NULL and no error.
 */
char *kvb_conf_rank_endpoint(const char *ep, unsigned rank, char *err,
    size_t errlen);


#endif /* _KVB_CONF_H_INCLUDED_ */
