/*
 * kvbridge's loop (tools/kvbridge/kvb_loop.c): sources it knows only by
 * their callbacks, each turn's budget (messages, bytes, time) so that a
 * flooded source shares the loop with a quiet one, deadlines that wake a
 * turn without I/O, ticks every turn, and the timings it keeps.  The
 * sockets are real ZeroMQ PAIRs over inproc.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "tap.h"
#include "kvb_log.h"
#include "kvb_loop.h"


typedef struct {
    void                   *sock;
    unsigned                read;       /* messages, in all */
    unsigned                turn_max;   /* the most in one call */
    unsigned                ticks;
    unsigned                calls;
    uint64_t                deadline;
    unsigned                slow_us;    /* spent per message */
} src_t;


static int
src_watch(void *data, uint64_t now_ms, zmq_pollitem_t *items, int max)
{
    src_t  *s = data;

    if (s->sock == NULL) {
        return 0;
    }

    items[0].socket = s->sock;
    items[0].events = ZMQ_POLLIN;

    return 1;
}


static void
src_io(void *data, const zmq_pollitem_t *items, int n, kvb_budget_t *b,
    uint64_t now_ms)
{
    unsigned          k;
    uint64_t          until;
    zmq_msg_t         m;
    src_t            *s = data;

    k = 0;
    s->calls++;

    while (kvb_budget_left(b)) {
        zmq_msg_init(&m);

        if (zmq_msg_recv(&m, s->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }

        kvb_budget_spend(b, zmq_msg_size(&m));
        zmq_msg_close(&m);
        k++;

        if (s->slow_us) {
            until = kvb_loop_now_ns() + (uint64_t) s->slow_us * 1000;
            while (kvb_loop_now_ns() < until) {
                /* busy, as decoding is */
            }
        }
    }

    s->read += k;
    s->turn_max = (k > s->turn_max) ? k : s->turn_max;
}


static uint64_t
src_deadline(void *data)
{
    src_t  *s = data;

    return s->deadline;
}


static void
src_tick(void *data, uint64_t now_ms)
{
    src_t  *s = data;

    s->ticks++;

    if (s->deadline != UINT64_MAX && now_ms >= s->deadline) {
        s->deadline = UINT64_MAX;
    }
}


static kvb_source_t *
add(kvb_loop_t *loop, src_t *s, const char *name)
{
    kvb_source_conf_t  sc;

    memset(&sc, 0, sizeof(sc));
    sc.watch = src_watch;
    sc.io = src_io;
    sc.deadline = src_deadline;
    sc.tick = src_tick;
    sc.data = s;
    sc.name = name;
    sc.max_items = 1;

    return kvb_loop_add(loop, &sc);
}


/* a connected PAIR: the far end to send on, the near one for the loop */

static void *
pair(void *zctx, const char *ep, void **far)
{
    int    hwm;
    void  *near;

    hwm = 0;
    near = zmq_socket(zctx, ZMQ_PAIR);
    *far = zmq_socket(zctx, ZMQ_PAIR);
    zmq_setsockopt(near, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(*far, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_bind(near, ep);
    zmq_connect(*far, ep);

    return near;
}


int
main(void)
{
    int                     i, turns;
    char                    big[8192];
    void                   *zctx, *far_a, *far_b;
    size_t                  k;
    uint64_t                t0, t;
    src_t                   a, b, c;
    kvb_loop_t             *loop;
    const char             *name;
    const kvb_loop_hist_t  *h;

    kvb_log_level = KVB_LOG_ERR;
    zctx = zmq_ctx_new();
    loop = kvb_loop_create();
    ok(loop != NULL, "a loop");

    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    memset(&c, 0, sizeof(c));
    a.sock = pair(zctx, "inproc://a", &far_a);
    b.sock = pair(zctx, "inproc://b", &far_b);
    a.deadline = b.deadline = c.deadline = UINT64_MAX;

    ok(add(loop, &a, "flooded") && add(loop, &b, "quiet")
       && add(loop, &c, "timer"), "three sources");

    /* a flood of 10,000 small messages against one message */

    for (i = 0; i < 10000; i++) {
        zmq_send(far_a, "x", 1, 0);
    }

    zmq_send(far_b, "y", 1, 0);

    kvb_loop_turn(loop, 100);

    ok(a.turn_max > 0 && a.turn_max <= KVB_BUDGET_MSGS,
       "a flooded source reads %u messages a turn (budget %d)",
       a.turn_max, KVB_BUDGET_MSGS);
    ok(b.read == 1, "the quiet one gets its message in the same turn");
    ok(a.ticks == 1 && b.ticks == 1 && c.ticks == 1,
       "every source ticks every turn");

    for (turns = 1; a.read < 10000 && turns < 100; turns++) {
        kvb_loop_turn(loop, 100);
    }

    ok(a.read == 10000 && turns >= 40,
       "the flood is read over the next turns: %u in %d turns", a.read,
       turns);

    /* bytes: 8 KB messages stop at 1 MB a turn */

    memset(big, 'z', sizeof(big));
    a.turn_max = 0;

    for (i = 0; i < 400; i++) {
        zmq_send(far_a, big, sizeof(big), 0);
    }

    kvb_loop_turn(loop, 100);
    ok(a.turn_max > 0 && a.turn_max <= KVB_BUDGET_BYTES / sizeof(big),
       "8 KB messages: %u a turn (1 MB)", a.turn_max);

    while (a.read < 10400) {
        kvb_loop_turn(loop, 100);
    }

    /* time: 1 ms a message stops at the time budget, one past it */

    a.turn_max = 0;
    a.slow_us = 1000;

    for (i = 0; i < 100; i++) {
        zmq_send(far_a, "s", 1, 0);
    }

    t0 = kvb_loop_now_ns();
    kvb_loop_turn(loop, 100);
    t = kvb_loop_now_ns() - t0;

    ok(a.turn_max >= 1 && a.turn_max <= KVB_BUDGET_NS / 1000000 + 1,
       "1 ms messages: %u in a turn, %.1f ms (budget %d ms)", a.turn_max,
       (double) t / 1e6, KVB_BUDGET_NS / 1000000);

    while (a.read < 10500) {
        kvb_loop_turn(loop, 100);
    }

    a.slow_us = 0;

    /* a deadline wakes a turn with no I/O; without one the wait is bounded */

    c.deadline = kvb_now_ms() + 30;
    c.ticks = 0;
    t0 = kvb_loop_now_ns();
    kvb_loop_turn(loop, 1000);
    t = kvb_loop_now_ns() - t0;

    ok(c.ticks == 1 && t >= 25 * 1000000 && t < 500 * 1000000,
       "a deadline 30 ms on ends the wait: %.1f ms", (double) t / 1e6);

    t0 = kvb_loop_now_ns();
    kvb_loop_turn(loop, 50);
    t = kvb_loop_now_ns() - t0;

    ok(t >= 45 * 1000000 && t < 900 * 1000000,
       "no deadline: the wait given, %.1f ms", (double) t / 1e6);

    /* timings */

    h = kvb_loop_turns(loop);
    ok(h->calls > 40, "%llu turns counted", (unsigned long long) h->calls);

    ok(kvb_loop_nsources(loop) == 3, "three sources timed");

    h = kvb_loop_source(loop, 0, &name);
    ok(strcmp(name, "flooded") == 0 && h->ns_max >= 4 * 1000000
       && h->exhausted > 40,
       "the flooded source: longest turn %.1f ms, budget spent %llu turns",
       (double) h->ns_max / 1e6, (unsigned long long) h->exhausted);

    k = 0;

    for (i = 0; i < KVB_LOOP_BUCKETS; i++) {
        k += h->buckets[i];
    }

    ok(k + h->over > 40, "its per-turn histogram counts %zu turns",
       k + h->over);

    h = kvb_loop_source(loop, 1, &name);
    ok(strcmp(name, "quiet") == 0 && h->calls == 1 && h->exhausted == 0,
       "the quiet source: one read, its budget never spent");

    zmq_close(far_a);
    zmq_close(far_b);
    zmq_close(a.sock);
    zmq_close(b.sock);
    kvb_loop_destroy(loop);
    zmq_ctx_term(zctx);

    return done_testing();
}
