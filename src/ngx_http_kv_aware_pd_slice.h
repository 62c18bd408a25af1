/*
 * ngx_http_kv_aware_module: the disaggregated serving slice of the zone,
 * the decisions of kv_aware_prefill, counted in the zone of the decode
 * upstream (the one the location proxies to).
 *
 * It has no .c of its own: ngx_http_kv_aware_zone.h composes the slices
 * and the concern's .c reads the zone, so the slice lives apart from
 * both and includes neither.
 */

#ifndef _NGX_HTTP_KV_AWARE_PD_SLICE_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_PD_SLICE_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"


/*
 * What kv_aware_prefill decided for a request: its status key and its
 * $kv_aware_pd value.  Split: a prefill server was chosen; aggregated:
 * the decode server computes the prompt itself, because the prompt is
 * short or because what it lacks of it is; fallback: aggregated since no
 * split could be made (no prompt to count, no prefill or decode server,
 * or, where nginx runs the prefill leg, that leg failed); client_gone:
 * the client left during that leg, and the request ended there.
 */
#define NGX_HTTP_KV_AWARE_PD_OUTCOMES(X)                                      \
    X(PD_SPLIT, "split", "split")                                             \
    X(PD_SHORT, "short", "aggregated:short")                                  \
    X(PD_CACHED, "cached", "aggregated:cached")                               \
    X(PD_NO_PROMPT, "no_prompt", "fallback:no_prompt")                        \
    X(PD_NO_DECODE, "no_decode", "fallback:no_decode")                        \
    X(PD_NO_PREFILL, "no_prefill", "fallback:no_prefill")                    \
    X(PD_PREFILL_FAILED, "prefill_failed", "fallback:prefill_failed")      \
    X(PD_CLIENT_GONE, "client_gone", "client_gone")

typedef enum {
    NGX_HTTP_KV_AWARE_PD_OUTCOMES(NGX_HTTP_KV_AWARE_ENUM3)
    NGX_HTTP_KV_AWARE_PD_LAST
} ngx_http_kv_aware_pd_e;


/* the decode upstream's */
typedef struct {
    ngx_atomic_t                    decided[NGX_HTTP_KV_AWARE_PD_LAST];
    ngx_atomic_t                    prefill_tokens;   /* of the splits */
} ngx_http_kv_aware_pd_sh_t;


/* indexed by ngx_http_kv_aware_pd_e (ngx_http_kv_aware_pd.c) */
extern const char  *ngx_http_kv_aware_pd_keys[];
extern const char  *ngx_http_kv_aware_pd_texts[];


#endif /* _NGX_HTTP_KV_AWARE_PD_SLICE_H_INCLUDED_ */
