/*
 * ngx_http_kv_aware_module: learned routing shared between nginx
 * instances (kv_aware_events share=on); see the header.
 *
 * A message on CHANNEL:learned is an event message of the protocol
 * (docs/events.md) with one "stored" event and the sender's "origin":
 * the blocks one instance routed to one server.  Its seq is the sender's
 * own count and means nothing to the others: learned state is a hint,
 * and a lost message only costs the affinity it would have given.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_budget.h"
#include "ngx_http_kv_aware_events.h"
#include "ngx_http_kv_aware_share.h"

#include "kva_event.h"


static void ngx_http_kv_aware_share_send(
    ngx_http_kv_aware_share_channel_t *sc, ngx_uint_t slot, uint64_t *hashes,
    ngx_uint_t n);
static void ngx_http_kv_aware_share_apply(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_uint_t slot, uint64_t *hashes, size_t n);
static void ngx_http_kv_aware_share_refuse(
    ngx_http_kv_aware_share_channel_t *sc, ngx_http_kv_aware_reject_e why,
    const char *detail);


void
ngx_http_kv_aware_share_queue(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_uint_t slot, const uint64_t *hashes, ngx_uint_t n)
{
    ngx_uint_t                  i, room, at;
    ngx_http_kv_aware_share_t  *sr;

    sr = kcf->sh->share;
    room = NGX_HTTP_KV_AWARE_SHARE_RING - (sr->tail - sr->head);

    /* the ring full: the newest go, what waits is as good as they are */
    if (n > room) {
        (void) ngx_atomic_fetch_add(&sr->stats.dropped, n - room);
        n = room;
    }

    for (i = 0; i < n; i++) {
        at = (sr->tail + i) & (NGX_HTTP_KV_AWARE_SHARE_RING - 1);
        sr->hashes[at] = hashes[i];
        sr->slots[at] = (uint16_t) slot;
    }

    sr->tail += n;
}


/* what the sending takes out of the ring goes here, a ring at most */
ngx_int_t
ngx_http_kv_aware_share_init(ngx_http_kv_aware_share_channel_t *sc,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_pool_t *pool)
{
    sc->kcf = kcf;

    sc->hashes = ngx_palloc(pool, NGX_HTTP_KV_AWARE_SHARE_RING
                                  * sizeof(uint64_t));
    sc->slots = ngx_palloc(pool, NGX_HTTP_KV_AWARE_SHARE_RING
                                 * sizeof(uint16_t));

    if (sc->hashes == NULL || sc->slots == NULL) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * The subscribing worker takes what queued up, a ring at most per tick
 * (so what goes out is bounded by the ring's size every SHARE_EVERY ms),
 * and sends it a server at a time.
 */
void
ngx_http_kv_aware_share_tick(ngx_event_t *ev)
{
    ngx_http_kv_aware_share_channel_t *sc = ev->data;

    ngx_uint_t                     i, n, run, at;
    ngx_http_kv_aware_share_t     *sr;
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = sc->kcf;
    sr = kcf->sh->share;

    ngx_shmtx_lock(&kcf->shpool->mutex);

    n = sr->tail - sr->head;

    for (i = 0; i < n; i++) {
        at = (sr->head + i) & (NGX_HTTP_KV_AWARE_SHARE_RING - 1);
        sc->hashes[i] = sr->hashes[at];
        sc->slots[i] = sr->slots[at];
    }

    sr->head += n;

    ngx_shmtx_unlock(&kcf->shpool->mutex);

    for (i = 0; i < n; i += run) {
        for (run = 1; i + run < n; run++) {
            if (sc->slots[i + run] != sc->slots[i]) {
                break;
            }
        }

        ngx_http_kv_aware_share_send(sc, sc->slots[i], &sc->hashes[i], run);
    }

    if (!ngx_exiting) {
        ngx_add_timer(ev, NGX_HTTP_KV_AWARE_SHARE_EVERY);
    }
}


/* one server's blocks, in messages within what nginx accepts of one */
static void
ngx_http_kv_aware_share_send(ngx_http_kv_aware_share_channel_t *sc,
    ngx_uint_t slot, uint64_t *hashes, ngx_uint_t n)
{
    char                             *msg;
    size_t                            len;
    kva_ev_t                          ev;
    ngx_uint_t                        piece;
    kva_batch_t                       b;
    ngx_http_kv_aware_slot_t         *sl;
    ngx_http_kv_aware_share_t        *sr;
    ngx_http_kv_aware_srv_conf_t     *kcf;
    ngx_http_kv_aware_events_conf_t  *ecf;

    kcf = sc->kcf;
    ecf = kcf->events;
    sr = kcf->sh->share;
    sl = &kcf->sh->slots[slot];

    if (sl->name_len == 0) {
        /* the server left the upstream since */
        return;
    }

    for ( /* void */ ; n; n -= piece, hashes += piece) {
        piece = ngx_min(n, ecf->max_hashes);

        ngx_memzero(&b, sizeof(kva_batch_t));
        ngx_memzero(&ev, sizeof(kva_ev_t));

        ngx_memcpy(b.server, sl->name, sl->name_len);
        b.server_len = sl->name_len;
        b.has_rank = (kcf->data_parallel > 1);
        b.rank = sl->rank;
        b.has_origin = 1;
        b.origin = sr->origin;
        b.seq = ++sc->seq;
        b.keyspace = (kcf->keys == NGX_HTTP_KV_AWARE_KEYS_TOKENS)
                     ? KVA_KEYSPACE_TOKEN_KEYS : KVA_KEYSPACE_TEXT_KEYS;

        ev.type = KVA_EV_STORED;
        ev.hashes = hashes;
        ev.nhashes = piece;
        b.events = &ev;
        b.nevents = 1;
        b.hash_count = piece;

        msg = kva_event_encode(&b, &len);

        if (msg == NULL
            || ngx_http_kv_aware_redis_publish(sc->redis,
                                               &ecf->link.second,
                                               (u_char *) msg, len)
               != NGX_OK)
        {
            /* Redis away: each instance goes on with its own learning */
            (void) ngx_atomic_fetch_add(&sr->stats.dropped, piece);

        } else {
            (void) ngx_atomic_fetch_add(&sr->stats.sent, piece);
            (void) ngx_atomic_fetch_add(&sr->stats.messages_out, 1);
        }

        free(msg);
    }
}


/*
 * A message on CHANNEL:learned (the Redis link's second channel).  Any
 * publisher with the nginx credentials can write there, so it costs no
 * more than an event message: the same max_rate before the parse, the
 * same limits while decoding, the same budgets per server after.
 */
void
ngx_http_kv_aware_share_message(ngx_http_kv_aware_share_channel_t *sc,
    u_char *msg, size_t len)
{
    char                              err[128];
    size_t                            i;
    ngx_uint_t                        slot;
    const char                       *what;
    kva_batch_t                       b;
    kva_event_rc_e                    rc;
    kva_event_limits_t                lim;
    ngx_http_kv_aware_share_t        *sr;
    ngx_http_kv_aware_srv_conf_t     *kcf;
    ngx_http_kv_aware_events_conf_t  *ecf;

    kcf = sc->kcf;
    ecf = kcf->events;
    sr = kcf->sh->share;

    if (ngx_http_kv_aware_budget_rate(&sc->budget, &ecf->budget)) {
        ngx_http_kv_aware_share_refuse(sc, NGX_HTTP_KV_AWARE_REJ_FLOOD,
                                       "over max_rate");
        return;
    }

    lim.max_message = ecf->max_message;
    lim.max_hashes = ecf->max_hashes;
    lim.max_events = ecf->max_events;

    rc = kva_event_decode((char *) msg, len, &lim, &b, err, sizeof(err));

    if (rc != KVA_EVENT_OK) {
        ngx_http_kv_aware_share_refuse(sc,
                                   ngx_http_kv_aware_events_reject_class(rc),
                                   err);
        return;
    }

    if (!b.has_origin) {
        ngx_http_kv_aware_share_refuse(sc, NGX_HTTP_KV_AWARE_REJ_BAD_FIELD,
                                       "no origin");
        goto done;
    }

    /* our own, back from Redis */
    if (b.origin == sr->origin) {
        goto done;
    }

    if (b.keyspace != ((kcf->keys == NGX_HTTP_KV_AWARE_KEYS_TOKENS)
                       ? KVA_KEYSPACE_TOKEN_KEYS : KVA_KEYSPACE_TEXT_KEYS))
    {
        ngx_http_kv_aware_share_refuse(sc, NGX_HTTP_KV_AWARE_REJ_KEYSPACE,
                                       "another key space");
        goto done;
    }

    /* a server this upstream lacks: another instance's configuration */
    ngx_shmtx_lock(&kcf->shpool->mutex);
    slot = ngx_http_kv_aware_zone_slot_by_name(kcf->sh, (u_char *) b.server,
                                          b.server_len, b.rank);
    ngx_shmtx_unlock(&kcf->shpool->mutex);

    if (slot == KVA_MAX_SLOTS) {
        goto done;
    }

    /*
     * Unlike on the events channel the server is not degraded past its
     * budget: no event of its own was lost, only hints.
     */
    what = ngx_http_kv_aware_budget_server(&sc->budget, &ecf->budget, slot,
                                           len, b.hash_count);
    if (what) {
        ngx_http_kv_aware_share_refuse(sc, NGX_HTTP_KV_AWARE_REJ_FLOOD, what);
        goto done;
    }

    (void) ngx_atomic_fetch_add(&sr->stats.messages_in, 1);

    /* what a server says of its cache beats what anybody routed */
    if (ngx_http_kv_aware_zone_precise(kcf->sh, slot)) {
        goto done;
    }

    for (i = 0; i < b.nevents; i++) {
        if (b.events[i].type == KVA_EV_STORED) {
            ngx_http_kv_aware_share_apply(kcf, slot, b.events[i].hashes,
                                          b.events[i].nhashes);
        }
    }

done:

    kva_batch_free(&b);
}


/* as learned entries, a chunk per hold of the lock */
static void
ngx_http_kv_aware_share_apply(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_uint_t slot, uint64_t *hashes, size_t n)
{
    size_t       from, piece;
    kva_clock_t  clk;

    ngx_http_kv_aware_zone_clock(kcf, &clk);

    for (from = 0; from < n; from += piece) {
        piece = ngx_min(n - from, KVA_ADD_CHUNK);

        ngx_shmtx_lock(&kcf->shpool->mutex);

        /*
         * Bounded by the server's cache as this nginx's own learning is,
         * whether or not this nginx has routed to it yet.
         */
        if (from == 0) {
            ngx_http_kv_aware_zone_learn_budget(kcf, slot, &clk);
        }

        kva_index_add(kcf->sh->index, hashes + from, (uint32_t) piece, slot,
                      KVA_BIT_LEARNED, &clk);
        ngx_http_kv_aware_zone_unlock_between(kcf);
    }

    (void) ngx_atomic_fetch_add(&kcf->sh->share->stats.received, n);
}


/*
 * Counted with the rejects of the events channel under the same classes
 * (and as "refused" under "share"), logged at most once every 5 s.
 */
static void
ngx_http_kv_aware_share_refuse(ngx_http_kv_aware_share_channel_t *sc,
    ngx_http_kv_aware_reject_e why, const char *detail)
{
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = sc->kcf;

    (void) ngx_atomic_fetch_add(&kcf->sh->share->stats.refused, 1);
    (void) ngx_atomic_fetch_add(&kcf->sh->events.rejected[why], 1);

    if (ngx_current_msec - sc->logged < 5000 && sc->logged != 0) {
        return;
    }

    sc->logged = ngx_current_msec;

    ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                  "kv_aware: upstream \"%V\" refused a message on \"%V\": "
                  "%s: %s", &kcf->upstream, &kcf->events->link.second,
                  ngx_http_kv_aware_zone_reject_texts[why], detail);
}
