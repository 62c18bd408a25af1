/*
 * ngx_http_kv_aware_module: the sessions' slice of the zone, what became
 * of the requests of a session (kv_aware session=) and the table's
 * figures, copied out of it under the zone's lock.
 *
 * It has no .c of its own: ngx_http_kv_aware_zone.h composes the slices
 * and the concern's .c reads the zone, so the slice lives apart from
 * both and includes neither.
 */

#ifndef _NGX_HTTP_KV_AWARE_SESSION_SLICE_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_SESSION_SLICE_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"


/*
 * What a request of a session was routed by: its status key and its
 * $kv_aware_reason.  Bound: to the server its session is bound to; new:
 * a session not bound (or bound no more), placed by the usual cost, whose
 * reason then stays the usual one; the others: the binding yielded, and
 * why.  Down (marked down), failed (max_fails, or already tried by this
 * request), full (max_conns), gone (no longer in the upstream: DNS),
 * cold (it holds no more of the prompt than the usual choice, which holds
 * some: the session's context there is gone, as far as the index knows),
 * overloaded (a hot spot by the gate's test, or its cost over the least
 * one's by more than session_margin).
 */
#define NGX_HTTP_KV_AWARE_SESSIONS(X)                                         \
    X(SESS_NONE, "", "")                                                      \
    X(SESS_BOUND, "bound", "session")                                         \
    X(SESS_NEW, "new", "")                                                    \
    X(SESS_DOWN, "down", "session:yielded:down")                              \
    X(SESS_FAILED, "failed", "session:yielded:failed")                        \
    X(SESS_FULL, "full", "session:yielded:full")                              \
    X(SESS_GONE, "gone", "session:yielded:gone")                              \
    X(SESS_COLD, "cold", "session:yielded:cold")                              \
    X(SESS_OVERLOADED, "overloaded", "session:yielded:overloaded")

typedef enum {
    NGX_HTTP_KV_AWARE_SESSIONS(NGX_HTTP_KV_AWARE_ENUM3)
    NGX_HTTP_KV_AWARE_SESS_LAST
} ngx_http_kv_aware_session_e;


/* the upstream's */
typedef struct {
    ngx_atomic_t                    routed[NGX_HTTP_KV_AWARE_SESS_LAST];
    /* the table's, as its last user left it (under the zone's lock) */
    uint64_t                        entries;
    uint64_t                        capacity;     /* 0: no session= */
    uint64_t                        expired;
    uint64_t                        evicted;
} ngx_http_kv_aware_session_sh_t;


/* indexed by ngx_http_kv_aware_session_e (ngx_http_kv_aware_session.c) */
extern const char  *ngx_http_kv_aware_session_keys[];
extern const char  *ngx_http_kv_aware_session_texts[];


#endif /* _NGX_HTTP_KV_AWARE_SESSION_SLICE_H_INCLUDED_ */
