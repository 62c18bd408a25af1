/*
 * A recorded run's requests fed to the core index as nginx fed them in
 * learned mode (no KV events), to see what the index believed each
 * server held.  bench/e2e/index_replay.py writes the requests from a
 * bench-e2e run's access log; this reads them on stdin, one a line, in
 * the order they started:
 *
 *     MS SLOT HOME HELD MATCHED LABEL N KEY...
 *
 *   MS       when nginx routed it, in milliseconds
 *   SLOT     the server nginx chose
 *   HOME     the server of the session's request before, -1 for none
 *   HELD     the blocks of the prompt HOME held then, by a model of its
 *            pool (bench/e2e/session_moves.py, pool_held())
 *   MATCHED  the blocks nginx logged as matched at SLOT
 *   LABEL    what to print for the request (its session), no blank
 *   N KEY    its N block keys, integers above 0: the same key, the
 *            same block
 *
 * Each request is looked up in all the servers seen so far
 * (kva_index_match_found), then learned at SLOT: the budget set, the
 * blocks added KVA_ADD_CHUNK at a time with KVA_BIT_LEARNED, as
 * ngx_http_kv_aware_balancer_learn_locked() does.  The lookup at SLOT
 * should give MATCHED: that is the check that the replay is faithful.
 * The lookup at HOME, set beside HELD, says where the index forgot what a
 * server still held (a session then leaves its cache behind) or trusted
 * what it no longer held.  What the budget keeps depends on the tick a
 * block was stamped in, and MS (the access log's wall clock) does not say
 * where nginx's ticks (its monotonic clock) begin: the driver tries each
 * --phase and keeps the most faithful.
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kva_index.h"


/* a field: numbers, and labels (session ids are 36 characters) */
#define REPLAY_FIELD        64

/* odd: keys to hashes one to one, spread over the index's buckets */
#define REPLAY_MIX          0x9e3779b97f4a7c15ULL


typedef struct {
    uint32_t            budget;
    uint64_t            ttl_ms;
    unsigned            tick_shift;
    uint64_t            phase;
    uint32_t            slack;
    uint32_t            max_blocks;
    uint64_t            index_size;
    int                 quiet;
} replay_conf_t;


typedef struct {
    uint64_t            requests;
    uint64_t            with_home;
    uint64_t            faithful;
    uint64_t            forgot;
    uint64_t            forgot_blocks;
    uint64_t            trusted;
    uint64_t            trusted_blocks;
} replay_sum_t;


typedef struct {
    FILE               *in;
    uint64_t            line;
    int                 eol;        /* the last field ended its line */
} replay_reader_t;


static int replay_field(replay_reader_t *rd, char *buf);
static int replay_number(replay_reader_t *rd, long long min, long long max,
    long long *v);
static int replay_options(int argc, char **argv, replay_conf_t *conf);
static int replay_run(const replay_conf_t *conf, kva_index_t *ix,
    uint64_t *hashes, uint32_t *found, replay_sum_t *sum);


/*
 * The next blank-separated field of the current line into buf: 1, or 0
 * at the end of the line (rd->eol then says a line ended), -1 at the end
 * of input, -2 for a field longer than buf, said on stderr.
 */
static int
replay_field(replay_reader_t *rd, char *buf)
{
    int     c;
    size_t  len;

    if (rd->eol) {
        return 0;
    }

    do {
        c = getc(rd->in);
    } while (c == ' ' || c == '\t' || c == '\r');

    if (c == EOF) {
        rd->eol = 1;
        return -1;
    }

    if (c == '\n') {
        rd->eol = 1;
        return 0;
    }

    for (len = 0; c != EOF && c != ' ' && c != '\t' && c != '\r'
                  && c != '\n'; c = getc(rd->in))
    {
        if (len == REPLAY_FIELD - 1) {
            fprintf(stderr, "bench_index_replay: line %" PRIu64 ": a field "
                    "longer than %d characters\n", rd->line,
                    REPLAY_FIELD - 1);
            return -2;
        }

        buf[len++] = (char) c;
    }

    buf[len] = '\0';

    if (c == '\n' || c == EOF) {
        rd->eol = 1;
    }

    return 1;
}


/* one integer field in [min, max]; 0, or -1 said on stderr */
static int
replay_number(replay_reader_t *rd, long long min, long long max,
    long long *v)
{
    int    rc;
    char   buf[REPLAY_FIELD], *end;

    rc = replay_field(rd, buf);

    if (rc == -2) {
        return -1;
    }

    if (rc != 1) {
        fprintf(stderr, "bench_index_replay: line %" PRIu64 ": fields "
                "missing\n", rd->line);
        return -1;
    }

    errno = 0;
    *v = strtoll(buf, &end, 10);

    if (errno || *end != '\0' || *v < min || *v > max) {
        fprintf(stderr, "bench_index_replay: line %" PRIu64 ": \"%s\" is "
                "not an integer in [%lld, %lld]\n", rd->line, buf, min, max);
        return -1;
    }

    return 0;
}


static int
replay_options(int argc, char **argv, replay_conf_t *conf)
{
    int                  c;
    char                *end;
    unsigned long long   v;

    static const struct option  lo[] = {
        { "budget", required_argument, NULL, 'b' },
        { "ttl", required_argument, NULL, 't' },
        { "tick-shift", required_argument, NULL, 's' },
        { "phase", required_argument, NULL, 'p' },
        { "slack", required_argument, NULL, 'k' },
        { "max-blocks", required_argument, NULL, 'm' },
        { "index-size", required_argument, NULL, 'i' },
        { "quiet", no_argument, NULL, 'q' },
        { NULL, 0, NULL, 0 }
    };

    while ((c = getopt_long(argc, argv, "q", lo, NULL)) != -1) {
        if (c == 'q') {
            conf->quiet = 1;
            continue;
        }

        if (c == '?' || optarg[0] < '0' || optarg[0] > '9') {
            return -1;
        }

        errno = 0;
        v = strtoull(optarg, &end, 10);

        if (errno || *end != '\0') {
            return -1;
        }

        switch (c) {
        case 'b':
            if (v >= UINT32_MAX) {
                return -1;
            }
            conf->budget = (uint32_t) v;
            break;

        case 't':
            if (v == 0 || v > 30 * 86400 * 1000ULL) {
                return -1;
            }
            conf->ttl_ms = v;
            break;

        case 's':
            if (v > 16) {
                return -1;
            }
            conf->tick_shift = (unsigned) v;
            break;

        case 'p':
            if (v >= (1u << 16)) {
                return -1;
            }
            conf->phase = v;
            break;

        case 'k':
            if (v >= UINT32_MAX) {
                return -1;
            }
            conf->slack = (uint32_t) v;
            break;

        case 'm':
            if (v == 0 || v > (1u << 24)) {
                return -1;
            }
            conf->max_blocks = (uint32_t) v;
            break;

        default: /* 'i' */
            if (v < (1u << 16) || v > (1ULL << 34)) {
                return -1;
            }
            conf->index_size = v;
        }
    }

    return optind == argc ? 0 : -1;
}


/* every request of stdin; 0 at the end of input, -1 said on stderr */
static int
replay_run(const replay_conf_t *conf, kva_index_t *ix, uint64_t *hashes,
    uint32_t *found, replay_sum_t *sum)
{
    int              rc;
    char             label[REPLAY_FIELD], *end;
    uint32_t         depth[KVA_MAX_SLOTS], n, i, piece, at, at_home;
    long long        ms, slot, home, held, matched, blocks, key;
    kva_clock_t      clk;
    kva_slotset_t    seen;
    replay_reader_t  rd;

    memset(&clk, 0, sizeof(kva_clock_t));
    memset(&seen, 0, sizeof(kva_slotset_t));

    /* no events: nothing is precise, nothing speculative */
    clk.ttl_learned = (uint32_t) (conf->ttl_ms >> conf->tick_shift);

    rd.in = stdin;
    rd.line = 0;

    for ( ;; ) {
        rd.line++;
        rd.eol = 0;

        rc = replay_field(&rd, label);

        if (rc == -1) {
            return 0;
        }

        if (rc == 0) {
            continue;
        }

        if (rc == -2) {
            return -1;
        }

        errno = 0;
        ms = strtoll(label, &end, 10);

        if (errno || *end != '\0' || ms < 0) {
            fprintf(stderr, "bench_index_replay: line %" PRIu64 ": \"%s\" "
                    "is not a time in ms\n", rd.line, label);
            return -1;
        }

        if (replay_number(&rd, 0, KVA_MAX_SLOTS - 1, &slot) != 0
            || replay_number(&rd, -1, KVA_MAX_SLOTS - 1, &home) != 0
            || replay_number(&rd, 0, UINT32_MAX, &held) != 0
            || replay_number(&rd, 0, UINT32_MAX, &matched) != 0)
        {
            return -1;
        }

        rc = replay_field(&rd, label);

        if (rc != 1) {
            if (rc != -2) {
                fprintf(stderr, "bench_index_replay: line %" PRIu64 ": no "
                        "label\n", rd.line);
            }

            return -1;
        }

        if (replay_number(&rd, 0, UINT32_MAX, &blocks) != 0) {
            return -1;
        }

        /* a prompt past the buffers: stop rather than replay a part */
        if (blocks > conf->max_blocks) {
            fprintf(stderr, "bench_index_replay: line %" PRIu64 ": %lld "
                    "blocks, more than --max-blocks %" PRIu32 "\n",
                    rd.line, blocks, conf->max_blocks);
            return -1;
        }

        n = (uint32_t) blocks;

        for (i = 0; i < n; i++) {
            if (replay_number(&rd, 1, LLONG_MAX, &key) != 0) {
                return -1;
            }

            hashes[i] = (uint64_t) key * REPLAY_MIX;
        }

        rc = replay_field(&rd, label);

        if (rc == -2) {
            return -1;
        }

        if (rc == 1) {
            fprintf(stderr, "bench_index_replay: line %" PRIu64 ": more "
                    "than %" PRIu32 " keys\n", rd.line, n);
            return -1;
        }

        /*
         * nginx's ticks count a monotonic clock, the log's times the wall
         * clock: where a tick begins in the log's milliseconds is not
         * known, --phase sets it.  Stamps wrap as nginx's do.
         */
        clk.now = (uint32_t) (((unsigned long long) ms + conf->phase)
                              >> conf->tick_shift);

        kva_slotset_add(&seen, (unsigned) slot);

        if (home >= 0) {
            kva_slotset_add(&seen, (unsigned) home);
        }

        memset(depth, 0, sizeof(depth));
        (void) kva_index_match_found(ix, hashes, n, &seen, &clk, depth,
                                     found);

        at = depth[slot];
        at_home = home >= 0 ? depth[home] : 0;

        sum->requests++;
        sum->faithful += (at == matched);

        if (!conf->quiet) {
            printf("req %s to %lld matched %lld index %" PRIu32 " %s",
                   label, slot, matched, at,
                   at == matched ? "same" : "DIFFERS");
        }

        if (home >= 0) {
            sum->with_home++;

            if (!conf->quiet) {
                printf(" home %lld held %lld index %" PRIu32, home, held,
                       at_home);
            }

            if (at_home + (uint64_t) conf->slack < (uint64_t) held) {
                sum->forgot++;
                sum->forgot_blocks += held - at_home;

                if (!conf->quiet) {
                    printf(" forgot %lld", held - at_home);
                }

            } else if (at_home > (uint64_t) held + conf->slack) {
                sum->trusted++;
                sum->trusted_blocks += at_home - held;

                if (!conf->quiet) {
                    printf(" trusted %lld", at_home - held);
                }
            }
        }

        if (!conf->quiet) {
            printf(" n %" PRIu32 "\n", n);
        }

        /*
         * What the balancer records once it has chosen: the budget the
         * server's pool sets, then the prompt a piece per hold of the
         * lock, each piece at the same tick here as it nearly is there.
         */
        kva_index_learn_budget(ix, (unsigned) slot, conf->budget, clk.now);

        for (i = 0; i < n; i += piece) {
            piece = n - i < KVA_ADD_CHUNK ? n - i : KVA_ADD_CHUNK;
            kva_index_add_at(ix, hashes + i, piece, i, (unsigned) slot,
                             KVA_BIT_LEARNED, &clk, found + i);
        }
    }
}


int
main(int argc, char **argv)
{
    void           *region;
    uint32_t       *found;
    uint64_t       *hashes;
    kva_index_t    *ix;
    replay_sum_t    sum;
    replay_conf_t   conf;

    /* nginx's defaults: learned_ttl 10m, index_size 32m, 16 ms ticks */
    conf.budget = 1600;
    conf.ttl_ms = 600000;
    conf.tick_shift = 4;
    conf.phase = 0;
    conf.slack = 10;
    conf.max_blocks = 1u << 16;
    conf.index_size = 32u << 20;
    conf.quiet = 0;

    if (replay_options(argc, argv, &conf) != 0
        || conf.phase >> conf.tick_shift)
    {
        fprintf(stderr, "usage: bench_index_replay [--budget BLOCKS] "
                "[--ttl MS] [--tick-shift N] [--phase MS]\n"
                "                          [--slack BLOCKS] [--max-blocks N] "
                "[--index-size BYTES] [-q]\n"
                "                          < requests\n"
                "(--phase below a tick: 2^N ms)\n");
        return 2;
    }

    region = calloc(1, conf.index_size);
    hashes = malloc(conf.max_blocks * sizeof(uint64_t));
    found = malloc(conf.max_blocks * sizeof(uint32_t));

    if (region == NULL || hashes == NULL || found == NULL) {
        fprintf(stderr, "bench_index_replay: out of memory\n");
        return 1;
    }

    ix = kva_index_init(region, conf.index_size, 42);
    if (ix == NULL) {
        fprintf(stderr, "bench_index_replay: no index in %" PRIu64
                " bytes\n", conf.index_size);
        return 1;
    }

    memset(&sum, 0, sizeof(replay_sum_t));

    if (replay_run(&conf, ix, hashes, found, &sum) != 0) {
        return 1;
    }

    printf("requests %" PRIu64 ", %" PRIu64 " with a previous server\n",
           sum.requests, sum.with_home);
    printf("faithful %" PRIu64 " of %" PRIu64 ": the index matched at the "
           "chosen server what nginx logged\n", sum.faithful, sum.requests);
    printf("forgot %" PRIu64 " requests, %" PRIu64 " blocks: the index at "
           "the previous server more than %" PRIu32 " short of what the "
           "model held\n", sum.forgot, sum.forgot_blocks, conf.slack);
    printf("trusted %" PRIu64 " requests, %" PRIu64 " blocks: the index at "
           "the previous server more than %" PRIu32 " past what the model "
           "held\n", sum.trusted, sum.trusted_blocks, conf.slack);

    free(found);
    free(hashes);
    free(region);

    return 0;
}
