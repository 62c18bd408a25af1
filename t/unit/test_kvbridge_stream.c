/*
 * kvbridge's stream (tools/kvbridge/kvb_stream.c): batches handed on once
 * and in order across duplicates, gaps, replays that work, replays that
 * skip or never end, and engines that restart, seen by their seq going
 * back or, when it did not, by the last batch seen replayed different or
 * not at all.  The replay side is a real ZeroMQ ROUTER socket answering
 * as vLLM's publisher does.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "tap.h"
#include "kvb_stream.h"


#define EP  "inproc://replay"


static void     *zctx, *router;
static uint64_t  got[256];
static size_t    ngot;
static int       resets, restarts;
static char      last_reset[128];
static unsigned  batch_us;      /* what handing a batch on costs */


static void
on_batch(void *data, uint64_t seq, const char *payload, size_t len)
{
    /* the payload says its seq too: "b<seq>", "n<seq>" for a new process */
    char  want[32];

    snprintf(want, sizeof(want), "%c%llu", len ? payload[0] : 'b',
             (unsigned long long) seq);

    if (len != strlen(want) || memcmp(payload, want, len) != 0
        || (want[0] != 'b' && want[0] != 'n'))
    {
        seq += 1000000;     /* shows up as wrong in the test */
    }

    if (ngot < 256) {
        got[ngot++] = seq;
    }

    if (batch_us) {
        usleep(batch_us);
    }
}


static void
on_reset(void *data, kvb_reset_e why, const char *detail)
{
    resets++;
    restarts += (why == KVB_RESET_RESTART);
    snprintf(last_reset, sizeof(last_reset), "%s", detail);
}


static void
be64(uint64_t v, unsigned char *p)
{
    int  i;

    for (i = 0; i < 8; i++) {
        p[i] = (unsigned char) (v >> (56 - 8 * i));
    }
}


static void
live(kvb_stream_t *st, uint64_t seq)
{
    char           payload[32];
    unsigned char  s[8];

    be64(seq, s);
    snprintf(payload, sizeof(payload), "b%llu", (unsigned long long) seq);
    kvb_stream_frame(st, s, 8, payload, strlen(payload), 0);
}


static void
live_as(kvb_stream_t *st, uint64_t seq, char process)
{
    char           payload[32];
    unsigned char  s[8];

    be64(seq, s);
    snprintf(payload, sizeof(payload), "%c%llu", process,
             (unsigned long long) seq);
    kvb_stream_frame(st, s, 8, payload, strlen(payload), 0);
}


static uint64_t
now_us(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);

    return (uint64_t) ts.tv_sec * 1000000 + (uint64_t) ts.tv_nsec / 1000;
}


/* the engine's side: reads one request, returns its start seq */

static int64_t
replay_request(unsigned char *id, size_t *id_len)
{
    int            n;
    uint64_t       v;
    unsigned char  empty[8], start[8];
    zmq_pollitem_t it = { router, 0, ZMQ_POLLIN, 0 };

    if (zmq_poll(&it, 1, 1000) != 1) {
        return -1;
    }

    n = zmq_recv(router, id, 64, 0);
    *id_len = (size_t) n;
    zmq_recv(router, empty, sizeof(empty), 0);
    n = zmq_recv(router, start, sizeof(start), 0);

    if (n != 8) {
        return -1;
    }

    v = 0;

    for (n = 0; n < 8; n++) {
        v = (v << 8) | start[n];
    }

    return (int64_t) v;
}


static void
replay_send_as(unsigned char *id, size_t id_len, int64_t seq, int topic,
    char process)
{
    char           payload[32];
    unsigned char  s[8];

    be64((uint64_t) seq, s);
    snprintf(payload, sizeof(payload), "%c%lld", process, (long long) seq);

    zmq_send(router, id, id_len, ZMQ_SNDMORE);
    zmq_send(router, "", 0, ZMQ_SNDMORE);

    if (topic) {
        zmq_send(router, "kv@pod-1@llama", 14, ZMQ_SNDMORE);
    }

    zmq_send(router, s, 8, ZMQ_SNDMORE);
    zmq_send(router, seq < 0 ? "" : payload, seq < 0 ? 0 : strlen(payload),
             0);
}


static void
replay_send(unsigned char *id, size_t id_len, int64_t seq, int topic)
{
    replay_send_as(id, id_len, seq, topic, 'b');
}


/* lets the stream read what the router sent, and no more */

static void
pump_reads(kvb_stream_t *st)
{
    int             i;
    zmq_pollitem_t  it;

    for (i = 0; i < 50 && kvb_stream_socket(st) != NULL; i++) {
        it.socket = kvb_stream_socket(st);
        it.fd = 0;
        it.events = ZMQ_POLLIN;
        it.revents = 0;

        if (zmq_poll(&it, 1, 20) > 0) {
            kvb_stream_io(st, 0);
        }
    }
}


/* the same, then the ticks the bridge's loop would run */

static void
pump(kvb_stream_t *st)
{
    int  i;

    pump_reads(st);

    /*
     * held batches left when a call's time ran out (a loaded machine)
     * are handed on by the ticks that follow, as the bridge's loop does
     */

    for (i = 0; i < 1000 && kvb_stream_deadline(st) == 0; i++) {
        kvb_stream_tick(st, 0);
    }
}


static int
got_is(const uint64_t *want, size_t n)
{
    size_t  i;

    if (ngot != n) {
        printf("# got %zu batches:", ngot);
        for (i = 0; i < ngot; i++) {
            printf(" %llu", (unsigned long long) got[i]);
        }
        printf("\n");
        return 0;
    }

    for (i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            return 0;
        }
    }

    return 1;
}


static kvb_stream_t *
fresh(const char *ep, size_t hold)
{
    kvb_stream_handler_t  h = { on_batch, on_reset, NULL };

    ngot = 0;
    resets = 0;
    restarts = 0;

    return kvb_stream_create(zctx, ep, 300, hold, &h);
}


int
main(void)
{
    size_t          id_len;
    int64_t         from;
    unsigned        i;
    kvb_stream_t   *st;
    unsigned char   id[64];

    zctx = zmq_ctx_new();
    router = zmq_socket(zctx, ZMQ_ROUTER);
    zmq_bind(router, EP);

    /* in order */
    st = fresh(EP, 64);
    for (i = 0; i < 5; i++) {
        live(st, i);
    }
    ok(got_is((uint64_t[]) { 0, 1, 2, 3, 4 }, 5) && resets == 0,
       "in order");

    /* a gap: replayed, the held batch follows, overlap dropped */
    live(st, 7);
    live(st, 8);
    from = replay_request(id, &id_len);
    ok(from == 4, "a gap asks for a replay from the last seq seen");
    replay_send(id, id_len, 4, 0);
    replay_send(id, id_len, 5, 0);
    replay_send(id, id_len, 6, 0);
    replay_send(id, id_len, 7, 0);
    replay_send(id, id_len, -1, 0);
    pump(st);
    live(st, 9);
    ok(got_is((uint64_t[]) { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 }, 10)
       && resets == 0 && kvb_stream_stats(st)->replays_ok == 1,
       "replayed 5..7, then the held 8 and the live 9, no reset");

    /* newer vLLM: a topic frame in the replies */
    live(st, 12);
    from = replay_request(id, &id_len);
    replay_send(id, id_len, 9, 1);
    replay_send(id, id_len, 10, 1);
    replay_send(id, id_len, 11, 1);
    replay_send(id, id_len, -1, 1);
    pump(st);
    ok(from == 9 && ngot == 13 && got[12] == 12 && resets == 0,
       "replies with a topic frame");

    /* the ROUTER dropped one: the replay skips */
    live(st, 16);
    from = replay_request(id, &id_len);
    replay_send(id, id_len, 12, 0);
    replay_send(id, id_len, 13, 0);
    replay_send(id, id_len, 15, 0);
    replay_send(id, id_len, -1, 0);
    pump(st);
    ok(from == 12 && resets == 1 && strstr(last_reset, "skipped") != NULL
       && got[ngot - 1] == 16 && kvb_stream_stats(st)->replays_failed == 1,
       "a replay that skips a seq resets: %s", last_reset);

    /* no answer at all */
    live(st, 20);
    from = replay_request(id, &id_len);
    kvb_stream_tick(st, 100);
    ok(kvb_stream_socket(st) != NULL, "still waiting before the timeout");
    kvb_stream_tick(st, 1000);
    ok(from == 16 && resets == 2 && strstr(last_reset, "timed out") != NULL
       && got[ngot - 1] == 20 && kvb_stream_socket(st) == NULL,
       "a replay that never ends times out and resets");

    /*
     * The engine restarts: seq back to 0.  A suspect: the replay is asked
     * for the last batch seen (20), the new process has none, so it is a
     * restart and the new process is replayed from its start; its live
     * seq 1, meanwhile, is dropped (the replay has it).
     */
    live(st, 0);
    ok(restarts == 0 && got[ngot - 1] == 20, "seq 0 again: not yet taken");
    from = replay_request(id, &id_len);
    live(st, 1);
    replay_send(id, id_len, -1, 0);
    pump(st);
    ok(from == 20 && restarts == 1
       && strstr(last_reset, "seq 20 no longer replayed") != NULL,
       "the replay has no seq 20: a restart (%s)", last_reset);
    from = replay_request(id, &id_len);
    replay_send(id, id_len, 0, 0);
    replay_send(id, id_len, 1, 0);
    replay_send(id, id_len, -1, 0);
    pump(st);
    ok(from == 0 && got[ngot - 2] == 0 && got[ngot - 1] == 1
       && kvb_stream_socket(st) == NULL,
       "seq 0 again: a restart, and the new stream goes on");

    kvb_stream_destroy(st);

    /*
     * Restarted, its seq 0 missed, no replay endpoint: a seq going back
     * is a restart once the next frame continues from it.
     */
    st = fresh(NULL, 64);
    for (i = 0; i < 40; i++) {
        live(st, i);
    }
    live(st, 3);
    ok(restarts == 0 && ngot == 40, "a seq below the expected one: kept");
    live(st, 4);
    ok(restarts == 1 && got[ngot - 2] == 3 && got[ngot - 1] == 4
       && ngot == 42,
       "the next frame continues from it: a restart, on from there");
    kvb_stream_destroy(st);

    /* no replay endpoint: a gap resets once the next frame follows it */
    st = fresh(NULL, 64);
    live(st, 0);
    live(st, 5);
    ok(resets == 0 && ngot == 1, "without a replay endpoint a gap waits");
    live(st, 6);
    ok(resets == 1 && ngot == 3 && got[1] == 5 && got[2] == 6
       && strstr(last_reset, "no replay") != NULL,
       "then resets: %s", last_reset);
    kvb_stream_destroy(st);

    /*
     * The engine's own socket, no replay endpoint: nobody else can send
     * on it, so a gap resets at once and a seq going back restarts at
     * once; an engine idle after a loss has its last batch published.
     */
    st = fresh(NULL, 64);
    kvb_stream_set_own_socket(st, 1);
    live(st, 0);
    live(st, 5);
    ok(resets == 1 && ngot == 2 && got[1] == 5
       && strstr(last_reset, "no replay") != NULL,
       "own socket: a gap resets at once: %s", last_reset);
    live(st, 2);
    ok(restarts == 1 && ngot == 3 && got[2] == 2,
       "own socket: a seq going back is a restart at once");
    kvb_stream_destroy(st);

    /* joining late: replayed from 0 */
    st = fresh(EP, 64);
    live(st, 3);
    from = replay_request(id, &id_len);
    for (i = 0; i < 3; i++) {
        replay_send(id, id_len, i, 0);
    }
    replay_send(id, id_len, -1, 0);
    pump(st);
    ok(from == 0 && got_is((uint64_t[]) { 0, 1, 2, 3 }, 4) && resets == 0,
       "a bridge that joins late replays the engine from seq 0");
    kvb_stream_destroy(st);

    /*
     * The replay's buffer no longer reaches back to the last seq seen:
     * nothing tells the same process from a new one, so it is a restart
     * (the mirror cannot be vouched for); replayed from 0, which fails
     * too, then on from the live batch.
     */
    st = fresh(EP, 64);
    live(st, 0);
    live(st, 9);
    from = replay_request(id, &id_len);
    replay_send(id, id_len, 5, 0);
    replay_send(id, id_len, -1, 0);
    pump(st);
    ok(from == 0 && restarts == 1
       && strstr(last_reset, "seq 0 no longer replayed") != NULL,
       "the last seq seen no longer buffered: a restart (%s)", last_reset);
    from = replay_request(id, &id_len);
    replay_send(id, id_len, 5, 0);
    replay_send(id, id_len, -1, 0);
    pump(st);
    ok(from == 0 && resets == 2 && strstr(last_reset, "skipped") != NULL
       && got[ngot - 1] == 9,
       "replayed from 0, which cannot be had either (%s), then on from "
       "the live batch", last_reset);
    kvb_stream_destroy(st);

    /*
     * An engine that restarted while the bridge was cut off, and
     * published past the seq the bridge saw: seq does not go back.  The
     * replay from the last seq seen gives another batch under that seq:
     * a restart, and the new process is replayed from its start.
     */
    st = fresh(EP, 64);
    for (i = 0; i < 5; i++) {
        live(st, i);
    }
    live(st, 9);
    from = replay_request(id, &id_len);
    replay_send_as(id, id_len, 4, 0, 'n');
    replay_send_as(id, id_len, 5, 0, 'n');
    pump(st);
    ok(from == 4 && restarts == 1 && resets == 1
       && strstr(last_reset, "seq 4 replayed is not the one seen"),
       "seq 4 replayed differs from the seq 4 seen: a restart (%s)",
       last_reset);
    from = replay_request(id, &id_len);
    for (i = 0; i < 9; i++) {
        replay_send_as(id, id_len, i, 0, 'n');
    }
    replay_send(id, id_len, -1, 0);
    pump(st);
    ok(from == 0 && ngot == 15 && got[5] == 0 && got[13] == 8
       && got[14] == 9 && resets == 1 && kvb_stream_socket(st) == NULL,
       "the new process replayed from 0, its held live 9 after");

    /* the socket reconnects to the same process: verified, nothing lost */
    ok(kvb_stream_verify(st, 0) == 0, "a reconnect asks for a check");
    from = replay_request(id, &id_len);
    replay_send(id, id_len, 9, 0);
    replay_send(id, id_len, 10, 0);
    replay_send(id, id_len, -1, 0);
    pump(st);
    ok(from == 9 && resets == 1 && got[ngot - 1] == 10 && ngot == 16,
       "the same process: seq 9 replayed unchanged, 10 handed on, no "
       "reset");
    ok(kvb_stream_stats(st)->verifies == 1, "one check counted");

    /* ... to a new process that has published nothing yet */
    ok(kvb_stream_verify(st, 0) == 0, "another reconnect");
    from = replay_request(id, &id_len);
    replay_send(id, id_len, -1, 0);
    pump(st);
    ok(from == 10 && restarts == 2
       && strstr(last_reset, "seq 10 no longer replayed"),
       "nothing replayed: a new process (%s)", last_reset);
    from = replay_request(id, &id_len);
    replay_send(id, id_len, -1, 0);
    pump(st);
    live(st, 0);
    ok(from == 0 && got[ngot - 1] == 0 && resets == 2,
       "replayed from 0 (nothing yet), then its seq 0 handed on");
    kvb_stream_destroy(st);

    /* nothing to check: nothing seen yet, or no replay endpoint */
    st = fresh(EP, 64);
    ok(kvb_stream_verify(st, 0) == -1, "no check before the first batch");
    kvb_stream_destroy(st);
    st = fresh(NULL, 64);
    live(st, 0);
    ok(kvb_stream_verify(st, 0) == -1, "no check without a replay socket");
    kvb_stream_destroy(st);

    /* more live batches than may be held during a replay */
    st = fresh(EP, 4);
    live(st, 0);
    for (i = 2; i < 8; i++) {
        live(st, i);
    }
    from = replay_request(id, &id_len);
    ok(from == 0 && resets == 1 && got[ngot - 1] == 7
       && kvb_stream_socket(st) == NULL,
       "past the hold limit the replay is abandoned: %s", last_reset);
    ok(ngot == 3 && got[0] == 0 && got[1] == 6 && got[2] == 7,
       "and what was held is dropped, not handed on in one go: %u "
       "handed on", (unsigned) ngot);
    kvb_stream_destroy(st);

    /* the dropped batches are freed a slice a tick, not in one call */
    {
        unsigned  ticks;

        st = fresh(EP, 200);
        live(st, 0);
        for (i = 2; i < 203; i++) {
            live(st, i);
        }
        from = replay_request(id, &id_len);
        for (ticks = 0; ticks < 100 && kvb_stream_deadline(st) == 0;
             ticks++)
        {
            kvb_stream_tick(st, 0);
        }
        ok(from == 0 && resets == 1 && ticks == 4
           && kvb_stream_deadline(st) == UINT64_MAX,
           "200 dropped batches freed over %u ticks", ticks);
        kvb_stream_destroy(st);
    }

    /* a rebuild: all the engine buffers from seq 0, live ones held */
    st = fresh(EP, 64);
    ok(kvb_stream_rebuild(st, 0) == 0 && kvb_stream_socket(st) != NULL,
       "a rebuild asks for a replay");
    from = replay_request(id, &id_len);
    live(st, 3);
    for (i = 0; i < 3; i++) {
        replay_send(id, id_len, i, 0);
    }
    replay_send(id, id_len, -1, 0);
    pump(st);
    ok(from == 0 && got_is((uint64_t[]) { 0, 1, 2, 3 }, 4) && resets == 0,
       "rebuilt from seq 0, then the live batch held meanwhile");
    ok(kvb_stream_rebuild(st, 0) == -1,
       "no rebuild once a batch was handed on");
    kvb_stream_destroy(st);
    st = fresh(NULL, 64);
    ok(kvb_stream_rebuild(st, 0) == -1, "no rebuild without a replay socket");
    kvb_stream_destroy(st);

    /*
     * Issue 18, defect 8: one stray frame on the engine's topic (anyone
     * on the collector port can send one) is not a restart.  Without a
     * replay endpoint it is kept aside and dropped when the established
     * sequence goes on; with one, the replay says the engine is the one
     * followed.
     */
    st = fresh(NULL, 64);
    for (i = 0; i < 10; i++) {
        live(st, i);
    }
    live_as(st, 0, 'x');
    live(st, 10);
    live_as(st, 1ULL << 63, 'x');
    live(st, 11);
    live_as(st, 5, 'x');
    live_as(st, 900000, 'x');
    live(st, 12);
    ok(resets == 0 && restarts == 0 && ngot == 13 && got[12] == 12
       && kvb_stream_stats(st)->suspects == 4
       && kvb_stream_stats(st)->strays == 4,
       "stray seqs 0, 2^63, 5 and 900000 among 0..12: no reset, nothing "
       "of theirs handed on");
    kvb_stream_destroy(st);

    st = fresh(EP, 64);
    for (i = 0; i < 10; i++) {
        live(st, i);
    }
    live_as(st, 0, 'x');
    from = replay_request(id, &id_len);
    live(st, 10);
    live_as(st, 1, 'x');
    live(st, 11);
    replay_send(id, id_len, 9, 0);
    replay_send(id, id_len, -1, 0);
    pump(st);
    ok(from == 9 && resets == 0 && ngot == 12 && got[11] == 11
       && kvb_stream_stats(st)->strays == 2,
       "a stray seq 0 with a replay endpoint: seq 9 replayed unchanged, "
       "the engine's 10 and 11 held and handed on, no reset");
    live_as(st, 1ULL << 63, 'x');
    from = replay_request(id, &id_len);
    replay_send(id, id_len, 11, 0);
    replay_send(id, id_len, -1, 0);
    pump(st);
    live(st, 12);
    ok(from == 11 && resets == 0 && ngot == 13 && got[12] == 12,
       "a stray seq 2^63, then the engine's next: no gap, no reset");
    kvb_stream_destroy(st);

    /*
     * One frame just ahead (next + 1), or with the engine's next seq
     * itself, is not a restart either: the first is dropped when the
     * engine's next comes, the second takes the engine's place and the
     * engine's own batch of that seq is dropped as a duplicate.
     */
    st = fresh(NULL, 64);
    for (i = 0; i < 10; i++) {
        live(st, i);
    }
    live_as(st, 11, 'x');
    live(st, 10);
    live(st, 11);
    live(st, 12);
    ok(resets == 0 && ngot == 13 && got[11] == 11 && got[12] == 12,
       "a stray seq 11 before the engine's 10, 11, 12: no reset");
    live_as(st, 13, 'b');
    live(st, 13);
    live(st, 14);
    ok(resets == 0 && ngot == 15 && got[14] == 14
       && kvb_stream_stats(st)->duplicates == 1,
       "a stray with the engine's next seq: the engine's own dropped, "
       "no reset");

    /* a repeat of the last seq between two strays parts them */
    live_as(st, 1ULL << 62, 'x');
    live_as(st, 14, 'x');
    live_as(st, (1ULL << 62) + 1, 'x');
    live(st, 15);
    ok(resets == 0 && ngot == 16 && got[15] == 15,
       "strays 2^62, the last seq again, 2^62 + 1: not a pair, no reset");
    kvb_stream_destroy(st);

    /*
     * Issue 18, defect 3: a replay that floods.  One kvb_stream_io() call
     * takes at most KVB_STREAM_IO_MSGS messages, and with batches that
     * take 1 ms each to hand on, KVB_STREAM_IO_US of time (plus one
     * batch); the replay's timeout is checked between messages.
     */
    {
        uint64_t        t0, t;
        int             calls;
        zmq_pollitem_t  it;

        st = fresh(EP, 64);
        live(st, 0);
        live(st, 3000);
        from = replay_request(id, &id_len);
        for (i = 0; i < 2000; i++) {
            replay_send(id, id_len, i, 0);
        }

        it.socket = kvb_stream_socket(st);
        it.fd = 0;
        it.events = ZMQ_POLLIN;
        it.revents = 0;
        zmq_poll(&it, 1, 1000);
        usleep(100000);             /* all of them on this side */
        ngot = 0;
        kvb_stream_io(st, 0);
        ok(ngot > 0 && ngot <= KVB_STREAM_IO_MSGS
           && kvb_stream_stats(st)->io_yields == 1,
           "a flood of 2000: one call hands on %zu", ngot);

        batch_us = 1000;
        ngot = 0;
        t0 = now_us();
        kvb_stream_io(st, 0);
        t = now_us() - t0;
        ok(ngot >= 1 && ngot <= 8 && t < KVB_STREAM_IO_US + 100000,
           "batches of 1 ms: one call hands on %zu in %llu us", ngot,
           (unsigned long long) t);

        /* the replay's time runs out inside a call, not between turns */
        calls = resets;
        kvb_stream_io(st, 299);
        ok(resets == calls + 1 && strstr(last_reset, "timed out") != NULL
           && kvb_stream_socket(st) == NULL,
           "a replay past its timeout fails inside the call: %s",
           last_reset);
        batch_us = 0;
        kvb_stream_destroy(st);
    }

    /* held batches are handed on under the budget too, from the tick */
    {
        size_t  before;

        st = fresh(EP, 2048);
        live(st, 0);
        for (i = 2; i < 1500; i++) {
            live(st, i);
        }
        from = replay_request(id, &id_len);
        replay_send(id, id_len, 0, 0);
        replay_send(id, id_len, 1, 0);
        replay_send(id, id_len, -1, 0);
        pump_reads(st);
        before = (size_t) kvb_stream_stats(st)->batches;
        ok(from == 0 && before < 1500 && kvb_stream_deadline(st) == 0,
           "1498 held batches: %zu handed on in the first call, the "
           "rest is due now", before);
        for (i = 0; i < 100 && kvb_stream_deadline(st) == 0; i++) {
            kvb_stream_tick(st, 0);
        }
        ok(kvb_stream_stats(st)->batches == 1500 && resets == 0
           && kvb_stream_deadline(st) == UINT64_MAX,
           "then all of them, in order, over %u ticks", i);
        kvb_stream_destroy(st);
    }

    /* a replay message past --max-batch never reaches the stream */
    {
        char           big[4096];
        unsigned char  s[8];

        st = fresh(EP, 64);
        kvb_stream_set_max_batch(st, 1024);
        live(st, 0);
        live(st, 5);
        from = replay_request(id, &id_len);
        memset(big, 'b', sizeof(big));
        be64(0, s);
        zmq_send(router, id, id_len, ZMQ_SNDMORE);
        zmq_send(router, "", 0, ZMQ_SNDMORE);
        zmq_send(router, s, 8, ZMQ_SNDMORE);
        zmq_send(router, big, sizeof(big), 0);
        pump(st);
        kvb_stream_tick(st, 1000);
        ok(from == 0 && ngot == 2 && got[1] == 5
           && strstr(last_reset, "timed out") != NULL,
           "a 4 KB reply with --max-batch 1k: dropped, the replay fails "
           "(%s)", last_reset);
        kvb_stream_destroy(st);
    }

    zmq_close(router);
    zmq_ctx_term(zctx);

    return done_testing();
}
