/*
 * kvload agent workload: conversations of tool-using agents, one turn at
 * a time with think time between turns, and where each one was served.
 */

#ifndef _KVLOAD_AGENT_H_INCLUDED_
#define _KVLOAD_AGENT_H_INCLUDED_


#include <jansson.h>

#include "kvload.h"


typedef struct {
    unsigned        concurrency;        /* conversations open at once */
    unsigned        tool_tokens;        /* tool result, every turn */
    unsigned        servers;            /* behind the target; 0: seen */
    double          think_ms;           /* mean, uncompressed */
} kvl_agent_conf_t;


/*
 * Runs ctx->wl.groups conversations of ctx->wl.turns turns against
 * ctx->target; the requests are counted in ctx->stages[0] like a stage.
 * -1 when out of memory.
 */
int kvl_agent_run(kvl_ctx_t *ctx, const kvl_agent_conf_t *ac);

/* adds "agent" to the report and prints its line */
int kvl_agent_report(kvl_ctx_t *ctx, json_t *root);


#endif /* _KVLOAD_AGENT_H_INCLUDED_ */
