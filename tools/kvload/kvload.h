/*
 * kvload: the state of one run, which the program (kvload_main.c) sets up
 * from its options, the run loop (kvload_run.c) drives, and the report
 * (kvload_report.c) writes out.
 */

#ifndef _KVLOAD_H_INCLUDED_
#define _KVLOAD_H_INCLUDED_


#include <stdint.h>

#include <event2/event.h>
#include <jansson.h>

#include "kvload_http.h"
#include "kvload_stats.h"
#include "kvload_trace.h"
#include "kvload_workload.h"


#define KVL_MAX_STAGES    64
#define KVL_MAX_METRICS   64


typedef struct {
    const char         *name;
    char                type;           /* s, d(ouble), u(nsigned), U64 */
    void               *p;
    const char         *dflt;
    const char         *help;
} kvl_opt_t;


typedef struct {
    const char         *target;
    const char         *workload;
    const char         *ladder;
    const char         *warmup;
    const char         *metrics;
    const char         *json;
    const char         *csv;
    const char         *label;
    double              scale;
    double              stage_seconds;
    double              timeout;
    double              drain_seconds;
    uint64_t            stage_requests;
    uint64_t            max_inflight;
    unsigned            metrics_ms;
    kvl_wl_conf_t       wl;
    struct event_base  *base;
    kvl_target_t        server;
    kvl_target_t        mtargets[KVL_MAX_METRICS];
    kvl_http_req_t      mreqs[KVL_MAX_METRICS];
    unsigned            nmetrics;
    unsigned            mpending;
    unsigned            mok;
    double              mwaiting;
    double              mlast;
    kvl_workload_t     *work;
    kvl_trace_conf_t    tc;             /* --trace: kvload_trace.c */
    kvl_trace_t        *trace;
    kvl_stage_t         stages[KVL_MAX_STAGES];
    unsigned            nstages;
    unsigned            cur;
    int                 arriving;
    int                 stopping;
    unsigned            errlog;
    uint64_t            rng;            /* arrivals, kva_rand.h */
    uint64_t            inflight;
    double              next_arrival;
    double              t_stage_end;
    struct event       *arrival;
    struct event       *tick;
    struct event       *sigint;
} kvl_ctx_t;


/* the timers, the signal and the scrapes: -1 when out of memory */
int kvl_run_init(kvl_ctx_t *ctx);
/* the stages in turn, until the last one drains or a second interrupt */
int kvl_run(kvl_ctx_t *ctx);

/* --trace: the window read, one stage of its requests at their times */
int kvl_trace_setup(kvl_ctx_t *ctx);

/* opts: echoed as the run's "config" */
json_t *kvl_report_json(kvl_ctx_t *ctx, kvl_opt_t *opts);
void kvl_report_print(kvl_ctx_t *ctx, json_t *stages);
int kvl_report_csv(const char *path, json_t *stages);


#endif /* _KVLOAD_H_INCLUDED_ */
