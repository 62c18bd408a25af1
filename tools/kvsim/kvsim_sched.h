/*
 * kvsim: one server's step scheduler, the pure model (no libevent).
 *
 * vLLM v1 style: each step serves running sequences first (decode one
 * token, or continue a chunked prefill), then admits waiting ones in FIFO
 * order while the token budget, max_seqs and free KV allow.  When a running
 * sequence cannot grow, the newest running one is preempted (recompute).
 */

#ifndef _KVSIM_SCHED_H_INCLUDED_
#define _KVSIM_SCHED_H_INCLUDED_


#include "kvsim_cache.h"


#define KVS_WAITING_MAX     4096


typedef struct kvs_seq_s  kvs_seq_t;

/* a token was produced (seq->out), or the sequence is done (done = 1) */
typedef void (*kvs_seq_pt)(kvs_seq_t *seq, int done, void *arg);


typedef enum {
    KVS_SEQ_WAITING = 0,
    KVS_SEQ_RUNNING,
    KVS_SEQ_DONE
} kvs_seq_state_e;


struct kvs_seq_s {
    kvs_seq_t          *prev;           /* waiting or running list */
    kvs_seq_t          *next;
    void               *data;           /* the owner's */

    uint32_t            prompt;         /* tokens */
    uint32_t            max_out;
    uint32_t            out;            /* tokens generated */
    uint32_t            computed;       /* tokens with KV */
    uint32_t            step_new;       /* scheduled in the current step */
    uint32_t            cached;         /* prefix hit at first admission */
    uint32_t            preempted;

    uint32_t           *blocks;         /* held, in token order */
    uint32_t            nblocks;
    uint32_t            blocks_cap;

    uint32_t            nhashes;        /* full prompt blocks */

    /* the engine's view (--events zmq), malloc'ed, freed with the seq */
    uint32_t           *ids;            /* the prompt's token ids */
    uint64_t           *ehashes;        /* nhashes of the engine's */
    uint32_t            lora;           /* 0, or an adapter's index + 1 */

    kvs_seq_state_e     state;
    unsigned            admitted:1;
    unsigned            in_step:1;
    unsigned            aborted:1;

    double              t_arrival;      /* ms, the caller's clock */
    double              t_admitted;
    uint64_t            hashes[];
};


/*
 * What a step costs: --calibration picks one of kvs_step_costs[]
 * (kvsim_sched.c says where each figure comes from).
 */
typedef enum {
    KVS_CALIBRATION_V01 = 0,            /* 0.1's, the default */
    KVS_CALIBRATION_LLMD                /* llm-d's measured pods */
} kvs_calibration_e;


typedef struct {
    const char         *name;
    double              floor;          /* s, the least step: weights */
    double              token;          /* s, computing a token */
    double              context;        /* s, a decode's context token */
    unsigned            roofline:1;     /* 0: floor + prefill + context;
                                           1: max(floor, all tokens) +
                                           context */
} kvs_step_costs_t;


extern const kvs_step_costs_t  kvs_step_costs[];


typedef struct {
    uint32_t            block_tokens;
    uint32_t            max_seqs;
    uint32_t            token_budget;
    double              time_scale;
    kvs_calibration_e   calibration;
    double              prefill_factor; /* a prefill token's cost, x */
} kvs_sched_conf_t;


typedef struct {
    kvs_sched_conf_t    conf;
    kvs_cache_t        *cache;

    kvs_seq_t          *wait_head;
    kvs_seq_t          *wait_tail;
    kvs_seq_t          *run_head;
    kvs_seq_t          *run_tail;
    uint32_t            nwaiting;
    uint32_t            nrunning;

    kvs_seq_t         **step;           /* the step in flight */
    uint32_t            nstep;
    uint32_t            step_cap;
    uint64_t            step_prefill;   /* uncached tokens computed */
    uint64_t            step_decode;    /* sequences decoding a token */
    uint64_t            step_context;   /* context of decoding sequences */

    uint64_t            steps;
    uint64_t            preemptions;
    uint64_t            query_tokens;   /* prefix cache queries */
    uint64_t            hit_tokens;
    uint64_t            prompt_tokens;
    uint64_t            gen_tokens;
    uint64_t            finished;
} kvs_sched_t;


typedef enum {
    KVS_SUBMIT_OK = 0,
    KVS_SUBMIT_TOO_LONG,                /* can never fit in the pool */
    KVS_SUBMIT_FULL                     /* waiting queue full */
} kvs_submit_e;


kvs_seq_t *kvs_seq_new(uint32_t prompt, uint32_t max_out,
    const uint64_t *hashes, uint32_t nhashes);
void kvs_seq_free(kvs_seq_t *seq);

int kvs_sched_init(kvs_sched_t *s, const kvs_sched_conf_t *conf,
    kvs_cache_t *cache);
void kvs_sched_free(kvs_sched_t *s, kvs_seq_pt cb, void *arg);

kvs_submit_e kvs_sched_submit(kvs_sched_t *s, kvs_seq_t *seq, double now);
/* plans the next step: its duration in seconds, 0 when there is no work */
double kvs_sched_plan(kvs_sched_t *s, double now);
/* applies the planned step, calls cb for tokens and finished sequences */
void kvs_sched_complete(kvs_sched_t *s, kvs_seq_pt cb, void *arg);
/* 1: gone now (caller frees); 0: leaves at the end of the step (cb) */
int kvs_sched_abort(kvs_sched_t *s, kvs_seq_t *seq);

double kvs_step_time(const kvs_step_costs_t *c, uint64_t prefill,
    uint64_t decode, uint64_t context, double scale);


#endif /* _KVSIM_SCHED_H_INCLUDED_ */
