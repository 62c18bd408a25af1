/*
 * ngx_http_kv_aware_module: KV events -> the shared index.
 *
 * Runs in the one worker that subscribes.  Decoded batches update the
 * index under the zone lock and each server's sync state: a gap in the
 * sequence, a lost subscription or a silent server makes the module stop
 * trusting that server's events and ask it for a snapshot (resync); until
 * the snapshot is in, routing for it uses what nginx learned by routing.
 *
 * The subscription calls these for what the Redis link reports, once it
 * knows that this subscriber is the one to apply: a message goes redis ->
 * subscription -> events -> the core, and nothing here calls back into
 * the link but to publish a resync.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_redis.h"
#include "ngx_http_kv_aware_budget.h"
#include "ngx_http_kv_aware_events.h"

#include "kva_event.h"


#define NGX_HTTP_KV_AWARE_LOG_EVERY     5000    /* ms between log lines */
#define NGX_HTTP_KV_AWARE_RESYNC_EVERY  1000    /* ms between requests */

/*
 * A "cleared" event or the start of a snapshot scans the used part of the
 * index under the zone lock (about 3 ms for 800,000 entries) while every
 * worker waits to route.  Past this many entries scanned a second, such
 * messages are a flood: at most about 2% of the time goes to scans.
 */
#define NGX_HTTP_KV_AWARE_SCAN_BUDGET   4000000


static void ngx_http_kv_aware_apply(ngx_http_kv_aware_event_path_t *ep,
    ngx_uint_t slot, kva_batch_t *b);
static void ngx_http_kv_aware_set_ev_state(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_uint_t slot, ngx_uint_t state);
static void ngx_http_kv_aware_resync(ngx_http_kv_aware_event_path_t *ep,
    ngx_uint_t slot);
static void ngx_http_kv_aware_reject(ngx_http_kv_aware_event_path_t *ep,
    ngx_http_kv_aware_reject_e why, const char *detail, size_t len);
static ngx_uint_t ngx_http_kv_aware_scans(kva_batch_t *b, size_t *first);
static void ngx_http_kv_aware_apply_hashes(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_uint_t slot, kva_batch_t *b, size_t first);
static ngx_uint_t ngx_http_kv_aware_over_budget(
    ngx_http_kv_aware_event_path_t *ep, ngx_uint_t slot, size_t len,
    kva_batch_t *b);
static void ngx_http_kv_aware_degrade(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_uint_t slot);
static char *ngx_http_kv_aware_rank_text(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_kv_aware_slot_t *sl, u_char *buf);
static ngx_uint_t ngx_http_kv_aware_other_publisher(
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_slot_t *sl,
    kva_batch_t *b);


/* a message this subscriber is to apply */
void
ngx_http_kv_aware_events_message(ngx_http_kv_aware_event_path_t *ep,
    u_char *msg, size_t len)
{
    char                              err[128];
    ngx_uint_t                        slot, scan;
    kva_batch_t                       b;
    ngx_http_kv_aware_slot_t         *sl;
    kva_event_rc_e                    rc;
    kva_event_limits_t                lim;
    ngx_http_kv_aware_srv_conf_t     *kcf;
    ngx_http_kv_aware_events_conf_t  *ecf;

    kcf = ep->kcf;
    ecf = kcf->events;

    if (ngx_http_kv_aware_budget_rate(&ep->budget, &ecf->budget)) {
        ngx_http_kv_aware_reject(ep, NGX_HTTP_KV_AWARE_REJ_FLOOD,
                                 "over max_rate",
                                 sizeof("over max_rate") - 1);
        return;
    }

    lim.max_message = ecf->max_message;
    lim.max_hashes = ecf->max_hashes;
    lim.max_events = ecf->max_events;

    rc = kva_event_decode((char *) msg, len, &lim, &b, err, sizeof(err));

    if (rc != KVA_EVENT_OK) {
        ngx_http_kv_aware_reject(ep,
                                 ngx_http_kv_aware_events_reject_class(rc),
                                 err, ngx_strlen(err));
        return;
    }

    /* hashes of the other key space would only ever match by accident */
    if (b.keyspace != (kcf->keys == NGX_HTTP_KV_AWARE_KEYS_TOKENS
                       ? KVA_KEYSPACE_TOKEN_KEYS : KVA_KEYSPACE_TEXT_KEYS))
    {
        ngx_http_kv_aware_reject(ep, NGX_HTTP_KV_AWARE_REJ_KEYSPACE,
                                 kva_event_keyspace_names[b.keyspace],
                                 ngx_strlen(kva_event_keyspace_names[
                                                b.keyspace]));
        kva_batch_free(&b);
        return;
    }

    ngx_shmtx_lock(&kcf->shpool->mutex);
    slot = ngx_http_kv_aware_zone_slot_by_name(kcf->sh, (u_char *) b.server,
                                          b.server_len, b.rank);
    ngx_shmtx_unlock(&kcf->shpool->mutex);

    if (slot == KVA_MAX_SLOTS) {
        ngx_http_kv_aware_reject(ep, NGX_HTTP_KV_AWARE_REJ_UNKNOWN_SERVER,
                                 b.server, b.server_len);
        kva_batch_free(&b);
        return;
    }

    sl = &kcf->sh->slots[slot];

    if (ngx_http_kv_aware_other_publisher(kcf, sl, &b)) {
        kva_batch_free(&b);
        return;
    }

    /*
     * Once the old subscriber has let go, the new one may still get a
     * message that the old one applied: a repeat, not a gap.
     */
    if (ep->took_over && sl->ev.has_seq && b.seq <= sl->ev.seq
        && sl->ev.seq_gen != kcf->generation
        && ngx_current_msec - ep->took_over
           < ecf->link.connect_timeout + 2 * NGX_HTTP_KV_AWARE_HANDOVER)
    {
        kva_batch_free(&b);
        return;
    }

    if (ngx_http_kv_aware_over_budget(ep, slot, len, &b)) {
        kva_batch_free(&b);
        return;
    }

    scan = ngx_http_kv_aware_scans(&b, NULL) * kcf->sh->index->high_water;

    /* the first scan of a second always passes, or a big index never syncs */
    if (scan && ep->budget.scanned >= NGX_HTTP_KV_AWARE_SCAN_BUDGET) {
        /*
         * Skipping a clear is safe once the server is degraded: its event
         * entries are not trusted until a snapshot replaces them.
         */
        ngx_http_kv_aware_reject(ep, NGX_HTTP_KV_AWARE_REJ_FLOOD,
                                 "too many index clears a second",
                                 sizeof("too many index clears a second")
                                 - 1);
        ngx_http_kv_aware_degrade(kcf, slot);
        kva_batch_free(&b);
        return;
    }

    ep->budget.scanned += scan;

    ngx_http_kv_aware_apply(ep, slot, &b);

    kva_batch_free(&b);
}


/*
 * Two bridges may follow one engine for redundancy, each counting its own
 * seq: applied together they would look like a gap at every message.  A
 * server's events are taken from one publisher ("origin", none counts as
 * one) and the other's ignored, until the one followed is silent past the
 * heartbeat, or the other starts afresh (seq 1: a restarted bridge).  A
 * switch costs one resync.
 */
static ngx_uint_t
ngx_http_kv_aware_other_publisher(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_kv_aware_slot_t *sl, kva_batch_t *b)
{
    u_char    rank[sizeof(" rank ") + NGX_INT_T_LEN];
    uint64_t  origin;

    origin = b->has_origin ? b->origin : 0;

    if (origin == sl->ev.origin) {
        return 0;
    }

    if (!sl->ev.has_seq || b->seq <= 1
        || ngx_current_msec - sl->ev.heard > kcf->events->heartbeat)
    {
        ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                      "kv_aware: events of \"%*s\"%s now followed from "
                      "publisher %016uxL (was %016uxL)", sl->name_len,
                      sl->name, ngx_http_kv_aware_rank_text(kcf, sl, rank),
                      origin, sl->ev.origin);

        sl->ev.origin = origin;
        sl->ev.two_told = 0;            /* a pair after the switch: said */
        return 0;
    }

    if (!sl->ev.two_told) {
        sl->ev.two_told = 1;
        ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                      "kv_aware: events of \"%*s\"%s come from two "
                      "publishers: %016uxL followed, %016uxL ignored while "
                      "the first is heard (logged once)", sl->name_len,
                      sl->name, ngx_http_kv_aware_rank_text(kcf, sl, rank),
                      sl->ev.origin, origin);
    }

    return 1;
}


/*
 * Past a server's budget the message is refused as a flood; the server
 * has then lost events, so it is degraded until a snapshot (asked for by
 * the tick) brings it back.
 */
static ngx_uint_t
ngx_http_kv_aware_over_budget(ngx_http_kv_aware_event_path_t *ep,
    ngx_uint_t slot, size_t len, kva_batch_t *b)
{
    const char  *what;

    what = ngx_http_kv_aware_budget_server(&ep->budget,
                                           &ep->kcf->events->budget, slot,
                                           len, b->hash_count);
    if (what == NULL) {
        return 0;
    }

    ngx_http_kv_aware_reject(ep, NGX_HTTP_KV_AWARE_REJ_FLOOD, what,
                             ngx_strlen(what));
    ngx_http_kv_aware_degrade(ep->kcf, slot);

    return 1;
}


/* a message of the server was dropped: its event entries are not trusted */
static void
ngx_http_kv_aware_degrade(ngx_http_kv_aware_srv_conf_t *kcf, ngx_uint_t slot)
{
    kcf->sh->slots[slot].ev.synced = 0;
    ngx_http_kv_aware_set_ev_state(kcf, slot, NGX_HTTP_KV_AWARE_EV_DEGRADED);
}


/*
 * How many whole-index scans applying the batch takes: one at most, since
 * a clear wipes what came before it in the message.  *first is the event
 * to apply from: the one after the last clear.
 */
static ngx_uint_t
ngx_http_kv_aware_scans(kva_batch_t *b, size_t *first)
{
    size_t      i, from;
    ngx_uint_t  n;

    n = (b->snapshot == KVA_SNAP_FULL || b->snapshot == KVA_SNAP_BEGIN);
    from = 0;

    for (i = 0; i < b->nevents; i++) {
        if (b->events[i].type == KVA_EV_CLEARED) {
            n = 1;
            from = i + 1;
        }
    }

    if (first) {
        *first = from;
    }

    return n;
}


static void
ngx_http_kv_aware_apply(ngx_http_kv_aware_event_path_t *ep, ngx_uint_t slot,
    kva_batch_t *b)
{
    u_char                         rank[sizeof(" rank ") + NGX_INT_T_LEN];
    size_t                         first;
    ngx_uint_t                     in_sequence;
    kva_slotset_t                  set;
    ngx_http_kv_aware_slot_t      *sl;
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = ep->kcf;
    sl = &kcf->sh->slots[slot];

    in_sequence = sl->ev.has_seq && b->seq == sl->ev.seq + 1;

    if (!sl->ev.has_seq && b->seq <= 1) {
        /* a server that starts publishing from its first message */
        in_sequence = 1;
        sl->ev.synced = 1;
    }

    if (!in_sequence) {
        sl->ev.synced = 0;
    }

    sl->ev.seq = b->seq;
    sl->ev.seq_gen = kcf->generation;
    sl->ev.has_seq = 1;
    sl->ev.heard = ngx_current_msec;

    if (b->has_load) {
        sl->ev.waiting = b->waiting;
        sl->ev.running = b->running;
        sl->ev.kv_usage = (uint32_t) (b->kv_usage * 1000);

        if (b->kv_tokens) {
            sl->ev.kv_tokens = b->kv_tokens;    /* the learned budget */
        }
        sl->ev.has_load = 1;
    }

    if (ngx_http_kv_aware_scans(b, &first)) {
        /*
         * A clear forgets guesses too; a snapshot replaces only what the
         * server said before.
         */
        kva_slotset_zero(&set);
        kva_slotset_add(&set, slot);
        ngx_http_kv_aware_zone_drop_slots(kcf, &set,
                                     first ? KVA_BITS_ALL : KVA_BIT_EVENT);
    }

    ngx_http_kv_aware_apply_hashes(kcf, slot, b, first);

    (void) ngx_atomic_fetch_add(&sl->ev.messages, 1);
    (void) ngx_atomic_fetch_add(&sl->ev.hashes, b->hash_count);
    (void) ngx_atomic_fetch_add(&kcf->sh->events.messages, 1);
    (void) ngx_atomic_fetch_add(&kcf->sh->events.hashes, b->hash_count);

    switch (b->snapshot) {

    case KVA_SNAP_FULL:
        sl->ev.synced = 1;
        ngx_http_kv_aware_set_ev_state(kcf, slot, NGX_HTTP_KV_AWARE_EV_FRESH);
        return;

    case KVA_SNAP_BEGIN:
        ngx_http_kv_aware_set_ev_state(kcf, slot,
                                       NGX_HTTP_KV_AWARE_EV_SYNCING);
        return;

    case KVA_SNAP_MORE:
    case KVA_SNAP_END:
        /* a snapshot with a part missing is no snapshot */
        if (in_sequence && sl->ev.state == NGX_HTTP_KV_AWARE_EV_SYNCING) {
            if (b->snapshot == KVA_SNAP_END) {
                sl->ev.synced = 1;
                ngx_http_kv_aware_set_ev_state(kcf, slot,
                                               NGX_HTTP_KV_AWARE_EV_FRESH);
            }

            return;
        }

        break;

    default:
        break;
    }

    if (!in_sequence) {
        (void) ngx_atomic_fetch_add(&sl->ev.gaps, 1);

        ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                      "kv_aware: events of \"%*s\"%s out of sequence at "
                      "%uL, asking for a resync", sl->name_len, sl->name,
                      ngx_http_kv_aware_rank_text(kcf, sl, rank),
                      (uint64_t) b->seq);

        ngx_http_kv_aware_set_ev_state(kcf, slot,
                                       NGX_HTTP_KV_AWARE_EV_DEGRADED);
        ngx_http_kv_aware_resync(ep, slot);
        return;
    }

    if (sl->ev.state == NGX_HTTP_KV_AWARE_EV_FRESH) {
        return;
    }

    if (sl->ev.synced) {
        /* back from silence, and nothing was missed meanwhile */
        ngx_http_kv_aware_set_ev_state(kcf, slot, NGX_HTTP_KV_AWARE_EV_FRESH);
        return;
    }

    if (sl->ev.state != NGX_HTTP_KV_AWARE_EV_SYNCING) {
        /* still waiting for the snapshot; ask again now and then */
        ngx_http_kv_aware_set_ev_state(kcf, slot,
                                       NGX_HTTP_KV_AWARE_EV_DEGRADED);
        ngx_http_kv_aware_resync(ep, slot);
    }
}


/*
 * Stored and removed hashes from events[first] on, under the zone lock a
 * chunk at a time: a message as large as max_hashes allows still keeps
 * routing waiting for no more than one chunk.
 */
static void
ngx_http_kv_aware_apply_hashes(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_uint_t slot, kva_batch_t *b, size_t first)
{
    size_t        i, off, n, held;
    kva_ev_t     *ev;
    kva_clock_t   clk;

    ngx_http_kv_aware_zone_clock(kcf, &clk);

    held = 0;

    ngx_shmtx_lock(&kcf->shpool->mutex);

    for (i = first; i < b->nevents; i++) {
        ev = &b->events[i];

        for (off = 0; off < ev->nhashes; off += n) {
            if (held >= KVA_ADD_CHUNK) {
                ngx_http_kv_aware_zone_unlock_between(kcf);
                held = 0;
                ngx_shmtx_lock(&kcf->shpool->mutex);
            }

            n = ngx_min(ev->nhashes - off,
                        KVA_ADD_CHUNK - held);
            held += n;

            if (ev->type == KVA_EV_STORED) {
                kva_index_add(kcf->sh->index, ev->hashes + off, n, slot,
                              KVA_BIT_EVENT | kva_tier_srcs(ev->tier), &clk);

            } else if (ev->type == KVA_EV_REMOVED) {
                /* gone from the server: guesses about it are wrong too */
                kva_index_del(kcf->sh->index, ev->hashes + off, n, slot,
                              KVA_BITS_ALL);
            }
        }
    }

    ngx_shmtx_unlock(&kcf->shpool->mutex);
}


static void
ngx_http_kv_aware_set_ev_state(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_uint_t slot, ngx_uint_t state)
{
    kva_slotset_t              set;
    ngx_http_kv_aware_slot_t  *sl;

    sl = &kcf->sh->slots[slot];

    if (sl->ev.state == state) {
        return;
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                   "kv_aware: server \"%*s\" events state %ui",
                   sl->name_len, sl->name, state);

    sl->ev.state = state;

    kva_slotset_zero(&set);
    kva_slotset_add(&set, slot);
    ngx_http_kv_aware_zone_set_precise(kcf->sh, &set,
                                  state == NGX_HTTP_KV_AWARE_EV_FRESH);
}


static void
ngx_http_kv_aware_resync(ngx_http_kv_aware_event_path_t *ep, ngx_uint_t slot)
{
    char                          *msg;
    size_t                         len;
    ngx_http_kv_aware_slot_t      *sl;
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = ep->kcf;
    sl = &kcf->sh->slots[slot];

    if (ngx_current_msec - sl->ev.resync < NGX_HTTP_KV_AWARE_RESYNC_EVERY
        && sl->ev.resync != 0)
    {
        return;
    }

    /* a server of one rank is asked as before: publishers may be older */
    msg = kva_event_encode_resync((char *) sl->name, sl->name_len,
                                  kcf->data_parallel > 1 ? (int) sl->rank
                                                         : -1,
                                  &len);
    if (msg == NULL) {
        return;
    }

    if (ngx_http_kv_aware_redis_publish(ep->redis,
                                        &kcf->events->resync_channel,
                                        (u_char *) msg, len)
        == NGX_OK)
    {
        sl->ev.resync = ngx_current_msec;
        (void) ngx_atomic_fetch_add(&kcf->sh->events.resyncs, 1);
    }

    free(msg);
}


/* " rank 3" after a server's name in logs, of a data-parallel upstream */
static char *
ngx_http_kv_aware_rank_text(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_kv_aware_slot_t *sl, u_char *buf)
{
    if (kcf->data_parallel < 2) {
        return "";
    }

    *ngx_sprintf(buf, " rank %ui", sl->rank) = '\0';

    return (char *) buf;
}


/* counted always, logged at most once every few seconds per class */
static void
ngx_http_kv_aware_reject(ngx_http_kv_aware_event_path_t *ep,
    ngx_http_kv_aware_reject_e why, const char *detail, size_t len)
{
    ngx_atomic_uint_t              n;
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = ep->kcf;
    n = ngx_atomic_fetch_add(&kcf->sh->events.rejected[why], 1) + 1;

    if (ngx_current_msec - ep->logged[why] < NGX_HTTP_KV_AWARE_LOG_EVERY
        && ep->logged[why] != 0)
    {
        return;
    }

    ep->logged[why] = ngx_current_msec;

    ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                  "kv_aware: upstream \"%V\" ignored an event message: "
                  "%s%s%*s (%uA so far)", &kcf->upstream,
                  ngx_http_kv_aware_zone_reject_texts[why], len ? ": " : "",
                  ngx_min(len, 128), detail ? detail : "", n);
}


/*
 * Redis is back and subscribed: what we knew may have gaps, unless the
 * subscriber of the cycle before is still subscribed (a reload): then
 * nothing was missed, it goes on applying until it lets go, and we take
 * over from there.
 */
void
ngx_http_kv_aware_events_subscribed(ngx_http_kv_aware_event_path_t *ep)
{
    ngx_uint_t                     s, live;
    ngx_http_kv_aware_shctx_t     *sh;
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = ep->kcf;
    sh = kcf->sh;
    live = sh->events.sub_live;

    if (sh->events.sub_gen < kcf->generation) {
        sh->events.sub_gen = kcf->generation;
    }

    if (live && live < kcf->generation && ep->took_over == 0) {
        ep->took_over = ngx_current_msec;

        ngx_log_error(NGX_LOG_NOTICE, ngx_cycle->log, 0,
                      "kv_aware: upstream \"%V\" takes the subscription "
                      "over from the previous configuration", &kcf->upstream);
        return;
    }

    sh->events.sub_live = kcf->generation;

    for (s = 0; s < KVA_MAX_SLOTS; s++) {
        if (kcf->sh->slots[s].name_len && kcf->sh->slots[s].ev.has_seq) {
            kcf->sh->slots[s].ev.synced = 0;
            ngx_http_kv_aware_set_ev_state(kcf, s,
                                           NGX_HTTP_KV_AWARE_EV_DEGRADED);
            kcf->sh->slots[s].ev.resync = 0;
            ngx_http_kv_aware_resync(ep, s);
        }
    }
}


/* the subscription is gone: nothing said from now on will reach us */
void
ngx_http_kv_aware_events_lost(ngx_http_kv_aware_event_path_t *ep)
{
    ngx_uint_t                     s;
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = ep->kcf;

    (void) ngx_atomic_cmp_set(&kcf->sh->events.sub_live, kcf->generation, 0);

    if (kcf->sh->events.sub_gen > kcf->generation) {
        /* a newer subscriber has it all: not ours to judge any more */
        return;
    }

    for (s = 0; s < KVA_MAX_SLOTS; s++) {
        if (kcf->sh->slots[s].ev.has_seq) {
            kcf->sh->slots[s].ev.synced = 0;
            ngx_http_kv_aware_set_ev_state(kcf, s,
                                           NGX_HTTP_KV_AWARE_EV_DEGRADED);
        }
    }
}


/* servers silent past their heartbeat are stale; the unsynced get asked */
void
ngx_http_kv_aware_events_tick(ngx_event_t *ev)
{
    ngx_http_kv_aware_event_path_t *ep = ev->data;

    u_char                         rank[sizeof(" rank ") + NGX_INT_T_LEN];
    ngx_uint_t                     s;
    ngx_http_kv_aware_slot_t      *sl;
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = ep->kcf;

    for (s = 0; s < KVA_MAX_SLOTS; s++) {
        sl = &kcf->sh->slots[s];

        if (!sl->ev.has_seq) {
            continue;
        }

        if (sl->ev.state != NGX_HTTP_KV_AWARE_EV_STALE
            && ngx_current_msec - sl->ev.heard > kcf->events->heartbeat)
        {
            ngx_log_error(NGX_LOG_WARN, ev->log, 0,
                          "kv_aware: server \"%*s\"%s silent for %M ms, "
                          "routing it by learned state", sl->name_len,
                          sl->name,
                          ngx_http_kv_aware_rank_text(kcf, sl, rank),
                          ngx_current_msec - sl->ev.heard);

            ngx_http_kv_aware_set_ev_state(kcf, s,
                                           NGX_HTTP_KV_AWARE_EV_STALE);
        }

        /* a request may have been lost, or Redis was not ready for it */
        if (sl->ev.state == NGX_HTTP_KV_AWARE_EV_DEGRADED
            || sl->ev.state == NGX_HTTP_KV_AWARE_EV_STALE)
        {
            ngx_http_kv_aware_resync(ep, s);
        }
    }

    if (!(ngx_exiting || ngx_quit || ngx_terminate)) {
        ngx_add_timer(ev, NGX_HTTP_KV_AWARE_TICK);
    }
}


/* the class a decoder's refusal counts under, on either channel */
static const ngx_http_kv_aware_rc_map_t  ngx_http_kv_aware_reject_classes[] = {
    { KVA_EVENT_TOO_BIG, NGX_HTTP_KV_AWARE_REJ_TOO_BIG },
    { KVA_EVENT_VERSION, NGX_HTTP_KV_AWARE_REJ_VERSION },
    { KVA_EVENT_BAD_FIELD, NGX_HTTP_KV_AWARE_REJ_BAD_FIELD }
};


ngx_http_kv_aware_reject_e
ngx_http_kv_aware_events_reject_class(kva_event_rc_e rc)
{
    return ngx_http_kv_aware_module_rc_reason(ngx_http_kv_aware_reject_classes,
               sizeof(ngx_http_kv_aware_reject_classes)
               / sizeof(ngx_http_kv_aware_rc_map_t),
               rc, NGX_HTTP_KV_AWARE_REJ_MALFORMED);
}
