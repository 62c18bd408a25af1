/*
 * Unit tests of kvsim's step scheduler (tools/kvsim/kvsim_sched.c): prefix
 * hits, the prompt - 1 cap, token budget and chunked prefill, max_seqs,
 * FIFO admission, preemption, aborts, limits, and the step time formula.
 */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "kva_hash.h"
#include "kvsim_sched.h"


#define MAX_SEQS   (KVS_WAITING_MAX + 8)


typedef struct {
    int                 calls;
    int                 done;
    int                 aborted;
} rec_t;


static kvs_cache_t   cache;
static kvs_sched_t   sched;
static kvs_seq_t    *seqs[MAX_SEQS];
static rec_t         recs[MAX_SEQS];
static int           nseqs;


static void
cb(kvs_seq_t *seq, int done, void *arg)
{
    rec_t  *r = seq->data;

    r->calls++;
    r->done = done;
    r->aborted = seq->aborted;
}


static void
setup(uint32_t bt, uint32_t blocks, uint32_t max_seqs, uint32_t budget)
{
    kvs_sched_conf_t  conf;

    conf.block_tokens = bt;
    conf.max_seqs = max_seqs;
    conf.token_budget = budget;
    conf.time_scale = 1.0;
    conf.calibration = KVS_CALIBRATION_V01;
    conf.prefill_factor = 1.0;

    if (kvs_cache_init(&cache, blocks) != 0
        || kvs_sched_init(&sched, &conf, &cache) != 0)
    {
        printf("Bail out! no memory\n");
        exit(1);
    }
}


static void
teardown(void)
{
    int  i;

    kvs_sched_free(&sched, cb, NULL);

    for (i = 0; i < nseqs; i++) {
        kvs_seq_free(seqs[i]);
    }

    memset(recs, 0, sizeof(recs));
    nseqs = 0;
    kvs_cache_free(&cache);
}


/* a prompt of the given tokens; equal salts share their prefix */
static kvs_seq_t *
mkseq(uint32_t prompt, uint32_t max_out, unsigned salt)
{
    uint32_t    i, bt, n;
    uint8_t    *text;
    uint64_t    h[1024];
    kvs_seq_t  *seq;

    bt = sched.conf.block_tokens;
    text = malloc(prompt * 4);

    for (i = 0; text && i < prompt * 4; i++) {
        text[i] = 'a' + (salt + i / 7) % 26;
    }

    n = kva_hash_blocks(kva_hash_seed(KVA_KEYSPACE_TEXT,
                                      (const uint8_t *) "m", 1),
                        text, prompt * 4, bt * 4, h, 1024);
    free(text);

    seq = kvs_seq_new(prompt, max_out, h, n);
    if (seq == NULL) {
        printf("Bail out! no memory\n");
        exit(1);
    }

    seq->data = &recs[nseqs];
    seqs[nseqs++] = seq;

    return seq;
}


static kvs_seq_t *
submit(uint32_t prompt, uint32_t max_out, unsigned salt)
{
    kvs_seq_t  *seq;

    seq = mkseq(prompt, max_out, salt);

    if (kvs_sched_submit(&sched, seq, 0) != KVS_SUBMIT_OK) {
        printf("# submit failed\n");
    }

    return seq;
}


static double
step(void)
{
    double  t;

    t = kvs_sched_plan(&sched, 0);
    kvs_sched_complete(&sched, cb, NULL);

    return t;
}


static int
run(int max_steps)
{
    int  n;

    for (n = 0; n < max_steps && step() > 0; n++) { /* void */ }

    return n;
}


static int
near(double a, double b)
{
    return fabs(a - b) < 1e-12;
}


int
main(void)
{
    int                      i, n, rc;
    double                   t;
    uint64_t                 h0, h3;
    kvs_seq_t               *a, *b, *c, *p, *q;
    const kvs_step_costs_t  *v01, *llmd;

    v01 = &kvs_step_costs[KVS_CALIBRATION_V01];
    llmd = &kvs_step_costs[KVS_CALIBRATION_LLMD];

    /* step time */

    ok(near(kvs_step_time(v01, 0, 0, 0, 1), 0.010), "step: 10 ms floor");
    ok(near(kvs_step_time(v01, 1000, 0, 0, 1), 0.010 + 0.0628),
       "step: 62.8 us per uncached prefill token");
    ok(near(kvs_step_time(v01, 0, 1, 1000000, 1), 0.010 + 0.039),
       "step: 39 ns per decode context token");
    ok(near(kvs_step_time(v01, 8192, 40, 300000, 20),
            (0.010 + 8192 * 62.8e-6 + 300000 * 39e-9) / 20),
       "step: divided by the time scale");
    ok(near(kvs_step_time(llmd, 0, 3, 3 * 7300, 1), 0.011 + 3 * 7300 * 65e-9),
       "llm-d: a few decodes cost the 11 ms floor and their KV reads");
    ok(fabs(kvs_step_time(llmd, 0, 38, 38 * 7300, 1) - 0.029) < 0.0005,
       "llm-d: 38 decodes of 7,300 tokens take its measured 29 ms ITL");
    ok(near(kvs_step_time(llmd, 1200, 38, 38 * 7300, 1),
            1238 * 62.8e-6 + 38 * 7300 * 65e-9),
       "llm-d: a mixed step computes its tokens once, then reads KV");
    ok(near(kvs_step_time(llmd, 100, 1, 301, 1), 0.011 + 301 * 65e-9),
       "llm-d: prefill within the floor rides on the weight reads");

    /* one sequence, prefill then decode */

    setup(64, 100, 256, 8192);
    a = submit(300, 3, 0);
    ok(a->nhashes == 4 && sched.nwaiting == 1, "300 tokens: 4 full blocks");

    t = kvs_sched_plan(&sched, 0);
    ok(near(t, kvs_step_time(v01, 300, 0, 0, 1)) && sched.nrunning == 1
       && sched.nwaiting == 0, "prefill of 300 uncached tokens in one step");
    kvs_sched_complete(&sched, cb, NULL);
    ok(a->out == 1 && recs[0].calls == 1 && !recs[0].done,
       "first token at the end of the prefill step");
    ok(cache.nops == 4 && cache.ops[0].hash == a->hashes[0]
       && cache.ops[3].hash == a->hashes[3]
       && cache.ops[3].parent == a->hashes[2]
       && cache.ops[0].type == KVS_OP_STORED,
       "stored: the 4 full blocks in prefix order");
    kvs_cache_ops_clear(&cache);

    t = kvs_sched_plan(&sched, 0);
    ok(near(t, kvs_step_time(v01, 0, 1, 301, 1)),
       "decode step: context of 301 tokens");
    kvs_sched_complete(&sched, cb, NULL);
    ok(a->out == 2 && cache.nops == 0, "one token per step, no new block");

    step();
    ok(a->out == 3 && recs[0].done && !recs[0].aborted
       && sched.finished == 1 && sched.nrunning == 0,
       "exactly max_tokens, then done");
    ok(cache.nactive == 0 && cache.nlru == 4 && cache.nhashed == 4,
       "finished: full blocks stay cached, the partial one is freed");
    ok(kvs_sched_plan(&sched, 0) == 0.0, "idle: no step");

    /* prefix hit, and its cap */

    b = submit(300, 1, 0);
    kvs_sched_plan(&sched, 0);
    ok(b->cached == 256 && sched.step_prefill == 44,
       "same prefix: 4 blocks hit, 44 tokens computed");
    ok(sched.hit_tokens == 256 && sched.query_tokens == 600,
       "prefix cache counters in tokens");
    kvs_sched_complete(&sched, cb, NULL);

    c = submit(200, 1, 0);
    kvs_sched_plan(&sched, 0);
    ok(c->cached == 192, "a shorter prompt hits its own full blocks");
    kvs_sched_complete(&sched, cb, NULL);

    c = submit(256, 1, 5);
    run(10);
    c = submit(256, 1, 5);
    kvs_sched_plan(&sched, 0);
    ok(c->cached == 255 && sched.step_prefill == 1,
       "a fully cached prompt recomputes its last token (%u)", c->cached);
    kvs_sched_complete(&sched, cb, NULL);
    ok(recs[nseqs - 1].done && c->out == 1, "and answers");

    c = submit(300, 1, 1);
    kvs_sched_plan(&sched, 0);
    ok(c->cached == 0, "another prefix misses");
    kvs_sched_complete(&sched, cb, NULL);
    teardown();

    /* chunked prefill and the token budget */

    setup(64, 100, 256, 100);
    a = submit(300, 2, 0);
    t = step();
    ok(near(t, kvs_step_time(v01, 100, 0, 0, 1)) && a->computed == 100
       && a->out == 0, "budget 100: a 100-token chunk, no token yet");
    ok(cache.nops == 1 && cache.ops[0].hash == a->hashes[0],
       "the block completed by the chunk is stored");
    kvs_cache_ops_clear(&cache);
    step();
    ok(cache.nops == 2 && cache.ops[0].hash == a->hashes[1]
       && cache.ops[1].hash == a->hashes[2], "then blocks 1 and 2");
    kvs_cache_ops_clear(&cache);
    step();
    ok(a->out == 1 && cache.nops == 1 && cache.ops[0].hash == a->hashes[3],
       "third chunk ends the prefill: block 3 and the first token");

    b = submit(300, 2, 1);
    t = kvs_sched_plan(&sched, 0);
    ok(sched.nstep == 2 && sched.step[0] == a && a->step_new == 1
       && b->step_new == 99 && sched.step_decode == 1
       && near(t, kvs_step_time(v01, 99, 1, 301, 1)),
       "running first (decode 1), the rest of the budget admits (99)");
    kvs_sched_complete(&sched, cb, NULL);
    ok(a->out == 2 && recs[0].done && b->computed == 99,
       "the decode finishes, the prefill goes on");
    teardown();

    /* max_seqs */

    setup(16, 100, 2, 8192);
    submit(10, 5, 0);
    submit(10, 5, 1);
    c = submit(10, 5, 2);
    kvs_sched_plan(&sched, 0);
    ok(sched.nrunning == 2 && sched.nwaiting == 1 && sched.wait_head == c,
       "max_seqs 2: the third waits");
    kvs_sched_complete(&sched, cb, NULL);
    n = run(100);
    ok(recs[0].done && recs[1].done && recs[2].done && c->out == 5,
       "and runs when a slot frees (%d steps)", n);
    teardown();

    /* FIFO: the head waits for KV and nobody overtakes it */

    setup(4, 10, 256, 8192);
    a = submit(32, 3, 0);               /* 8 of 10 blocks */
    b = submit(16, 1, 1);               /* needs 4 */
    c = submit(4, 1, 2);                /* would fit */
    kvs_sched_plan(&sched, 0);
    ok(sched.nrunning == 1 && sched.wait_head == b && b->next == c,
       "no KV for the head: admission stops there");
    kvs_sched_complete(&sched, cb, NULL);
    run(100);
    ok(recs[0].done && recs[1].done && recs[2].done,
       "all served once the first one finishes");
    teardown();

    /* preemption */

    setup(4, 8, 256, 8192);
    p = submit(12, 14, 0);
    q = submit(12, 14, 1);
    step();
    ok(sched.nrunning == 2 && cache.nactive == 6, "two running, 6 blocks");

    for (i = 0; i < 20 && sched.preemptions == 0; i++) {
        step();
    }

    ok(sched.preemptions == 1 && q->preempted == 1 && p->preempted == 0,
       "KV full for a decode: the newest running is preempted");
    ok(q->state == KVS_SEQ_WAITING && sched.wait_head == q
       && q->computed == 0 && q->nblocks == 0,
       "it frees its blocks and waits at the front");
    ok(cache.nlru + cache.nfree + cache.nactive == 8 && cache.nactive == 5,
       "its full prompt blocks went to the cache");

    n = run(200);
    ok(recs[0].done && recs[1].done && !recs[1].aborted
       && p->out == 14 && q->out == 14,
       "both finish with all their tokens (%d steps)", n);
    ok(cache.nactive == 0, "no block held at the end");
    teardown();

    /* aborts */

    setup(16, 100, 256, 8192);
    a = submit(40, 5, 0);
    rc = kvs_sched_abort(&sched, a);
    ok(rc == 1 && sched.nwaiting == 0, "abort while waiting: gone now");
    b = submit(40, 5, 0);
    kvs_sched_plan(&sched, 0);
    rc = kvs_sched_abort(&sched, b);
    ok(rc == 0, "abort during its step: deferred");
    kvs_sched_complete(&sched, cb, NULL);
    ok(recs[1].done && recs[1].aborted && sched.nrunning == 0
       && cache.nactive == 0, "released at the end of the step");
    ok(kvs_sched_plan(&sched, 0) == 0.0, "nothing left to do");
    teardown();

    /* limits */

    setup(4, 10, 256, 8192);
    a = mkseq(40, 2, 0);
    rc = kvs_sched_submit(&sched, a, 0);
    ok(rc == KVS_SUBMIT_TOO_LONG, "a sequence that can never fit: refused");
    a = mkseq(36, 5, 0);
    rc = kvs_sched_submit(&sched, a, 0);
    ok(rc == KVS_SUBMIT_OK, "one that fills the pool exactly: accepted");

    for (i = 1; i < KVS_WAITING_MAX; i++) {
        kvs_sched_submit(&sched, mkseq(4, 1, i), 0);
    }

    a = mkseq(4, 1, 0);
    rc = kvs_sched_submit(&sched, a, 0);
    ok(rc == KVS_SUBMIT_FULL && sched.nwaiting == KVS_WAITING_MAX,
       "waiting queue full at %d", KVS_WAITING_MAX);
    teardown();

    /* the hashes are the module's */

    setup(64, 100, 256, 8192);
    a = mkseq(128, 1, 3);
    h0 = kva_hash_seed(KVA_KEYSPACE_TEXT, (const uint8_t *) "m", 1);
    {
        uint8_t  text[512];

        for (i = 0; i < 512; i++) {
            text[i] = 'a' + (3 + i / 7) % 26;
        }

        kva_hash_blocks(h0, text, 512, 256, &h3, 1);
    }
    ok(a->nhashes == 2 && a->hashes[0] == h3,
       "block hashes: kva_hash_blocks over 4 * block_tokens bytes");
    teardown();

    return done_testing();
}
