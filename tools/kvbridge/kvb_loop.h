/*
 * kvbridge: its one event loop, in the manner of redis's ae.c.
 *
 * A source registers what it polls (zmq sockets or fds, given afresh each
 * turn by its watch callback), when it must run without I/O (deadline),
 * and its callbacks with a data pointer; the loop finds the nearest
 * deadline, polls, calls back, and knows no kinds of sources.
 *
 * No source may hold the loop: each I/O callback gets a budget for the
 * turn (messages, bytes, time) and must return once it is spent, leaving
 * the rest for the next turn (zmq_poll() says again that it is readable).
 * The loop measures each source's callbacks and each turn, for the
 * bridge's metrics page.
 */

#ifndef _KVB_LOOP_H_INCLUDED_
#define _KVB_LOOP_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include <zmq.h>


/*
 * A source's share of one turn.  The goal is 10 ms of loop time a source
 * a turn: half of it for the reads, the other half for the one message
 * in hand when the time runs out, and the tick.  One message is not
 * split: a batch near --max-batch (4 MB, tens of ms to decode) holds the
 * loop that long by itself; --max-batch is the bound on that.
 */
#define KVB_BUDGET_MSGS      256
#define KVB_BUDGET_BYTES     (1024 * 1024)
#define KVB_BUDGET_NS        (5 * 1000 * 1000)

/* a callback longer than this is logged (at most every 5 s a source) */
#define KVB_LOOP_SLOW_NS     (10 * 1000 * 1000)

/* the turn and callback time histograms' upper bounds, in seconds */
#define KVB_LOOP_BUCKETS     12


typedef struct {
    unsigned                msgs;       /* left */
    size_t                  bytes;      /* left */
    uint64_t                until_ns;   /* kvb_loop_now_ns() */
    unsigned                spent:1;    /* at least one message taken */
} kvb_budget_t;


typedef struct {
    /* the items to poll this turn, at most max; their count */
    int                   (*watch)(void *data, uint64_t now_ms,
                                   zmq_pollitem_t *items, int max);
    /* some of the items watched have revents: make bounded progress */
    void                  (*io)(void *data, const zmq_pollitem_t *items,
                                int n, kvb_budget_t *b, uint64_t now_ms);
    /* when tick must run without I/O (UINT64_MAX: never); NULL: never */
    uint64_t              (*deadline)(void *data);
    /* every turn, after the I/O of all sources; NULL: none */
    void                  (*tick)(void *data, uint64_t now_ms);
    void                   *data;
    const char             *name;       /* for the metrics, copied */
    int                     max_items;  /* the most watch() gives */
} kvb_source_conf_t;


typedef struct {
    uint64_t                calls;      /* of io; turns */
    uint64_t                ns_sum;
    uint64_t                ns_max;
    /*
     * The same on the bridge's own CPU clock: where ns_max is far above
     * cpu_ns_max, the turn was long because the bridge was not running
     * (the machine busy), not because of its work.
     */
    uint64_t                cpu_ns_sum;
    uint64_t                cpu_ns_max;
    uint64_t                buckets[KVB_LOOP_BUCKETS];  /* not cumulative */
    uint64_t                over;       /* past the last bucket */
    uint64_t                exhausted;  /* turns its budget ran out */
} kvb_loop_hist_t;


typedef struct kvb_loop_s    kvb_loop_t;
typedef struct kvb_source_s  kvb_source_t;


kvb_loop_t *kvb_loop_create(void);
void kvb_loop_destroy(kvb_loop_t *loop);

/* NULL on no memory; the source lives as long as the loop */
kvb_source_t *kvb_loop_add(kvb_loop_t *loop, const kvb_source_conf_t *conf);

/* one turn: wait at most max_wait_ms for I/O or a deadline; -1: error */
int kvb_loop_turn(kvb_loop_t *loop, int max_wait_ms);

/* 1 while b allows one more message (always before the first) */
int kvb_budget_left(kvb_budget_t *b);
void kvb_budget_spend(kvb_budget_t *b, size_t bytes);

uint64_t kvb_loop_now_ns(void);
/* the CPU time the bridge's main thread has used */
uint64_t kvb_loop_cpu_ns(void);

/* the histograms' bounds, seconds (KVB_LOOP_BUCKETS of them) */
extern const double  kvb_loop_bounds[KVB_LOOP_BUCKETS];

/* whole turns (I/O and ticks, not the wait in zmq_poll()) */
const kvb_loop_hist_t *kvb_loop_turns(const kvb_loop_t *loop);
size_t kvb_loop_nsources(const kvb_loop_t *loop);
/* one source's callbacks, per turn it ran in */
const kvb_loop_hist_t *kvb_loop_source(const kvb_loop_t *loop, size_t i,
    const char **name);


#endif /* _KVB_LOOP_H_INCLUDED_ */
