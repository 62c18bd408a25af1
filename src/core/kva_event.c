/*
 * kv_aware core: KV event protocol v1 (docs/events.md).
 *
 * Decoding goes through jansson, then two passes over the tree: the first
 * checks the shape and counts, so that the limits are enforced before any
 * allocation and all hashes of a message land in one malloc; the second
 * converts the hex strings.  jansson sets the cost: about 3 us a message
 * plus 0.3 us a hash, so publishers should batch a step's blocks into one
 * message rather than send one message a block.
 *
 * Before jansson sees a message, kva_event_shape() (kva_event_shape.c)
 * counts its values, objects and arrays and its depth in one pass over
 * the bytes, and the limits bound those counts: jansson spends about 100
 * bytes and 0.1 us a value, so a 4 MB message of [{},{},...] in an ignored
 * field used to cost 140 ms (880 ms cold) and left the worker 300 MB
 * larger; it is now rejected by the scan in about 1 ms.
 *
 * The encoder is kva_event_encode.c.
 */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "kva_event.h"


#define KVA_SEQ_MAX          (1ULL << 53)

/*
 * Past this size a message's tree is megabytes of small chunks that glibc
 * keeps once freed (a worker stayed 300 MB larger).  The trim adds about
 * 15% to such a decode (0.7 ms at 260 KB, 3.5 ms at 1.2 MB); smaller
 * messages are the common case and do not pay it.
 */
#define KVA_TRIM_MIN         (256 * 1024)

const char  *const kva_event_keyspace_names[] = {
    "text", "tokens"
};


const char  *const kva_event_snap_names[] = {
    NULL, "full", "begin", "more", "end"
};

const char  *const kva_event_type_names[] = { "stored", "removed", "cleared" };

/* indexed by the tier (KVA_EVENT_TIER_*); read in any case: vLLM's "GPU" */
const char  *const kva_event_tier_names[] = { "gpu", "cpu", "disk" };

/* indexed by kva_event_rc_e */
static const char  *kva_rc_names[] = {
    "ok", "too big", "malformed", "bad field", "unsupported version",
    "no memory"
};


typedef struct {
    char                *buf;
    size_t               len;
} kva_err_t;


static kva_event_rc_e kva_errf(kva_err_t *e, kva_event_rc_e rc,
    const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void kva_shape_max(const kva_event_limits_t *lim,
    kva_event_shape_t *max);
static kva_event_rc_e kva_check_shape(const char *msg, size_t len,
    const kva_event_shape_t *max, kva_err_t *e);
static void kva_release_heap(void);
static json_t *kva_parse(const char *msg, size_t len, kva_err_t *e,
    kva_event_rc_e *rc);
static kva_event_rc_e kva_decode_root(json_t *root,
    const kva_event_limits_t *lim, kva_batch_t *b, kva_err_t *e);
static kva_event_rc_e kva_decode_load(json_t *load, kva_batch_t *b,
    kva_err_t *e);
static kva_event_rc_e kva_decode_events(json_t *events,
    const kva_event_limits_t *lim, kva_batch_t *b, kva_err_t *e);
static size_t kva_get_server(json_t *root, char *dst, size_t cap);
static int kva_get_uint(json_t *j, uint64_t max, uint64_t *v);
static int kva_lookup(const char *const *names, int n, json_t *j);
static int kva_tier(json_t *j, unsigned *tier);


static kva_event_rc_e
kva_errf(kva_err_t *e, kva_event_rc_e rc, const char *fmt, ...)
{
    va_list  args;

    if (e->buf != NULL && e->len > 0) {
        va_start(args, fmt);
        vsnprintf(e->buf, e->len, fmt, args);
        va_end(args);
    }

    return rc;
}


kva_event_rc_e
kva_event_decode(const char *msg, size_t len, const kva_event_limits_t *lim,
    kva_batch_t *b, char *err, size_t err_len)
{
    json_t             *root;
    kva_err_t           e;
    kva_event_rc_e      rc;
    kva_event_shape_t   max;

    memset(b, 0, sizeof(kva_batch_t));

    e.buf = err;
    e.len = err_len;

    if (err != NULL && err_len > 0) {
        err[0] = '\0';
    }

    if (lim != NULL && lim->max_message != 0 && len > lim->max_message) {
        return kva_errf(&e, KVA_EVENT_TOO_BIG,
                        "message: %zu bytes, over %zu", len,
                        lim->max_message);
    }

    kva_shape_max(lim, &max);

    rc = kva_check_shape(msg, len, &max, &e);
    if (rc != KVA_EVENT_OK) {
        return rc;
    }

    root = kva_parse(msg, len, &e, &rc);

    if (root != NULL) {
        rc = kva_decode_root(root, lim, b, &e);
        json_decref(root);
    }

    if (len >= KVA_TRIM_MIN) {
        kva_release_heap();
    }

    if (rc != KVA_EVENT_OK) {
        kva_batch_free(b);
    }

    return rc;
}


/* the bounds kva_event_limits_t documents, 0 (none) where they overflow */
static void
kva_shape_max(const kva_event_limits_t *lim, kva_event_shape_t *max)
{
    size_t  n;

    max->depth = KVA_EVENT_DEPTH_MAX;
    max->values = 0;
    max->containers = 0;

    if (lim == NULL || lim->max_events == 0
        || lim->max_events > (SIZE_MAX / 2) / KVA_EVENT_VALUES_PER_EVENT)
    {
        return;
    }

    max->containers = KVA_EVENT_CONTAINERS_PER_EVENT * lim->max_events
                      + KVA_EVENT_CONTAINERS_ENVELOPE;

    n = KVA_EVENT_VALUES_PER_EVENT * lim->max_events
        + KVA_EVENT_VALUES_ENVELOPE;

    if (lim->max_hashes != 0 && lim->max_hashes <= SIZE_MAX / 2) {
        max->values = n + lim->max_hashes;
    }
}


static kva_event_rc_e
kva_check_shape(const char *msg, size_t len, const kva_event_shape_t *max,
    kva_err_t *e)
{
    kva_event_shape_t  s;

    if (msg == NULL || kva_event_shape(msg, len, max, &s) == 0) {
        return KVA_EVENT_OK;
    }

    if (s.depth > max->depth) {
        return kva_errf(e, KVA_EVENT_TOO_BIG,
                        "message: nested deeper than %zu", max->depth);
    }

    if (max->containers != 0 && s.containers > max->containers) {
        return kva_errf(e, KVA_EVENT_TOO_BIG,
                        "message: over %zu objects and arrays",
                        max->containers);
    }

    return kva_errf(e, KVA_EVENT_TOO_BIG, "message: over %zu values",
                    max->values);
}


/* glibc keeps freed small chunks; malloc_trim() unmaps their whole pages */
static void
kva_release_heap(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}


/* the top-level object with "v" checked, as both messages start */
static json_t *
kva_parse(const char *msg, size_t len, kva_err_t *e, kva_event_rc_e *rc)
{
    json_t        *root, *j;
    json_error_t   jerr;

    if (msg == NULL) {
        *rc = kva_errf(e, KVA_EVENT_MALFORMED, "no message");
        return NULL;
    }

    root = json_loadb(msg, len, 0, &jerr);

    if (root == NULL) {
        if (json_error_code(&jerr) == json_error_out_of_memory) {
            *rc = kva_errf(e, KVA_EVENT_NO_MEMORY, "no memory");

        } else {
            *rc = kva_errf(e, KVA_EVENT_MALFORMED, "not json: %s at %d",
                           jerr.text, jerr.position);
        }

        return NULL;
    }

    /*
     * A missing or non-integer "v" is a broken message; only a well-formed
     * other version is reported as such, so that it can be told apart.
     */

    j = json_object_get(root, "v");

    if (!json_is_object(root)) {
        *rc = kva_errf(e, KVA_EVENT_MALFORMED, "not an object");

    } else if (!json_is_integer(j)) {
        *rc = kva_errf(e, KVA_EVENT_BAD_FIELD,
                       "v: missing or not an integer");

    } else if (json_integer_value(j) != 1) {
        *rc = kva_errf(e, KVA_EVENT_VERSION, "v: %" JSON_INTEGER_FORMAT
                       " not supported", json_integer_value(j));

    } else {
        return root;
    }

    json_decref(root);

    return NULL;
}


static kva_event_rc_e
kva_decode_root(json_t *root, const kva_event_limits_t *lim, kva_batch_t *b,
    kva_err_t *e)
{
    int              k;
    json_t          *j;
    uint64_t         u;
    kva_event_rc_e   rc;

    b->server_len = kva_get_server(root, b->server, KVA_EVENT_SERVER_MAX);

    if (b->server_len == 0) {
        return kva_errf(e, KVA_EVENT_BAD_FIELD,
                        "server: missing, not a string, empty or over %d "
                        "bytes", KVA_EVENT_SERVER_MAX - 1);
    }

    if (kva_get_uint(json_object_get(root, "seq"), KVA_SEQ_MAX, &u) != 0) {
        return kva_errf(e, KVA_EVENT_BAD_FIELD,
                        "seq: missing or not an integer in 0..2^53");
    }

    b->seq = u;

    j = json_object_get(root, "rank");

    if (j != NULL) {
        if (kva_get_uint(j, KVA_EVENT_RANK_MAX, &u) != 0) {
            return kva_errf(e, KVA_EVENT_BAD_FIELD,
                            "rank: not an integer in 0..%d",
                            KVA_EVENT_RANK_MAX);
        }

        b->has_rank = 1;
        b->rank = (uint32_t) u;
    }

    j = json_object_get(root, "origin");

    if (j != NULL) {
        if (!json_is_string(j)
            || kva_unhex64(json_string_value(j), json_string_length(j),
                           &b->origin) != 0)
        {
            return kva_errf(e, KVA_EVENT_BAD_FIELD,
                            "origin: not 16 hex digits");
        }

        b->has_origin = 1;
    }

    j = json_object_get(root, "keyspace");

    if (j != NULL) {
        k = kva_lookup(kva_event_keyspace_names,
                       KVA_KEYSPACE_TOKEN_KEYS + 1, j);

        if (k < 0) {
            return kva_errf(e, KVA_EVENT_BAD_FIELD,
                            "keyspace: not \"text\" or \"tokens\"");
        }

        b->keyspace = (kva_keyspace_e) k;
    }

    j = json_object_get(root, "snapshot");

    if (j != NULL) {
        k = kva_lookup(kva_event_snap_names, KVA_SNAP_END + 1, j);

        if (k <= KVA_SNAP_NONE) {
            return kva_errf(e, KVA_EVENT_BAD_FIELD,
                            "snapshot: not full, begin, more or end");
        }

        b->snapshot = (kva_snap_e) k;
    }

    j = json_object_get(root, "load");

    if (j != NULL) {
        rc = kva_decode_load(j, b, e);
        if (rc != KVA_EVENT_OK) {
            return rc;
        }
    }

    j = json_object_get(root, "events");

    if (j != NULL) {
        rc = kva_decode_events(j, lim, b, e);
        if (rc != KVA_EVENT_OK) {
            return rc;
        }
    }

    b->heartbeat = (b->nevents == 0 && b->snapshot == KVA_SNAP_NONE);

    return KVA_EVENT_OK;
}


static kva_event_rc_e
kva_decode_load(json_t *load, kva_batch_t *b, kva_err_t *e)
{
    int          i;
    double       x;
    json_t      *j;
    uint64_t     u;
    uint32_t    *dst[2];
    const char  *keys[2] = { "waiting", "running" };

    if (!json_is_object(load)) {
        return kva_errf(e, KVA_EVENT_BAD_FIELD, "load: not an object");
    }

    b->has_load = 1;
    dst[0] = &b->waiting;
    dst[1] = &b->running;

    for (i = 0; i < 2; i++) {
        j = json_object_get(load, keys[i]);
        if (j == NULL) {
            continue;
        }

        if (kva_get_uint(j, UINT64_MAX, &u) != 0) {
            return kva_errf(e, KVA_EVENT_BAD_FIELD,
                            "load.%s: not an integer >= 0", keys[i]);
        }

        /* queue lengths past 2^32 mean nothing more to a balancer */
        *dst[i] = u > UINT32_MAX ? UINT32_MAX : (uint32_t) u;
    }

    j = json_object_get(load, "kv_usage");

    if (j != NULL) {
        x = json_is_number(j) ? json_number_value(j) : -1.0;

        if (!(x >= 0.0 && x <= 1.0)) {
            return kva_errf(e, KVA_EVENT_BAD_FIELD,
                            "load.kv_usage: not a number in 0..1");
        }

        b->kv_usage = x;
    }

    j = json_object_get(load, "kv_tokens");

    if (j != NULL && kva_get_uint(j, 1ULL << 48, &b->kv_tokens) != 0) {
        return kva_errf(e, KVA_EVENT_BAD_FIELD,
                        "load.kv_tokens: not an integer in 0..2^48");
    }

    return KVA_EVENT_OK;
}


static kva_event_rc_e
kva_decode_events(json_t *events, const kva_event_limits_t *lim,
    kva_batch_t *b, kva_err_t *e)
{
    int         t;
    size_t      n, i, k, total;
    unsigned    tier;
    json_t     *ev, *j, *h;
    uint64_t   *p;
    kva_ev_t   *out;

    if (!json_is_array(events)) {
        return kva_errf(e, KVA_EVENT_BAD_FIELD, "events: not an array");
    }

    n = json_array_size(events);

    if (n == 0) {
        return KVA_EVENT_OK;
    }

    if (lim != NULL && lim->max_events != 0 && n > lim->max_events) {
        return kva_errf(e, KVA_EVENT_TOO_BIG, "events: %zu, over %zu",
                        n, lim->max_events);
    }

    b->events = calloc(n, sizeof(kva_ev_t));
    if (b->events == NULL) {
        return kva_errf(e, KVA_EVENT_NO_MEMORY, "no memory");
    }

    b->nevents = n;
    total = 0;

    for (i = 0; i < n; i++) {
        ev = json_array_get(events, i);
        out = &b->events[i];

        if (!json_is_object(ev)) {
            return kva_errf(e, KVA_EVENT_BAD_FIELD,
                            "events[%zu]: not an object", i);
        }

        t = kva_lookup(kva_event_type_names, KVA_EV_CLEARED + 1,
                       json_object_get(ev, "type"));

        if (t < 0) {
            return kva_errf(e, KVA_EVENT_BAD_FIELD,
                            "events[%zu].type: not stored, removed or "
                            "cleared", i);
        }

        out->type = (kva_ev_type_e) t;

        if (out->type == KVA_EV_CLEARED) {
            /* hashes or parent on "cleared" mean nothing: ignored */
            continue;
        }

        j = json_object_get(ev, "hashes");

        if (!json_is_array(j)) {
            return kva_errf(e, KVA_EVENT_BAD_FIELD,
                            "events[%zu].hashes: missing or not an array", i);
        }

        out->nhashes = json_array_size(j);
        total += out->nhashes;

        if (lim != NULL && lim->max_hashes != 0 && total > lim->max_hashes) {
            return kva_errf(e, KVA_EVENT_TOO_BIG,
                            "events[%zu].hashes: over %zu in the message",
                            i, lim->max_hashes);
        }

        if (out->type != KVA_EV_STORED) {
            continue;
        }

        j = json_object_get(ev, "medium");

        if (j != NULL) {
            if (kva_tier(j, &tier) != 0) {
                return kva_errf(e, KVA_EVENT_BAD_FIELD,
                                "events[%zu].medium: not gpu, cpu or disk",
                                i);
            }

            out->tier = tier;
        }

        j = json_object_get(ev, "parent");

        if (j != NULL) {
            if (!json_is_string(j)
                || kva_unhex64(json_string_value(j), json_string_length(j),
                               &out->parent)
                   != 0)
            {
                return kva_errf(e, KVA_EVENT_BAD_FIELD,
                                "events[%zu].parent: not 16 hex digits", i);
            }

            out->has_parent = 1;
        }
    }

    if (total == 0) {
        return KVA_EVENT_OK;
    }

    b->hash_store = malloc(total * sizeof(uint64_t));
    if (b->hash_store == NULL) {
        return kva_errf(e, KVA_EVENT_NO_MEMORY, "no memory");
    }

    b->hash_count = total;
    p = b->hash_store;

    for (i = 0; i < n; i++) {
        out = &b->events[i];

        if (out->type == KVA_EV_CLEARED || out->nhashes == 0) {
            continue;
        }

        out->hashes = p;
        j = json_object_get(json_array_get(events, i), "hashes");

        for (k = 0; k < out->nhashes; k++, p++) {
            h = json_array_get(j, k);

            if (!json_is_string(h)
                || kva_unhex64(json_string_value(h), json_string_length(h),
                               p)
                   != 0)
            {
                return kva_errf(e, KVA_EVENT_BAD_FIELD,
                                "events[%zu].hashes[%zu]: not 16 hex digits",
                                i, k);
            }
        }
    }

    return KVA_EVENT_OK;
}


/* the string's length, 0 if it cannot be a server name or does not fit */
static size_t
kva_get_server(json_t *root, char *dst, size_t cap)
{
    size_t   n;
    json_t  *j;

    j = json_object_get(root, "server");

    if (!json_is_string(j)) {
        return 0;
    }

    n = json_string_length(j);

    if (n >= KVA_EVENT_SERVER_MAX || n >= cap) {
        return 0;
    }

    memcpy(dst, json_string_value(j), n);
    dst[n] = '\0';

    return n;
}


/* jansson keeps reals apart from integers: 1.0 is not an integer here */
static int
kva_get_uint(json_t *j, uint64_t max, uint64_t *v)
{
    json_int_t  n;

    if (!json_is_integer(j)) {
        return -1;
    }

    n = json_integer_value(j);

    if (n < 0 || (uint64_t) n > max) {
        return -1;
    }

    *v = (uint64_t) n;

    return 0;
}


/* the index of j's string in names, -1 if j is not one of them */
static int
kva_lookup(const char *const *names, int n, json_t *j)
{
    int          i;
    const char  *s;

    if (!json_is_string(j)) {
        return -1;
    }

    s = json_string_value(j);

    for (i = 0; i < n; i++) {
        if (names[i] != NULL && strcmp(names[i], s) == 0) {
            return i;
        }
    }

    return -1;
}


/* a tier's name, in any case and nothing else (no NUL inside) */
static int
kva_tier(json_t *j, unsigned *tier)
{
    size_t       len;
    unsigned     i;
    const char  *s;

    if (!json_is_string(j)) {
        return -1;
    }

    s = json_string_value(j);
    len = json_string_length(j);

    for (i = 0; i < KVA_EVENT_TIERS; i++) {
        if (len == strlen(kva_event_tier_names[i])
            && strncasecmp(s, kva_event_tier_names[i], len) == 0)
        {
            *tier = i;
            return 0;
        }
    }

    return -1;
}


int
kva_event_decode_resync(const char *msg, size_t len, char *server,
    size_t server_cap, size_t *server_len, unsigned *rank)
{
    size_t              n;
    uint64_t            r;
    json_t             *root, *j;
    kva_err_t           e;
    kva_event_rc_e      rc;
    kva_event_shape_t   max;

    e.buf = NULL;
    e.len = 0;

    /* anyone on the channel may send one: a few values are all it needs */
    max.values = KVA_EVENT_VALUES_ENVELOPE;
    max.containers = KVA_EVENT_CONTAINERS_ENVELOPE;
    max.depth = KVA_EVENT_DEPTH_MAX;

    if (kva_check_shape(msg, len, &max, &e) != KVA_EVENT_OK) {
        return -1;
    }

    root = kva_parse(msg, len, &e, &rc);
    if (root == NULL) {
        return -1;
    }

    j = json_object_get(root, "type");
    n = 0;

    r = 0;

    if (json_is_string(j) && strcmp(json_string_value(j), "resync") == 0) {
        n = kva_get_server(root, server, server_cap);

        j = json_object_get(root, "rank");

        if (j != NULL && kva_get_uint(j, KVA_EVENT_RANK_MAX, &r) != 0) {
            n = 0;
        }
    }

    json_decref(root);

    if (n == 0) {
        return -1;
    }

    if (rank != NULL) {
        *rank = (unsigned) r;
    }

    if (server_len != NULL) {
        *server_len = n;
    }

    return 0;
}


const char *
kva_event_strerror(kva_event_rc_e rc)
{
    if ((unsigned) rc >= sizeof(kva_rc_names) / sizeof(kva_rc_names[0])) {
        return "unknown error";
    }

    return kva_rc_names[rc];
}


int
kva_unhex64(const char *s, size_t len, uint64_t *v)
{
    size_t     i;
    uint64_t   r;
    unsigned   c, d;

    if (len != 16) {
        return -1;
    }

    r = 0;

    for (i = 0; i < 16; i++) {
        c = (unsigned char) s[i];
        d = c - '0';

        if (d > 9) {
            /* folds upper case onto lower case; other bytes fall out */
            d = (c | 0x20) - 'a';

            if (d > 5) {
                return -1;
            }

            d += 10;
        }

        r = (r << 4) | d;
    }

    *v = r;

    return 0;
}
