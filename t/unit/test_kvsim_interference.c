/*
 * Why people split prefill from decode, in kvsim's model: a prefill
 * admitted on a server runs in the same step as that server's decodes,
 * so the step, which is every decoding stream's inter-token latency,
 * grows by the prefill's compute (kvs_step_time() in kvsim_sched.c), in
 * both calibrations.
 */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "kvsim_sched.h"


#define STREAMS     8
#define CONTEXT     1000                /* tokens of each stream's prompt */
#define PROMPT      4096                /* the newcomer's */


static unsigned  tokens[STREAMS + 1];


static void
cb(kvs_seq_t *seq, int done, void *arg)
{
    tokens[(uintptr_t) seq->data]++;
}


static void
run(kvs_calibration_e cal)
{
    int                i, all;
    double             t_dec, t_mix, want;
    uint64_t           ctx;
    kvs_seq_t         *seqs[STREAMS + 1];
    kvs_cache_t        cache;
    kvs_sched_t        sched;
    kvs_sched_conf_t   conf;
    const char        *name;

    name = kvs_step_costs[cal].name;
    conf.block_tokens = 64;
    conf.max_seqs = 256;
    conf.token_budget = 8192;
    conf.time_scale = 1.0;
    conf.calibration = cal;
    conf.prefill_factor = 1.0;

    if (kvs_cache_init(&cache, 4096) != 0
        || kvs_sched_init(&sched, &conf, &cache) != 0)
    {
        printf("Bail out! no memory\n");
        exit(1);
    }

    memset(tokens, 0, sizeof(tokens));

    for (i = 0; i < STREAMS; i++) {
        seqs[i] = kvs_seq_new(CONTEXT, 1000, NULL, 0);
        seqs[i]->data = (void *) (uintptr_t) i;
        kvs_sched_submit(&sched, seqs[i], 0);
    }

    /* the streams' prefills (8000 tokens: one step), then one decode */
    kvs_sched_plan(&sched, 0);
    kvs_sched_complete(&sched, cb, NULL);
    t_dec = kvs_sched_plan(&sched, 0);
    ctx = sched.step_context;
    kvs_sched_complete(&sched, cb, NULL);

    ok(sched.step_decode == STREAMS && sched.step_prefill == 0,
       "%s: %d streams decoding alone", name, STREAMS);

    /* a prompt arrives: its prefill joins the streams' next step */
    seqs[STREAMS] = kvs_seq_new(PROMPT, 1, NULL, 0);
    seqs[STREAMS]->data = (void *) (uintptr_t) STREAMS;
    kvs_sched_submit(&sched, seqs[STREAMS], 0);

    t_mix = kvs_sched_plan(&sched, 0);

    ok(sched.step_decode == STREAMS && sched.step_prefill == PROMPT,
       "%s: the prefill's %d tokens share the step with the %d decodes",
       name, PROMPT, STREAMS);

    want = kvs_step_time(&kvs_step_costs[cal], PROMPT, STREAMS,
                         ctx + STREAMS, 1.0);
    ok(fabs(t_mix - want) < 1e-9, "%s: the step costs the prefill's "
       "compute on top (%.1f ms)", name, want * 1e3);

    ok(t_mix > t_dec + PROMPT * 50e-6,
       "%s: every stream's ITL %.1f ms -> %.1f ms", name, t_dec * 1e3,
       t_mix * 1e3);

    kvs_sched_complete(&sched, cb, NULL);

    for (all = 1, i = 0; i < STREAMS; i++) {
        all &= (tokens[i] == 3);        /* prefill's, decode, the long one */
    }

    ok(all, "%s: each stream's next token waited for that step", name);

    kvs_sched_free(&sched, cb, NULL);

    for (i = 0; i <= STREAMS; i++) {
        kvs_seq_free(seqs[i]);
    }

    kvs_cache_free(&cache);
}


int
main(void)
{
    run(KVS_CALIBRATION_V01);
    run(KVS_CALIBRATION_LLMD);

    return done_testing();
}
