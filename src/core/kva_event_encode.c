/*
 * kv_aware core: KV event protocol v1, the encoder (docs/events.md).
 *
 * Built as a jansson tree and dumped compact.  The hand-written encoder
 * this replaced wrote into one buffer sized up front and was 10x to 30x
 * faster (bench/bench_event.c: 3.9 million against 0.34 million messages/s
 * of 1 hash; 90 million against 4.7 million hashes/s at 64 a message).
 * Only publishers encode (the simulator once a step, the module a resync
 * request per server), and jansson encodes faster than the module decodes
 * (3.2 million hashes/s, 0.27 million messages/s): not worth a second JSON
 * writer with its own escaping and number formatting.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kva_event.h"


static json_t *kva_encode_event(const kva_ev_t *ev);
static json_t *kva_encode_load(const kva_batch_t *b, size_t *flags);
static json_t *kva_encode_usage(double x, size_t *flags);
static int kva_set(json_t *obj, const char *key, json_t *value);
static char *kva_dump(json_t *root, size_t flags, size_t *len);


static const char   kva_digits[] = "0123456789abcdef";


/*
 * NULL also covers a batch that cannot be expressed (an unknown event
 * type): publishing half of it would be worse.
 */

char *
kva_event_encode(const kva_batch_t *b, size_t *len)
{
    char       hex[16];
    size_t     i, slen, flags;
    json_t    *root, *events;

    slen = b->server_len < KVA_EVENT_SERVER_MAX ? b->server_len
                                                : KVA_EVENT_SERVER_MAX;
    flags = 0;

    root = json_object();
    if (root == NULL) {
        return NULL;
    }

    if (kva_set(root, "v", json_integer(1)) != 0
        || kva_set(root, "server", json_stringn(b->server, slen)) != 0
        || (b->has_rank
            && kva_set(root, "rank", json_integer(b->rank)) != 0)
        || kva_set(root, "seq", json_integer((json_int_t) b->seq)) != 0)
    {
        goto failed;
    }

    if (b->has_origin) {
        kva_hex64(b->origin, hex);

        if (kva_set(root, "origin", json_stringn(hex, 16)) != 0) {
            goto failed;
        }
    }

    /* text is the default: its messages stay as they were */

    if (b->keyspace == KVA_KEYSPACE_TOKEN_KEYS
        && kva_set(root, "keyspace",
                   json_string(kva_event_keyspace_names[b->keyspace])) != 0)
    {
        goto failed;
    }

    if (b->snapshot > KVA_SNAP_NONE && b->snapshot <= KVA_SNAP_END
        && kva_set(root, "snapshot",
                   json_string(kva_event_snap_names[b->snapshot])) != 0)
    {
        goto failed;
    }

    if (b->nevents > 0) {
        events = json_array();

        if (kva_set(root, "events", events) != 0) {
            goto failed;
        }

        for (i = 0; i < b->nevents; i++) {
            if (json_array_append_new(events,
                                      kva_encode_event(&b->events[i]))
                != 0)
            {
                goto failed;
            }
        }
    }

    if (b->has_load
        && kva_set(root, "load", kva_encode_load(b, &flags)) != 0)
    {
        goto failed;
    }

    return kva_dump(root, flags, len);

failed:

    json_decref(root);

    return NULL;
}


static json_t *
kva_encode_event(const kva_ev_t *ev)
{
    char     hex[16];
    size_t   k;
    json_t  *obj, *hashes;

    if ((unsigned) ev->type > KVA_EV_CLEARED) {
        return NULL;
    }

    obj = json_object();
    if (obj == NULL) {
        return NULL;
    }

    if (kva_set(obj, "type", json_string(kva_event_type_names[ev->type]))
        != 0)
    {
        goto failed;
    }

    if (ev->type == KVA_EV_CLEARED) {
        return obj;
    }

    if (ev->type == KVA_EV_STORED && ev->has_parent) {
        kva_hex64(ev->parent, hex);

        if (kva_set(obj, "parent", json_stringn(hex, 16)) != 0) {
            goto failed;
        }
    }

    /* GPU goes unsaid: what every publisher before tiers meant */
    if (ev->type == KVA_EV_STORED && ev->tier != KVA_EVENT_TIER_GPU
        && ev->tier < KVA_EVENT_TIERS
        && kva_set(obj, "medium", json_string(kva_event_tier_names[ev->tier]))
           != 0)
    {
        goto failed;
    }

    hashes = json_array();

    if (kva_set(obj, "hashes", hashes) != 0) {
        goto failed;
    }

    for (k = 0; k < ev->nhashes; k++) {
        kva_hex64(ev->hashes[k], hex);

        if (json_array_append_new(hashes, json_stringn(hex, 16)) != 0) {
            goto failed;
        }
    }

    return obj;

failed:

    json_decref(obj);

    return NULL;
}


static json_t *
kva_encode_load(const kva_batch_t *b, size_t *flags)
{
    json_t  *load;

    load = json_object();

    if (load == NULL
        || kva_set(load, "waiting", json_integer(b->waiting)) != 0
        || kva_set(load, "running", json_integer(b->running)) != 0
        || kva_set(load, "kv_usage", kva_encode_usage(b->kv_usage, flags))
           != 0
        || (b->kv_tokens
            && kva_set(load, "kv_tokens", json_integer(b->kv_tokens)) != 0))
    {
        json_decref(load);
        return NULL;
    }

    return load;
}


/*
 * The shortest of %.15g and %.17g that reads back exactly: "0.43", not
 * "0.42999999999999999".  It is the message's only real, so the precision
 * can be the whole dump's.  NaN and out of range values would make the
 * message invalid JSON or rejected: they are clamped.
 */

static json_t *
kva_encode_usage(double x, size_t *flags)
{
    char  buf[32];

    if (!(x > 0.0)) {
        return json_integer(0);
    }

    if (x >= 1.0) {
        return json_integer(1);
    }

    snprintf(buf, sizeof(buf), "%.15g", x);

    /* a locale may have set a decimal comma: then keep jansson's 17 */
    if (strchr(buf, ',') == NULL && strtod(buf, NULL) == x) {
        *flags = JSON_REAL_PRECISION(15);
    }

    return json_real(x);
}


char *
kva_event_encode_resync(const char *server, size_t server_len, int rank,
    size_t *len)
{
    json_t  *root;

    if (server_len > KVA_EVENT_SERVER_MAX) {
        server_len = KVA_EVENT_SERVER_MAX;
    }

    root = json_object();

    if (root == NULL
        || kva_set(root, "v", json_integer(1)) != 0
        || kva_set(root, "type", json_string("resync")) != 0
        || kva_set(root, "server", json_stringn(server, server_len)) != 0
        || (rank >= 0 && kva_set(root, "rank", json_integer(rank)) != 0))
    {
        json_decref(root);
        return NULL;
    }

    return kva_dump(root, 0, len);
}


/* takes value's reference, as json_object_set_new() does, NULL included */

static int
kva_set(json_t *obj, const char *key, json_t *value)
{
    if (value == NULL) {
        return -1;
    }

    return json_object_set_new(obj, key, value);
}


/* consumes root; a server that is not UTF-8 makes the dump fail: NULL */

static char *
kva_dump(json_t *root, size_t flags, size_t *len)
{
    char  *s;

    s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER | flags);
    json_decref(root);

    if (s != NULL && len != NULL) {
        *len = strlen(s);
    }

    return s;
}


void
kva_hex64(uint64_t v, char out[16])
{
    int  i;

    for (i = 15; i >= 0; i--) {
        out[i] = kva_digits[v & 0xf];
        v >>= 4;
    }
}
