/*
 * kvbridge: one engine's event stream in order (kvb_stream.h).
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>
#include <zmq.h>

#include "kvb_stream.h"
#include "kvb_zmsg.h"


/* what batches held during a replay may take, whatever their number */
#define KVB_HOLD_BYTES_MAX  (64 * 1024 * 1024)

/*
 * Held batches dropped at once are freed a slice a tick: glibc gives the
 * freed top of its heap back to the kernel as it goes, and 64 MB of
 * batches freed in one call held the loop 11-220 ms (bench_loop.sh, the
 * event flood, at the replay's give-up).
 */
#define KVB_FREE_SLICE      64
#define KVB_FREE_BYTES      (4 * 1024 * 1024)

#define KVB_SEQ_END         UINT64_MAX      /* -1: the replay's end */

/* past this, time since the stream moved adds nothing to a plausible jump */
#define KVB_JUMP_MS_MAX     (1000ULL * 86400 * 365)


typedef struct {
    uint64_t                seq;
    char                   *payload;
    size_t                  len;
} kvb_held_t;


/* what one call may still do */
typedef struct {
    uint64_t                start_us;
    unsigned                msgs;
    size_t                  bytes;
} kvb_budget_t;


struct kvb_stream_s {
    void                   *zctx;
    char                   *replay_ep;
    void                   *dealer;
    unsigned                timeout_ms;
    size_t                  max_msg;
    kvb_stream_handler_t    h;

    unsigned                started:1;
    unsigned                replaying:1;
    unsigned                verifying:1;    /* next - 1 is replayed first */
    unsigned                have_last:1;
    unsigned                draining:1;     /* held batches to hand on */
    unsigned                after_reset:1;  /* the next jump is expected */
    unsigned                checking:1;     /* a verify for a suspect */
    unsigned                have_cand:1;    /* a suspect kept aside */
    unsigned                own:1;          /* the engine's own socket */
    uint64_t                next;           /* the seq expected */
    uint64_t                last_digest;    /* of next - 1's payload */
    uint64_t                deadline;
    uint64_t                now;            /* the caller's clock */
    uint64_t                moved;          /* when next last moved */

    kvb_held_t             *held;           /* [drained, nheld) to go */
    size_t                  nheld, drained, hold_max, held_bytes;
    kvb_held_t             *dead;           /* dropped, to be freed */
    size_t                  ndead;
    kvb_held_t              cand;

    kvb_stream_stats_t      st;
};


static void kvb_stream_take(kvb_stream_t *st, uint64_t seq,
    const char *payload, size_t len);
static void kvb_stream_live(kvb_stream_t *st, uint64_t seq,
    const char *payload, size_t len);
static void kvb_stream_jump(kvb_stream_t *st, uint64_t seq,
    const char *payload, size_t len);
static void kvb_stream_suspect(kvb_stream_t *st, uint64_t seq,
    const char *payload, size_t len);
static int kvb_stream_plausible(const kvb_stream_t *st, uint64_t from,
    uint64_t seq);
static void kvb_stream_drop_cand(kvb_stream_t *st);
static void kvb_stream_deliver(kvb_stream_t *st, uint64_t seq,
    const char *payload, size_t len);
static void kvb_stream_reply(kvb_stream_t *st, kvb_zmsg_t *m);
static int kvb_stream_replay(kvb_stream_t *st, uint64_t from);
static int kvb_stream_replay_gap(kvb_stream_t *st);
static int kvb_stream_check(kvb_stream_t *st, uint64_t seq,
    const char *payload, size_t len);
static int kvb_stream_hold(kvb_stream_t *st, uint64_t seq,
    const char *payload, size_t len);
static void kvb_stream_ended(kvb_stream_t *st);
static void kvb_stream_drop_held(kvb_stream_t *st);
static void kvb_stream_free_dead(kvb_stream_t *st);
static void kvb_stream_drain(kvb_stream_t *st, kvb_budget_t *b);
static void kvb_stream_give_up(kvb_stream_t *st, const char *detail);
static void kvb_stream_close(kvb_stream_t *st);
static void kvb_budget_start(kvb_budget_t *b);
static int kvb_budget_left(const kvb_budget_t *b);
static uint64_t kvb_budget_used_us(const kvb_budget_t *b);
static uint64_t kvb_now_us(void);
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
    st->dead = calloc(hold_max ? hold_max : 1, sizeof(kvb_held_t));
    if (st->held == NULL || st->dead == NULL) {
        free(st->held);
        free(st->dead);
        free(st);
        return NULL;
    }

    if (replay != NULL) {
        st->replay_ep = strdup(replay);
        if (st->replay_ep == NULL) {
            free(st->held);
            free(st->dead);
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

    while (st->nheld > st->drained) {
        free(st->held[--st->nheld].payload);
    }

    while (st->ndead) {
        free(st->dead[--st->ndead].payload);
    }

    free(st->cand.payload);
    free(st->held);
    free(st->dead);
    free(st->replay_ep);
    free(st);
}


void
kvb_stream_set_max_batch(kvb_stream_t *st, size_t max_bytes)
{
    st->max_msg = max_bytes;
}


void
kvb_stream_set_own_socket(kvb_stream_t *st, int own)
{
    st->own = own ? 1 : 0;
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

    if (s == KVB_SEQ_END) {
        /* a replay's end marker has no place in the live stream */
        st->st.bad_frames++;
        return;
    }

    st->now = now_ms;

    kvb_stream_take(st, s, payload, len);
}


/* a live batch: held behind a replay or held batches, or handed on */

static void
kvb_stream_take(kvb_stream_t *st, uint64_t seq, const char *payload,
    size_t len)
{
    if (st->replaying || st->draining) {

        if (!kvb_stream_plausible(st, st->next, seq)) {
            /* a restart shows again once the replay is over */
            st->st.suspects++;
            st->st.strays++;
            return;
        }

        if (kvb_stream_hold(st, seq, payload, len) == 0) {
            return;
        }

        /*
         * Too much to hold: the replay is too slow to be worth it, or
         * the engine outruns what the budget lets through.  Handing on
         * all that is held at once held the loop (4,096 batches: 103 ms
         * in make bench-loop); the held batches are dropped as lost
         * instead, nginx is told to forget (a gap), and the stream goes
         * on from this batch.
         */
        if (st->replaying) {
            kvb_stream_give_up(st, "live batches past the hold limit");

        } else {
            st->st.resets++;
            st->h.reset(st->h.data, KVB_RESET_GAP,
                        "live batches past the hold limit");
        }

        kvb_stream_drop_held(st);
        st->next = seq;
        kvb_stream_deliver(st, seq, payload, len);
        return;
    }

    kvb_stream_live(st, seq, payload, len);
}


static void
kvb_stream_drop_held(kvb_stream_t *st)
{
    kvb_held_t  *h;

    while (st->nheld > st->drained) {
        h = &st->held[--st->nheld];

        if (st->ndead < st->hold_max) {
            st->dead[st->ndead++] = *h;     /* freed by the ticks */

        } else {
            free(h->payload);
        }

        h->payload = NULL;
    }

    st->nheld = 0;
    st->drained = 0;
    st->held_bytes = 0;
    st->draining = 0;
    st->after_reset = 0;
}


void *
kvb_stream_socket(const kvb_stream_t *st)
{
    return st->replaying ? st->dealer : NULL;
}


void
kvb_stream_io(kvb_stream_t *st, uint64_t now_ms)
{
    size_t        i;
    uint64_t      used;
    kvb_zmsg_t    m;
    kvb_budget_t  b;

    kvb_budget_start(&b);
    st->now = now_ms;

    while (st->replaying) {

        if (!kvb_budget_left(&b)) {
            /* the rest waits for the next turn: others go first */
            st->st.io_yields++;
            break;
        }

        if (now_ms + kvb_budget_used_us(&b) / 1000 >= st->deadline) {
            kvb_stream_give_up(st, "replay timed out");
            break;
        }

        if (!kvb_zmsg_recv(st->dealer, &m, 4)) {
            break;
        }

        b.msgs++;

        for (i = 0; i < m.n; i++) {
            b.bytes += zmq_msg_size(&m.part[i]);
        }

        st->now = now_ms + kvb_budget_used_us(&b) / 1000;
        kvb_stream_reply(st, &m);
        kvb_zmsg_close(&m);
    }

    if (st->draining) {
        kvb_stream_drain(st, &b);
    }

    used = kvb_budget_used_us(&b);

    if (used > st->st.io_max_us) {
        st->st.io_max_us = used;
    }
}


/* one message from the replay socket */

static void
kvb_stream_reply(kvb_stream_t *st, kvb_zmsg_t *m)
{
    char      detail[96];
    size_t    n, len;
    uint64_t  seq;
    char     *payload;

    /* ["", [topic,] seq, payload]: newer vLLM adds the topic */

    n = m->n;

    if (m->too_long || n < 3 || zmq_msg_size(&m->part[0]) != 0
        || zmq_msg_size(&m->part[n - 2]) != 8)
    {
        st->st.bad_frames++;
        return;
    }

    seq = kvb_be64(zmq_msg_data(&m->part[n - 2]));
    payload = zmq_msg_data(&m->part[n - 1]);
    len = zmq_msg_size(&m->part[n - 1]);

    if (st->verifying && kvb_stream_check(st, seq, payload, len) != 0) {
        /* a restart: a replay from 0 asked instead, or given up */
        return;
    }

    if (seq == KVB_SEQ_END) {
        kvb_stream_ended(st);

    } else if (seq < st->next) {
        st->st.duplicates++;

    } else if (seq == st->next) {
        kvb_stream_deliver(st, seq, payload, len);

    } else {
        snprintf(detail, sizeof(detail), "replay skipped seq %llu to %llu",
                 (unsigned long long) st->next,
                 (unsigned long long) seq - 1);
        kvb_stream_give_up(st, detail);
    }
}


uint64_t
kvb_stream_deadline(const kvb_stream_t *st)
{
    if (st->draining || st->ndead) {
        return 0;
    }

    return st->replaying ? st->deadline : UINT64_MAX;
}


void
kvb_stream_tick(kvb_stream_t *st, uint64_t now_ms)
{
    kvb_budget_t  b;

    st->now = now_ms;

    if (st->replaying && now_ms >= st->deadline) {
        kvb_stream_give_up(st, "replay timed out");
    }

    if (st->draining) {
        kvb_budget_start(&b);
        kvb_stream_drain(st, &b);
    }

    kvb_stream_free_dead(st);
}


/* a slice of the dropped batches freed (KVB_FREE_SLICE) */

static void
kvb_stream_free_dead(kvb_stream_t *st)
{
    size_t  n, bytes;

    for (n = 0, bytes = 0;
         st->ndead && n < KVB_FREE_SLICE && bytes < KVB_FREE_BYTES;
         n++)
    {
        st->ndead--;
        bytes += st->dead[st->ndead].len;
        free(st->dead[st->ndead].payload);
        st->dead[st->ndead].payload = NULL;
    }
}


const kvb_stream_stats_t *
kvb_stream_stats(const kvb_stream_t *st)
{
    return &st->st;
}


static void
kvb_stream_live(kvb_stream_t *st, uint64_t seq, const char *payload,
    size_t len)
{
    kvb_held_t  c;

    if (!st->started) {
        st->started = 1;
        st->next = 0;
        st->moved = st->now;

        if (seq == 0 || st->replay_ep == NULL) {
            /* from its start, or as much of it as can be had */
            st->next = seq;
            kvb_stream_deliver(st, seq, payload, len);
            return;
        }

        kvb_stream_jump(st, seq, payload, len);
        return;
    }

    if (seq == st->next) {
        kvb_stream_drop_cand(st);
        kvb_stream_deliver(st, seq, payload, len);
        return;
    }

    if (seq + 1 == st->next && st->have_last) {
        /*
         * The seq just handed on, again: live batches never repeat, and a
         * new process would have to be at exactly that seq.  A stray took
         * the engine's seq first: dropping this one keeps the stream.
         * It is a stray too, so a suspect kept aside is not continued
         * by the frame after it: kept, a peer sending X, the last seq
         * and X + 1 reset the engine (fuzz_kvb_stream, issue 21).
         */
        kvb_stream_drop_cand(st);
        st->st.duplicates++;
        st->st.suspects++;
        st->st.strays++;
        return;
    }

    if (st->have_cand && seq == st->cand.seq + 1) {
        /* the suspect kept aside is continued: it was real */
        c = st->cand;
        st->have_cand = 0;
        st->cand.payload = NULL;
        kvb_stream_jump(st, c.seq, c.payload, c.len);
        free(c.payload);

        /* seq follows it: handed on, or held behind a replay */
        kvb_stream_take(st, seq, payload, len);
        return;
    }

    if (st->replay_ep != NULL && kvb_stream_plausible(st, st->next, seq)) {
        /* a gap: the replay tells what is missing, and if seq is real */
        kvb_stream_drop_cand(st);
        kvb_stream_jump(st, seq, payload, len);
        return;
    }

    if (st->own && st->replay_ep == NULL) {
        /*
         * Frames from a socket of the bridge's own, connected to the
         * engine's endpoint, are the engine's: with nothing to check them
         * against, waiting for the next frame would only leave an engine
         * that goes idle after a loss with its last batch unpublished.
         */
        kvb_stream_drop_cand(st);
        kvb_stream_jump(st, seq, payload, len);
        return;
    }

    kvb_stream_suspect(st, seq, payload, len);
}


/*
 * A seq that is not the next one, taken as what it says: back is a new
 * engine process, ahead is a gap, replayed if it can be.
 */

static void
kvb_stream_jump(kvb_stream_t *st, uint64_t seq, const char *payload,
    size_t len)
{
    if (seq < st->next) {
        /*
         * Live batches never repeat: a replay's overlap is sorted out
         * while they are held.  A seq below the expected one, confirmed,
         * is a new engine process (its seq 0 may have been missed while
         * the socket reconnected).
         */

        st->st.restarts++;
        st->st.resets++;
        st->h.reset(st->h.data, KVB_RESET_RESTART, "seq went back");
        st->next = 0;
        st->have_last = 0;

        if (seq == 0 || st->replay_ep == NULL) {
            st->next = seq;
            kvb_stream_deliver(st, seq, payload, len);
            return;
        }
    }

    /* a gap: next .. seq - 1 are missing */

    st->st.gaps++;

    if (st->replay_ep != NULL && kvb_stream_replay_gap(st) == 0
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


/*
 * A seq back or far ahead of the established sequence (kvb_stream.h):
 * the replay tells whose it is, else the frame after it does.
 */

static void
kvb_stream_suspect(kvb_stream_t *st, uint64_t seq, const char *payload,
    size_t len)
{
    st->st.suspects++;
    kvb_stream_drop_cand(st);

    if (st->replay_ep != NULL && st->have_last && st->next > 0
        && !kvb_stream_plausible(st, st->next, seq)
        && kvb_stream_replay_gap(st) == 0)
    {
        /* the frame itself is dropped: if it is real, the replay has it */
        st->checking = 1;
        return;
    }

    st->cand.payload = malloc(len ? len : 1);
    if (st->cand.payload == NULL) {
        st->st.strays++;
        return;
    }

    memcpy(st->cand.payload, payload, len);
    st->cand.seq = seq;
    st->cand.len = len;
    st->have_cand = 1;
}


/* seq can follow from, given the time since the stream last moved */

static int
kvb_stream_plausible(const kvb_stream_t *st, uint64_t from, uint64_t seq)
{
    uint64_t  ms, ahead;

    if (seq < from || seq == KVB_SEQ_END) {
        return 0;
    }

    ms = (st->now > st->moved) ? st->now - st->moved : 0;
    ms = (ms < KVB_JUMP_MS_MAX) ? ms : KVB_JUMP_MS_MAX;
    ahead = KVB_STREAM_JUMP_BASE + ms * KVB_STREAM_JUMP_RATE / 1000;

    return seq - from <= ahead;
}


static void
kvb_stream_drop_cand(kvb_stream_t *st)
{
    if (st->have_cand) {
        st->st.strays++;
        st->have_cand = 0;
    }

    free(st->cand.payload);
    st->cand.payload = NULL;
}


static void
kvb_stream_deliver(kvb_stream_t *st, uint64_t seq, const char *payload,
    size_t len)
{
    st->next = seq + 1;
    st->moved = st->now;
    st->after_reset = 0;
    st->last_digest = XXH3_64bits(payload, len);
    st->have_last = 1;
    st->st.batches++;
    st->h.batch(st->h.data, seq, payload, len);
}


static int
kvb_stream_replay(kvb_stream_t *st, uint64_t from)
{
    int            zero, hwm;
    int64_t        max;
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

    /*
     * What a replay may queue here is bounded: a flood stops at the
     * high-water mark (the engine's ROUTER drops past it, and the replay
     * skips a seq), a message past --max-batch ends the connection.
     */

    zero = 0;
    hwm = KVB_STREAM_REPLAY_HWM;
    zmq_setsockopt(st->dealer, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(st->dealer, ZMQ_RCVHWM, &hwm, sizeof(hwm));

    if (st->max_msg) {
        max = (int64_t) st->max_msg + 64;
        zmq_setsockopt(st->dealer, ZMQ_MAXMSGSIZE, &max, sizeof(max));
    }

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
    st->checking = 0;
    st->deadline = st->now + st->timeout_ms;

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
kvb_stream_replay_gap(kvb_stream_t *st)
{
    if (!st->have_last || st->next == 0) {
        return kvb_stream_replay(st, st->next);
    }

    if (kvb_stream_replay(st, st->next - 1) != 0) {
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

    st->now = now_ms;
    st->st.verifies++;

    return kvb_stream_replay_gap(st);
}


int
kvb_stream_rebuild(kvb_stream_t *st, uint64_t now_ms)
{
    if (st->replay_ep == NULL || st->replaying || st->have_last) {
        return -1;
    }

    /* live batches that come meanwhile are held, as for a gap */
    st->now = now_ms;
    st->started = 1;
    st->next = 0;
    st->moved = now_ms;

    return kvb_stream_replay(st, 0);
}


/*
 * The first message of a verifying replay: 0 when it is the batch
 * delivered last, unchanged (the replay goes on); -1 when the engine is
 * another process: its owner starts again from a clean slate and the
 * new process is replayed from its start, the live batches still held.
 */

static int
kvb_stream_check(kvb_stream_t *st, uint64_t seq, const char *payload,
    size_t len)
{
    char  detail[96];

    st->verifying = 0;

    if (seq == st->next - 1) {
        if (XXH3_64bits(payload, len) == st->last_digest) {
            /* the same process: the batch is known, the rest follows */
            if (st->checking) {
                st->st.strays++;
                st->checking = 0;
            }

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

    if (kvb_stream_replay(st, 0) != 0) {
        kvb_stream_give_up(st, "cannot replay the new process");
    }

    return -1;
}


static int
kvb_stream_hold(kvb_stream_t *st, uint64_t seq, const char *payload,
    size_t len)
{
    char        *copy;
    size_t       i;
    kvb_held_t  *h;

    if (st->nheld == st->hold_max
        || st->held_bytes + len > KVB_HOLD_BYTES_MAX)
    {
        return -1;
    }

    copy = malloc(len ? len : 1);
    if (copy == NULL) {
        return -1;
    }

    memcpy(copy, payload, len);

    /*
     * in seq order, a stray among them or not: the engine's batches come
     * in order, almost always at the end
     */

    for (i = st->nheld; i > st->drained && st->held[i - 1].seq > seq; i--) {
        st->held[i] = st->held[i - 1];
    }

    h = &st->held[i];
    h->payload = copy;
    h->seq = seq;
    h->len = len;
    st->nheld++;
    st->held_bytes += len;

    return 0;
}


/* the replay's end: the held batches follow on, or the gap stays */

static void
kvb_stream_ended(kvb_stream_t *st)
{
    kvb_stream_close(st);

    /*
     * A held batch past the replay's end was published before the replay
     * was asked for, yet the engine did not replay it: unless the batch
     * after it is held too, it is not the engine's (kvb_stream_drain())
     */

    st->draining = (st->nheld > st->drained);
    st->st.replays_ok++;
}


/*
 * Hands on the held batches, in seq order, as many as the budget allows
 * (b NULL: all): what the replay already gave is dropped; a gap among
 * them is a reset (one more replay is not worth it) if the batch after
 * the gap is continued by the next one held, else it is a stray's.
 */

static void
kvb_stream_drain(kvb_stream_t *st, kvb_budget_t *b)
{
    kvb_held_t  *h;

    while (st->nheld > st->drained && (b == NULL || kvb_budget_left(b))) {
        h = &st->held[st->drained++];
        st->held_bytes -= h->len;

        if (b != NULL) {
            b->msgs++;
            b->bytes += h->len;
        }

        if (h->seq < st->next) {
            st->st.duplicates++;

        } else if (h->seq == st->next) {
            kvb_stream_deliver(st, h->seq, h->payload, h->len);

        } else if (st->after_reset) {
            kvb_stream_deliver(st, h->seq, h->payload, h->len);

        } else if (st->nheld > st->drained
                   && st->held[st->drained].seq == h->seq + 1
                   && kvb_stream_plausible(st, st->next, h->seq))
        {
            st->st.resets++;
            st->h.reset(st->h.data, KVB_RESET_GAP, "live batches lost");
            kvb_stream_deliver(st, h->seq, h->payload, h->len);

        } else {
            st->st.suspects++;
            st->st.strays++;
        }

        free(h->payload);
        h->payload = NULL;
    }

    if (st->nheld == st->drained) {
        st->nheld = 0;
        st->drained = 0;
        st->held_bytes = 0;
        st->draining = 0;

    } else if (b != NULL) {
        st->st.io_yields++;
    }
}


/* the replay failed: a gap for good, the held batches go on after it */

static void
kvb_stream_give_up(kvb_stream_t *st, const char *detail)
{
    st->st.replays_failed++;
    st->st.resets++;
    kvb_stream_close(st);

    st->h.reset(st->h.data, KVB_RESET_GAP, detail);
    st->after_reset = 1;
    st->draining = (st->nheld > st->drained);
}


static void
kvb_stream_close(kvb_stream_t *st)
{
    if (st->dealer != NULL) {
        zmq_close(st->dealer);
        st->dealer = NULL;
    }

    st->replaying = 0;
    st->verifying = 0;
    st->checking = 0;
}


static void
kvb_budget_start(kvb_budget_t *b)
{
    b->start_us = kvb_now_us();
    b->msgs = 0;
    b->bytes = 0;
}


/*
 * The first message always goes: a call that a preempted process enters
 * with its time already spent would otherwise do nothing, and the next
 * one again (fuzz_kvb_stream, a clock that moves 5.8 ms a reading).
 */

static int
kvb_budget_left(const kvb_budget_t *b)
{
    return b->msgs == 0
           || (b->msgs < KVB_STREAM_IO_MSGS && b->bytes < KVB_STREAM_IO_BYTES
               && kvb_budget_used_us(b) < KVB_STREAM_IO_US);
}


static uint64_t
kvb_budget_used_us(const kvb_budget_t *b)
{
    return kvb_now_us() - b->start_us;
}


#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION

/*
 * Under libFuzzer the input sets the clock (fuzz/fuzz_kvb_stream.c):
 * a budget that runs out mid-call is then a case the fuzzer explores and
 * replays, not an accident of the machine's load.  A CI run on a busy
 * machine met one the fuzzer could not find again (issue 21, stop 29).
 */

uint64_t kvb_stream_fuzz_now_us(void);

static uint64_t
kvb_now_us(void)
{
    return kvb_stream_fuzz_now_us();
}

#else

static uint64_t
kvb_now_us(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);

    return (uint64_t) ts.tv_sec * 1000000 + (uint64_t) ts.tv_nsec / 1000;
}

#endif


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
