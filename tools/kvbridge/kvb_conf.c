/*
 * kvbridge: configuration from arguments and files (kvb_conf.h).
 *
 * One table says every directive's name, kind, field and range; the
 * command line and the file both go through it, so a directive behaves
 * and fails the same in either.
 */

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kva_event.h"
#include "kvb_conf.h"
#include "kvb_log.h"


#define KVB_VERSION  "0.2.0"

/* no size option goes near it; what is above is refused by its range */
#define KVB_SIZE_LIMIT  (1ULL << 40)


typedef enum {
    KVB_ARG_SIZE,       /* bytes, with k or m: a size_t */
    KVB_ARG_COUNT,      /* a size_t */
    KVB_ARG_MS,         /* an unsigned */
    KVB_ARG_STR,
    KVB_ARG_FLAG,       /* takes no value */
    KVB_ARG_REDIS,      /* host:port */
    KVB_ARG_ENGINE,
    KVB_ARG_CONFIG,
    KVB_ARG_LOG_LEVEL,
    KVB_ARG_HELP,
    KVB_ARG_VERSION
} kvb_arg_kind_e;


typedef struct {
    const char             *name;
    kvb_arg_kind_e          kind;
    size_t                  offset;
    size_t                  min;
    size_t                  max;
    const char             *value;      /* for --help */
    const char             *help;
} kvb_arg_t;


#define F(field)  offsetof(kvb_conf_t, field)

static const kvb_arg_t  kvb_args[] = {
    { "config", KVB_ARG_CONFIG, 0, 0, 0,
      "FILE", "read these directives from FILE, one a line" },
    { "redis", KVB_ARG_REDIS, 0, 0, 0,
      "HOST:PORT", "Redis to publish on (127.0.0.1:6379); with "
      "--redis-cluster, up to 8 times: seeds tried in turn" },
    { "redis-cluster", KVB_ARG_FLAG, F(redis_cluster), 0, 0,
      "", "--redis is a node of a Redis 7 Cluster: SPUBLISH on the "
      "master of the channel's slot (the channel needs a hash tag)" },
    { "redis-user", KVB_ARG_STR, F(redis_user), 0, 0,
      "NAME", "Redis ACL user" },
    { "redis-password", KVB_ARG_STR, F(redis_password), 0, 0,
      "SECRET", "Redis AUTH (or KVBRIDGE_REDIS_PASSWORD)" },
    { "channel", KVB_ARG_STR, F(channel), 0, 0,
      "NAME", "the module's events channel (kv_aware:events)" },
    { "redis-max-pending", KVB_ARG_SIZE, F(redis_max_pending), 65536,
      1024 * 1024 * 1024, "BYTES", "messages sent to Redis and not yet "
      "answered, at most; past it they are dropped and nginx resyncs "
      "(16m)" },
    { "redis-timeout", KVB_ARG_MS, F(redis_timeout_ms), 100, 600000,
      "MS", "a Redis that answers nothing for this long is hung: the "
      "link is dropped and made again (5000)" },
    { "engine", KVB_ARG_ENGINE, 0, 0, 0,
      "SPEC", "an engine: \"ADDRESS model=NAME events=ENDPOINT "
      "[replay=ENDPOINT] [topic=T] [metrics=URL] [data_parallel=N | "
      "rank=R]\"" },
    { "collect", KVB_ARG_STR, F(collect), 0, 0,
      "ENDPOINT", "bind one socket that engines connect to; engines "
      "then take topic= instead of events=" },
    { "collect-allow", KVB_ARG_STR, F(collect_allow), 0, 0,
      "IP[,IP...]", "only these peers may publish on --collect "
      "(default: any that reach it)" },
    { "collect-rate", KVB_ARG_COUNT, F(collect_rate), 1, 1 << 24,
      "N", "messages a second a collector peer may send; past it they "
      "are dropped (default: no cap)" },
    { "metrics", KVB_ARG_STR, F(metrics_listen), 0, 0,
      "ADDR", "serve the bridge's own Prometheus page on IP:PORT" },
    { "max-batch", KVB_ARG_SIZE, F(lim.decode.max_bytes), 1024,
      256 * 1024 * 1024, "BYTES", "an engine batch's cap (4m)" },
    { "max-hashes", KVB_ARG_COUNT, F(lim.max_hashes), 16, 1 << 20,
      "N", "hashes a message to nginx, at most its max_hashes (8192)" },
    { "max-events", KVB_ARG_COUNT, F(lim.max_events), 1, 1 << 20,
      "N", "events a message to nginx, at most its max_events (1024)" },
    { "max-blocks", KVB_ARG_COUNT, F(lim.max_blocks), 16, 1 << 30,
      "N", "blocks mirrored an engine (4194304, about 80 bytes each)" },
    { "heartbeat", KVB_ARG_MS, F(lim.heartbeat_ms), 100, 60000,
      "MS", "a message at least this often an engine (1000)" },
    { "replay-timeout", KVB_ARG_MS, F(lim.replay_ms), 10, 600000,
      "MS", "give up a replay after (2000)" },
    { "snapshot-rate", KVB_ARG_SIZE, F(lim.snapshot_bytes), 65536,
      1024 * 1024 * 1024, "BYTES", "an engine's messages to nginx a "
      "second, live ones included: a snapshot gets what they leave; at "
      "most 3/4 of nginx's server_bytes (6m)" },
    { "metrics-interval", KVB_ARG_MS, F(metrics_ms), 50, 60000,
      "MS", "scrape each engine's metrics this often (500)" },
    { "log-level", KVB_ARG_LOG_LEVEL, 0, 0, 0,
      "LEVEL", "error, warn, info (default) or debug" },
    { "daemon", KVB_ARG_FLAG, 0, 0, 0,
      "", "detach from the terminal (default: foreground, for "
      "systemd and containers)" },
    { "pid-file", KVB_ARG_STR, F(pid_file), 0, 0,
      "FILE", "with --daemon: write the pid there" },
    { "help", KVB_ARG_HELP, 0, 0, 0, "", "this text" },
    { "version", KVB_ARG_VERSION, 0, 0, 0, "", "the version" }
};

#undef F


static const kvb_arg_t *kvb_arg_find(const char *name);
static int kvb_arg_set(kvb_conf_t *c, const kvb_arg_t *a, const char *v,
    char *err, size_t errlen);
static int kvb_engine_spec(kvb_conf_t *c, const char *v, char *err,
    size_t errlen);
static int kvb_engine_ranks(kvb_conf_t *c, unsigned n, char *err,
    size_t errlen);
static int kvb_conf_same_topic(kvb_conf_t *c, size_t i, char *err,
    size_t errlen);
static int kvb_parse_rank(const char *v, unsigned min, unsigned max,
    unsigned *n);
static int kvb_parse_size(const char *v, size_t *n);
static int kvb_parse_number(const char *v, size_t *n);


void
kvb_conf_defaults(kvb_conf_t *c)
{
    memset(c, 0, sizeof(kvb_conf_t));

    c->redis_host = "127.0.0.1";
    c->redis_port = 6379;
    c->redis_password = getenv("KVBRIDGE_REDIS_PASSWORD");
    c->channel = "kv_aware:events";
    c->redis_max_pending = 16 * 1024 * 1024;
    c->redis_timeout_ms = 5000;

    c->lim.decode.max_bytes = 4 * 1024 * 1024;
    c->lim.decode.max_events = 65536;
    c->lim.decode.max_hashes = 1 << 20;
    c->lim.max_hashes = 8192;
    c->lim.max_events = 1024;
    c->lim.max_blocks = 4194304;
    c->lim.heartbeat_ms = 1000;
    c->lim.replay_ms = 2000;
    c->lim.replay_hold = 4096;
    /* nginx's server_bytes is 8m: 6m, saved-up credit and a part fit */
    c->lim.snapshot_bytes = 6 * 1024 * 1024;

    c->metrics_ms = 500;
    c->log_level = KVB_LOG_INFO;
}


int
kvb_conf_args(kvb_conf_t *c, int argc, char **argv, char *err,
    size_t errlen)
{
    int               i, rc;
    const char       *name, *value, *eq;
    char              buf[64];
    const kvb_arg_t  *a;

    for (i = 1; i < argc; i++) {
        name = argv[i];

        if (strcmp(name, "-h") == 0) {
            name = "--help";

        } else if (strcmp(name, "-c") == 0) {
            name = "--config";

        } else if (strcmp(name, "-d") == 0) {
            name = "--daemon";
        }

        if (strncmp(name, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument \"%s\"", name);
            return -1;
        }

        name += 2;
        value = NULL;

        /* --name=value or --name value */

        eq = strchr(name, '=');
        if (eq != NULL && (size_t) (eq - name) < sizeof(buf)) {
            memcpy(buf, name, eq - name);
            buf[eq - name] = '\0';
            name = buf;
            value = eq + 1;
        }

        a = kvb_arg_find(name);
        if (a == NULL) {
            snprintf(err, errlen, "unknown option \"--%s\", see --help",
                     name);
            return -1;
        }

        if (value == NULL && a->kind != KVB_ARG_FLAG
            && a->kind != KVB_ARG_HELP && a->kind != KVB_ARG_VERSION)
        {
            if (i + 1 == argc) {
                snprintf(err, errlen, "option \"--%s\" needs a value",
                         a->name);
                return -1;
            }

            value = argv[++i];
        }

        rc = kvb_arg_set(c, a, value, err, errlen);
        if (rc != 0) {
            return rc;
        }
    }

    return 0;
}


int
kvb_conf_file(kvb_conf_t *c, const char *path, char *err, size_t errlen)
{
    int               rc, lineno;
    char             *p, *name, *value, *end;
    char              line[4096], inner[3584];
    FILE             *f;
    const kvb_arg_t  *a;

    f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "cannot open \"%s\": %s", path,
                 strerror(errno));
        return -1;
    }

    lineno = 0;
    rc = 0;

    while (rc == 0 && fgets(line, sizeof(line), f) != NULL) {
        lineno++;

        if (strchr(line, '\n') == NULL && !feof(f)) {
            snprintf(err, errlen, "%s:%d: line too long", path, lineno);
            rc = -1;
            break;
        }

        p = line + strspn(line, " \t");
        end = p + strcspn(p, "#\r\n");
        *end = '\0';

        while (end > p && (end[-1] == ' ' || end[-1] == '\t')) {
            *--end = '\0';
        }

        if (*p == '\0') {
            continue;
        }

        name = p;
        p += strcspn(p, " \t");

        if (*p) {
            *p++ = '\0';
            p += strspn(p, " \t");
        }

        value = (*p) ? strdup(p) : NULL;

        a = kvb_arg_find(name);
        if (a == NULL || a->kind == KVB_ARG_CONFIG || a->kind == KVB_ARG_HELP
            || a->kind == KVB_ARG_VERSION)
        {
            snprintf(err, errlen, "%s:%d: unknown directive \"%s\"", path,
                     lineno, name);
            rc = -1;
            break;
        }

        if (value == NULL && a->kind != KVB_ARG_FLAG) {
            snprintf(err, errlen, "%s:%d: \"%s\" needs a value", path,
                     lineno, name);
            rc = -1;
            break;
        }

        rc = kvb_arg_set(c, a, value, inner, sizeof(inner));
        if (rc != 0) {
            snprintf(err, errlen, "%s:%d: %s", path, lineno, inner);
        }
    }

    fclose(f);

    return rc;
}


int
kvb_conf_check(kvb_conf_t *c, char *err, size_t errlen)
{
    size_t              i, j;
    kvb_engine_spec_t  *s;

    if (c->nengines == 0) {
        snprintf(err, errlen, "no engine: give at least one --engine");
        return -1;
    }

    /*
     * A Redis Cluster's seeds, tried in turn from the first; one Redis
     * otherwise, the last given (the command line over a config file)
     */
    if (c->nredis) {
        i = c->redis_cluster ? 0 : c->nredis - 1;
        c->redis_host = (char *) c->redis_hosts[i];
        c->redis_port = c->redis_ports[i];

        if (!c->redis_cluster) {
            c->redis_hosts[0] = c->redis_hosts[i];
            c->redis_ports[0] = c->redis_ports[i];
            c->nredis = 1;
        }
    }

    for (i = 0; i < c->nengines; i++) {
        s = &c->engines[i];

        if (c->collect == NULL && s->engine.events == NULL) {
            snprintf(err, errlen, "engine \"%s\" has no events=, and there "
                     "is no --collect", s->engine.name);
            return -1;
        }

        if (c->collect != NULL && s->engine.events == NULL
            && (s->engine.topic == NULL || s->engine.topic[0] == '\0'))
        {
            snprintf(err, errlen, "engine \"%s\" is collected: it needs a "
                     "topic= to be told apart", s->engine.name);
            return -1;
        }

        for (j = 0; j < i; j++) {
            if (strcmp(c->engines[j].engine.name, s->engine.name) != 0) {
                continue;
            }

            /* the ranks of one server: each once, all of them ranked */

            if (!s->engine.ranked || !c->engines[j].engine.ranked) {
                snprintf(err, errlen, "engine \"%s\" given twice (give "
                         "its ranks data_parallel= or each its rank=)",
                         s->engine.name);
                return -1;
            }

            if (c->engines[j].engine.rank == s->engine.rank) {
                snprintf(err, errlen, "engine \"%s\" rank %u given twice",
                         s->engine.name, s->engine.rank);
                return -1;
            }
        }

        if (kvb_conf_same_topic(c, i, err, errlen) != 0) {
            return -1;
        }
    }

    return 0;
}


/*
 * The collector tells engines apart by topic, then by a batch's rank: an
 * engine whose topic and rank an earlier one has would never get a batch
 * (an engine without a rank takes all of its topic's).  The ranks of one
 * server share its topic, each its own rank.
 */

static int
kvb_conf_same_topic(kvb_conf_t *c, size_t i, char *err, size_t errlen)
{
    size_t                    j;
    const kvb_engine_conf_t  *a, *b;

    b = &c->engines[i].engine;

    if (c->collect == NULL || b->events != NULL) {
        return 0;
    }

    for (j = 0; j < i; j++) {
        a = &c->engines[j].engine;

        if (a->events != NULL || strcmp(a->topic, b->topic) != 0
            || (a->ranked && b->ranked && a->rank != b->rank))
        {
            continue;
        }

        if (a->ranked && b->ranked) {
            snprintf(err, errlen, "engines \"%s\" and \"%s\" are both "
                     "collected on topic \"%s\" rank %u: the second would "
                     "never get a batch; give each its own topic=",
                     a->name, b->name, b->topic, b->rank);

        } else {
            snprintf(err, errlen, "engines \"%s\" and \"%s\" are both "
                     "collected on topic \"%s\": one would never get a "
                     "batch; give each its own topic=",
                     a->name, b->name, b->topic);
        }

        return -1;
    }

    return 0;
}


void
kvb_conf_usage(void)
{
    size_t  i;

    printf("kvbridge %s: vLLM and SGLang KV cache events (ZeroMQ) to "
           "ngx_http_kv_aware_module (Redis)\n\n"
           "usage: kvbridge [options]\n\n", KVB_VERSION);

    for (i = 0; i < sizeof(kvb_args) / sizeof(kvb_args[0]); i++) {
        printf("  --%-18s %-10s %s\n", kvb_args[i].name, kvb_args[i].value,
               kvb_args[i].help);
    }

    printf("\nA config file holds the same directives without the dashes,"
           " one a line.\nSee docs/engines.md.\n");
}


static const kvb_arg_t *
kvb_arg_find(const char *name)
{
    size_t  i;

    for (i = 0; i < sizeof(kvb_args) / sizeof(kvb_args[0]); i++) {
        if (strcmp(kvb_args[i].name, name) == 0) {
            return &kvb_args[i];
        }
    }

    return NULL;
}


static int
kvb_arg_set(kvb_conf_t *c, const kvb_arg_t *a, const char *v, char *err,
    size_t errlen)
{
    char        *end, *host;
    size_t       n;
    unsigned     i;
    const char  *colon;
    static const char  *levels[] = { "error", "warn", "info", "debug" };

    switch (a->kind) {

    case KVB_ARG_SIZE:
    case KVB_ARG_COUNT:
    case KVB_ARG_MS:
        /* a value too big for any range is SIZE_MAX: refused below */

        if (a->kind == KVB_ARG_SIZE) {
            if (kvb_parse_size(v, &n) != 0) {
                goto invalid;
            }

        } else if (kvb_parse_number(v, &n) != 0) {
            goto invalid;
        }

        if (n < a->min || n > a->max) {
            snprintf(err, errlen, "invalid %s \"%s\", expected %zu to %zu",
                     a->name, v, a->min, a->max);
            return -1;
        }

        if (a->kind == KVB_ARG_MS) {
            *(unsigned *) ((char *) c + a->offset) = (unsigned) n;
        } else {
            *(size_t *) ((char *) c + a->offset) = n;
        }

        return 0;

    case KVB_ARG_STR:
        *(const char **) ((char *) c + a->offset) = v;
        return 0;

    case KVB_ARG_FLAG:
        if (a->offset != 0) {
            *(int *) ((char *) c + a->offset) = 1;

        } else {
            c->daemon = 1;
        }

        return 0;

    case KVB_ARG_REDIS:
        colon = strrchr(v, ':');
        if (colon == NULL || colon == v) {
            goto invalid;
        }

        errno = 0;
        n = strtoul(colon + 1, &end, 10);
        if (errno || end == colon + 1 || *end || n == 0 || n > 65535) {
            goto invalid;
        }

        host = strndup(v, colon - v);
        if (host == NULL) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }

        /* the same seed twice (a config file and the command line) */
        for (i = 0; i < c->nredis; i++) {
            if (c->redis_ports[i] == (int) n
                && strcmp(c->redis_hosts[i], host) == 0)
            {
                free(host);
                return 0;
            }
        }

        if (c->nredis == KVB_REDIS_SEEDS) {
            free(host);
            snprintf(err, errlen, "--redis: at most %d seeds",
                     KVB_REDIS_SEEDS);
            return -1;
        }

        c->redis_hosts[c->nredis] = host;
        c->redis_ports[c->nredis++] = (int) n;
        return 0;

    case KVB_ARG_ENGINE:
        return kvb_engine_spec(c, v, err, errlen);

    case KVB_ARG_CONFIG:
        return kvb_conf_file(c, v, err, errlen);

    case KVB_ARG_LOG_LEVEL:
        for (i = 0; i < 4; i++) {
            if (strcmp(v, levels[i]) == 0) {
                c->log_level = (int) i;
                return 0;
            }
        }

        goto invalid;

    case KVB_ARG_HELP:
        kvb_conf_usage();
        return 1;

    case KVB_ARG_VERSION:
        printf("kvbridge %s\n", KVB_VERSION);
        return 1;
    }

invalid:

    snprintf(err, errlen, "invalid %s \"%s\", expected %s", a->name, v,
             a->kind == KVB_ARG_SIZE ? "a size such as 512k or 4m"
             : a->kind == KVB_ARG_COUNT || a->kind == KVB_ARG_MS
             ? "a number"
             : a->kind == KVB_ARG_REDIS ? "HOST:PORT"
             : "error, warn, info or debug");

    return -1;
}


/* "ADDRESS key=value ..." */

static int
kvb_engine_spec(kvb_conf_t *c, const char *v, char *err, size_t errlen)
{
    char               *copy, *tok, *save, *eq;
    unsigned            dp, rank;
    kvb_engine_spec_t  *s;

    if (c->nengines == KVB_ENGINES_MAX) {
        snprintf(err, errlen, "more than %d engines", KVB_ENGINES_MAX);
        return -1;
    }

    copy = strdup(v);
    if (copy == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }

    s = &c->engines[c->nengines];
    memset(s, 0, sizeof(*s));
    s->engine.topic = "";
    dp = 0;
    rank = 0;

    tok = strtok_r(copy, " \t\r\n", &save);
    if (tok == NULL || strchr(tok, '=') != NULL) {
        snprintf(err, errlen, "invalid engine \"%s\", expected its address "
                 "as nginx's upstream names it first", v);
        return -1;
    }

    if (strlen(tok) >= KVA_EVENT_SERVER_MAX) {
        snprintf(err, errlen, "invalid engine \"%s\", expected an address "
                 "under %d bytes", tok, KVA_EVENT_SERVER_MAX);
        return -1;
    }

    s->engine.name = tok;

    while ((tok = strtok_r(NULL, " \t\r\n", &save)) != NULL) {
        eq = strchr(tok, '=');

        if (eq == NULL || eq[1] == '\0') {
            snprintf(err, errlen, "invalid engine parameter \"%s\", "
                     "expected key=value", tok);
            return -1;
        }

        *eq++ = '\0';

        if (strcmp(tok, "model") == 0) {
            s->engine.model = eq;

        } else if (strcmp(tok, "events") == 0) {
            s->engine.events = eq;

        } else if (strcmp(tok, "replay") == 0) {
            s->engine.replay = eq;

        } else if (strcmp(tok, "topic") == 0) {
            s->engine.topic = eq;

        } else if (strcmp(tok, "metrics") == 0) {
            if (strncmp(eq, "http://", 7) != 0) {
                snprintf(err, errlen, "invalid metrics \"%s\", expected "
                         "http://HOST:PORT/PATH", eq);
                return -1;
            }

            s->metrics = eq;

        } else if (strcmp(tok, "data_parallel") == 0) {
            if (kvb_parse_rank(eq, 1, KVB_RANKS_MAX, &dp) != 0) {
                snprintf(err, errlen, "invalid data_parallel \"%s\", "
                         "expected 1 to %d", eq, KVB_RANKS_MAX);
                return -1;
            }

        } else if (strcmp(tok, "rank") == 0) {
            if (kvb_parse_rank(eq, 0, KVB_RANKS_MAX - 1, &rank) != 0) {
                snprintf(err, errlen, "invalid rank \"%s\", expected 0 "
                         "to %d", eq, KVB_RANKS_MAX - 1);
                return -1;
            }

            s->engine.rank = rank;
            s->engine.ranked = 1;

        } else {
            snprintf(err, errlen, "unknown engine parameter \"%s\", "
                     "expected model, events, replay, topic, metrics, "
                     "data_parallel or rank", tok);
            return -1;
        }
    }

    if (dp && s->engine.ranked) {
        snprintf(err, errlen, "engine \"%s\": data_parallel= gives all "
                 "its ranks, rank= one of them: not both", s->engine.name);
        return -1;
    }

    if (s->engine.model == NULL) {
        snprintf(err, errlen, "engine \"%s\" needs model=, the name "
                 "requests give in \"model\"", s->engine.name);
        return -1;
    }

    c->nengines++;

    return dp > 1 ? kvb_engine_ranks(c, dp, err, errlen) : 0;
}


/*
 * data_parallel=N: the spec just read becomes rank 0 of N, and ranks 1
 * to N - 1 follow it, each on the endpoints vLLM gives rank r
 * (vllm/distributed/kv_events.py, offset_endpoint_port): a tcp port plus
 * r, an ipc or inproc path with "_dp<r>" appended.  One metrics URL
 * serves them all: the bridge scrapes it once.
 */

static int
kvb_engine_ranks(kvb_conf_t *c, unsigned n, char *err, size_t errlen)
{
    unsigned            r;
    kvb_engine_spec_t  *first, *s;

    if (c->nengines - 1 + n > KVB_ENGINES_MAX) {
        snprintf(err, errlen, "more than %d engines, ranks counted",
                 KVB_ENGINES_MAX);
        return -1;
    }

    first = &c->engines[c->nengines - 1];
    first->engine.ranked = 1;
    first->engine.rank = 0;

    for (r = 1; r < n; r++) {
        s = &c->engines[c->nengines];
        *s = *first;
        s->engine.rank = r;

        s->engine.events = kvb_conf_rank_endpoint(first->engine.events, r,
                                                  err, errlen);
        if (first->engine.events != NULL && s->engine.events == NULL) {
            return -1;
        }

        s->engine.replay = kvb_conf_rank_endpoint(first->engine.replay, r,
                                                  err, errlen);
        if (first->engine.replay != NULL && s->engine.replay == NULL) {
            return -1;
        }

        c->nengines++;
    }

    return 0;
}


char *
kvb_conf_rank_endpoint(const char *ep, unsigned rank, char *err,
    size_t errlen)
{
    char           *out, *end;
    size_t          len;
    const char     *colon;
    unsigned long   port;

    if (ep == NULL) {
        return NULL;
    }

    len = strlen(ep);
    out = malloc(len + 16);
    if (out == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }

    if (rank == 0) {
        memcpy(out, ep, len + 1);
        return out;
    }

    if (strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0) {
        snprintf(out, len + 16, "%s_dp%u", ep, rank);
        return out;
    }

    colon = strrchr(ep, ':');

    if (strncmp(ep, "tcp://", 6) == 0 && colon != NULL && colon > ep + 5) {
        errno = 0;
        port = strtoul(colon + 1, &end, 10);

        if (errno == 0 && end != colon + 1 && *end == '\0'
            && port + rank <= 65535)
        {
            snprintf(out, len + 16, "%.*s:%lu", (int) (colon - ep), ep,
                     port + rank);
            return out;
        }
    }

    free(out);
    snprintf(err, errlen, "endpoint \"%s\" for rank %u: expected "
             "tcp://HOST:PORT (rank r on PORT + r, at most 65535), or an "
             "ipc:// or inproc:// path", ep, rank);

    return NULL;
}


static int
kvb_parse_rank(const char *v, unsigned min, unsigned max, unsigned *n)
{
    char           *end;
    unsigned long   x;

    errno = 0;
    x = strtoul(v, &end, 10);

    if (errno || end == v || *end || v[0] == '-' || v[0] == '+'
        || x < min || x > max)
    {
        return -1;
    }

    *n = (unsigned) x;

    return 0;
}


/*
 * Digits, then k or m: a size.  Past what size_t holds (or 1 TB) it is
 * SIZE_MAX, so that the option's range refuses it with its bounds; a
 * multiplication that wrapped once took "17592186044417m" for 1m.
 */

static int
kvb_parse_size(const char *v, size_t *n)
{
    char                *end;
    unsigned             shift;
    unsigned long long   x;

    if (v[0] < '0' || v[0] > '9') {
        return -1;
    }

    errno = 0;
    x = strtoull(v, &end, 10);

    if (end == v || (errno != 0 && errno != ERANGE)) {
        return -1;
    }

    if (errno == ERANGE) {
        x = ULLONG_MAX;
    }

    shift = 0;

    if (*end == 'k' || *end == 'K') {
        shift = 10;
        end++;

    } else if (*end == 'm' || *end == 'M') {
        shift = 20;
        end++;
    }

    if (*end != '\0') {
        return -1;
    }

    *n = (x > (KVB_SIZE_LIMIT >> shift)) ? SIZE_MAX : (size_t) (x << shift);

    return 0;
}


/* digits only (no sign, no space); too big for size_t: SIZE_MAX */

static int
kvb_parse_number(const char *v, size_t *n)
{
    char                *end;
    unsigned long long   x;

    if (v[0] < '0' || v[0] > '9') {
        return -1;
    }

    errno = 0;
    x = strtoull(v, &end, 10);

    if (end == v || *end != '\0' || (errno != 0 && errno != ERANGE)) {
        return -1;
    }

    *n = (errno == ERANGE || x > SIZE_MAX) ? SIZE_MAX : (size_t) x;

    return 0;
}
