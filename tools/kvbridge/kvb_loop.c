/*
 * kvbridge: its one event loop (kvb_loop.h).
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvb_log.h"
#include "kvb_loop.h"


struct kvb_source_s {
    kvb_source_conf_t       conf;
    char                   *name;
    int                     first;      /* its items this turn */
    int                     n;
    uint64_t                turn_ns;    /* its callbacks this turn */
    uint64_t                turn_cpu_ns;
    unsigned                ran:1;
    kvb_log_limit_t         slow_log;
    kvb_loop_hist_t         hist;
};


struct kvb_loop_s {
    kvb_source_t          **sources;
    size_t                  nsources;
    zmq_pollitem_t         *items;
    int                     max_items;
    kvb_loop_hist_t         turns;
};


static void kvb_loop_record(kvb_loop_hist_t *h, uint64_t ns,
    uint64_t cpu_ns);
static void kvb_loop_slow(kvb_source_t *s, const char *what, uint64_t ns,
    uint64_t cpu_ns, uint64_t now_ms);


const double  kvb_loop_bounds[KVB_LOOP_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05,
    0.1, 0.5, 1.0
};


kvb_loop_t *
kvb_loop_create(void)
{
    return calloc(1, sizeof(kvb_loop_t));
}


void
kvb_loop_destroy(kvb_loop_t *loop)
{
    size_t  i;

    if (loop == NULL) {
        return;
    }

    for (i = 0; i < loop->nsources; i++) {
        free(loop->sources[i]->name);
        free(loop->sources[i]);
    }

    free(loop->sources);
    free(loop->items);
    free(loop);
}


kvb_source_t *
kvb_loop_add(kvb_loop_t *loop, const kvb_source_conf_t *conf)
{
    kvb_source_t     *s, **sources;
    zmq_pollitem_t   *items;

    sources = realloc(loop->sources,
                      (loop->nsources + 1) * sizeof(kvb_source_t *));
    if (sources == NULL) {
        return NULL;
    }

    loop->sources = sources;

    items = realloc(loop->items, (loop->max_items + conf->max_items + 1)
                                 * sizeof(zmq_pollitem_t));
    if (items == NULL) {
        return NULL;
    }

    loop->items = items;

    s = calloc(1, sizeof(kvb_source_t));
    if (s == NULL) {
        return NULL;
    }

    s->conf = *conf;
    s->name = strdup(conf->name ? conf->name : "");

    if (s->name == NULL) {
        free(s);
        return NULL;
    }

    loop->max_items += conf->max_items;
    loop->sources[loop->nsources++] = s;

    return s;
}


int
kvb_loop_turn(kvb_loop_t *loop, int max_wait_ms)
{
    int            rc, n, i, ready;
    size_t         k;
    uint64_t       now, deadline, d, t0, t, start, cpu0, cpu, cpu_start;
    kvb_budget_t   b;
    kvb_source_t  *s;

    now = kvb_now_ms();
    n = 0;

    for (k = 0; k < loop->nsources; k++) {
        s = loop->sources[k];
        s->first = n;
        s->n = 0;
        s->turn_ns = 0;
        s->turn_cpu_ns = 0;
        s->ran = 0;

        if (s->conf.watch != NULL) {
            s->n = s->conf.watch(s->conf.data, now, &loop->items[n],
                                 s->conf.max_items);
        }

        for (i = n; i < n + s->n; i++) {
            loop->items[i].revents = 0;
        }

        n += s->n;
    }

    /* until the nearest deadline */

    deadline = now + (uint64_t) max_wait_ms;

    for (k = 0; k < loop->nsources; k++) {
        s = loop->sources[k];

        if (s->conf.deadline != NULL) {
            d = s->conf.deadline(s->conf.data);
            deadline = (d < deadline) ? d : deadline;
        }
    }

    rc = zmq_poll(loop->items, n, (deadline > now) ? (int) (deadline - now)
                                                   : 0);

    if (rc < 0 && zmq_errno() != EINTR) {
        kvb_log(KVB_LOG_ERR, "zmq_poll: %s", zmq_strerror(zmq_errno()));
        return -1;
    }

    t0 = kvb_loop_now_ns();
    cpu0 = kvb_loop_cpu_ns();
    now = kvb_now_ms();

    for (k = 0; rc > 0 && k < loop->nsources; k++) {
        s = loop->sources[k];
        ready = 0;

        for (i = s->first; i < s->first + s->n; i++) {
            ready |= (loop->items[i].revents != 0);
        }

        if (!ready || s->conf.io == NULL) {
            continue;
        }

        start = kvb_loop_now_ns();
        cpu_start = kvb_loop_cpu_ns();

        b.msgs = KVB_BUDGET_MSGS;
        b.bytes = KVB_BUDGET_BYTES;
        b.until_ns = start + KVB_BUDGET_NS;
        b.spent = 0;

        s->conf.io(s->conf.data, &loop->items[s->first], s->n, &b, now);

        if (b.spent && !kvb_budget_left(&b)) {
            s->hist.exhausted++;
        }

        t = kvb_loop_now_ns() - start;
        cpu = kvb_loop_cpu_ns() - cpu_start;
        kvb_loop_slow(s, "reads", t, cpu, now);
        s->turn_ns += t;
        s->turn_cpu_ns += cpu;
        s->hist.calls++;
        s->ran = 1;
    }

    for (k = 0; k < loop->nsources; k++) {
        s = loop->sources[k];

        if (s->conf.tick != NULL) {
            start = kvb_loop_now_ns();
            cpu_start = kvb_loop_cpu_ns();
            s->conf.tick(s->conf.data, now);
            t = kvb_loop_now_ns() - start;
            cpu = kvb_loop_cpu_ns() - cpu_start;
            kvb_loop_slow(s, "tick", t, cpu, now);
            s->turn_ns += t;
            s->turn_cpu_ns += cpu;
            s->ran = 1;
        }

        if (s->ran) {
            kvb_loop_record(&s->hist, s->turn_ns, s->turn_cpu_ns);
        }
    }

    t = kvb_loop_now_ns();
    loop->turns.calls++;
    kvb_loop_record(&loop->turns, t - t0, kvb_loop_cpu_ns() - cpu0);

    return 0;
}


/* past the stated bound: which source, and which of its callbacks */

static void
kvb_loop_slow(kvb_source_t *s, const char *what, uint64_t ns,
    uint64_t cpu_ns, uint64_t now_ms)
{
    if (ns > KVB_LOOP_SLOW_NS) {
        kvb_log_limited(&s->slow_log, now_ms, KVB_LOG_INFO,
                        "loop: %s held the loop %.1f ms (%.1f ms of CPU) "
                        "in its %s", s->name, (double) ns / 1e6,
                        (double) cpu_ns / 1e6, what);
    }
}


static void
kvb_loop_record(kvb_loop_hist_t *h, uint64_t ns, uint64_t cpu_ns)
{
    unsigned  i;

    h->ns_sum += ns;
    h->ns_max = (ns > h->ns_max) ? ns : h->ns_max;
    h->cpu_ns_sum += cpu_ns;
    h->cpu_ns_max = (cpu_ns > h->cpu_ns_max) ? cpu_ns : h->cpu_ns_max;

    for (i = 0; i < KVB_LOOP_BUCKETS; i++) {
        if ((double) ns <= kvb_loop_bounds[i] * 1e9) {
            h->buckets[i]++;
            return;
        }
    }

    h->over++;
}


int
kvb_budget_left(kvb_budget_t *b)
{
    if (!b->spent) {
        return 1;
    }

    return b->msgs > 0 && b->bytes > 0 && kvb_loop_now_ns() < b->until_ns;
}


void
kvb_budget_spend(kvb_budget_t *b, size_t bytes)
{
    b->spent = 1;
    b->msgs = b->msgs ? b->msgs - 1 : 0;
    b->bytes = (bytes < b->bytes) ? b->bytes - bytes : 0;
}


uint64_t
kvb_loop_now_ns(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);

    return (uint64_t) ts.tv_sec * 1000000000 + (uint64_t) ts.tv_nsec;
}


/*
 * A system call (the thread CPU clock has no vDSO path), about 0.3 us:
 * four a source a turn are well within the budget.
 */

uint64_t
kvb_loop_cpu_ns(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);

    return (uint64_t) ts.tv_sec * 1000000000 + (uint64_t) ts.tv_nsec;
}


const kvb_loop_hist_t *
kvb_loop_turns(const kvb_loop_t *loop)
{
    return &loop->turns;
}


size_t
kvb_loop_nsources(const kvb_loop_t *loop)
{
    return loop->nsources;
}


const kvb_loop_hist_t *
kvb_loop_source(const kvb_loop_t *loop, size_t i, const char **name)
{
    *name = loop->sources[i]->name;

    return &loop->sources[i]->hist;
}
