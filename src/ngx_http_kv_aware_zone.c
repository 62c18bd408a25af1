/*
 * ngx_http_kv_aware_module: the per-upstream shared memory zone.
 *
 * The zone outlives reloads (limit_req's pattern): the index and the
 * server slots are reused when the new configuration is compatible, so
 * affinity survives `nginx -s reload`.  Servers keep their slot by name;
 * slots of servers that left the upstream are wiped.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_zone.h"

#if (NGX_LINUX)
#include <sys/random.h>
#endif


static ngx_int_t ngx_http_kv_aware_create_sh(ngx_shm_zone_t *shm_zone,
    ngx_http_kv_aware_srv_conf_t *kcf);
static ngx_int_t ngx_http_kv_aware_assign_slots(
    ngx_http_kv_aware_srv_conf_t *kcf);
static ngx_uint_t ngx_http_kv_aware_load_table(
    ngx_http_kv_aware_shctx_t *sh, ngx_http_kv_aware_load_t *current);
static ngx_uint_t ngx_http_kv_aware_in_flight(ngx_http_kv_aware_load_t *load);
static uint64_t ngx_http_kv_aware_secret(void);


const char  *ngx_http_kv_aware_zone_ev_state_names[] = {
    NGX_HTTP_KV_AWARE_EV_STATES(NGX_HTTP_KV_AWARE_KEY2)
};

const char  *ngx_http_kv_aware_zone_reject_keys[] = {
    NGX_HTTP_KV_AWARE_REJECTS(NGX_HTTP_KV_AWARE_KEY3)
};

const char  *ngx_http_kv_aware_zone_reject_texts[] = {
    NGX_HTTP_KV_AWARE_REJECTS(NGX_HTTP_KV_AWARE_TEXT3)
};


ngx_int_t
ngx_http_kv_aware_zone_init(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_kv_aware_srv_conf_t  *okcf = data;

    ngx_uint_t                     g, layout;
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = shm_zone->data;
    kcf->shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (okcf) {
        kcf->sh = okcf->sh;

    } else if (shm_zone->shm.exists) {
        kcf->sh = kcf->shpool->data;

    } else if (ngx_http_kv_aware_create_sh(shm_zone, kcf) != NGX_OK) {
        return NGX_ERROR;
    }

    /*
     * A zone kept from an older layout of the index (kva_index.h's magic)
     * is not read in the new one: a guard for what a module's own zone tag
     * does not cover.
     */
    layout = kcf->sh->block_size
             && !kva_index_valid(kcf->sh->index, kcf->sh->index_size);

    if (layout
        || kcf->sh->block_size != kcf->block_size
        || kcf->sh->keys != kcf->keys
        || kcf->sh->block_tokens != kcf->block_tokens)
    {
        if (layout) {
            ngx_log_error(NGX_LOG_NOTICE, shm_zone->shm.log, 0,
                          "kv_aware: index layout of upstream \"%V\" "
                          "changed, index reset", &kcf->upstream);

        /* hashes of another block size never match: start afresh */
        } else if (kcf->sh->block_size != kcf->block_size
                   && kcf->sh->block_size)
        {
            ngx_log_error(NGX_LOG_NOTICE, shm_zone->shm.log, 0,
                          "kv_aware: block_size of upstream \"%V\" "
                          "changed, index reset", &kcf->upstream);

        } else if (kcf->sh->block_size) {
            ngx_log_error(NGX_LOG_NOTICE, shm_zone->shm.log, 0,
                          "kv_aware: keys or block_tokens of upstream "
                          "\"%V\" changed, index reset", &kcf->upstream);
        }

        /*
         * Workers of the old cycle still route under the lock: a reset
         * under their feet could leave them linking an entry into the
         * fresh index, and a cycle in a chain.
         */
        ngx_shmtx_lock(&kcf->shpool->mutex);

        (void) kva_index_init(kcf->sh->index, kcf->sh->index_size,
                              ngx_http_kv_aware_secret());
        ngx_memzero(kcf->sh->slots, sizeof(kcf->sh->slots));
        ngx_memzero((void *) kcf->sh->events.precise,
                    sizeof(kcf->sh->events.precise));
        kcf->sh->block_size = kcf->block_size;
        kcf->sh->keys = kcf->keys;
        kcf->sh->block_tokens = kcf->block_tokens;

        ngx_shmtx_unlock(&kcf->shpool->mutex);
    }

    kcf->generation = ++kcf->sh->generation;

    g = ngx_http_kv_aware_load_table(kcf->sh, okcf ? okcf->load : NULL);
    kcf->load = kcf->sh->load[g];

    return ngx_http_kv_aware_assign_slots(kcf);
}


static ngx_int_t
ngx_http_kv_aware_create_sh(ngx_shm_zone_t *shm_zone,
    ngx_http_kv_aware_srv_conf_t *kcf)
{
    size_t            len, size;
    void             *region;
    ngx_uint_t        tries;
    ngx_slab_pool_t  *shpool;

    shpool = kcf->shpool;

    kcf->sh = ngx_slab_calloc(shpool, sizeof(ngx_http_kv_aware_shctx_t));
    if (kcf->sh == NULL) {
        return NGX_ERROR;
    }

    shpool->data = kcf->sh;

    len = sizeof(" in kv_aware zone \"\"") + shm_zone->shm.name.len;

    shpool->log_ctx = ngx_slab_alloc(shpool, len);
    if (shpool->log_ctx == NULL) {
        return NGX_ERROR;
    }

    ngx_sprintf(shpool->log_ctx, " in kv_aware zone \"%V\"%Z",
                &shm_zone->shm.name);

    shpool->log_nomem = 0;

    /* always there: share=on may come with a reload */
    kcf->sh->share = ngx_slab_calloc(shpool,
                                     sizeof(ngx_http_kv_aware_share_t));
    if (kcf->sh->share == NULL) {
        return NGX_ERROR;
    }

    kcf->sh->share->origin = ngx_http_kv_aware_secret();

    /*
     * session=: its table, for which kv_aware grew the zone, before the
     * index takes the rest.  Made with the zone only: a reload that turns
     * session= on or changes session_capacity changes the zone's size,
     * and so comes with a new zone.
     */
    if (kcf->session) {
        size = kva_session_size(kcf->session_capacity);
        region = ngx_slab_alloc(shpool, size);

        kcf->sh->sessions = region ? kva_session_init(region, size,
                                                      kcf->session_capacity)
                                   : NULL;

        if (kcf->sh->sessions == NULL) {
            ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                          "kv_aware: no room for the sessions in zone "
                          "\"%V\"", &shm_zone->shm.name);
            return NGX_ERROR;
        }

        kcf->sh->sessions->seed = ngx_http_kv_aware_secret();
        kcf->sh->session.capacity = kcf->session_capacity;
    }

    /* the index takes every page left, in one run of pages */
    size = shpool->pfree * ngx_pagesize;
    region = NULL;

    for (tries = 0; tries < 16 && size > ngx_pagesize; tries++) {
        region = ngx_slab_alloc(shpool, size);

        if (region) {
            break;
        }

        size -= ngx_pagesize;
    }

    if (region == NULL) {
        ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                      "kv_aware: no room for the index in zone \"%V\"",
                      &shm_zone->shm.name);
        return NGX_ERROR;
    }

    kcf->sh->index = kva_index_init(region, size,
                                    ngx_http_kv_aware_secret());
    if (kcf->sh->index == NULL) {
        return NGX_ERROR;
    }

    kcf->sh->index_size = size;

    ngx_log_error(NGX_LOG_NOTICE, shm_zone->shm.log, 0,
                  "kv_aware: upstream \"%V\" indexes up to %uD blocks",
                  &kcf->upstream, kcf->sh->index->capacity);

    return NGX_OK;
}


/*
 * Workers of older cycles still return their in-flight load to the table
 * they charged, for as long as their longest stream lasts: a table is
 * zeroed only when nothing is in flight there, or those workers would
 * drive its counts below zero.  The old cycle's own table is never taken
 * (its workers may still be starting requests); of the others, the one
 * with the least work in flight.  When every table still drains, this
 * cycle shares the least busy one as it is: its counts stay exact, and the
 * load they show is real, only charged by another cycle.
 */
static ngx_uint_t
ngx_http_kv_aware_load_table(ngx_http_kv_aware_shctx_t *sh,
    ngx_http_kv_aware_load_t *current)
{
    ngx_uint_t  g, best, n, least;

    best = NGX_HTTP_KV_AWARE_GENERATIONS;
    least = (ngx_uint_t) -1;

    for (g = 0; g < NGX_HTTP_KV_AWARE_GENERATIONS; g++) {
        if (sh->load[g] == current) {
            continue;
        }

        n = ngx_http_kv_aware_in_flight(sh->load[g]);

        if (n < least) {
            least = n;
            best = g;
        }
    }

    if (least == 0) {
        /* anything left is a count a crashed worker never gave back */
        ngx_memzero(sh->load[best], sizeof(sh->load[best]));
    }

    return best;
}


/* requests in flight on a table; a count below zero is work too */
static ngx_uint_t
ngx_http_kv_aware_in_flight(ngx_http_kv_aware_load_t *load)
{
    ngx_uint_t        s, n;
    ngx_atomic_int_t  reqs;

    n = 0;

    for (s = 0; s < KVA_MAX_SLOTS; s++) {
        reqs = (ngx_atomic_int_t) load[s].reqs;
        n += (reqs < 0) ? (ngx_uint_t) -reqs : (ngx_uint_t) reqs;
    }

    return n;
}


/* where (name, rank) starts its probe in the name table */
static ngx_uint_t
ngx_http_kv_aware_name_hash(u_char *name, size_t len, ngx_uint_t rank)
{
    uint32_t  h;

    h = ngx_murmur_hash2(name, len) ^ ((uint32_t) rank * 0x9e3779b1);
    h ^= h >> 15;

    return h & (NGX_HTTP_KV_AWARE_NAME_TABLE - 1);
}


/*
 * The slot a server's rank holds, by its name, or KVA_MAX_SLOTS.  The
 * table only says where to look: each slot it names is checked against
 * the slot itself, so that a slot reserved (its server gone) or wiped
 * since is passed over.  At most KVA_MAX_SLOTS entries in twice as many
 * places: a probe ends at an empty one.
 */
ngx_uint_t
ngx_http_kv_aware_zone_slot_by_name(ngx_http_kv_aware_shctx_t *sh, u_char *name,
    size_t len, ngx_uint_t rank)
{
    ngx_uint_t                 i, n, s;
    ngx_http_kv_aware_slot_t  *sl;

    i = ngx_http_kv_aware_name_hash(name, len, rank);

    for (n = 0; n < NGX_HTTP_KV_AWARE_NAME_TABLE; n++) {
        if (sh->members.by_name[i] == 0) {
            break;
        }

        s = sh->members.by_name[i] - 1;
        sl = &sh->slots[s];

        if (sl->name_len == len && sl->rank == rank
            && !kva_slotset_has(&sh->members.reserved, s)
            && ngx_memcmp(sl->name, name, len) == 0)
        {
            return s;
        }

        i = (i + 1) & (NGX_HTTP_KV_AWARE_NAME_TABLE - 1);
    }

    return KVA_MAX_SLOTS;
}


/* slot was just given its name */
void
ngx_http_kv_aware_zone_name_add(ngx_http_kv_aware_shctx_t *sh,
    ngx_uint_t slot)
{
    ngx_uint_t                 i, n;
    ngx_http_kv_aware_slot_t  *sl;

    sl = &sh->slots[slot];
    i = ngx_http_kv_aware_name_hash(sl->name, sl->name_len, sl->rank);

    for (n = 0; n < NGX_HTTP_KV_AWARE_NAME_TABLE; n++) {
        if (sh->members.by_name[i] == 0
            || sh->members.by_name[i] == slot + 1)
        {
            sh->members.by_name[i] = (uint16_t) (slot + 1);
            return;
        }

        i = (i + 1) & (NGX_HTTP_KV_AWARE_NAME_TABLE - 1);
    }
}


/*
 * Slots were wiped: the table again from the named ones, O(slots), only
 * when servers leave (a reload, a resolve).
 */
void
ngx_http_kv_aware_zone_names_rebuild(ngx_http_kv_aware_shctx_t *sh)
{
    ngx_uint_t  s;

    ngx_memzero(sh->members.by_name, sizeof(sh->members.by_name));

    for (s = 0; s < KVA_MAX_SLOTS; s++) {
        if (sh->slots[s].name_len) {
            ngx_http_kv_aware_zone_name_add(sh, s);
        }
    }
}


static ngx_int_t
ngx_http_kv_aware_assign_slots(ngx_http_kv_aware_srv_conf_t *kcf)
{
    ngx_str_t                 *names;
    ngx_uint_t                 i, s, n, dp;
    kva_slotset_t              used, kept, stale;
    ngx_http_kv_aware_slot_t  *slots;

    slots = kcf->sh->slots;
    names = kcf->peer_names->elts;
    dp = kcf->data_parallel;
    n = kcf->peer_names->nelts * dp;     /* <= KVA_MAX_SLOTS: init_upstream */
    kva_slotset_zero(&used);
    kva_slotset_zero(&kept);
    kva_slotset_zero(&stale);

    /*
     * Servers (ranks) that were there before keep their slot, and what it
     * knows; entry i of slot_of is rank i % dp of server i / dp.  The
     * lock: the old cycle's workers look names up meanwhile.
     */
    ngx_shmtx_lock(&kcf->shpool->mutex);

    for (i = 0; i < n; i++) {
        s = ngx_http_kv_aware_zone_slot_by_name(kcf->sh, names[i / dp].data,
                                           names[i / dp].len, i % dp);

        if (s < KVA_MAX_SLOTS) {
            kcf->slot_of[i] = (uint16_t) s;
            kva_slotset_add(&used, s);
            kva_slotset_add(&kept, i);
        }
    }

    /*
     * Slots of servers that left: their entries would mislead newcomers.
     * Where servers come and go at run time, those resolved are not in
     * the configuration: the workers' first look at the lists decides.
     * Still locked: a name the old workers compare must not be wiped
     * under them.
     */
    for (s = 0; s < KVA_MAX_SLOTS && !kcf->dynamic; s++) {
        if (slots[s].name_len && !kva_slotset_has(&used, s)) {
            kva_slotset_add(&stale, s);
            ngx_memzero(&slots[s], sizeof(ngx_http_kv_aware_slot_t));
        }
    }

    ngx_shmtx_unlock(&kcf->shpool->mutex);

    if (!kva_slotset_empty(&stale)) {
        kva_slotset_andnot(&kcf->sh->members.reserved, &stale);
        ngx_http_kv_aware_zone_forget_slots(kcf, &stale);
    }

    /* the name table after a reset or the wipe above, newcomers then */
    ngx_shmtx_lock(&kcf->shpool->mutex);
    ngx_http_kv_aware_zone_names_rebuild(kcf->sh);

    /* newcomers take free slots */
    for (i = 0; i < n; i++) {
        if (kva_slotset_has(&kept, i)) {
            continue;
        }

        for (s = 0; s < KVA_MAX_SLOTS; s++) {
            if (slots[s].name_len == 0 && !kva_slotset_has(&used, s)) {
                break;
            }
        }

        if (s == KVA_MAX_SLOTS) {
            /* only where servers come and go: the first look decides */
            kcf->slot_of[i] = NGX_HTTP_KV_AWARE_NO_SLOT;
            continue;
        }

        kva_slotset_add(&used, s);

        kcf->slot_of[i] = (uint16_t) s;
        slots[s].name_len = names[i / dp].len;
        slots[s].rank = i % dp;
        ngx_memcpy(slots[s].name, names[i / dp].data, names[i / dp].len);
        ngx_http_kv_aware_zone_name_add(kcf->sh, s);
    }

    ngx_shmtx_unlock(&kcf->shpool->mutex);

    return NGX_OK;
}


/*
 * The servers of the slots in mask left the upstream: whatever takes a
 * slot next has published nothing (not precise), holds nothing, and has
 * learned nothing (its learned budget counts afresh).
 */
void
ngx_http_kv_aware_zone_forget_slots(ngx_http_kv_aware_srv_conf_t *kcf,
    const kva_slotset_t *set)
{
    unsigned  s;

    ngx_http_kv_aware_zone_set_precise(kcf->sh, set, 0);
    ngx_http_kv_aware_zone_drop_slots(kcf, set, KVA_BITS_ALL);

    ngx_shmtx_lock(&kcf->shpool->mutex);

    kva_slotset_each(set, s) {
        kva_index_learn_budget(kcf->sh->index, s, 0, 0);
    }

    ngx_shmtx_unlock(&kcf->shpool->mutex);
}


/* sched_yield() calls at most, about 1 us each on an idle CPU */
#define KVA_HANDOVER_YIELDS  1000


/*
 * Forgets what srcs say about the slots in mask, a chunk of the index at a
 * time under the lock: routing waits for one chunk at most, whatever the
 * index size.  Entries added meanwhile are newer knowledge, which a clear
 * must not take back anyway.
 */
void
ngx_http_kv_aware_zone_drop_slots(ngx_http_kv_aware_srv_conf_t *kcf,
    const kva_slotset_t *set, unsigned srcs)
{
    uint32_t      from;
    kva_index_t  *ix;

    ix = kcf->sh->index;
    from = 0;

    for ( ;; ) {
        ngx_shmtx_lock(&kcf->shpool->mutex);

        if (from >= ix->high_water) {
            ngx_shmtx_unlock(&kcf->shpool->mutex);
            return;
        }

        from = kva_index_drop_range(ix, set, srcs, from,
                                    from + KVA_SCAN_CHUNK);

        ngx_http_kv_aware_zone_unlock_between(kcf);
    }
}


/*
 * Gives the zone's lock up between two chunks of a long task (a clear, a
 * status page's count, a large event message or shared batch), letting a
 * worker that sleeps waiting for it take it first.  nginx's mutex is not
 * fair: taken again at once, it was taken again before the woken waiter
 * ran, chunk after chunk, and a routed request on the other worker
 * waited 22 to 40 ms, most of a 43 to 155 ms status page, not a chunk
 * (t/45, requests on the worker making no page, 3 runs of 5; t/39 for
 * event messages).  Waiters asleep are counted by the mutex; one that
 * still spins takes the lock in the gap or soon sleeps and is counted.
 * The wait here is bounded (KVA_HANDOVER_YIELDS), and spent only when
 * someone waits: the long task goes slower, routing does not.  Not for
 * a prompt's lookup and record: the upstream's peers lock may be held
 * there, and waiting for another's chunk would stall every worker
 * routing to the upstream.
 */
void
ngx_http_kv_aware_zone_unlock_between(ngx_http_kv_aware_srv_conf_t *kcf)
{
    ngx_shmtx_t  *mtx;
#if (NGX_HAVE_ATOMIC_OPS && NGX_HAVE_POSIX_SEM)
    ngx_uint_t    i, asleep;
#endif

    mtx = &kcf->shpool->mutex;

#if (NGX_HAVE_ATOMIC_OPS && NGX_HAVE_POSIX_SEM)

    asleep = mtx->semaphore && *mtx->wait != 0;

    ngx_shmtx_unlock(mtx);

    /* the woken waiter runs on another CPU: the lock stays free till then */
    for (i = 0; asleep && i < KVA_HANDOVER_YIELDS && *mtx->lock == 0; i++) {
        ngx_sched_yield();
    }

#else

    ngx_shmtx_unlock(mtx);

#endif
}


/*
 * Sets (on) or clears the slots of set in the set of precise slots.
 * Two subscribers may overlap while a reload hands over, and the master
 * writes it on reload: a plain read-modify-write could lose an update.
 * A slot's change touches its word only, so a CAS a word is enough.
 */
void
ngx_http_kv_aware_zone_set_precise(ngx_http_kv_aware_shctx_t *sh,
    const kva_slotset_t *set, ngx_uint_t on)
{
    ngx_uint_t         i;
    ngx_atomic_uint_t  old, new, mask;

    for (i = 0; i < KVA_SLOT_WORDS; i++) {
        mask = (ngx_atomic_uint_t) set->w[i];

        do {
            old = sh->events.precise[i];
            new = on ? (old | mask) : (old & ~mask);

            if (new == old) {
                break;
            }

        } while (!ngx_atomic_cmp_set(&sh->events.precise[i], old, new));
    }
}


/* a per-index random value: what keys the bucket choice must not be known */
static uint64_t
ngx_http_kv_aware_secret(void)
{
    uint64_t  secret;

#if (NGX_LINUX)
    if (getrandom(&secret, sizeof(secret), GRND_NONBLOCK)
        == (ssize_t) sizeof(secret))
    {
        return secret;
    }
#endif

    /* not as good, still unknown to anybody outside this host */
    secret = ((uint64_t) ngx_random() << 33) ^ ((uint64_t) ngx_random() << 11)
             ^ (uint64_t) ngx_pid ^ ((uint64_t) ngx_time() << 20)
             ^ (uint64_t) (uintptr_t) &secret;

    return secret;
}


void
ngx_http_kv_aware_zone_clock(ngx_http_kv_aware_srv_conf_t *kcf,
    kva_clock_t *clk)
{
    ngx_uint_t  i;

    clk->now = ngx_http_kv_aware_ticks(ngx_current_msec);
    clk->ttl_learned = ngx_http_kv_aware_ticks(kcf->learned_ttl);
    clk->ttl_spec = ngx_http_kv_aware_ticks(kcf->spec_ttl);

    for (i = 0; i < KVA_SLOT_WORDS; i++) {
        clk->precise.w[i] = kcf->sh->events.precise[i];
    }
}


/*
 * What is learned of a server is bounded by what its KV cache holds: the
 * pool its events announce ("kv_tokens" in load), else learned_tokens.
 * Tokens to blocks: block_tokens a block with keys=tokens, else 4 bytes a
 * token (what kvsim's pseudo-tokens are, and about English text's).  Called
 * with the zone locked, before what a request taught is recorded.
 */
void
ngx_http_kv_aware_zone_learn_budget(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_uint_t slot, kva_clock_t *clk)
{
    uint64_t  tokens, blocks;

    tokens = kcf->sh->slots[slot].ev.kv_tokens;

    if (tokens == 0) {
        tokens = kcf->learned_tokens;
    }

    if (kcf->keys == NGX_HTTP_KV_AWARE_KEYS_TOKENS) {
        blocks = tokens / kcf->block_tokens;

    } else {
        blocks = tokens * 4 / kcf->block_size;
    }

    if (tokens && blocks == 0) {
        blocks = 1;
    }

    kva_index_learn_budget(kcf->sh->index, slot,
                           blocks < UINT32_MAX ? (uint32_t) blocks
                                               : UINT32_MAX - 1,
                           clk->now);
}
