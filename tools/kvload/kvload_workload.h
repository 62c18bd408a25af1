/*
 * kvload workloads: deterministic OpenAI chat request bodies from a seed.
 */

#ifndef _KVLOAD_WORKLOAD_H_INCLUDED_
#define _KVLOAD_WORKLOAD_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


typedef enum {
    KVL_WL_SHARED_PREFIX = 0,
    KVL_WL_MULTI_TURN,
    KVL_WL_NO_SHARING,
    KVL_WL_AGENT,                       /* kvload_agent.c: closed loop */
    KVL_WL_SESSIONS                     /* kvload_sessions.c: replayed */
} kvl_wl_kind_e;


typedef struct {
    kvl_wl_kind_e   kind;
    unsigned        groups;             /* multi-turn: conversations */
    unsigned        prompts_per_group;
    unsigned        turns;
    unsigned        system_tokens;
    unsigned        question_tokens;    /* multi-turn: per user turn */
    unsigned        output_tokens;      /* multi-turn: per assistant turn */
    const char     *model;
    uint64_t        seed;
    /*
     * 1: a completions body whose prompt is token ids, one a 4-byte
     * pseudo-token of the same text and a role's id before each message,
     * so that nginx (keys=tokens) needs no tokenizer
     */
    unsigned        prompt_ids;
} kvl_wl_conf_t;


typedef struct kvl_workload_s  kvl_workload_t;


kvl_workload_t *kvl_workload_create(const kvl_wl_conf_t *conf);
int kvl_workload_next(kvl_workload_t *wl, const char **body, size_t *len);
void kvl_workload_free(kvl_workload_t *wl);


#endif /* _KVLOAD_WORKLOAD_H_INCLUDED_ */
