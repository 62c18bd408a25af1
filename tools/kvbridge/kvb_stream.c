/*
 * kvbridge: one engine's event stream in order (kvb_stream.h).
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>
#include <zmq.h>

#include "kvb_stream.h"
#include "kvb_zmsg.h"


/* what batches held during a replay may take, whatever their number */
#define KVB_HOLD_BYTES_MAX  (64 * 1024 * 1024)

#define KVB_SEQ_END         UINT64_MAX      /* -1: the replay's end */


typedef struct {
    uint64_t                seq;
    char                   *payload;
    size_t                  len;
} kvb_held_t;


struct kvb_stream_s {
    void                   *zctx;
    char                   *replay_ep;
    void                   *dealer;
    unsigned                timeout_ms;
    kvb_stream_handler_t    h;

    unsigned                started:1;
    unsigned                replaying:1;
    unsigned                verifying:1;    /* next - 1 is replayed first */
    unsigned                have_last:1;
    uint64_t                next;           /* the seq expected */
    uint64_t                last_digest;    /* of next - 1's payload */
    uint64_t                deadline;

    kvb_held_t             *held;
    size_t                  nheld, hold_max, held_bytes;

    kvb_stream_stats_t      st;
};


static void kvb_stream_live(kvb_stream_t *st, uint64_t seq,
    const char *payload, size_t len, uint64_t now_ms);
static void kvb_stream_deliver(kvb_stream_t *st, uint64_t seq,
    const char *payload, size_t len);
static int kvb_stream_replay(kvb_stream_t *st, uint64_t from,
    uint64_t now_ms);
static int kvb_stream_replay_gap(kvb_stream_t *st, uint64_t now_ms);
static int kvb_stream_check(kvb_stream_t *st, uint64_t seq,
    const char *payload, size_t len, uint64_t now_ms);
static int kvb_stream_hold(kvb_stream_t *st, uint64_t seq,
    const char *payload, size_t len);
static void kvb_stream_drain(kvb_stream_t *st);
static void kvb_stream_give_up(kvb_stream_t *st, const char *detail);
static void kvb_stream_close(kvb_stream_t *st);
static uint64_t kvb_be64(const unsigned char *p);


kvb_stream_t *
kvb_stream_create(void *zctx, const char *replay, unsigned timeout_ms,
    size_t hold_max, const kvb_stream_handler_t *h)
{
    kvb_stream_t  *st;

    st = calloc(1, sizeof(kvb_stream_t));
    if (st == NULL) {
        return NULL;
    }

    st->held = calloc(hold_max ? hold_max : 1, sizeof(kvb_held_t));
    if (st->held == NULL) {
        free(st);
        return NULL;
    }

    if (replay != NULL) {
        st->replay_ep = strdup(replay);
        if (st->replay_ep == NULL) {
            free(st->held);
            free(st);
            return NULL;
        }
    }

    st->zctx = zctx;
    st->timeout_ms = timeout_ms;
    st->hold_max = hold_max;
    st->h = *h;

    return st;
}


void
kvb_stream_destroy(kvb_stream_t *st)
{
    if (st == NULL) {
        return;
    }

    kvb_stream_close(st);

    while (st->nheld) {
        free(st->held[--st->nheld].payload);
    }

    free(st->held);
    free(st->replay_ep);
    free(st);
}


void
kvb_stream_frame(kvb_stream_t *st, const void *seq, size_t seq_len,
    const char *payload, size_t len, uint64_t now_ms)
{
    uint64_t  s;

    if (seq_len != 8) {
        st->st.bad_frames++;
        return;
    }

    s = kvb_be64(seq);

    if (st->replaying) {
        if (kvb_stream_hold(st, s, payload, len) == 0) {
            return;
        }

        /* too much to hold: the replay is too slow to be worth it */
        kvb_stream_give_up(st, "live batches past the hold limit");
    }

    kvb_stream_live(st, s, payload, len, now_ms);
}


void *
kvb_stream_socket(const kvb_stream_t *st)
{
    return st->replaying ? st->dealer : NULL;
}


void
kvb_stream_io(kvb_stream_t *st, uint64_t now_ms)
{
    char        detail[96];
    size_t      n;
    uint64_t    seq;
    kvb_zmsg_t  m;

    /* ["", [topic,] seq, payload]: newer vLLM adds the topic */

    while (st->replaying && kvb_zmsg_recv(st->dealer, &m, 4)) {
        n = m.n;

        if (m.too_long || n < 3 || zmq_msg_size(&m.part[0]) != 0
            || zmq_msg_size(&m.part[n - 2]) != 8)
        {
            st->st.bad_frames++;

        } else {
            seq = kvb_be64(zmq_msg_data(&m.part[n - 2]));

            if (st->verifying
                && kvb_stream_check(st, seq, zmq_msg_data(&m.part[n - 1]),
                                    zmq_msg_size(&m.part[n - 1]), now_ms)
                   != 0)
            {
                /* a restart: a replay from 0 asked instead, or given up */

            } else if (seq == KVB_SEQ_END) {
                kvb_stream_close(st);
                kvb_stream_drain(st);

            } else if (seq < st->next) {
                st->st.duplicates++;

            } else if (seq == st->next) {
                kvb_stream_deliver(st, seq, zmq_msg_data(&m.part[n - 1]),
                                   zmq_msg_size(&m.part[n - 1]));

            } else {
                snprintf(detail, sizeof(detail),
                         "replay skipped seq %llu to %llu",
                         (unsigned long long) st->next,
                         (unsigned long long) seq - 1);
                kvb_stream_give_up(st, detail);
            }
        }

        kvb_zmsg_close(&m);
    }
}


uint64_t
kvb_stream_deadline(const kvb_stream_t *st)
{
    return st->replaying ? st->deadline : UINT64_MAX;
}


void
kvb_stream_tick(kvb_stream_t *st, uint64_t now_ms)
{
    if (st->replaying && now_ms >= st->deadline) {
        kvb_stream_give_up(st, "replay timed out");
    }
}


const kvb_stream_stats_t *
kvb_stream_stats(const kvb_stream_t *st)
{
    return &st->st;
}


static void
kvb_stream_live(kvb_stream_t *st, uint64_t seq, const char *payload,
    size_t len, uint64_t now_ms)
{
    if (!st->started) {
        st->started = 1;
        st->next = 0;

        if (seq == 0 || st->replay_ep == NULL) {
            /* from its start, or as much of it as can be had */
            st->next = seq;
            kvb_stream_deliver(st, seq, payload, len);
            return;
        }
    }

    if (seq == st->next) {
        kvb_stream_deliver(st, seq, payload, len);
        return;
    }

    if (seq < st->next) {
        /*
         * Live batches never repeat: a replay's overlap is sorted out
         * while they are held.  A seq below the expected one is a new
         * engine process (its seq 0 may have been missed while the SUB
         * socket reconnected), or a second publisher on the same topic.
         */

        st->st.restarts++;
        st->st.resets++;
        st->h.reset(st->h.data, KVB_RESET_RESTART, "seq went back");
        st->next = 0;

        if (seq == 0 || st->replay_ep == NULL) {
            st->next = seq;
            kvb_stream_deliver(st, seq, payload, len);
            return;
        }
    }

    /* a gap: next .. seq - 1 are missing */

    st->st.gaps++;

    if (st->replay_ep != NULL && kvb_stream_replay_gap(st, now_ms) == 0
        && kvb_stream_hold(st, seq, payload, len) == 0)
    {
        return;
    }

    if (st->replaying) {
        kvb_stream_close(st);
    }

    st->st.resets++;
    st->h.reset(st->h.data, KVB_RESET_GAP,
                st->replay_ep ? "cannot replay" : "no replay endpoint");
    st->next = seq;
    kvb_stream_deliver(st, seq, payload, len);
}


static void
kvb_stream_deliver(kvb_stream_t *st, uint64_t seq, const char *payload,
    size_t len)
{
    st->next = seq + 1;
    st->last_digest = XXH3_64bits(payload, len);
    st->have_last = 1;
    st->st.batches++;
    st->h.batch(st->h.data, seq, payload, len);
}


static int
kvb_stream_replay(kvb_stream_t *st, uint64_t from, uint64_t now_ms)
{
    int            zero, hwm;
    unsigned char  req[8];
    unsigned       i;

    /*
     * a fresh socket for every replay: replies to an abandoned one may
     * still be on their way and would pass for this one's
     */

    st->dealer = zmq_socket(st->zctx, ZMQ_DEALER);
    if (st->dealer == NULL) {
        return -1;
    }

    zero = 0;
    hwm = 0;    /* no limit on our side: the engine's ROUTER drops anyway */
    zmq_setsockopt(st->dealer, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(st->dealer, ZMQ_RCVHWM, &hwm, sizeof(hwm));

    for (i = 0; i < 8; i++) {
        req[i] = (unsigned char) (from >> (56 - 8 * i));
    }

    if (zmq_connect(st->dealer, st->replay_ep) != 0
        || zmq_send(st->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) != 0
        || zmq_send(st->dealer, req, 8, ZMQ_DONTWAIT) != 8)
    {
        kvb_stream_close(st);
        return -1;
    }

    st->replaying = 1;
    st->verifying = 0;
    st->deadline = now_ms + st->timeout_ms;

    return 0;
}


/*
 * A replay of what is missing, from the last batch delivered on: that
 * one must come back first and the same, byte for byte (its digest).  A
 * different one, or none, is a new engine process that has published
 * more batches than the bridge saw of the old one (seq did not go back):
 * its buffer holds none of the old process's batches.
 */

static int
kvb_stream_replay_gap(kvb_stream_t *st, uint64_t now_ms)
{
    if (!st->have_last || st->next == 0) {
        return kvb_stream_replay(st, st->next, now_ms);
    }

    if (kvb_stream_replay(st, st->next - 1, now_ms) != 0) {
        return -1;
    }

    st->verifying = 1;

    return 0;
}


int
kvb_stream_verify(kvb_stream_t *st, uint64_t now_ms)
{
    if (!st->started || !st->have_last || st->replay_ep == NULL
        || st->replaying)
    {
        return -1;
    }

    st->st.verifies++;

    return kvb_stream_replay_gap(st, now_ms);
}


int
kvb_stream_rebuild(kvb_stream_t *st, uint64_t now_ms)
{
    if (st->replay_ep == NULL || st->replaying || st->have_last) {
        return -1;
    }

    /* live batches that come meanwhile are held, as for a gap */
    st->started = 1;
    st->next = 0;

    return kvb_stream_replay(st, 0, now_ms);
}


/*
 * The first message of a verifying replay: 0 when it is the batch
 * delivered last, unchanged (the replay goes on); -1 when the engine is
 * another process: its owner starts again from a clean slate and the
 * new process is replayed from its start, the live batches still held.
 */

static int
kvb_stream_check(kvb_stream_t *st, uint64_t seq, const char *payload,
    size_t len, uint64_t now_ms)
{
    char  detail[96];

    st->verifying = 0;

    if (seq == st->next - 1) {
        if (XXH3_64bits(payload, len) == st->last_digest) {
            /* the same process: the batch is known, the rest follows */
            return 0;
        }

        snprintf(detail, sizeof(detail), "seq %llu replayed is not the "
                 "one seen", (unsigned long long) seq);

    } else {
        snprintf(detail, sizeof(detail), "seq %llu no longer replayed",
                 (unsigned long long) st->next - 1);
    }

    st->st.restarts++;
    st->st.resets++;
    kvb_stream_close(st);
    st->h.reset(st->h.data, KVB_RESET_RESTART, detail);
    st->next = 0;
    st->have_last = 0;

    if (kvb_stream_replay(st, 0, now_ms) != 0) {
        kvb_stream_give_up(st, "cannot replay the new process");
    }

    return -1;
}


static int
kvb_stream_hold(kvb_stream_t *st, uint64_t seq, const char *payload,
    size_t len)
{
    kvb_held_t  *h;

    if (st->nheld == st->hold_max
        || st->held_bytes + len > KVB_HOLD_BYTES_MAX)
    {
        return -1;
    }

    h = &st->held[st->nheld];
    h->payload = malloc(len ? len : 1);
    if (h->payload == NULL) {
        return -1;
    }

    memcpy(h->payload, payload, len);
    h->seq = seq;
    h->len = len;
    st->nheld++;
    st->held_bytes += len;

    return 0;
}


/* the replay is over: the held batches follow on, or the gap stays */

static void
kvb_stream_drain(kvb_stream_t *st)
{
    size_t       i;
    kvb_held_t  *h;

    if (st->nheld && st->held[0].seq > st->next) {
        kvb_stream_give_up(st, "replay ended before the live batches");
        return;
    }

    st->st.replays_ok++;

    for (i = 0; i < st->nheld; i++) {
        h = &st->held[i];

        if (h->seq < st->next) {
            st->st.duplicates++;

        } else if (h->seq == st->next) {
            kvb_stream_deliver(st, h->seq, h->payload, h->len);

        } else {
            /* a gap among the held: one more replay is not worth it */
            st->st.resets++;
            st->h.reset(st->h.data, KVB_RESET_GAP, "live batches lost");
            kvb_stream_deliver(st, h->seq, h->payload, h->len);
        }

        free(h->payload);
    }

    st->nheld = 0;
    st->held_bytes = 0;
}


static void
kvb_stream_give_up(kvb_stream_t *st, const char *detail)
{
    size_t       i;
    kvb_held_t  *h;

    st->st.replays_failed++;
    st->st.resets++;
    kvb_stream_close(st);

    st->h.reset(st->h.data, KVB_RESET_GAP, detail);

    for (i = 0; i < st->nheld; i++) {
        h = &st->held[i];

        if (h->seq >= st->next) {
            kvb_stream_deliver(st, h->seq, h->payload, h->len);
        }

        free(h->payload);
    }

    st->nheld = 0;
    st->held_bytes = 0;
}


static void
kvb_stream_close(kvb_stream_t *st)
{
    if (st->dealer != NULL) {
        zmq_close(st->dealer);
        st->dealer = NULL;
    }

    st->replaying = 0;
}


static uint64_t
kvb_be64(const unsigned char *p)
{
    unsigned  i;
    uint64_t  v;

    v = 0;

    for (i = 0; i < 8; i++) {
        v = (v << 8) | p[i];
    }

    return v;
}
