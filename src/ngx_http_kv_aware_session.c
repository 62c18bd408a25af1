/*
 * ngx_http_kv_aware_module: sessions that stay where their context lives.
 *
 * With "kv_aware session=$value", a request whose value is not empty
 * belongs to a session.  Its first request is placed by the usual cost
 * and binds the session to the server (rank) chosen, in a table of the
 * upstream's zone (src/core/kva_session.c); its next ones go there,
 * whatever their prompt, unless the binding would hurt: the server is
 * down, failed, full or gone, cold (it holds no more of the prompt than
 * the usual choice, which holds some; or no server holds affinity_min of
 * the prompt and capacity chose another), or overloaded
 * (kva_score_overloaded(): a hot spot by the gate's test, or its cost
 * over the least one's by more than session_margin).  Then the usual
 * choice is taken and the session moves there.  A session idle for
 * session_timeout is forgotten.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_conf.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_session.h"

#include "kva_session.h"


static ngx_uint_t ngx_http_kv_aware_session_cold(kva_candidate_t *cand,
    ngx_uint_t n, ngx_uint_t bound);
static ngx_http_kv_aware_session_e ngx_http_kv_aware_session_cause(
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_uint_t slot);


const char  *ngx_http_kv_aware_session_keys[] = {
    NGX_HTTP_KV_AWARE_SESSIONS(NGX_HTTP_KV_AWARE_KEY3)
};

const char  *ngx_http_kv_aware_session_texts[] = {
    NGX_HTTP_KV_AWARE_SESSIONS(NGX_HTTP_KV_AWARE_TEXT3)
};


/* session=: any value with a variable; a constant would be one session */
char *
ngx_http_kv_aware_session_conf(ngx_conf_t *cf, ngx_http_kv_aware_param_t *p,
    ngx_str_t *value, void *conf)
{
    ngx_http_complex_value_t          *cv;
    ngx_http_compile_complex_value_t   ccv;

    if (value->len == 0) {
        return "a value with a variable, such as $http_x_session_affinity";
    }

    cv = ngx_palloc(cf->pool, sizeof(ngx_http_complex_value_t));
    if (cv == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));

    ccv.cf = cf;
    ccv.value = value;
    ccv.complex_value = cv;

    if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    if (cv->lengths == NULL) {
        return "a value with a variable, such as $http_x_session_affinity";
    }

    *(ngx_http_complex_value_t **) ((u_char *) conf + p->offset) = cv;

    return NGX_CONF_OK;
}


size_t
ngx_http_kv_aware_session_size(ngx_http_kv_aware_srv_conf_t *kcf)
{
    if (kcf->session == NULL) {
        return 0;
    }

    /* a page more: the slab allocator rounds a large one up to pages */
    return ngx_align(kva_session_size(kcf->session_capacity), ngx_pagesize)
           + ngx_pagesize;
}


/* the request's session key for this upstream; a huge value is hashed */
void
ngx_http_kv_aware_session_key(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx)
{
    ngx_str_t  v;

    if (ctx->session_of == kcf) {
        return;
    }

    ctx->session_of = kcf;
    ctx->session_key = 0;

    if (kcf->session == NULL || kcf->sh->sessions == NULL) {
        return;
    }

    /* no memory for the value: the request is placed as without one */
    if (ngx_http_complex_value(r, kcf->session, &v) != NGX_OK
        || v.len == 0)
    {
        return;
    }

    ctx->session_key = kva_session_key(kcf->sh->sessions, v.data, v.len);
}


ngx_uint_t
ngx_http_kv_aware_session_pick_locked(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_kv_aware_ctx_t *ctx, ngx_http_kv_aware_pick_t *picks,
    kva_candidate_t *cand, ngx_uint_t n)
{
    uint32_t                      slot;
    ngx_uint_t                    best, i;
    kva_session_t                *t;
    ngx_http_kv_aware_shctx_t    *sh;
    ngx_http_kv_aware_session_e   outcome;

    best = kva_score_costs(&kcf->score, cand, n, ctx->nblocks,
                           (uint32_t) ngx_random(), kcf->scratch->cost,
                           &ctx->why);

    ctx->session = NGX_HTTP_KV_AWARE_SESS_NONE;

    if (ctx->session_key == 0 || ctx->session_of != kcf) {
        return best;
    }

    sh = kcf->sh;
    t = sh->sessions;

    if (kva_session_get(t, ctx->session_key, ngx_current_msec,
                        kcf->session_timeout, &slot)
        != KVA_SESSION_FOUND)
    {
        outcome = NGX_HTTP_KV_AWARE_SESS_NEW;

    } else {
        for (i = 0; i < n && picks[i].slot != slot; i++) {
            /* void */
        }

        if (i == n) {
            outcome = ngx_http_kv_aware_session_cause(kcf, slot);

        } else if (i == best) {
            outcome = NGX_HTTP_KV_AWARE_SESS_BOUND;

        } else if (ngx_http_kv_aware_session_cold(cand, n, i)
                   || ctx->why == KVA_WHY_CAPACITY)
        {
            /*
             * By capacity: no server holds affinity_min of the prompt,
             * the bound one included, and another has more room for it
             * once what each holds is counted.  Kept, the session
             * overfilled a server its sessions had outgrown (each turn
             * computing again what its neighbours' turns evicted), as
             * it would not have without session=.
             */
            outcome = NGX_HTTP_KV_AWARE_SESS_COLD;

        } else if (kva_score_overloaded(&kcf->score, cand, n, ctx->nblocks,
                                        i, kcf->session_margin))
        {
            outcome = NGX_HTTP_KV_AWARE_SESS_OVERLOADED;

        } else {
            outcome = NGX_HTTP_KV_AWARE_SESS_BOUND;
            best = i;
            ctx->why = cand[i].matched ? KVA_WHY_AFFINITY : KVA_WHY_LOAD;
        }
    }

    /*
     * A session placed anew opens a context that grows where it lands,
     * turn after turn: where the usual choice follows what its prompt
     * matches, it is placed by capacity instead, as a new conversation
     * is (step 5), what a server holds of the prompt taken off its fill.
     * By the match, the first turns of agents sharing a system prompt
     * and tools (most of a first prompt) all went to the server that
     * held it first: in a quick agents run, 10 of 24 sessions started
     * on one of 8 servers, their contexts grew to 2.8 times its pool,
     * and their turns yielded as cold one by one.  A session back after
     * its binding expired, its context still held, goes home unless
     * home is fuller by more than that context.  A prompt that matches
     * nothing still goes by load.  Not a cold session: one whose turns
     * share only the common prompt would find every server it moves to
     * as cold as the last, and move again.
     */
    if (outcome == NGX_HTTP_KV_AWARE_SESS_NEW
        && ctx->why == KVA_WHY_AFFINITY)
    {
        best = kva_score_capacity(&kcf->score, cand, n, ctx->nblocks,
                                  (uint32_t) ngx_random(),
                                  kcf->scratch->cost);
        ctx->why = KVA_WHY_CAPACITY;
    }

    /* bound, placed or moved: the session is where this try goes */
    kva_session_bind(t, ctx->session_key, (uint32_t) picks[best].slot,
                     ngx_current_msec);

    sh->session.entries = t->used;
    sh->session.expired = t->expired;
    sh->session.evicted = t->evicted;

    ctx->session = outcome;
    (void) ngx_atomic_fetch_add(&sh->session.routed[outcome], 1);

    return best;
}


/*
 * What the binding keeps is the session's own blocks.  Cold: the bound
 * server holds nothing of the prompt that another candidate does not (as
 * far as the index knows), and another holds some: only what others hold
 * too is left there, such as a system prompt all sessions share, and the
 * session's context is gone.  Kept, such a session would stay on a server
 * too full to hold the sessions bound to it.  A prompt nobody holds any
 * of (changed completely, or evicted everywhere) is not cold.
 */
static ngx_uint_t
ngx_http_kv_aware_session_cold(kva_candidate_t *cand, ngx_uint_t n,
    ngx_uint_t bound)
{
    uint32_t    other;
    ngx_uint_t  j;

    other = 0;

    for (j = 0; j < n; j++) {
        if (j != bound && cand[j].matched > other) {
            other = cand[j].matched;
        }
    }

    return other && cand[bound].matched <= other;
}


/*
 * Why the bound server is not a candidate: its peer's state, read without
 * the lock of its list (which may not be the one held), for the reason.
 */
static ngx_http_kv_aware_session_e
ngx_http_kv_aware_session_cause(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_uint_t slot)
{
    ngx_uint_t                     j, i, nslots;
    ngx_http_upstream_rr_peer_t   *peer;
    ngx_http_upstream_rr_peers_t  *peers;

    nslots = kcf->npeers * kcf->data_parallel;

    for (j = 0; j < nslots && kcf->slot_of[j] != slot; j++) {
        /* void */
    }

    if (j == nslots) {
        return NGX_HTTP_KV_AWARE_SESS_GONE;
    }

    i = j / kcf->data_parallel;
    peers = kcf->uscf->peer.data;

    if (i >= kcf->nprimary) {
        i -= kcf->nprimary;
        peers = peers->next;
    }

    for (peer = peers ? peers->peer : NULL; peer && i; peer = peer->next) {
        i--;
    }

    if (peer == NULL) {
        return NGX_HTTP_KV_AWARE_SESS_GONE;
    }

    if (peer->down) {
        return NGX_HTTP_KV_AWARE_SESS_DOWN;
    }

    if (peer->max_conns && peer->conns >= peer->max_conns) {
        return NGX_HTTP_KV_AWARE_SESS_FULL;
    }

    /* max_fails, or a try of this request that failed there */
    return NGX_HTTP_KV_AWARE_SESS_FAILED;
}
