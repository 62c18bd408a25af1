/*
 * ngx_http_kv_aware_module: the time-to-first-token slice of a server's
 * slot: its learned prefill rate and the work routed there not answered
 * yet (ngx_http_kv_aware_ttft.c).
 *
 * It has no .c of its own, for the reason balancer_slice.h gives.
 */

#ifndef _NGX_HTTP_KV_AWARE_TTFT_SLICE_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_TTFT_SLICE_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"

#include "kva_ttft.h"


typedef struct {
    /* uncached blocks routed there whose answer has not begun */
    ngx_atomic_t                    queued;
    ngx_atomic_t                    ignored;      /* answers not learned */

    /* under the zone lock */
    kva_ttft_t                      est;
    ngx_uint_t                      rate;         /* est's, for the pages */
    ngx_uint_t                      predicted_ms; /* the last request's */
    ngx_uint_t                      observed_ms;  /* the last answer's */
} ngx_http_kv_aware_ttft_slot_t;


#endif /* _NGX_HTTP_KV_AWARE_TTFT_SLICE_H_INCLUDED_ */
