/*
 * kvbridge: one engine's event stream in order, whatever the wire loses.
 *
 * vLLM and SGLang number their batches (seq, 8 bytes big-endian, from 0
 * per process) and keep the last buffer_steps of them for replay behind a
 * ROUTER socket.  This file turns the frames the SUB socket delivers into
 * batches handed on exactly once and in order:
 *
 *   - the next seq: handed on;
 *   - a seq that goes back: the engine restarted (live batches never
 *     repeat; a replay overlapping them is sorted out while they wait);
 *   - a gap: the stream asks the replay socket for everything from the
 *     first missing seq, holds live batches meanwhile (bounded), hands on
 *     the replayed ones and then the held ones.  A replay that skips a
 *     seq (ROUTER drops past its high-water mark, silently), never ends,
 *     or does not reach the held batches, fails;
 *   - a replay starts at the last seq handed on, which must come back
 *     the same (a digest of its payload): otherwise the engine is a new
 *     process that has run past the seq the bridge saw (while the bridge
 *     was cut off from it), and it is replayed from its start instead;
 *     the same check runs when the SUB socket reconnects;
 *   - a restart, or a gap that replay cannot close (no replay endpoint,
 *     the seq no longer buffered, a failed replay): the stream says so
 *     (on_reset), so that the engine's owner starts again from a clean
 *     slate, and goes on from the batch at hand.
 *
 * The first batch after the bridge starts is a gap from 0 when its seq is
 * not 0: an engine that ran before the bridge is replayed from its start
 * if it still buffers it.
 *
 * A frame is not proof of anything: anyone who reaches the collector can
 * send one on an engine's topic.  So a seq that goes back, or one further
 * ahead than the engine can have published since the stream last moved
 * (KVB_STREAM_JUMP_BASE batches plus KVB_STREAM_JUMP_RATE a second), is
 * a suspect, acted on only once confirmed:
 *
 *   - with a replay endpoint, the suspect is dropped and the replay is
 *     asked for the last batch delivered: the same batch back means the
 *     engine is the one already followed (the suspect was a stray);
 *     another batch, or none, is a restart, and the new process is
 *     replayed from its start, which brings the suspect's seq if real.
 *     A plausible gap is replayed as above; a held batch the replay did
 *     not reach is kept only if the one after it is held too;
 *   - without one, on the collector, any seq but the next one (a gap
 *     too) is kept aside:
 *     the frame right after it continuing from it (seq + 1) confirms it,
 *     and it is then a restart (back) or a gap (ahead); the established
 *     sequence going on, or another suspect, drops it;
 *   - without one, on a socket the bridge connected to the engine's own
 *     endpoint (kvb_stream_set_own_socket()), where nobody else can send,
 *     a gap or a seq going back is acted on at once: waiting would leave
 *     an engine that goes idle after a loss with its last batch unsent;
 *   - the seq just handed on, again, is dropped: live batches never
 *     repeat, and a new process would have to be at exactly that seq.
 *
 * Frames from the established sequence flow meanwhile; during a replay a
 * suspect live frame is dropped (a real restart shows again afterwards).
 * The cost: without a replay endpoint a collected engine's restart or
 * gap is seen one batch late.  What this does not stop: a peer that
 * sends two frames that continue each other, or the engine's next seq
 * before the engine does (its batch then takes the engine's place,
 * without a reset); only keeping such peers off the collector does.
 *
 * No call holds the caller long: kvb_stream_io() reads at most
 * KVB_STREAM_IO_MSGS messages, KVB_STREAM_IO_BYTES bytes and
 * KVB_STREAM_IO_US of time (whichever comes first, batches handed on
 * included; the first message always goes, so a call entered late
 * still moves the stream), and the replay timeout is checked between
 * messages, not only between turns.  Held batches are handed on under
 * the same budget from kvb_stream_tick() (kvb_stream_deadline() says
 * "now" until they are).  The replay socket queues at most
 * KVB_STREAM_REPLAY_HWM messages of at most the size
 * kvb_stream_set_max_batch() sets: past that a flooding replay loses
 * messages, skips a seq and fails as a gap.
 */

#ifndef _KVB_STREAM_H_INCLUDED_
#define _KVB_STREAM_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


typedef enum {
    KVB_RESET_RESTART = 0,      /* seq went back: a new engine process */
    KVB_RESET_GAP               /* batches lost for good */
} kvb_reset_e;


typedef struct {
    /* a batch, in order; payload is the msgpack frame */
    void                  (*batch)(void *data, uint64_t seq,
                                   const char *payload, size_t len);
    /* what the batches so far said may be wrong: start again */
    void                  (*reset)(void *data, kvb_reset_e why,
                                   const char *detail);
    void                   *data;
} kvb_stream_handler_t;


typedef struct {
    uint64_t                batches;
    uint64_t                duplicates;
    uint64_t                gaps;
    uint64_t                replays_ok;
    uint64_t                replays_failed;
    uint64_t                restarts;
    uint64_t                resets;
    uint64_t                bad_frames;
    uint64_t                verifies;       /* on reconnects */
    uint64_t                suspects;       /* seq back or far ahead */
    uint64_t                strays;         /* suspects never confirmed */
    uint64_t                io_yields;      /* calls ended by the budget */
    uint64_t                io_max_us;      /* the longest call */
} kvb_stream_stats_t;


/* one call's budget, and what a suspect seq is (see above) */
#define KVB_STREAM_IO_MSGS      256
#define KVB_STREAM_IO_BYTES     (1024 * 1024)
#define KVB_STREAM_IO_US        5000
#define KVB_STREAM_REPLAY_HWM   1000
#define KVB_STREAM_JUMP_BASE    100000
#define KVB_STREAM_JUMP_RATE    10000


typedef struct kvb_stream_s  kvb_stream_t;


/*
 * zctx: the ZeroMQ context; replay: the engine's replay endpoint or NULL.
 * timeout_ms bounds a replay, hold_max the live batches held during one.
 */
kvb_stream_t *kvb_stream_create(void *zctx, const char *replay,
    unsigned timeout_ms, size_t hold_max, const kvb_stream_handler_t *h);
void kvb_stream_destroy(kvb_stream_t *st);

/*
 * The largest message a replay may send (the engine's --max-batch):
 * ZeroMQ drops the connection past it, and the replay fails.  0: none.
 */
void kvb_stream_set_max_batch(kvb_stream_t *st, size_t max_bytes);

/*
 * The frames come from a socket the bridge connected to the engine's own
 * endpoint (not the collector, where anyone may send on a topic): without
 * a replay endpoint a gap or a seq going back is then acted on at once.
 */
void kvb_stream_set_own_socket(kvb_stream_t *st, int own);

/* a live frame pair from the SUB socket: seq (8 bytes), payload */
void kvb_stream_frame(kvb_stream_t *st, const void *seq, size_t seq_len,
    const char *payload, size_t len, uint64_t now_ms);

/* the replay socket to poll while a replay runs (else NULL), and its I/O */
void *kvb_stream_socket(const kvb_stream_t *st);
void kvb_stream_io(kvb_stream_t *st, uint64_t now_ms);

/*
 * The engine's socket (re)connected: is it still the process whose
 * batches were delivered?  A replay from the last one delivered answers
 * (see above); -1 when there is nothing to check or no way to.
 */
int kvb_stream_verify(kvb_stream_t *st, uint64_t now_ms);

/*
 * Nothing delivered yet (the bridge just started, or the engine restarted
 * while the bridge was cut off): asks the replay socket for everything
 * the engine still buffers, from seq 0, so that the owner's view is
 * rebuilt before the engine next publishes.  0 when asked; -1 without a
 * replay endpoint, with a replay running, or once a batch was delivered.
 */
int kvb_stream_rebuild(kvb_stream_t *st, uint64_t now_ms);

/* when kvb_stream_tick() must run without I/O (UINT64_MAX: never, 0: now) */
uint64_t kvb_stream_deadline(const kvb_stream_t *st);
void kvb_stream_tick(kvb_stream_t *st, uint64_t now_ms);

const kvb_stream_stats_t *kvb_stream_stats(const kvb_stream_t *st);


#endif /* _KVB_STREAM_H_INCLUDED_ */
