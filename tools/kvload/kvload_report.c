/*
 * kvload: the results of a run, per stage, with durations scaled back to
 * uncompressed time: JSON (with the options that made the run), a table
 * on stdout, CSV.
 */

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kvload.h"


json_t *
kvl_report_json(kvl_ctx_t *ctx, kvl_opt_t *opts)
{
    size_t          b;
    unsigned        i;
    json_t         *root, *conf, *stages, *o, *be, *v;
    kvl_opt_t      *opt;
    kvl_stage_t    *st;
    kvl_summary_t   s;

    root = json_object();
    conf = json_object();
    stages = json_array();

    if (root == NULL || conf == NULL || stages == NULL
        || json_object_set_new(root, "config", conf) != 0
        || json_object_set_new(root, "stages", stages) != 0)
    {
        return NULL;
    }

    for (opt = opts; opt->name; opt++) {
        switch (opt->type) {
        case 's':
            v = *(char **) opt->p ? json_string(*(char **) opt->p)
                                  : json_null();
            break;
        case 'd': v = json_real(*(double *) opt->p); break;
        case 'u': v = json_integer(*(unsigned *) opt->p); break;
        default: v = json_integer((json_int_t) *(uint64_t *) opt->p);
        }

        if (json_object_set_new(conf, opt->name, v) != 0) {
            goto failed;
        }
    }

    for (i = 0; i <= ctx->cur && i < ctx->nstages; i++) {
        st = &ctx->stages[i];
        kvl_stage_summarize(st, ctx->scale, &s);

        o = json_pack("{s:s, s:s, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I,"
                      " s:I, s:I, s:f,"
                      " s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f,"
                      " s:I, s:I, s:I, s:I,"
                      " s:f, s:f, s:I, s:b, s:f, s:{}}",
                      "label", ctx->label, "workload", ctx->workload,
                      "time_scale", ctx->scale, "qps", st->qps,
                      "sent", (json_int_t) st->sent,
                      "completed", (json_int_t) st->completed,
                      "errors", (json_int_t) st->errors,
                      "timeouts", (json_int_t) st->timeouts,
                      "http_5xx", (json_int_t) st->http_5xx,
                      "cut", (json_int_t) st->cut,
                      "retried", (json_int_t) st->retried,
                      "dropped", (json_int_t) st->dropped,
                      "achieved_qps", s.achieved_qps,
                      "ttft_p50", s.ttft_p50, "ttft_p90", s.ttft_p90,
                      "ttft_p99", s.ttft_p99, "itl_p50", s.itl_p50,
                      "gap_p50", s.gap_p50, "gap_p99", s.gap_p99,
                      "e2e_p50", s.e2e_p50, "gen_tok_s", s.gen_tok_s,
                      "output_tokens", (json_int_t) st->output_tokens,
                      "window_tokens", (json_int_t) st->window_tokens,
                      "prompt_tokens", (json_int_t) st->prompt_tokens,
                      "cached_tokens", (json_int_t) st->cached_tokens,
                      "hit_rate", s.hit_rate,
                      "queue_waiting_mean", s.waiting_mean,
                      "backend_unknown", (json_int_t) st->backend_unknown,
                      "warmup", (int) st->warmup,
                      "seconds", st->seconds > 0.0 ? st->seconds
                                                   : ctx->stage_seconds,
                      "backends");

        if (o == NULL || json_array_append_new(stages, o) != 0) {
            goto failed;
        }

        be = json_object_get(o, "backends");

        for (b = 0; b < st->nbackends; b++) {
            if (json_object_set_new(be, st->backends[b].name,
                    json_integer((json_int_t) st->backends[b].requests))
                != 0)
            {
                goto failed;
            }
        }
    }

    return root;

failed:

    json_decref(root);
    return NULL;
}


void
kvl_report_print(kvl_ctx_t *ctx, json_t *stages)
{
    size_t              i, k;
    json_t             *st;
    static const char  *cols[] = {           /* key, heading */
        "qps", "qps", "sent", "sent", "completed", "ok", "errors", "err",
        "dropped", "drop", "achieved_qps", "ach.qps", "ttft_p50", "ttft50",
        "ttft_p90", "ttft90", "ttft_p99", "ttft99", "itl_p50", "itl50",
        "e2e_p50", "e2e50", "gen_tok_s", "tok/s", "hit_rate", "hit",
        "queue_waiting_mean", "waitq", NULL
    };

    printf("# kvload %s %s, time scale %g (figures uncompressed)\n",
           ctx->label, ctx->workload, ctx->scale);

    for (k = 0; cols[k]; k += 2) {
        printf(" %8s%s", cols[k + 1], cols[k + 2] ? "" : "\n");
    }

    json_array_foreach(stages, i, st) {
        for (k = 0; cols[k]; k += 2) {
            printf(" %8.4g%s", json_number_value(json_object_get(st, cols[k])),
                   cols[k + 2] ? "" : "\n");
        }
    }

    fflush(stdout);
}


int
kvl_report_csv(const char *path, json_t *stages)
{
    int          row;
    FILE        *f;
    size_t       i, n, m;
    json_t      *st, *v, *c;
    const char  *key, *k;

    /* one row per stage, the columns of the JSON; backends as "a=1;b=2" */

    f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "kvload: %s: %s\n", path, strerror(errno));
        return -1;
    }

    json_array_foreach(stages, i, st) {
        for (row = i ? 1 : 0; row < 2; row++) {    /* 0: the header */
            n = 0;

            json_object_foreach(st, key, v) {
                fputs(n++ ? "," : "", f);

                if (row == 0) {
                    fputs(key, f);
                } else if (json_is_string(v)) {
                    fputs(json_string_value(v), f);
                } else if (json_is_boolean(v)) {
                    fputc(json_is_true(v) ? '1' : '0', f);
                } else if (json_is_integer(v)) {
                    fprintf(f, "%lld", (long long) json_integer_value(v));
                } else if (json_is_real(v)) {
                    fprintf(f, "%.6g", json_real_value(v));
                } else {
                    m = 0;

                    json_object_foreach(v, k, c) {
                        fprintf(f, "%s%s=%lld", m++ ? ";" : "", k,
                                (long long) json_integer_value(c));
                    }
                }
            }

            fputc('\n', f);
        }
    }

    if (fclose(f) != 0) {
        fprintf(stderr, "kvload: %s: %s\n", path, strerror(errno));
        return -1;
    }

    return 0;
}
