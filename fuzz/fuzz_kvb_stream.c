/*
 * libFuzzer target: kvbridge's stream state machine (tools/kvbridge/
 * kvb_stream.c) fed live frames, lost frames, strays, engine restarts,
 * replay answers (true, cut short, skipping, or any seq), timeouts and
 * reconnect checks, in any order.  The replay side is a real ZeroMQ
 * ROUTER on inproc, answering from the engine's history as vLLM does.
 *
 * Checked on every input:
 *   - between two resets, batches are handed on once each and in order
 *     (each seq the one after the last);
 *   - no more batches are handed on than frames and replies were fed;
 *   - without a replay endpoint, an engine that loses nothing and does
 *     not restart is never reset by strays, unless two strays in a row
 *     continue each other, or a stray came before the engine's first
 *     frame (the first frame is taken as it comes) (issue 18, defect 8);
 *   - and, by ASan and LSan, nothing held is read after free or leaked.
 *
 * The stream's budget clock is the input's too (kvb_stream_fuzz_now_us):
 * "time passes" also sets how far each reading of it moves, from 0 (no
 * budget ever runs out on time) to past a whole budget (every call
 * runs out after its first message), so calls cut short anywhere are
 * explored and replayed, whatever the machine's load.
 *
 *   make build/fuzz/fuzz_kvb_stream
 *   build/fuzz/fuzz_kvb_stream fuzz/corpus/kvb_stream
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "kvb_stream.h"


#define FZ_EP       "inproc://fuzz-kvb-stream"
#define FZ_HISTORY  512     /* the engine's replay buffer, in batches */


typedef struct {
    const uint8_t          *p;
    size_t                  left;
} fz_in_t;


typedef struct {
    uint64_t                epoch;      /* the engine process */
    uint64_t                seq;        /* its next seq */
    uint64_t                first;      /* the oldest it still buffers */

    int                     have_prev;
    uint64_t                prev;       /* the last seq handed on */
    uint64_t                handed, fed, resets;
} fz_state_t;


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fz_init(void);
static void fz_on_batch(void *data, uint64_t seq, const char *payload,
    size_t len);
static void fz_on_reset(void *data, kvb_reset_e why, const char *detail);
static void fz_frame(kvb_stream_t *st, fz_state_t *s, uint64_t seq,
    const char *payload, size_t len, uint64_t now);
static void fz_replay(fz_in_t *in, fz_state_t *s);
static void fz_send(const unsigned char *id, size_t id_len, uint64_t seq,
    const char *payload, size_t len);
static void fz_payload(char *buf, size_t size, uint64_t epoch,
    uint64_t seq);
static void fz_flush_router(void);
static unsigned fz_byte(fz_in_t *in);
static uint64_t fz_u64(fz_in_t *in);


static void      *fz_zctx, *fz_router;
static uint64_t   fz_clock_us, fz_pace_us;


uint64_t kvb_stream_fuzz_now_us(void);


uint64_t
kvb_stream_fuzz_now_us(void)
{
    fz_clock_us += fz_pace_us;

    return fz_clock_us;
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int                    replay, lost, pair, last_stray, engine;
    char                   payload[48];
    unsigned               op, flags, n, b;
    uint64_t               now, seq, stray_prev;
    fz_in_t                in;
    fz_state_t             s;
    kvb_stream_t          *st;
    kvb_stream_handler_t   h;

    fz_init();

    in.p = data;
    in.left = size;
    memset(&s, 0, sizeof(s));

    fz_clock_us = 0;
    fz_pace_us = 0;

    flags = fz_byte(&in);
    replay = flags & 1;

    h.batch = fz_on_batch;
    h.reset = fz_on_reset;
    h.data = &s;

    st = kvb_stream_create(fz_zctx, replay ? FZ_EP : NULL, 50,
                           1 + ((flags >> 1) & 63), &h);
    if (st == NULL) {
        return 0;
    }

    kvb_stream_set_max_batch(st, 4096);

    now = 1000;
    lost = 0;
    pair = 0;
    last_stray = 0;
    stray_prev = 0;
    engine = 0;

    for (n = 0; in.left > 0 && n < 4096; n++) {
        b = fz_byte(&in);
        op = b % 8;

        switch (op) {

        case 0:     /* the engine publishes */
        case 1:
            fz_payload(payload, sizeof(payload), s.epoch, s.seq);
            fz_frame(st, &s, s.seq, payload, strlen(payload), now);
            s.seq++;
            last_stray = 0;
            engine = 1;
            break;

        case 2:     /* the engine publishes, the wire loses it */
            s.seq++;
            lost = 1;
            break;

        case 3:     /* a stray: near the engine's seq, or anywhere */
            seq = fz_byte(&in);
            seq = (seq & 0x80) ? fz_u64(&in) : s.seq + (seq & 0x3f) - 32;

            if (seq == UINT64_MAX) {
                seq--;
            }

            if ((last_stray && seq == stray_prev + 1) || !engine) {
                pair = 1;
            }

            fz_frame(st, &s, seq, "stray", 5, now);
            last_stray = 1;
            stray_prev = seq;
            break;

        case 4:     /* the engine's replay socket answers */
            fz_replay(&in, &s);
            kvb_stream_io(st, now);
            break;

        case 5:     /* time passes, the budget's clock at a new pace */
            now += fz_byte(&in);
            fz_pace_us = (uint64_t) (b >> 3) * 200;
            kvb_stream_tick(st, now);
            break;

        case 6:     /* the socket reconnected */
            kvb_stream_verify(st, now);
            break;

        case 7:     /* the engine restarts */
            s.epoch++;
            s.seq = 0;
            s.first = 0;
            lost = 1;
            break;
        }

        if (s.seq - s.first > FZ_HISTORY) {
            s.first = s.seq - FZ_HISTORY;
        }

        if (s.handed > s.fed) {
            abort();
        }
    }

    /* whatever is running ends: its time runs out, held batches go on */

    now += 1000;
    kvb_stream_tick(st, now);

    for (n = 0; n < 1000 && kvb_stream_deadline(st) == 0; n++) {
        kvb_stream_tick(st, now);
    }

    if (kvb_stream_deadline(st) != UINT64_MAX || s.handed > s.fed) {
        abort();
    }

    if (!replay && !lost && !pair && s.resets != 0) {
        /* one stray frame at a time must never reset the engine */
        abort();
    }

    kvb_stream_destroy(st);
    fz_flush_router();

    return 0;
}


static void
fz_init(void)
{
    int  zero;

    if (fz_zctx != NULL) {
        return;
    }

    fz_zctx = zmq_ctx_new();
    fz_router = zmq_socket(fz_zctx, ZMQ_ROUTER);

    if (fz_zctx == NULL || fz_router == NULL
        || zmq_bind(fz_router, FZ_EP) != 0)
    {
        abort();
    }

    zero = 0;
    zmq_setsockopt(fz_router, ZMQ_LINGER, &zero, sizeof(zero));
}


static void
fz_on_batch(void *data, uint64_t seq, const char *payload, size_t len)
{
    fz_state_t  *s = data;

    /* once each, in order, between resets */
    if (s->have_prev && seq != s->prev + 1) {
        abort();
    }

    s->have_prev = 1;
    s->prev = seq;
    s->handed++;
}


static void
fz_on_reset(void *data, kvb_reset_e why, const char *detail)
{
    fz_state_t  *s = data;

    if (detail == NULL || detail[0] == '\0') {
        abort();
    }

    s->have_prev = 0;
    s->resets++;
}


static void
fz_frame(kvb_stream_t *st, fz_state_t *s, uint64_t seq,
    const char *payload, size_t len, uint64_t now)
{
    unsigned char  b[8];
    unsigned       i;

    for (i = 0; i < 8; i++) {
        b[i] = (unsigned char) (seq >> (56 - 8 * i));
    }

    s->fed++;
    kvb_stream_frame(st, b, 8, payload, len, now);
}


/*
 * One request, if one waits, answered from the engine's buffer as the
 * input says: whole, cut short, skipping one, with a made-up seq, too
 * big, or with no end.
 */

static void
fz_replay(fz_in_t *in, fz_state_t *s)
{
    int             n;
    char            payload[48], big[8192];
    size_t          id_len;
    unsigned        how, i, count;
    uint64_t        start, seq;
    unsigned char   id[256], req[8], empty[8];
    zmq_pollitem_t  it = { fz_router, 0, ZMQ_POLLIN, 0 };

    if (zmq_poll(&it, 1, 0) != 1) {
        return;
    }

    n = zmq_recv(fz_router, id, sizeof(id), ZMQ_DONTWAIT);
    if (n <= 0 || (size_t) n > sizeof(id)) {
        fz_flush_router();
        return;
    }

    id_len = (size_t) n;
    zmq_recv(fz_router, empty, sizeof(empty), ZMQ_DONTWAIT);

    if (zmq_recv(fz_router, req, sizeof(req), ZMQ_DONTWAIT) != 8) {
        return;
    }

    start = 0;

    for (i = 0; i < 8; i++) {
        start = (start << 8) | req[i];
    }

    how = fz_byte(in);
    count = 0;

    for (seq = (start > s->first) ? start : s->first;
         seq < s->seq && count < 600; seq++, count++)
    {
        if ((how & 3) == 1 && count == (how >> 2)) {
            continue;                   /* the ROUTER dropped one */
        }

        if ((how & 3) == 2 && count == (how >> 2)) {
            break;                      /* cut short */
        }

        fz_payload(payload, sizeof(payload), s->epoch, seq);
        s->fed++;
        fz_send(id, id_len, seq, payload, strlen(payload));
    }

    if ((how & 0x30) == 0x10) {
        s->fed++;
        fz_send(id, id_len, fz_u64(in), "made up", 7);
    }

    if ((how & 0x30) == 0x20) {
        memset(big, 'b', sizeof(big));
        s->fed++;
        fz_send(id, id_len, s->seq, big, sizeof(big));
    }

    if (!(how & 0x40)) {
        fz_send(id, id_len, UINT64_MAX, "", 0);
    }
}


static void
fz_send(const unsigned char *id, size_t id_len, uint64_t seq,
    const char *payload, size_t len)
{
    unsigned char  b[8];
    unsigned       i;

    for (i = 0; i < 8; i++) {
        b[i] = (unsigned char) (seq >> (56 - 8 * i));
    }

    zmq_send(fz_router, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(fz_router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(fz_router, b, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(fz_router, payload, len, ZMQ_DONTWAIT);
}


static void
fz_payload(char *buf, size_t size, uint64_t epoch, uint64_t seq)
{
    snprintf(buf, size, "e%llu:%llu", (unsigned long long) epoch,
             (unsigned long long) seq);
}


/* requests left over from this input must not answer for the next */

static void
fz_flush_router(void)
{
    zmq_msg_t  m;

    for ( ;; ) {
        zmq_msg_init(&m);

        if (zmq_msg_recv(&m, fz_router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }

        zmq_msg_close(&m);
    }
}


static unsigned
fz_byte(fz_in_t *in)
{
    if (in->left == 0) {
        return 0;
    }

    in->left--;

    return *in->p++;
}


static uint64_t
fz_u64(fz_in_t *in)
{
    unsigned  i;
    uint64_t  v;

    v = 0;

    for (i = 0; i < 8; i++) {
        v = (v << 8) | fz_byte(in);
    }

    return v;
}
