/*
 * kvbridge: vLLM's and SGLang's event batches, msgpack to structs
 * (kvb_vllm.h).  msgpack-c unpacks, after kvb_scan() has bounded what
 * unpacking may allocate; this file only walks the objects.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvb_scan.h"
#include "kvb_vllm.h"


/* the biggest block an engine uses is a few hundred tokens */
#define KVB_BLOCK_SIZE_MAX  65536


typedef enum {
    KVB_F_HASHES = 0,
    KVB_F_PARENT,
    KVB_F_TOKENS,
    KVB_F_BLOCK_SIZE,
    KVB_F_LORA_ID,
    KVB_F_MEDIUM,
    KVB_F_LORA_NAME,
    KVB_F_EXTRA_KEYS,
    KVB_F_GROUP_IDX,
    KVB_F_SPEC_KIND,
    KVB_F_IGNORED           /* known, not needed: the sliding window */
} kvb_field_e;


typedef struct {
    const char             *name;
    kvb_field_e             field;
} kvb_field_name_t;


static const kvb_field_name_t  kvb_field_names[] = {
    { "block_hashes",                  KVB_F_HASHES },
    { "parent_block_hash",             KVB_F_PARENT },
    { "token_ids",                     KVB_F_TOKENS },
    { "block_size",                    KVB_F_BLOCK_SIZE },
    { "lora_id",                       KVB_F_LORA_ID },
    { "medium",                        KVB_F_MEDIUM },
    { "lora_name",                     KVB_F_LORA_NAME },
    { "extra_keys",                    KVB_F_EXTRA_KEYS },
    { "group_idx",                     KVB_F_GROUP_IDX },
    { "kv_cache_spec_kind",            KVB_F_SPEC_KIND },
    { "kv_cache_spec_sliding_window",  KVB_F_IGNORED }
};


/* the positional layouts: the fields after the tag, in order */

static const kvb_field_e  kvb_stored_order[] = {
    KVB_F_HASHES, KVB_F_PARENT, KVB_F_TOKENS, KVB_F_BLOCK_SIZE,
    KVB_F_LORA_ID, KVB_F_MEDIUM, KVB_F_LORA_NAME, KVB_F_EXTRA_KEYS,
    KVB_F_GROUP_IDX, KVB_F_SPEC_KIND, KVB_F_IGNORED
};

static const kvb_field_e  kvb_removed_order[] = {
    KVB_F_HASHES, KVB_F_MEDIUM, KVB_F_GROUP_IDX
};


#define kvb_nelts(a)  (sizeof(a) / sizeof((a)[0]))


static int kvb_str_is(const msgpack_object *o, const char *s);
static int kvb_event_type(const msgpack_object *tag, kvb_ev_type_e *type);
static int kvb_decode_event(const msgpack_object *o, kvb_ev_t *ev);
static int kvb_set_field(kvb_ev_t *ev, kvb_field_e f,
    const msgpack_object *v);
static int kvb_check_event(kvb_ev_t *ev);
static int kvb_get_str(const msgpack_object *v, kvb_str_t *s);
static int kvb_get_int(const msgpack_object *v, int64_t *n);


kvb_rc_e
kvb_decode(const char *buf, size_t len, const kvb_limits_t *lim,
    kvb_batch_t *b, char *err, size_t errlen)
{
    size_t                 i, values, hashes;
    uint32_t               k;
    msgpack_object        *root, *ts, *events, *rank, *key;
    kvb_scan_rc_e          src;
    msgpack_unpack_return  urc;

    memset(b, 0, sizeof(kvb_batch_t));
    err[0] = '\0';

    if (len > lim->max_bytes) {
        snprintf(err, errlen, "payload of %zu bytes, max_bytes is %zu",
                 len, lim->max_bytes);
        return KVB_ERR_TOO_BIG;
    }

    src = kvb_scan((const unsigned char *) buf, len, len, &values);
    if (src != KVB_SCAN_OK) {
        snprintf(err, errlen, "%s", kvb_scan_strerror(src));
        return KVB_ERR_MSGPACK;
    }

    msgpack_unpacked_init(&b->msg);
    b->unpacked = 1;

    urc = msgpack_unpack_next(&b->msg, buf, len, NULL);
    if (urc == MSGPACK_UNPACK_NOMEM_ERROR) {
        snprintf(err, errlen, "out of memory unpacking %zu bytes", len);
        return KVB_ERR_NOMEM;
    }

    if (urc != MSGPACK_UNPACK_SUCCESS) {
        snprintf(err, errlen, "msgpack-c refused the payload (%d)",
                 (int) urc);
        return KVB_ERR_MSGPACK;
    }

    root = &b->msg.data;
    ts = NULL;
    events = NULL;
    rank = NULL;

    if (root->type == MSGPACK_OBJECT_ARRAY) {
        /* [ts, events, data_parallel_rank?] */
        if (root->via.array.size >= 2) {
            ts = &root->via.array.ptr[0];
            events = &root->via.array.ptr[1];
        }

        if (root->via.array.size >= 3) {
            rank = &root->via.array.ptr[2];
        }

    } else if (root->type == MSGPACK_OBJECT_MAP) {
        for (k = 0; k < root->via.map.size; k++) {
            key = &root->via.map.ptr[k].key;

            if (kvb_str_is(key, "ts")) {
                ts = &root->via.map.ptr[k].val;

            } else if (kvb_str_is(key, "events")) {
                events = &root->via.map.ptr[k].val;

            } else if (kvb_str_is(key, "data_parallel_rank")) {
                rank = &root->via.map.ptr[k].val;
            }
        }
    }

    if (ts == NULL || events == NULL
        || events->type != MSGPACK_OBJECT_ARRAY)
    {
        snprintf(err, errlen, "not an event batch: no ts and events list");
        return KVB_ERR_NOT_BATCH;
    }

    if (ts->type == MSGPACK_OBJECT_FLOAT64
        || ts->type == MSGPACK_OBJECT_FLOAT32)
    {
        b->ts = ts->via.f64;

    } else if (ts->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        b->ts = (double) ts->via.u64;

    } else {
        snprintf(err, errlen, "not an event batch: ts is not a number");
        return KVB_ERR_NOT_BATCH;
    }

    if (rank != NULL && rank->type != MSGPACK_OBJECT_NIL) {
        if (kvb_get_int(rank, &b->rank) != 0 || b->rank < 0) {
            snprintf(err, errlen, "data_parallel_rank is not a rank");
            return KVB_ERR_NOT_BATCH;
        }

        b->has_rank = 1;
    }

    if (events->via.array.size > lim->max_events) {
        snprintf(err, errlen, "%u events in a batch, max_events is %zu",
                 events->via.array.size, lim->max_events);
        return KVB_ERR_TOO_MANY;
    }

    if (events->via.array.size == 0) {
        return KVB_OK;
    }

    b->events = malloc(events->via.array.size * sizeof(kvb_ev_t));
    if (b->events == NULL) {
        snprintf(err, errlen, "out of memory for %u events",
                 events->via.array.size);
        return KVB_ERR_NOMEM;
    }

    hashes = 0;

    for (i = 0; i < events->via.array.size; i++) {

        switch (kvb_decode_event(&events->via.array.ptr[i],
                                 &b->events[b->nevents]))
        {
        case 0:
            hashes += b->events[b->nevents].nhashes;
            b->nevents++;
            break;

        case 1:
            b->unknown++;
            break;

        default:
            b->malformed++;
        }
    }

    if (hashes > lim->max_hashes) {
        snprintf(err, errlen, "%zu block hashes in a batch, max_hashes is %zu",
                 hashes, lim->max_hashes);
        return KVB_ERR_TOO_MANY;
    }

    return KVB_OK;
}


void
kvb_batch_free(kvb_batch_t *b)
{
    free(b->events);
    b->events = NULL;
    b->nevents = 0;

    if (b->unpacked) {
        msgpack_unpacked_destroy(&b->msg);
        b->unpacked = 0;
    }
}


const char *
kvb_strerror(kvb_rc_e rc)
{
    switch (rc) {
    case KVB_OK:             return "ok";
    case KVB_ERR_TOO_BIG:    return "too_big";
    case KVB_ERR_MSGPACK:    return "bad_msgpack";
    case KVB_ERR_NOT_BATCH:  return "not_batch";
    case KVB_ERR_TOO_MANY:   return "too_many";
    case KVB_ERR_NOMEM:      return "no_memory";
    }

    return "unknown";
}


int
kvb_engine_hash(const msgpack_object *o, uint64_t *hash)
{
    uint32_t              i, n;
    uint64_t              v;
    const unsigned char  *p;

    switch (o->type) {

    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *hash = o->via.u64;
        return 0;

    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *hash = (uint64_t) o->via.i64;
        return 0;

    case MSGPACK_OBJECT_BIN:
    case MSGPACK_OBJECT_STR:
        /* bin and str share a layout in msgpack-c's union */
        n = o->via.bin.size;
        if (n == 0) {
            return -1;
        }

        p = (const unsigned char *) o->via.bin.ptr;
        i = (n > 8) ? n - 8 : 0;
        v = 0;

        for ( /* void */ ; i < n; i++) {
            v = (v << 8) | p[i];
        }

        *hash = v;
        return 0;

    default:
        return -1;
    }
}


/* 0: decoded; 1: an event of a type not known; -1: malformed */

static int
kvb_decode_event(const msgpack_object *o, kvb_ev_t *ev)
{
    size_t              norder;
    uint32_t            k;
    const kvb_field_e  *order;
    msgpack_object     *tag, *key;

    memset(ev, 0, sizeof(kvb_ev_t));

    if (o->type == MSGPACK_OBJECT_ARRAY) {

        if (o->via.array.size == 0) {
            return -1;
        }

        if (kvb_event_type(&o->via.array.ptr[0], &ev->type) != 0) {
            return 1;
        }

        if (ev->type == KVB_EV_STORED) {
            order = kvb_stored_order;
            norder = kvb_nelts(kvb_stored_order);

        } else if (ev->type == KVB_EV_REMOVED) {
            order = kvb_removed_order;
            norder = kvb_nelts(kvb_removed_order);

        } else {
            order = NULL;
            norder = 0;
        }

        /* fields past the known layout are an engine's newer additions */

        for (k = 1; k < o->via.array.size && k - 1 < norder; k++) {
            if (kvb_set_field(ev, order[k - 1], &o->via.array.ptr[k]) != 0) {
                return -1;
            }
        }

        return kvb_check_event(ev);
    }

    if (o->type != MSGPACK_OBJECT_MAP) {
        return -1;
    }

    tag = NULL;

    for (k = 0; k < o->via.map.size; k++) {
        if (kvb_str_is(&o->via.map.ptr[k].key, "type")) {
            tag = &o->via.map.ptr[k].val;
            break;
        }
    }

    if (tag == NULL) {
        return -1;
    }

    if (kvb_event_type(tag, &ev->type) != 0) {
        return 1;
    }

    for (k = 0; k < o->via.map.size; k++) {
        key = &o->via.map.ptr[k].key;

        if (key->type != MSGPACK_OBJECT_STR
            && key->type != MSGPACK_OBJECT_BIN)
        {
            continue;
        }

        for (norder = 0; norder < kvb_nelts(kvb_field_names); norder++) {
            if (kvb_str_is(key, kvb_field_names[norder].name)) {
                if (kvb_set_field(ev, kvb_field_names[norder].field,
                                  &o->via.map.ptr[k].val)
                    != 0)
                {
                    return -1;
                }

                break;
            }
        }
    }

    return kvb_check_event(ev);
}


static int
kvb_event_type(const msgpack_object *tag, kvb_ev_type_e *type)
{
    if (kvb_str_is(tag, "BlockStored")) {
        *type = KVB_EV_STORED;

    } else if (kvb_str_is(tag, "BlockRemoved")) {
        *type = KVB_EV_REMOVED;

    } else if (kvb_str_is(tag, "AllBlocksCleared")) {
        *type = KVB_EV_CLEARED;

    } else {
        return -1;
    }

    return 0;
}


static int
kvb_set_field(kvb_ev_t *ev, kvb_field_e f, const msgpack_object *v)
{
    int64_t    n;
    uint32_t   i;
    uint64_t   h;

    if (v->type == MSGPACK_OBJECT_NIL && f != KVB_F_HASHES
        && f != KVB_F_TOKENS)
    {
        /* None: the field's default */
        return 0;
    }

    switch (f) {

    case KVB_F_HASHES:
        if (v->type != MSGPACK_OBJECT_ARRAY) {
            return -1;
        }

        for (i = 0; i < v->via.array.size; i++) {
            if (kvb_engine_hash(&v->via.array.ptr[i], &h) != 0) {
                return -1;
            }
        }

        ev->hashes = v->via.array.ptr;
        ev->nhashes = v->via.array.size;
        ev->has_hashes = 1;
        return 0;

    case KVB_F_PARENT:
        if (kvb_engine_hash(v, &ev->parent) != 0) {
            return -1;
        }

        ev->has_parent = 1;
        return 0;

    case KVB_F_TOKENS:
        if (v->type != MSGPACK_OBJECT_ARRAY) {
            return -1;
        }

        for (i = 0; i < v->via.array.size; i++) {
            if (v->via.array.ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER
                || v->via.array.ptr[i].via.u64 > UINT32_MAX)
            {
                return -1;
            }
        }

        ev->tokens = v->via.array.ptr;
        ev->ntokens = v->via.array.size;
        ev->has_tokens = 1;
        return 0;

    case KVB_F_BLOCK_SIZE:
        /* 0: an offload tier's event that names its blocks by hash only */
        if (kvb_get_int(v, &n) != 0 || n < 0 || n > KVB_BLOCK_SIZE_MAX) {
            return -1;
        }

        ev->block_size = (uint32_t) n;
        return 0;

    case KVB_F_LORA_ID:
        if (kvb_get_int(v, &ev->lora_id) != 0) {
            return -1;
        }

        ev->has_lora_id = 1;
        return 0;

    case KVB_F_MEDIUM:
        return kvb_get_str(v, &ev->medium);

    case KVB_F_LORA_NAME:
        return kvb_get_str(v, &ev->lora_name);

    case KVB_F_SPEC_KIND:
        return kvb_get_str(v, &ev->spec_kind);

    case KVB_F_EXTRA_KEYS:
        if (v->type != MSGPACK_OBJECT_ARRAY) {
            return -1;
        }

        ev->extra_keys = v;
        return 0;

    case KVB_F_GROUP_IDX:
        if (kvb_get_int(v, &ev->group_idx) != 0 || ev->group_idx < 0) {
            return -1;
        }

        ev->has_group = 1;
        return 0;

    case KVB_F_IGNORED:
        return 0;
    }

    return -1;
}


/* what the fields must say together; 0 or -1 as kvb_decode_event() */

static int
kvb_check_event(kvb_ev_t *ev)
{
    uint32_t               i;
    const msgpack_object  *k;

    if (ev->type == KVB_EV_CLEARED) {
        return 0;
    }

    /* a stored or removed event names its blocks, if only as [] */

    if (!ev->has_hashes) {
        return -1;
    }

    if (ev->type == KVB_EV_REMOVED) {
        return 0;
    }

    /*
     * vLLM's offload tiers, without self_describing_kv_events, send
     * token_ids [] and block_size 0: hashes alone, which the mirror maps
     * through the blocks it knows.
     */

    if (!ev->has_tokens
        || (ev->block_size == 0 && ev->ntokens != 0)
        || (uint64_t) ev->nhashes * ev->block_size != ev->ntokens)
    {
        return -1;
    }

    if (ev->extra_keys != NULL) {
        if (ev->extra_keys->via.array.size != ev->nhashes) {
            return -1;
        }

        for (i = 0; i < ev->nhashes; i++) {
            k = &ev->extra_keys->via.array.ptr[i];

            if (k->type != MSGPACK_OBJECT_NIL
                && k->type != MSGPACK_OBJECT_ARRAY)
            {
                return -1;
            }
        }
    }

    return 0;
}


/*
 * Names and tags are str in msgspec's output; encoders that predate
 * msgpack's str type (or Perl's and Go's with their defaults) send bin:
 * the bytes are what count.  bin and str share a layout in msgpack-c.
 */

static int
kvb_str_is(const msgpack_object *o, const char *s)
{
    size_t  n;

    if (o->type != MSGPACK_OBJECT_STR && o->type != MSGPACK_OBJECT_BIN) {
        return 0;
    }

    n = strlen(s);

    return o->via.str.size == n && memcmp(o->via.str.ptr, s, n) == 0;
}


static int
kvb_get_str(const msgpack_object *v, kvb_str_t *s)
{
    if (v->type != MSGPACK_OBJECT_STR && v->type != MSGPACK_OBJECT_BIN) {
        return -1;
    }

    s->data = v->via.str.ptr;
    s->len = v->via.str.size;

    return 0;
}


static int
kvb_get_int(const msgpack_object *v, int64_t *n)
{
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (v->via.u64 > INT64_MAX) {
            return -1;
        }

        *n = (int64_t) v->via.u64;
        return 0;
    }

    if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *n = v->via.i64;
        return 0;
    }

    return -1;
}


int
kvb_decode_rank(const char *buf, size_t len, const kvb_limits_t *lim,
    int64_t *rank)
{
    char         err[160];
    kvb_rc_e     rc;
    kvb_batch_t  b;

    rc = kvb_decode(buf, len, lim, &b, err, sizeof(err));

    if (rc == KVB_OK) {
        *rank = b.has_rank ? b.rank : 0;
    }

    kvb_batch_free(&b);

    return rc == KVB_OK ? 0 : -1;
}
