/*
 * kvsim: one server's step scheduler, the pure model (no libevent).
 */

#include <stdlib.h>
#include <string.h>

#include "kvsim_sched.h"


#define kvs_min(a, b)       ((a) < (b) ? (a) : (b))
#define kvs_div_up(a, b)    (((a) + (b) - 1) / (b))


static int kvs_admit(kvs_sched_t *s, kvs_seq_t *seq, uint32_t *budget,
    double now);
static void kvs_preempt(kvs_sched_t *s, kvs_seq_t *seq);
static void kvs_step_add(kvs_sched_t *s, kvs_seq_t *seq, uint32_t n);
static int kvs_grow(kvs_sched_t *s, kvs_seq_t *seq, uint32_t tokens);
static void kvs_release(kvs_sched_t *s, kvs_seq_t *seq);
static void kvs_unlink(kvs_sched_t *s, kvs_seq_t *seq);
static void kvs_link(kvs_seq_t **head, kvs_seq_t **tail, kvs_seq_t *seq,
    int front);


kvs_seq_t *
kvs_seq_new(uint32_t prompt, uint32_t max_out, const uint64_t *hashes,
    uint32_t nhashes)
{
    kvs_seq_t  *seq;

    seq = calloc(1, sizeof(kvs_seq_t) + nhashes * sizeof(uint64_t));
    if (seq == NULL) {
        return NULL;
    }

    seq->prompt = prompt ? prompt : 1;
    seq->max_out = max_out ? max_out : 1;
    seq->nhashes = nhashes;

    if (hashes) {
        memcpy(seq->hashes, hashes, nhashes * sizeof(uint64_t));
    }

    return seq;
}


void
kvs_seq_free(kvs_seq_t *seq)
{
    if (seq) {
        free(seq->blocks);
        free(seq->ids);
        free(seq->ehashes);
        free(seq);
    }
}


int
kvs_sched_init(kvs_sched_t *s, const kvs_sched_conf_t *conf,
    kvs_cache_t *cache)
{
    memset(s, 0, sizeof(kvs_sched_t));

    if (conf->block_tokens == 0 || conf->max_seqs == 0
        || conf->token_budget == 0)
    {
        return -1;
    }

    s->step = malloc(conf->max_seqs * sizeof(kvs_seq_t *));
    if (s->step == NULL) {
        return -1;
    }

    s->conf = *conf;

    if (!(s->conf.prefill_factor > 0.0)) {
        s->conf.prefill_factor = 1.0;
    }
    s->cache = cache;
    s->step_cap = conf->max_seqs;

    return 0;
}


void
kvs_sched_free(kvs_sched_t *s, kvs_seq_pt cb, void *arg)
{
    kvs_seq_t  *seq;

    while ((seq = s->run_head ? s->run_head : s->wait_head) != NULL) {
        kvs_release(s, seq);
        kvs_unlink(s, seq);
        seq->aborted = 1;
        seq->in_step = 0;
        cb(seq, 1, arg);
    }

    free(s->step);
    s->step = NULL;
    s->nstep = 0;
}


kvs_submit_e
kvs_sched_submit(kvs_sched_t *s, kvs_seq_t *seq, double now)
{
    uint64_t  need;

    need = kvs_div_up((uint64_t) seq->prompt + seq->max_out - 1,
                      s->conf.block_tokens);

    if (need > s->cache->nblocks) {
        return KVS_SUBMIT_TOO_LONG;
    }

    if (s->nwaiting >= KVS_WAITING_MAX) {
        return KVS_SUBMIT_FULL;
    }

    seq->blocks = malloc(need * sizeof(uint32_t));
    if (seq->blocks == NULL) {
        return KVS_SUBMIT_FULL;
    }

    seq->blocks_cap = need;
    seq->t_arrival = now;
    seq->state = KVS_SEQ_WAITING;
    kvs_link(&s->wait_head, &s->wait_tail, seq, 0);
    s->nwaiting++;

    return KVS_SUBMIT_OK;
}


double
kvs_sched_plan(kvs_sched_t *s, double now)
{
    int         preempted;
    uint32_t    budget, n;
    kvs_seq_t  *seq, *next, *victim;

    budget = s->conf.token_budget;
    preempted = 0;
    s->nstep = 0;
    s->step_prefill = 0;
    s->step_decode = 0;
    s->step_context = 0;

    for (seq = s->run_head; seq && budget; seq = next) {
        n = kvs_min(seq->prompt + seq->out - seq->computed, budget);

        while (kvs_grow(s, seq, seq->computed + n) != 0) {
            /* recompute preemption of the newest running sequence */
            victim = s->run_tail;
            kvs_preempt(s, victim);
            preempted = 1;

            if (victim == seq) {
                break;
            }
        }

        if (seq->state != KVS_SEQ_RUNNING) {
            break;
        }

        next = seq->next;
        kvs_step_add(s, seq, n);
        budget -= n;
    }

    while (!preempted && budget && s->wait_head
           && s->nrunning < s->conf.max_seqs)
    {
        if (kvs_admit(s, s->wait_head, &budget, now) != 0) {
            break;
        }
    }

    if (s->nstep == 0) {
        return 0.0;
    }

    s->steps++;

    /* a slower server (--slow-servers): each prefill token costs more */
    return kvs_step_time(&kvs_step_costs[s->conf.calibration],
                         (uint64_t) (s->step_prefill * s->conf.prefill_factor
                                     + 0.5),
                         s->step_decode, s->step_context,
                         s->conf.time_scale);
}


void
kvs_sched_complete(kvs_sched_t *s, kvs_seq_pt cb, void *arg)
{
    uint32_t             i, b, last, bt, nstep;
    kvs_seq_t           *seq;
    kvs_engine_block_t   eb;

    bt = s->conf.block_tokens;
    nstep = s->nstep;
    s->nstep = 0;

    for (i = 0; i < nstep; i++) {
        seq = s->step[i];
        seq->in_step = 0;

        if (seq->aborted) {
            kvs_release(s, seq);
            kvs_unlink(s, seq);
            cb(seq, 1, arg);
            continue;
        }

        b = seq->computed / bt;
        seq->computed += seq->step_new;
        last = kvs_min(seq->computed / bt, seq->nhashes);

        for ( /* void */ ; b < last; b++) {
            if (seq->ehashes == NULL) {
                kvs_cache_commit(s->cache, seq->blocks[b], seq->hashes[b],
                                 b ? seq->hashes[b - 1] : 0);
                continue;
            }

            eb.ids = &seq->ids[(size_t) b * bt];
            eb.nids = bt;
            eb.lora = seq->lora;
            eb.ehash = seq->ehashes[b];
            eb.eparent = b ? seq->ehashes[b - 1] : 0;
            kvs_cache_commit_engine(s->cache, seq->blocks[b], seq->hashes[b],
                                    b ? seq->hashes[b - 1] : 0, &eb);
        }

        if (seq->computed < seq->prompt + seq->out) {
            continue;                   /* a prefill chunk */
        }

        seq->out++;
        s->gen_tokens++;

        if (seq->out < seq->max_out) {
            cb(seq, 0, arg);
            continue;
        }

        kvs_release(s, seq);
        kvs_unlink(s, seq);
        s->finished++;
        cb(seq, 1, arg);
    }
}


int
kvs_sched_abort(kvs_sched_t *s, kvs_seq_t *seq)
{
    if (seq->in_step) {
        seq->aborted = 1;
        return 0;
    }

    kvs_release(s, seq);
    kvs_unlink(s, seq);

    return 1;
}


/*
 * One pod of llm-d's benchmark: Qwen3-32B, tensor-parallel over 2 H100
 * SXM (llm-d's "KV-Cache Wins You Can See", appendix A.1).
 *
 * 0.1, from the hardware's figures, its costs added up:
 *   floor: 32.8e9 parameters x 2 bytes over 2 GPUs, each reading its
 *     32.8 GB at 3.35 TB/s (H100 SXM datasheet): 9.8 ms, 10 ms a step;
 *   token: 62.8 us of compute a prefill token, llm-d's measured 15,926
 *     prefill tokens/s a pod (a decode token's hides in the floor);
 *   context: 64 layers x (K, V) x 4 of the 8 KV heads x 128 x 2 bytes =
 *     131,072 bytes a context token a GPU (Qwen3-32B's config), 39 ns at
 *     3.35 TB/s, for every token of every decoding sequence's context.
 *
 * llm-d, fitted to the ITL llm-d measured for precise routing
 * (llm-d-kv-cache-manager, benchmarking/73-capacity) and combined as a
 * GPU runs a mixed batch, the step's tokens computed in the time its
 * weight reads take (a roofline), then the decodes' attention:
 *   floor: 11 ms, the ITL at 3 QPS, a few sequences a pod;
 *   token: 62.8 us, as 0.1;
 *   context: 65 ns: at 57-60 QPS the ITL is 29 ms with 10,300-10,500
 *     output tokens/s, 38 sequences decoding a pod, each about 7,300
 *     tokens of context: (29 - 11) ms / (38 x 7,300).  The KV reads run
 *     at 60% of the bandwidth 0.1 assumed.
 */

const kvs_step_costs_t  kvs_step_costs[] = {
    { "0.1", 0.010, 62.8e-6, 39e-9, 0 },
    { "llm-d", 0.011, 62.8e-6, 65e-9, 1 },
    { NULL, 0, 0, 0, 0 }
};


double
kvs_step_time(const kvs_step_costs_t *c, uint64_t prefill, uint64_t decode,
    uint64_t context, double scale)
{
    double  t, compute;

    if (c->roofline) {
        compute = c->token * (double) (prefill + decode);
        t = (compute > c->floor ? compute : c->floor)
            + c->context * (double) context;

    } else {
        t = c->floor + c->token * (double) prefill
            + c->context * (double) context;
    }

    return scale > 0.0 ? t / scale : t;
}


static int
kvs_admit(kvs_sched_t *s, kvs_seq_t *seq, uint32_t *budget, double now)
{
    uint32_t  i, bt, total, hit, hit_blocks, n, need, in_lru, b;

    bt = s->conf.block_tokens;
    total = seq->prompt + seq->out;

    /* prefix hit: leading full blocks, capped at total - 1 tokens */
    hit = kvs_cache_match(s->cache, seq->hashes, seq->nhashes) * bt;
    hit = kvs_min(hit, total - 1);
    hit_blocks = kvs_div_up(hit, bt);
    n = kvs_min(total - hit, *budget);
    need = kvs_div_up(hit + n, bt) - hit_blocks;

    in_lru = 0;

    for (i = 0; i < hit_blocks; i++) {
        b = kvs_cache_lookup(s->cache, seq->hashes[i]);
        in_lru += (s->cache->blocks[b].ref == 0);
    }

    if (need > kvs_cache_available(s->cache) - in_lru) {
        return -1;                      /* FIFO: the head waits for KV */
    }

    for (i = 0; i < hit_blocks; i++) {
        b = kvs_cache_lookup(s->cache, seq->hashes[i]);
        kvs_cache_acquire(s->cache, b);
        seq->blocks[seq->nblocks++] = b;
    }

    if (kvs_grow(s, seq, hit + n) != 0) {
        kvs_release(s, seq);
        return -1;
    }

    if (!seq->admitted) {
        seq->admitted = 1;
        seq->cached = hit;
        seq->t_admitted = now;
        s->prompt_tokens += seq->prompt;
    }

    s->query_tokens += total;
    s->hit_tokens += hit;

    seq->computed = hit;
    kvs_unlink(s, seq);
    seq->state = KVS_SEQ_RUNNING;
    kvs_link(&s->run_head, &s->run_tail, seq, 0);
    s->nrunning++;

    kvs_step_add(s, seq, n);
    *budget -= n;

    return 0;
}


static void
kvs_preempt(kvs_sched_t *s, kvs_seq_t *seq)
{
    kvs_release(s, seq);
    kvs_unlink(s, seq);

    seq->computed = 0;
    seq->preempted++;
    seq->state = KVS_SEQ_WAITING;
    kvs_link(&s->wait_head, &s->wait_tail, seq, 1);
    s->nwaiting++;
    s->preemptions++;
}


static void
kvs_step_add(kvs_sched_t *s, kvs_seq_t *seq, uint32_t n)
{
    uint32_t  total;

    total = seq->prompt + seq->out;

    if (n == 1 && seq->out > 0 && seq->computed + 1 == total) {
        s->step_context += total;
        s->step_decode++;

    } else {
        s->step_prefill += n;
    }

    seq->step_new = n;
    seq->in_step = 1;
    s->step[s->nstep++] = seq;
}


static int
kvs_grow(kvs_sched_t *s, kvs_seq_t *seq, uint32_t tokens)
{
    uint32_t  need, b;

    need = kvs_div_up(tokens, s->conf.block_tokens);

    while (seq->nblocks < need) {
        if (seq->nblocks == seq->blocks_cap) {
            return -1;
        }

        b = kvs_cache_alloc(s->cache);
        if (b == KVS_NIL) {
            return -1;
        }

        seq->blocks[seq->nblocks++] = b;
    }

    return 0;
}


static void
kvs_release(kvs_sched_t *s, kvs_seq_t *seq)
{
    /* tail first: the end of a prefix is evicted before its start */
    while (seq->nblocks) {
        kvs_cache_release(s->cache, seq->blocks[--seq->nblocks]);
    }
}


static void
kvs_unlink(kvs_sched_t *s, kvs_seq_t *seq)
{
    kvs_seq_t  **head, **tail;

    if (seq->state == KVS_SEQ_DONE) {
        return;
    }

    if (seq->state == KVS_SEQ_WAITING) {
        head = &s->wait_head;
        tail = &s->wait_tail;
        s->nwaiting--;

    } else {
        head = &s->run_head;
        tail = &s->run_tail;
        s->nrunning--;
    }

    if (seq->prev) {
        seq->prev->next = seq->next;

    } else {
        *head = seq->next;
    }

    if (seq->next) {
        seq->next->prev = seq->prev;

    } else {
        *tail = seq->prev;
    }

    seq->prev = NULL;
    seq->next = NULL;
    seq->state = KVS_SEQ_DONE;
}


static void
kvs_link(kvs_seq_t **head, kvs_seq_t **tail, kvs_seq_t *seq, int front)
{
    if (front) {
        seq->prev = NULL;
        seq->next = *head;

        if (*head) {
            (*head)->prev = seq;

        } else {
            *tail = seq;
        }

        *head = seq;
        return;
    }

    seq->next = NULL;
    seq->prev = *tail;

    if (*tail) {
        (*tail)->next = seq;

    } else {
        *head = seq;
    }

    *tail = seq;
}
