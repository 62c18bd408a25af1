/*
 * kvbridge's configuration of data-parallel engines (tools/kvbridge/
 * kvb_conf.c): data_parallel=N becomes N engines, one a rank, on the
 * endpoints vLLM gives rank r (tcp port + r, ipc and inproc "_dp<r>"),
 * sharing the metrics URL; rank=R names one rank by hand; mistakes are
 * refused with the reason.  And the collector's look at a batch's rank
 * (kvb_decode_rank(), tools/kvbridge/kvb_vllm.c).
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "tap.h"
#include "kvb_conf.h"
#include "kvb_vllm.h"


static char  err[512];


/*
 * The bridge's configuration lives as long as the process: its strings
 * are never freed, by design.  Each parse here drops the last one's, which
 * LeakSanitizer would report under make test-asan (its ASAN_OPTIONS ask
 * for leak checks, overriding any default of this test's): what the
 * configuration's parser allocated is suppressed, nothing else.
 */
const char *__lsan_default_suppressions(void);

const char *
__lsan_default_suppressions(void)
{
    return "leak:kvb_conf_args\nleak:kvb_conf_file\n";
}


/* parses argv (NULL-terminated), then checks: the rc of the first failing */

static int
conf(kvb_conf_t *c, const char **argv)
{
    int  argc, rc;

    kvb_conf_defaults(c);
    err[0] = '\0';

    for (argc = 0; argv[argc] != NULL; argc++) {
        /* void */
    }

    rc = kvb_conf_args(c, argc, (char **) argv, err, sizeof(err));

    return rc != 0 ? rc : kvb_conf_check(c, err, sizeof(err));
}


static int
streq(const char *a, const char *b)
{
    return (a == NULL && b == NULL)
           || (a != NULL && b != NULL && strcmp(a, b) == 0);
}


static void
test_ranks(void)
{
    unsigned    r, good;
    kvb_conf_t  c;
    char        ev[64], rp[64];

    const char  *dp4[] = { "kvbridge", "--engine",
        "10.0.0.1:8000 model=m events=tcp://10.0.0.1:5557 "
        "replay=tcp://10.0.0.1:6557 data_parallel=4 topic=t "
        "metrics=http://10.0.0.1:8000/metrics", "--engine",
        "10.0.0.2:8000 model=m events=tcp://10.0.0.2:5557", NULL };

    ok(conf(&c, dp4) == 0 && c.nengines == 5,
       "data_parallel=4 and a plain engine: 5 engines (%s)", err);

    good = 0;

    for (r = 0; r < 4 && c.nengines == 5; r++) {
        kvb_engine_spec_t  *s = &c.engines[r];

        snprintf(ev, sizeof(ev), "tcp://10.0.0.1:%u", 5557 + r);
        snprintf(rp, sizeof(rp), "tcp://10.0.0.1:%u", 6557 + r);

        if (streq(s->engine.name, "10.0.0.1:8000") && s->engine.ranked
            && s->engine.rank == r && streq(s->engine.events, ev)
            && streq(s->engine.replay, rp) && streq(s->engine.topic, "t")
            && streq(s->engine.model, "m")
            && streq(s->metrics, "http://10.0.0.1:8000/metrics"))
        {
            good++;

        } else {
            printf("# rank %u: %s %s %s\n", r, s->engine.name,
                   s->engine.events, s->engine.replay);
        }
    }

    ok(good == 4, "each rank: its events and replay on port + r, the "
       "server's name, topic, model and metrics URL");
    ok(c.nengines == 5 && !c.engines[4].engine.ranked
       && c.engines[4].engine.rank == 0,
       "the plain engine has no rank");

    {
        const char  *one[] = { "kvbridge", "--engine",
            "h:1 model=m events=tcp://h:9 data_parallel=1", NULL };

        ok(conf(&c, one) == 0 && c.nengines == 1
           && !c.engines[0].engine.ranked,
           "data_parallel=1: one engine, no rank in its messages");
    }

    {
        const char  *by_hand[] = { "kvbridge", "--engine",
            "h:1 model=m events=tcp://h:9 rank=0", "--engine",
            "h:1 model=m events=tcp://h:20 rank=3", NULL };

        ok(conf(&c, by_hand) == 0 && c.nengines == 2
           && c.engines[1].engine.ranked && c.engines[1].engine.rank == 3
           && streq(c.engines[1].engine.events, "tcp://h:20"),
           "rank=R by hand: its endpoints as given (%s)", err);
    }

    {
        const char  *ipc[] = { "kvbridge", "--engine",
            "h:1 model=m events=ipc:///run/kv replay=inproc://r "
            "data_parallel=3", NULL };

        ok(conf(&c, ipc) == 0 && c.nengines == 3
           && streq(c.engines[0].engine.events, "ipc:///run/kv")
           && streq(c.engines[2].engine.events, "ipc:///run/kv_dp2")
           && streq(c.engines[2].engine.replay, "inproc://r_dp2"),
           "ipc and inproc: rank r gets \"_dp<r>\", rank 0 none");
    }

    {
        const char  *collected[] = { "kvbridge", "--collect",
            "tcp://*:5557", "--engine",
            "h:1 model=m topic=kv@h data_parallel=2", NULL };

        ok(conf(&c, collected) == 0 && c.nengines == 2
           && c.engines[1].engine.events == NULL
           && c.engines[1].engine.rank == 1
           && streq(c.engines[1].engine.topic, "kv@h"),
           "collected: two ranks of one topic, no events endpoint");
    }
}


static void
test_mistakes(void)
{
    unsigned    i, good;
    kvb_conf_t  c;

    static const struct {
        const char  *spec;
        const char  *spec2;
        const char  *why;
    } bad[] = {
        { "h:1 model=m events=tcp://h:9 data_parallel=2 rank=1", NULL,
          "not both" },
        { "h:1 model=m events=tcp://h:9 rank=1 data_parallel=2", NULL,
          "not both" },
        { "h:1 model=m events=tcp://h:9 data_parallel=0", NULL,
          "expected 1 to 1024" },
        { "h:1 model=m events=tcp://h:9 data_parallel=1025", NULL,
          "expected 1 to 1024" },
        { "h:1 model=m events=tcp://h:9 data_parallel=-1", NULL,
          "expected 1 to 1024" },
        { "h:1 model=m events=tcp://h:9 data_parallel=2x", NULL,
          "expected 1 to 1024" },
        { "h:1 model=m events=tcp://h:9 rank=1024", NULL,
          "expected 0 to 1023" },
        { "h:1 model=m events=tcp://h:9 rank=+1", NULL,
          "expected 0 to 1023" },
        { "h:1 model=m events=tcp://h:65535 data_parallel=2", NULL,
          "at most 65535" },
        { "h:1 model=m events=tcp://h:9 replay=tcp://h data_parallel=2",
          NULL, "for rank 1" },
        { "h:1 model=m events=udp://h:9 data_parallel=2", NULL,
          "for rank 1" },
        { "h:1 model=m events=tcp://h:9 rank=2",
          "h:1 model=m events=tcp://h:10 rank=2", "rank 2 given twice" },
        { "h:1 model=m events=tcp://h:9 data_parallel=2",
          "h:1 model=m events=tcp://h:20 rank=1", "rank 1 given twice" },
        { "h:1 model=m events=tcp://h:9 rank=2",
          "h:1 model=m events=tcp://h:10", "given twice" },
        { "h:1 model=m events=tcp://h:9 data_parallel=2000", NULL,
          "expected 1 to 1024" }
    };

    good = 0;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char  *argv[] = { "kvbridge", "--engine", bad[i].spec,
                                bad[i].spec2 ? "--engine" : NULL,
                                bad[i].spec2, NULL };

        if (conf(&c, argv) == -1 && strstr(err, bad[i].why) != NULL) {
            good++;

        } else {
            printf("# \"%s\": \"%s\"\n", bad[i].spec, err);
        }
    }

    ok(good == i, "%u mistakes refused, each saying why", good);

    /* 64 ranks of four servers pass the engines' cap of 256; a fifth not */
    {
        char         specs[5][96];
        const char  *argv[12];

        argv[0] = "kvbridge";

        for (i = 0; i < 5; i++) {
            snprintf(specs[i], sizeof(specs[i]), "h:%u model=m "
                     "events=tcp://h:%u data_parallel=64", i + 1,
                     1000 + 100 * i);
            argv[1 + 2 * i] = "--engine";
            argv[2 + 2 * i] = specs[i];
        }

        argv[9] = NULL;
        ok(conf(&c, argv) == 0 && c.nengines == 256,
           "4 servers of 64 ranks: 256 engines");

        argv[9] = "--engine";
        argv[10] = specs[4];
        argv[11] = NULL;
        ok(conf(&c, argv) == -1 && strstr(err, "more than 256"),
           "a fifth: refused (%s)", err);
    }
}


static void
test_endpoint(void)
{
    char  *s;

    s = kvb_conf_rank_endpoint("tcp://*:5557", 0, err, sizeof(err));
    ok(streq(s, "tcp://*:5557"), "rank 0: the endpoint as given");
    free(s);

    s = kvb_conf_rank_endpoint("tcp://[::1]:5557", 7, err, sizeof(err));
    ok(streq(s, "tcp://[::1]:5564"), "IPv6: the port after the last colon");
    free(s);

    s = kvb_conf_rank_endpoint("tcp://h:65534", 1, err, sizeof(err));
    ok(streq(s, "tcp://h:65535"), "up to 65535");
    free(s);

    ok(kvb_conf_rank_endpoint(NULL, 3, err, sizeof(err)) == NULL,
       "no endpoint: none for the rank either");
}


static void
pack_batch(msgpack_sbuffer *sb, int map, int rank)
{
    msgpack_packer  pk;

    msgpack_sbuffer_clear(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);

    if (map) {
        msgpack_pack_map(&pk, rank >= -1 ? 3 : 2);
        msgpack_pack_str(&pk, 2);
        msgpack_pack_str_body(&pk, "ts", 2);
    } else {
        msgpack_pack_array(&pk, rank >= -1 ? 3 : 2);
    }

    msgpack_pack_double(&pk, 1.5);

    if (map) {
        msgpack_pack_str(&pk, 6);
        msgpack_pack_str_body(&pk, "events", 6);
    }

    msgpack_pack_array(&pk, 0);

    if (rank >= -1) {
        if (map) {
            msgpack_pack_str(&pk, 18);
            msgpack_pack_str_body(&pk, "data_parallel_rank", 18);
        }

        if (rank == -1) {
            msgpack_pack_nil(&pk);
        } else {
            msgpack_pack_int(&pk, rank);
        }
    }
}


static void
test_decode_rank(void)
{
    int              map;
    int64_t          rank;
    kvb_limits_t     lim;
    msgpack_sbuffer  sb;

    lim.max_bytes = 1 << 20;
    lim.max_events = 1024;
    lim.max_hashes = 1 << 16;
    msgpack_sbuffer_init(&sb);

    for (map = 0; map < 2; map++) {
        pack_batch(&sb, map, 3);
        ok(kvb_decode_rank(sb.data, sb.size, &lim, &rank) == 0 && rank == 3,
           "%s batch of rank 3: 3", map ? "a map" : "an array");

        pack_batch(&sb, map, -1);
        ok(kvb_decode_rank(sb.data, sb.size, &lim, &rank) == 0 && rank == 0,
           "%s, rank nil: 0", map ? "a map" : "an array");

        pack_batch(&sb, map, -2);
        ok(kvb_decode_rank(sb.data, sb.size, &lim, &rank) == 0 && rank == 0,
           "%s without a rank: 0", map ? "a map" : "an array");
    }

    rank = 99;
    ok(kvb_decode_rank("\xc1", 1, &lim, &rank) == -1 && rank == 99,
       "not msgpack: -1, rank untouched");

    msgpack_sbuffer_destroy(&sb);
}


/* the example the docs point at parses, its data-parallel server too */

static void
test_example(void)
{
    int         rc;
    kvb_conf_t  c;

    kvb_conf_defaults(&c);
    rc = kvb_conf_file(&c, "tools/kvbridge/kvbridge.conf.example", err,
                       sizeof(err));
    if (rc == 0) {
        rc = kvb_conf_check(&c, err, sizeof(err));
    }

    ok(rc == 0 && c.nengines == 6 && c.engines[5].engine.rank == 3
       && streq(c.engines[5].engine.events, "tcp://10.0.0.13:5560")
       && streq(c.engines[5].engine.replay, "tcp://10.0.0.13:6560")
       && !c.engines[0].engine.ranked,
       "kvbridge.conf.example: 2 engines and 4 ranks of a third (%s)", err);
}


/*
 * Sizes and numbers: a value too big for its option is refused with the
 * option's range, whatever the multiplication or the type would make of
 * it ("17592186044417m" once wrapped to 1m), and so is a sign.
 */

static void
test_numbers(void)
{
    unsigned    i, good;
    kvb_conf_t  c;

    static const struct {
        const char  *opt;
        const char  *value;
        const char  *why;       /* NULL: accepted */
        size_t       want;
    } cases[] = {
        { "--max-batch", "17592186044417m", "expected 1024 to", 0 },
        { "--max-batch", "18014398509481985k", "expected 1024 to", 0 },
        { "--max-batch", "18446744073709551617", "expected 1024 to", 0 },
        { "--max-batch", "99999999999999999999999m", "expected 1024 to", 0 },
        { "--max-batch", "1099511627776", "expected 1024 to", 0 },
        { "--max-batch", "-1", "expected a size", 0 },
        { "--max-batch", " 4m", "expected a size", 0 },
        { "--max-batch", "+4m", "expected a size", 0 },
        { "--max-batch", "4g", "expected a size", 0 },
        { "--max-batch", "4m", NULL, 4 * 1024 * 1024 },
        { "--max-batch", "256m", NULL, 256 * 1024 * 1024 },
        { "--max-batch", "262145k", "expected 1024 to", 0 },
        { "--snapshot-rate", "17592186044416m", "expected 65536 to", 0 },
        { "--redis-max-pending", "17592186044417m", "expected 65536 to", 0 },
        { "--redis-max-pending", "32m", NULL, 32 * 1024 * 1024 },
        { "--max-hashes", "18446744073709551617", "expected 16 to", 0 },
        { "--max-hashes", "-5", "expected a number", 0 },
        { "--max-blocks", "4294967313", "expected 16 to", 0 },
        { "--heartbeat", "4294967396", "expected 100 to", 0 },
        { "--heartbeat", "18446744073709551616", "expected 100 to", 0 },
        { "--redis-timeout", "4294967396", "expected 100 to", 0 },
        { "--redis-timeout", "2000", NULL, 2000 }
    };

    good = 0;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int          rc;
        size_t       got;
        const char  *argv[] = { "kvbridge", cases[i].opt, cases[i].value,
                                "--engine", "h:1 model=m events=tcp://h:9",
                                NULL };

        rc = conf(&c, argv);

        if (cases[i].why != NULL) {
            if (rc == -1 && strstr(err, cases[i].why) != NULL) {
                good++;
                continue;
            }

            printf("# %s %s: rc %d \"%s\"\n", cases[i].opt, cases[i].value,
                   rc, err);
            continue;
        }

        got = strcmp(cases[i].opt, "--max-batch") == 0
              ? c.lim.decode.max_bytes
              : strcmp(cases[i].opt, "--redis-max-pending") == 0
              ? c.redis_max_pending : c.redis_timeout_ms;

        if (rc == 0 && got == cases[i].want) {
            good++;

        } else {
            printf("# %s %s: rc %d, %zu \"%s\"\n", cases[i].opt,
                   cases[i].value, rc, got, err);
        }
    }

    ok(good == i, "%u of %u sizes and numbers: overflows refused with the "
       "range, good values taken", good, i);

    kvb_conf_defaults(&c);
    ok(c.redis_max_pending == 16 * 1024 * 1024 && c.redis_timeout_ms == 5000,
       "Redis: 16m pending and a 5 s reply deadline by default");
}


/*
 * Two collected engines on one topic and rank: the collector would give
 * every batch to the first, the second would never hear a thing.
 */

static void
test_topics(void)
{
    unsigned    i, good;
    kvb_conf_t  c;

    static const struct {
        const char  *a;
        const char  *b;
        const char  *why;       /* NULL: accepted */
    } cases[] = {
        { "h:1 model=m topic=t", "h:2 model=m topic=t",
          "both collected on topic \"t\"" },
        { "h:1 model=m topic=t rank=1", "h:2 model=m topic=t rank=1",
          "topic \"t\" rank 1" },
        { "h:1 model=m topic=t data_parallel=2", "h:2 model=m topic=t",
          "both collected on topic \"t\"" },
        { "h:1 model=m topic=t", "h:2 model=m topic=t data_parallel=2",
          "both collected on topic \"t\"" },
        { "h:1 model=m topic=t data_parallel=2",
          "h:2 model=m topic=t data_parallel=2", "topic \"t\" rank 0" },
        { "h:1 model=m topic=t", "h:2 model=m topic=u", NULL },
        { "h:1 model=m topic=t rank=0", "h:2 model=m topic=t rank=1", NULL },
        { "h:1 model=m topic=t data_parallel=4", "h:2 model=m topic=u "
          "data_parallel=4", NULL },
        /* not collected: their own sockets, the topic filters only */
        { "h:1 model=m topic=t events=tcp://h:9",
          "h:2 model=m topic=t events=tcp://h:10", NULL },
        { "h:1 model=m topic=t events=tcp://h:9", "h:2 model=m topic=t",
          NULL }
    };

    good = 0;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int          rc;
        const char  *argv[] = { "kvbridge", "--collect", "tcp://*:5557",
                                "--engine", cases[i].a,
                                "--engine", cases[i].b, NULL };

        rc = conf(&c, argv);

        if (cases[i].why == NULL ? rc == 0
            : rc == -1 && strstr(err, cases[i].why) != NULL
              && strstr(err, "give each its own topic=") != NULL)
        {
            good++;

        } else {
            printf("# \"%s\" and \"%s\": rc %d \"%s\"\n", cases[i].a,
                   cases[i].b, rc, err);
        }
    }

    ok(good == i, "%u of %u pairs of collected engines: one topic and rank "
       "refused, told apart accepted", good, i);
}


/* --redis more than once: a cluster's seeds; without it, the last */
static void
test_seeds(void)
{
    kvb_conf_t   c;

    const char  *one[] = { "kvbridge", "--engine",
        "10.0.0.1:8000 model=m events=tcp://10.0.0.1:5557",
        "--redis", "10.0.0.5:7000", NULL };
    const char  *two[] = { "kvbridge", "--engine",
        "10.0.0.1:8000 model=m events=tcp://10.0.0.1:5557",
        "--redis", "10.0.0.5:7000", "--redis", "10.0.0.6:7001", NULL };
    const char  *cluster[] = { "kvbridge", "--engine",
        "10.0.0.1:8000 model=m events=tcp://10.0.0.1:5557",
        "--redis-cluster", "--channel", "{k}:e",
        "--redis", "10.0.0.5:7000", "--redis", "10.0.0.6:7001",
        "--redis", "10.0.0.5:7000", NULL };

    ok(conf(&c, one) == 0 && c.nredis == 1
       && streq(c.redis_host, "10.0.0.5") && c.redis_port == 7000,
       "one --redis replaces the default (%s)", err);
    ok(conf(&c, two) == 0 && c.nredis == 1
       && streq(c.redis_host, "10.0.0.6") && c.redis_port == 7001,
       "--redis twice without --redis-cluster: the last one, as a "
       "command line's over a config file's (%s)", err);
    ok(conf(&c, cluster) == 0 && c.nredis == 2
       && streq(c.redis_host, "10.0.0.5") && c.redis_port == 7000
       && streq(c.redis_hosts[1], "10.0.0.6") && c.redis_ports[1] == 7001,
       "with --redis-cluster: two seeds (one given twice), the first as "
       "host:port (%s)",
       err);
}


int
main(void)
{
    test_ranks();
    test_numbers();
    test_topics();
    test_example();
    test_mistakes();
    test_endpoint();
    test_decode_rank();
    test_seeds();

    return done_testing();
}
