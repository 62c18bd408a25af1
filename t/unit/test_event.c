/*
 * Unit tests of src/kva_event.c: the KV event protocol codec.  TAP output.
 *
 *   gcc -std=gnu99 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter \
 *       -Isrc -o /tmp/test_event t/unit/test_event.c src/kva_event.c \
 *       -ljansson && /tmp/test_event
 *
 * Also meant to run under -fsanitize=address,undefined: the fuzz loop
 * hands the decoder exactly-sized heap copies, so an overread shows.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <math.h>
#include <unistd.h>

#include "tap.h"
#include "kva_event.h"


#define RT_ROUNDS      5000
#define FUZZ_ROUNDS    20000


static uint64_t rnd(void);
static int zeroed(const kva_batch_t *b);
static kva_event_rc_e dec(const char *msg, const kva_event_limits_t *lim,
    kva_batch_t *b, char *err);
static int expect(const char *msg, kva_event_rc_e want, const char *desc);
static int sane(const kva_batch_t *b);
static uint64_t random_hash(void);
static void random_batch(kva_batch_t *b, uint64_t **store);
static void random_server(char *s, size_t *len);
static char *filler(const char *item, size_t n, size_t *len);
static kva_event_rc_e dec_len(const char *msg, size_t len,
    const kva_event_limits_t *lim, kva_batch_t *b, char *err);
static long rss_kb(void);


static uint64_t  rng_state = 0x9e3779b97f4a7c15ULL;


/* xorshift64*: fixed seed, so a failure reproduces */
static uint64_t
rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;

    return rng_state * 0x2545f4914f6cdd1dULL;
}


static int
zeroed(const kva_batch_t *b)
{
    kva_batch_t  z;

    memset(&z, 0, sizeof(z));

    return memcmp(&z, b, sizeof(z)) == 0;
}


/* decodes from an exactly-sized heap copy, so ASan sees any overread */
static kva_event_rc_e
dec(const char *msg, const kva_event_limits_t *lim, kva_batch_t *b,
    char *err)
{
    char            *copy, dummy[128];
    size_t           len;
    kva_event_rc_e   rc;

    len = strlen(msg);
    copy = malloc(len ? len : 1);

    if (copy == NULL) {
        abort();
    }

    memcpy(copy, msg, len);
    rc = kva_event_decode(copy, len, lim, b, err ? err : dummy, 128);
    free(copy);

    return rc;
}


static int
expect(const char *msg, kva_event_rc_e want, const char *desc)
{
    int              r;
    char             err[128];
    kva_batch_t      b;
    kva_event_rc_e   rc;

    memset(&b, 0xa5, sizeof(b));
    rc = dec(msg, NULL, &b, err);

    if (want == KVA_EVENT_OK) {
        r = (rc == KVA_EVENT_OK);
        ok(r, "%s: ok", desc);

        if (!r) {
            printf("# rc %d: %s\n", rc, err);
        }

        kva_batch_free(&b);
        return r;
    }

    r = (rc == want && zeroed(&b) && err[0] != '\0');
    ok(r, "%s: %s (%s)", desc, kva_event_strerror(want), err);

    if (!r) {
        printf("# got rc %d, zeroed %d\n", rc, zeroed(&b));
    }

    kva_batch_free(&b);

    return r;
}


/* the invariants of a decoded batch */
static int
sane(const kva_batch_t *b)
{
    size_t  i, total;

    if (b->server_len == 0 || b->server_len >= KVA_EVENT_SERVER_MAX
        || strlen(b->server) != b->server_len
        || b->seq > (1ULL << 53))
    {
        return 0;
    }

    if ((b->nevents == 0) != (b->events == NULL)
        || (b->hash_count == 0) != (b->hash_store == NULL)
        || b->heartbeat != (b->nevents == 0 && b->snapshot == KVA_SNAP_NONE)
        || !(b->kv_usage >= 0.0 && b->kv_usage <= 1.0))
    {
        return 0;
    }

    total = 0;

    for (i = 0; i < b->nevents; i++) {
        if (b->events[i].nhashes == 0) {
            continue;
        }

        if (b->events[i].hashes != b->hash_store + total) {
            return 0;
        }

        total += b->events[i].nhashes;
    }

    return total == b->hash_count;
}


/* whole UTF-8 sequences, JSON specials and controls, never NUL */
static void
random_server(char *s, size_t *len)
{
    size_t              n, want, t;
    static const char  *pieces[] = {
        "a", "z", "0", ".", ":", "-", "\"", "\\", "/", "\n", "\t", "\x01",
        "\x1f", "\x7f", "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98\x80", " "
    };

    want = 1 + rnd() % (KVA_EVENT_SERVER_MAX - 1);
    n = 0;

    do {
        t = rnd() % (sizeof(pieces) / sizeof(pieces[0]));

        if (n + strlen(pieces[t]) > want) {
            break;
        }

        memcpy(s + n, pieces[t], strlen(pieces[t]));
        n += strlen(pieces[t]);
    } while (n < want);

    if (n == 0) {
        s[n++] = 'x';
    }

    s[n] = '\0';
    *len = n;
}


static uint64_t
random_hash(void)
{
    switch (rnd() % 8) {
    case 0:
        return 0;
    case 1:
        return UINT64_MAX;
    case 2:
        return rnd() | (1ULL << 63);
    case 3:
        return rnd() >> (rnd() % 64);
    default:
        return rnd();
    }
}


static void
random_batch(kva_batch_t *b, uint64_t **store)
{
    size_t     i, k, n, total;
    kva_ev_t  *ev;

    memset(b, 0, sizeof(kva_batch_t));
    random_server(b->server, &b->server_len);

    switch (rnd() % 4) {
    case 0:
        b->seq = 0;
        break;
    case 1:
        b->seq = 1ULL << 53;
        break;
    default:
        b->seq = rnd() >> 11;
    }

    b->snapshot = (kva_snap_e) (rnd() % 5);

    if (rnd() % 2) {
        b->has_load = 1;
        b->waiting = (uint32_t) rnd();
        b->running = rnd() % 3 ? (uint32_t) (rnd() % 100) : UINT32_MAX;

        switch (rnd() % 4) {
        case 0:
            b->kv_usage = (double) (rnd() % 2);
            break;
        case 1:
            b->kv_usage = (double) (rnd() % 1000) / 1000.0;
            break;
        default:
            b->kv_usage = (double) (rnd() >> 11) / (double) (1ULL << 53);
        }
    }

    n = rnd() % 4 ? rnd() % 8 : 0;
    b->nevents = n;
    b->events = n ? calloc(n, sizeof(kva_ev_t)) : NULL;
    *store = malloc(8 * 40 * (n + 1));

    if ((n && b->events == NULL) || *store == NULL) {
        abort();
    }

    total = 0;

    for (i = 0; i < n; i++) {
        ev = &b->events[i];
        ev->type = (kva_ev_type_e) (rnd() % 3);

        if (ev->type == KVA_EV_CLEARED) {
            continue;
        }

        ev->nhashes = rnd() % 41;
        ev->hashes = *store + total;
        total += ev->nhashes;

        for (k = 0; k < ev->nhashes; k++) {
            ev->hashes[k] = random_hash();
        }

        if (ev->type == KVA_EV_STORED && rnd() % 2) {
            ev->has_parent = 1;
            ev->parent = random_hash();
        }
    }

    b->hash_count = total;
    b->heartbeat = (n == 0 && b->snapshot == KVA_SNAP_NONE);
}


static void
test_hex(void)
{
    int       c, good, r;
    char      buf[17];
    uint64_t  v;

    buf[16] = '\0';

    kva_hex64(0, buf);
    ok(strcmp(buf, "0000000000000000") == 0, "hex64(0)");

    kva_hex64(UINT64_MAX, buf);
    ok(strcmp(buf, "ffffffffffffffff") == 0, "hex64(UINT64_MAX)");

    kva_hex64(0x0123456789abcdefULL, buf);
    ok(strcmp(buf, "0123456789abcdef") == 0, "hex64 is lowercase, padded");

    ok(kva_unhex64("0123456789ABCDEF", 16, &v) == 0
       && v == 0x0123456789abcdefULL, "unhex64 upper case");
    ok(kva_unhex64("fedcba9876543210", 16, &v) == 0
       && v == 0xfedcba9876543210ULL, "unhex64 lower case");
    ok(kva_unhex64("0123456789abcde", 15, &v) != 0
       && kva_unhex64("0123456789abcdef0", 17, &v) != 0
       && kva_unhex64("", 0, &v) != 0, "unhex64 rejects other lengths");

    good = 1;
    memcpy(buf, "0000000000000000", 16);

    for (c = 0; c < 256; c++) {
        buf[7] = (char) c;
        r = kva_unhex64(buf, 16, &v);

        if ((r == 0) != (isxdigit(c) != 0)
            || (r == 0 && v != (uint64_t) strtoull(&buf[7], NULL, 16)))
        {
            printf("# byte 0x%02x\n", c);
            good = 0;
        }
    }

    ok(good, "unhex64 accepts exactly the 22 hex digits, every byte tried");
}


static void
test_fields(void)
{
    char             err[128];
    kva_batch_t      b;
    kva_event_rc_e   rc;

    rc = dec("{\"v\":1,\"server\":\"127.0.0.1:8001\",\"seq\":42,"
             "\"events\":["
             "{\"type\":\"stored\",\"parent\":\"0000000000000000\","
             "\"hashes\":[\"9f3c2a0b11d4e5f6\",\"0123456789abcdef\"]},"
             "{\"type\":\"removed\",\"hashes\":[\"0123456789abcdef\"]},"
             "{\"type\":\"cleared\"}],"
             "\"load\":{\"waiting\":3,\"running\":12,\"kv_usage\":0.43},"
             "\"keyspace\":\"text\",\"future\":{\"x\":[1,2]}}",
             NULL, &b, err);

    ok(rc == KVA_EVENT_OK && sane(&b), "the documented example decodes");
    ok(strcmp(b.server, "127.0.0.1:8001") == 0 && b.server_len == 14
       && b.seq == 42, "server, seq");
    ok(b.nevents == 3 && b.hash_count == 3 && !b.heartbeat
       && b.snapshot == KVA_SNAP_NONE, "three events, three hashes");
    ok(b.nevents == 3 && b.events[0].type == KVA_EV_STORED
       && b.events[0].has_parent && b.events[0].parent == 0
       && b.events[0].nhashes == 2
       && b.events[0].hashes[0] == 0x9f3c2a0b11d4e5f6ULL
       && b.events[0].hashes[1] == 0x0123456789abcdefULL, "stored event");
    ok(b.nevents == 3 && b.events[1].type == KVA_EV_REMOVED
       && b.events[1].nhashes == 1
       && b.events[1].hashes[0] == 0x0123456789abcdefULL, "removed event");
    ok(b.nevents == 3 && b.events[2].type == KVA_EV_CLEARED
       && b.events[2].nhashes == 0, "cleared event");
    ok(b.has_load && b.waiting == 3 && b.running == 12
       && b.kv_usage == 0.43, "load");
    kva_batch_free(&b);
    ok(zeroed(&b), "kva_batch_free leaves the batch zeroed");

    rc = dec("{\"seq\":0,\"server\":\"s\",\"v\":1}", NULL, &b, err);
    ok(rc == KVA_EVENT_OK && b.heartbeat && b.nevents == 0 && !b.has_load
       && b.events == NULL && b.hash_store == NULL && sane(&b),
       "no events: heartbeat, any field order");
    kva_batch_free(&b);

    rc = dec("{\"v\":1,\"server\":\"s\",\"seq\":9007199254740992,"
             "\"events\":[],\"load\":{\"kv_usage\":1}}", NULL, &b, err);
    ok(rc == KVA_EVENT_OK && b.heartbeat && b.has_load && b.kv_usage == 1.0
       && b.waiting == 0 && b.seq == (1ULL << 53),
       "events [] is a heartbeat; seq 2^53; integer kv_usage");
    kva_batch_free(&b);

    rc = dec("{\"v\":1,\"server\":\"s\",\"seq\":1,\"snapshot\":\"end\"}",
             NULL, &b, err);
    ok(rc == KVA_EVENT_OK && !b.heartbeat && b.snapshot == KVA_SNAP_END,
       "a snapshot end without events is not a heartbeat");
    kva_batch_free(&b);

    rc = dec("{\"v\":1,\"server\":\"s\",\"seq\":1,\"load\":{"
             "\"waiting\":5000000000,\"running\":4294967295}}",
             NULL, &b, err);
    ok(rc == KVA_EVENT_OK && b.waiting == UINT32_MAX
       && b.running == UINT32_MAX, "waiting, running clamp to uint32");
    kva_batch_free(&b);

    rc = dec("{\"v\":1,\"server\":\"s\",\"seq\":1,\"events\":["
             "{\"type\":\"cleared\",\"hashes\":\"junk\"},"
             "{\"type\":\"stored\",\"hashes\":[],\"x\":1},"
             "{\"type\":\"removed\",\"hashes\":[\"FFFFFFFFFFFFFFFF\"],"
             "\"parent\":\"junk\"}]}", NULL, &b, err);
    ok(rc == KVA_EVENT_OK && b.nevents == 3 && b.hash_count == 1
       && b.events[1].nhashes == 0 && b.events[2].hashes[0] == UINT64_MAX
       && sane(&b), "ignored: hashes on cleared, parent on removed, "
       "unknown keys; empty hashes allowed");
    kva_batch_free(&b);
}


static void
test_snapshots(void)
{
    int                 i;
    char                msg[128];
    kva_batch_t         b;
    kva_event_rc_e      rc;
    static const char  *names[] = { NULL, "full", "begin", "more", "end" };

    for (i = 1; i <= 4; i++) {
        snprintf(msg, sizeof(msg), "{\"v\":1,\"server\":\"s\",\"seq\":1,"
                 "\"snapshot\":\"%s\",\"events\":[{\"type\":\"stored\","
                 "\"hashes\":[\"0000000000000001\"]}]}", names[i]);
        rc = dec(msg, NULL, &b, NULL);
        ok(rc == KVA_EVENT_OK && b.snapshot == (kva_snap_e) i
           && !b.heartbeat, "snapshot \"%s\"", names[i]);
        kva_batch_free(&b);
    }

    expect("{\"v\":1,\"server\":\"s\",\"seq\":1,\"snapshot\":\"FULL\"}",
           KVA_EVENT_BAD_FIELD, "snapshot FULL");
    expect("{\"v\":1,\"server\":\"s\",\"seq\":1,\"snapshot\":1}",
           KVA_EVENT_BAD_FIELD, "snapshot 1");
    expect("{\"v\":1,\"server\":\"s\",\"seq\":1,\"snapshot\":null}",
           KVA_EVENT_BAD_FIELD, "snapshot null");
}


#define H   "\"0123456789abcdef\""
#define HDR "\"v\":1,\"server\":\"s\",\"seq\":1"

static void
test_errors(void)
{
    int                  i;
    char                 msg[8192], err[128], *p;
    char                 big[KVA_EVENT_SERVER_MAX + 64];
    kva_batch_t          b;
    kva_event_rc_e       rc;
    kva_event_limits_t   lim;

    expect("", KVA_EVENT_MALFORMED, "empty");
    expect("{", KVA_EVENT_MALFORMED, "truncated");
    expect("hello", KVA_EVENT_MALFORMED, "not json");
    expect("{\"v\":1,} ", KVA_EVENT_MALFORMED, "trailing comma");
    expect("[{\"v\":1}]", KVA_EVENT_MALFORMED, "array at the top");
    expect("1", KVA_EVENT_MALFORMED, "number at the top");
    expect("{\"v\":1,\"server\":\"a\\u0000b\",\"seq\":1}",
           KVA_EVENT_MALFORMED, "NUL in a string");
    expect("{\"v\":1,\"server\":\"\xff\",\"seq\":1}",
           KVA_EVENT_MALFORMED, "invalid UTF-8");
    expect("{" HDR "} x", KVA_EVENT_MALFORMED, "garbage after the object");

    expect("{\"server\":\"s\",\"seq\":1}", KVA_EVENT_BAD_FIELD, "no v");
    expect("{\"v\":1,\"seq\":1}", KVA_EVENT_BAD_FIELD, "no server");
    expect("{\"v\":1,\"server\":\"s\"}", KVA_EVENT_BAD_FIELD, "no seq");
    expect("{\"v\":2,\"server\":\"s\",\"seq\":1}", KVA_EVENT_VERSION, "v 2");
    expect("{\"v\":0,\"server\":\"s\",\"seq\":1}", KVA_EVENT_VERSION, "v 0");
    expect("{\"v\":\"1\",\"server\":\"s\",\"seq\":1}", KVA_EVENT_BAD_FIELD,
           "v \"1\"");
    expect("{\"v\":1.0,\"server\":\"s\",\"seq\":1}", KVA_EVENT_BAD_FIELD,
           "v 1.0");
    expect("{\"v\":1,\"server\":5,\"seq\":1}", KVA_EVENT_BAD_FIELD,
           "server 5");
    expect("{\"v\":1,\"server\":\"\",\"seq\":1}", KVA_EVENT_BAD_FIELD,
           "server empty");
    expect("{\"v\":1,\"server\":\"s\",\"seq\":-1}", KVA_EVENT_BAD_FIELD,
           "seq -1");
    expect("{\"v\":1,\"server\":\"s\",\"seq\":9007199254740993}",
           KVA_EVENT_BAD_FIELD, "seq 2^53 + 1");
    expect("{\"v\":1,\"server\":\"s\",\"seq\":1.5}", KVA_EVENT_BAD_FIELD,
           "seq 1.5");
    expect("{\"v\":1,\"server\":\"s\",\"seq\":\"1\"}", KVA_EVENT_BAD_FIELD,
           "seq \"1\"");

    p = big;
    p += sprintf(p, "{\"v\":1,\"seq\":1,\"server\":\"");
    memset(p, 'x', KVA_EVENT_SERVER_MAX - 1);
    strcpy(p + KVA_EVENT_SERVER_MAX - 1, "\"}");
    expect(big, KVA_EVENT_OK, "server of 127 bytes");
    memset(p, 'x', KVA_EVENT_SERVER_MAX);
    strcpy(p + KVA_EVENT_SERVER_MAX, "\"}");
    expect(big, KVA_EVENT_BAD_FIELD, "server of 128 bytes");

    expect("{" HDR ",\"events\":{}}", KVA_EVENT_BAD_FIELD, "events {}");
    expect("{" HDR ",\"events\":[1]}", KVA_EVENT_BAD_FIELD, "events [1]");
    expect("{" HDR ",\"events\":[{\"hashes\":[]}]}", KVA_EVENT_BAD_FIELD,
           "no type");
    expect("{" HDR ",\"events\":[{\"type\":\"evicted\",\"hashes\":[]}]}",
           KVA_EVENT_BAD_FIELD, "unknown type");
    expect("{" HDR ",\"events\":[{\"type\":\"Stored\",\"hashes\":[]}]}",
           KVA_EVENT_BAD_FIELD, "type in the wrong case");
    expect("{" HDR ",\"events\":[{\"type\":\"stored\"}]}",
           KVA_EVENT_BAD_FIELD, "stored without hashes");
    expect("{" HDR ",\"events\":[{\"type\":\"removed\",\"hashes\":" H "}]}",
           KVA_EVENT_BAD_FIELD, "hashes not an array");
    expect("{" HDR ",\"events\":[{\"type\":\"stored\",\"hashes\":"
           "[\"0123456789abcde\"]}]}", KVA_EVENT_BAD_FIELD, "15 hex digits");
    expect("{" HDR ",\"events\":[{\"type\":\"stored\",\"hashes\":"
           "[\"0123456789abcdef0\"]}]}", KVA_EVENT_BAD_FIELD,
           "17 hex digits");
    expect("{" HDR ",\"events\":[{\"type\":\"stored\",\"hashes\":"
           "[\"0123456789abcdeg\"]}]}", KVA_EVENT_BAD_FIELD, "hex digit g");
    expect("{" HDR ",\"events\":[{\"type\":\"stored\",\"hashes\":"
           "[\"0x23456789abcdef\"]}]}", KVA_EVENT_BAD_FIELD, "0x prefix");
    expect("{" HDR ",\"events\":[{\"type\":\"stored\",\"hashes\":"
           "[81985529216486895]}]}", KVA_EVENT_BAD_FIELD, "hash as number");
    expect("{" HDR ",\"events\":[{\"type\":\"stored\",\"parent\":\"xyz\","
           "\"hashes\":[" H "]}]}", KVA_EVENT_BAD_FIELD, "bad parent");
    expect("{" HDR ",\"events\":[{\"type\":\"stored\",\"parent\":1,"
           "\"hashes\":[" H "]}]}", KVA_EVENT_BAD_FIELD, "parent number");

    rc = dec("{" HDR ",\"events\":[{\"type\":\"cleared\"},{\"type\":\"stored"
             "\",\"hashes\":[]},{\"type\":\"stored\",\"hashes\":[" H "," H
             "," H "," H "," H ",\"0123456789abcdeX\"]}]}", NULL, &b, err);
    ok(rc == KVA_EVENT_BAD_FIELD && zeroed(&b)
       && strcmp(err, "events[2].hashes[5]: not 16 hex digits") == 0,
       "the reason names the hash: %s", err);

    expect("{" HDR ",\"load\":[]}", KVA_EVENT_BAD_FIELD, "load []");
    expect("{" HDR ",\"load\":{\"waiting\":-1}}", KVA_EVENT_BAD_FIELD,
           "waiting -1");
    expect("{" HDR ",\"load\":{\"running\":1.5}}", KVA_EVENT_BAD_FIELD,
           "running 1.5");
    expect("{" HDR ",\"load\":{\"kv_usage\":1.5}}", KVA_EVENT_BAD_FIELD,
           "kv_usage 1.5");
    expect("{" HDR ",\"load\":{\"kv_usage\":-0.1}}", KVA_EVENT_BAD_FIELD,
           "kv_usage -0.1");
    expect("{" HDR ",\"load\":{\"kv_usage\":2}}", KVA_EVENT_BAD_FIELD,
           "kv_usage 2");
    expect("{" HDR ",\"load\":{\"kv_usage\":\"0.5\"}}", KVA_EVENT_BAD_FIELD,
           "kv_usage \"0.5\"");
    expect("{" HDR ",\"keyspace\":\"text\"}", KVA_EVENT_OK,
           "keyspace text");
    expect("{" HDR ",\"keyspace\":\"tokens\"}", KVA_EVENT_BAD_FIELD,
           "keyspace tokens");
    expect("{" HDR ",\"keyspace\":null}", KVA_EVENT_BAD_FIELD,
           "keyspace null");

    /* limits */

    memset(&lim, 0, sizeof(lim));
    strcpy(msg, "{" HDR ",\"events\":[{\"type\":\"stored\",\"hashes\":["
           H "," H "]},{\"type\":\"removed\",\"hashes\":[" H "]}]}");

    lim.max_message = strlen(msg);
    rc = dec(msg, &lim, &b, err);
    ok(rc == KVA_EVENT_OK, "message at max_message");
    kva_batch_free(&b);

    lim.max_message--;
    rc = dec(msg, &lim, &b, err);
    ok(rc == KVA_EVENT_TOO_BIG && zeroed(&b), "message over max_message");

    lim.max_message = 0;
    lim.max_hashes = 3;
    rc = dec(msg, &lim, &b, err);
    ok(rc == KVA_EVENT_OK && b.hash_count == 3, "hashes at max_hashes");
    kva_batch_free(&b);

    lim.max_hashes = 2;
    rc = dec(msg, &lim, &b, err);
    ok(rc == KVA_EVENT_TOO_BIG && zeroed(&b),
       "hashes over max_hashes, counted over events (%s)", err);

    lim.max_hashes = 0;
    lim.max_events = 2;
    rc = dec(msg, &lim, &b, err);
    ok(rc == KVA_EVENT_OK, "events at max_events");
    kva_batch_free(&b);

    lim.max_events = 1;
    rc = dec(msg, &lim, &b, err);
    ok(rc == KVA_EVENT_TOO_BIG && zeroed(&b), "events over max_events (%s)",
       err);

    /* a big message: 1000 hashes, and the limit just under it */

    p = msg + sprintf(msg, "{" HDR ",\"events\":[{\"type\":\"stored\","
                      "\"hashes\":[");

    for (i = 0; i < 400; i++) {
        p += sprintf(p, "%s\"%016x\"", i ? "," : "", i);
    }

    strcpy(p, "]}]}");
    memset(&lim, 0, sizeof(lim));
    lim.max_hashes = 400;
    rc = dec(msg, &lim, &b, err);
    ok(rc == KVA_EVENT_OK && b.hash_count == 400
       && b.events[0].hashes[399] == 399, "400 hashes");
    kva_batch_free(&b);

    lim.max_hashes = 399;
    rc = dec(msg, &lim, &b, err);
    ok(rc == KVA_EVENT_TOO_BIG && zeroed(&b), "400 hashes over 399");

    rc = kva_event_decode("{" HDR "}", sizeof("{" HDR "}") - 1, NULL, &b,
                          NULL, 0);
    ok(rc == KVA_EVENT_OK, "err may be NULL");
    kva_batch_free(&b);

    rc = kva_event_decode("{\"v\":3}", 7, NULL, &b, err, 4);
    ok(rc == KVA_EVENT_VERSION && strlen(err) == 3, "a short err truncates");

    rc = kva_event_decode(NULL, 0, NULL, &b, err, sizeof(err));
    ok(rc == KVA_EVENT_MALFORMED && zeroed(&b), "NULL message");
}


static void
test_encode(void)
{
    char            *s;
    size_t           len;
    uint64_t         hs[3];
    kva_ev_t         ev[3];
    kva_batch_t      b, d;
    kva_event_rc_e   rc;

    memset(&b, 0, sizeof(b));
    memset(ev, 0, sizeof(ev));
    strcpy(b.server, "127.0.0.1:8001");
    b.server_len = 14;
    b.seq = 42;
    hs[0] = 0x9f3c2a0b11d4e5f6ULL;
    hs[1] = 0x0123456789abcdefULL;
    hs[2] = 0x0123456789abcdefULL;
    ev[0].type = KVA_EV_STORED;
    ev[0].has_parent = 1;
    ev[0].parent = 0;
    ev[0].hashes = hs;
    ev[0].nhashes = 2;
    ev[1].type = KVA_EV_REMOVED;
    ev[1].hashes = hs + 2;
    ev[1].nhashes = 1;
    ev[2].type = KVA_EV_CLEARED;
    b.events = ev;
    b.nevents = 3;
    b.has_load = 1;
    b.waiting = 3;
    b.running = 12;
    b.kv_usage = 0.43;

    s = kva_event_encode(&b, &len);
    ok(s != NULL && len == strlen(s) && strcmp(s,
       "{\"v\":1,\"server\":\"127.0.0.1:8001\",\"seq\":42,\"events\":["
       "{\"type\":\"stored\",\"parent\":\"0000000000000000\","
       "\"hashes\":[\"9f3c2a0b11d4e5f6\",\"0123456789abcdef\"]},"
       "{\"type\":\"removed\",\"hashes\":[\"0123456789abcdef\"]},"
       "{\"type\":\"cleared\"}],"
       "\"load\":{\"waiting\":3,\"running\":12,\"kv_usage\":0.43}}") == 0,
       "encode: the documented example, compact");
    free(s);

    b.nevents = 0;
    b.has_load = 0;
    b.snapshot = KVA_SNAP_BEGIN;
    s = kva_event_encode(&b, &len);
    ok(s != NULL && strcmp(s, "{\"v\":1,\"server\":\"127.0.0.1:8001\","
       "\"seq\":42,\"snapshot\":\"begin\"}") == 0, "encode: snapshot");
    free(s);

    b.snapshot = KVA_SNAP_NONE;
    s = kva_event_encode(&b, &len);
    ok(s != NULL && strcmp(s, "{\"v\":1,\"server\":\"127.0.0.1:8001\","
       "\"seq\":42}") == 0, "encode: heartbeat");
    free(s);

    strcpy(b.server, "a\"b\\c\n\x01\xc3\xa9");
    b.server_len = strlen(b.server);
    b.has_load = 1;
    b.kv_usage = NAN;
    s = kva_event_encode(&b, &len);
    ok(s != NULL && strcmp(s, "{\"v\":1,\"server\":\"a\\\"b\\\\c\\u000a"
       "\\u0001\xc3\xa9\",\"seq\":42,\"load\":{\"waiting\":3,\"running\":12,"
       "\"kv_usage\":0}}") == 0, "encode: escapes; NaN kv_usage is 0");

    rc = KVA_EVENT_MALFORMED;

    if (s != NULL) {
        rc = kva_event_decode(s, len, NULL, &d, NULL, 0);
    }

    ok(rc == KVA_EVENT_OK && strcmp(d.server, b.server) == 0,
       "encode: escaped server decodes back");
    kva_batch_free(&d);
    free(s);

    b.nevents = 1;
    ev[0].type = (kva_ev_type_e) 7;
    s = kva_event_encode(&b, &len);
    ok(s == NULL, "encode: unknown type is NULL");
    free(s);
}


static void
test_round_trip(void)
{
    int              i, good, special;
    char            *s;
    size_t           len, k;
    uint64_t        *store;
    kva_batch_t      b, d;
    kva_event_rc_e   rc;

    good = 1;
    special = 0;

    for (i = 0; i < RT_ROUNDS && good; i++) {
        random_batch(&b, &store);
        s = kva_event_encode(&b, &len);

        if (s == NULL || strlen(s) != len) {
            printf("# round %d: encode failed\n", i);
            good = 0;
            break;
        }

        rc = kva_event_decode(s, len, NULL, &d, NULL, 0);

        if (rc != KVA_EVENT_OK || !sane(&d) || !kva_batch_equal(&b, &d)
            || d.heartbeat != b.heartbeat)
        {
            printf("# round %d: rc %d: %s\n", i, rc, s);
            good = 0;
        }

        for (k = 0; k < d.hash_count; k++) {
            special |= d.hash_store[k] == 0;
            special |= (d.hash_store[k] == UINT64_MAX) << 1;
            special |= ((d.hash_store[k] >> 63) != 0) << 2;
        }

        kva_batch_free(&d);
        free(s);
        free(b.events);
        free(store);
    }

    ok(good, "round trip of %d random batches", RT_ROUNDS);
    ok(special == 7, "they included 0, UINT64_MAX and top-bit hashes");
}


static void
test_resync(void)
{
    int      i, good;
    char    *s, server[KVA_EVENT_SERVER_MAX], got[KVA_EVENT_SERVER_MAX];
    size_t   len, n, glen;

    s = kva_event_encode_resync("127.0.0.1:8001", 14, &len);
    ok(s != NULL && len == strlen(s) && strcmp(s,
       "{\"v\":1,\"type\":\"resync\",\"server\":\"127.0.0.1:8001\"}") == 0,
       "resync encode");
    ok(s != NULL && kva_event_decode_resync(s, len, got, sizeof(got), &glen)
       == 0 && glen == 14 && strcmp(got, "127.0.0.1:8001") == 0,
       "resync decode");
    ok(s != NULL && kva_event_decode_resync(s, len, got, 14, &glen) != 0,
       "resync decode: server over the caller's buffer");
    free(s);

    ok(kva_event_decode_resync("{\"v\":1,\"type\":\"stored\",\"server\":\"a\""
       "}", 34, got, sizeof(got), &glen) != 0, "resync: wrong type");
    ok(kva_event_decode_resync("{\"v\":2,\"type\":\"resync\",\"server\":\"a\""
       "}", 34, got, sizeof(got), &glen) != 0, "resync: v 2");
    ok(kva_event_decode_resync("{\"v\":1,\"type\":\"resync\"}", 23, got,
       sizeof(got), &glen) != 0, "resync: no server");
    ok(kva_event_decode_resync("{\"v\":1,\"type\":\"resync\",\"server\":\"\"}",
       33, got, sizeof(got), &glen) != 0, "resync: empty server");
    ok(kva_event_decode_resync("{\"v\":1,", 7, got, sizeof(got), &glen) != 0,
       "resync: not json");
    ok(kva_event_decode_resync("[1]", 3, got, sizeof(got), &glen) != 0,
       "resync: array");

    good = 1;

    for (i = 0; i < 1000 && good; i++) {
        random_server(server, &n);
        s = kva_event_encode_resync(server, n, &len);

        if (s == NULL
            || kva_event_decode_resync(s, len, got, sizeof(got), &glen) != 0
            || glen != n || memcmp(got, server, n) != 0)
        {
            printf("# %s\n", s ? s : "(null)");
            good = 0;
        }

        free(s);
    }

    ok(good, "resync round trip of servers with quotes, backslashes, "
       "controls, UTF-8");
}


static void
test_strerror(void)
{
    int          rc, good;
    const char  *s, *p;

    good = 1;

    for (rc = KVA_EVENT_OK; rc <= KVA_EVENT_NO_MEMORY; rc++) {
        s = kva_event_strerror((kva_event_rc_e) rc);

        for (p = s; *p; p++) {
            good &= !isupper((unsigned char) *p);
        }

        good &= s[0] != '\0' && (rc == 0 || strcmp(s, "ok") != 0);
    }

    s = kva_event_strerror((kva_event_rc_e) 99);
    ok(good && s != NULL && s[0] != '\0', "strerror: short lowercase");
}


/* random flips, truncations, insertions, deletions of valid messages */
static void
test_fuzz(void)
{
    int                  i, good, k, nok;
    char                *s, *m, err[128];
    size_t               len, mlen, pos, j;
    uint64_t            *store;
    kva_batch_t          b, d;
    kva_event_rc_e       rc;
    kva_event_limits_t   lim;
    static const char    alphabet[] = "{}[]\",:0123456789abcdefvx\\ -.eE";

    lim.max_message = 4096;
    lim.max_hashes = 100;
    lim.max_events = 6;

    good = 1;
    nok = 0;

    for (i = 0; i < FUZZ_ROUNDS; i++) {
        random_batch(&b, &store);
        s = kva_event_encode(&b, &len);
        free(b.events);
        free(store);

        if (s == NULL) {
            abort();
        }

        m = malloc(len + 16);
        if (m == NULL) {
            abort();
        }

        memcpy(m, s, len);
        mlen = len;

        for (k = 1 + rnd() % 4; k > 0; k--) {
            pos = mlen ? rnd() % mlen : 0;

            switch (rnd() % 6) {
            case 0:
                m[pos] = (char) rnd();
                break;
            case 1:
                m[pos] ^= (char) (1 << (rnd() % 8));
                break;
            case 2:
                mlen = pos;
                break;
            case 3:
                if (mlen > 0) {
                    memmove(m + pos, m + pos + 1, mlen - pos - 1);
                    mlen--;
                }
                break;
            default:
                if (mlen < len + 15) {
                    memmove(m + pos + 1, m + pos, mlen - pos);
                    m[pos] = alphabet[rnd() % (sizeof(alphabet) - 1)];
                    mlen++;
                }
            }
        }

        /* exactly sized, so ASan catches a read past the end */
        m = realloc(m, mlen ? mlen : 1);
        if (m == NULL) {
            abort();
        }

        memset(&d, 0x5a, sizeof(d));
        rc = kva_event_decode(m, mlen, i % 2 ? &lim : NULL, &d, err,
                              sizeof(err));

        if (rc == KVA_EVENT_OK) {
            nok++;

            if (!sane(&d)) {
                printf("# round %d: insane batch\n", i);
                good = 0;
            }

            for (j = 0; j < d.hash_count; j++) {
                d.hash_store[j] ^= 1;
            }

        } else if (!zeroed(&d) || err[0] == '\0') {
            printf("# round %d: rc %d, batch not zeroed or no reason\n",
                   i, rc);
            good = 0;
        }

        kva_batch_free(&d);
        free(m);
        free(s);
    }

    ok(good, "fuzz: %d mutated messages, %d still valid, no crash; "
       "failures leave the batch zeroed", FUZZ_ROUNDS, nok);
}


/* {"v":1,"server":"s","seq":1,"x":[item,item,...]}: n items, 5 + n values */
static char *
filler(const char *item, size_t n, size_t *len)
{
    char    *msg, *p;
    size_t   i, k;

    k = strlen(item);
    msg = malloc(64 + n * (k + 1));

    if (msg == NULL) {
        abort();
    }

    p = msg + sprintf(msg, "{" HDR ",\"x\":[");

    for (i = 0; i < n; i++) {
        if (i > 0) {
            *p++ = ',';
        }

        memcpy(p, item, k);
        p += k;
    }

    strcpy(p, "]}");
    *len = (p - msg) + 2;

    return msg;
}


static kva_event_rc_e
dec_len(const char *msg, size_t len, const kva_event_limits_t *lim,
    kva_batch_t *b, char *err)
{
    char            *copy;
    kva_event_rc_e   rc;

    copy = malloc(len);

    if (copy == NULL) {
        abort();
    }

    memcpy(copy, msg, len);
    rc = kva_event_decode(copy, len, lim, b, err, 128);
    free(copy);

    return rc;
}


static void
test_shape(void)
{
    const char          *m;
    kva_event_shape_t    none, s;

    memset(&none, 0, sizeof(none));

    m = "{\"a\":[1,2,{\"b\":\"[,]\"}],\"c\":{}, \"d\" : [ ] }";
    ok(kva_event_shape(m, strlen(m), &none, &s) == 0 && s.values == 8
       && s.containers == 5 && s.depth == 3,
       "shape: values %zu, containers %zu, depth %zu", s.values,
       s.containers, s.depth);

    /* an escaped quote does not end the string; an escaped backslash does */
    m = "[\"\\\",{[\",\"\\\\\",{}]";
    ok(kva_event_shape(m, strlen(m), &none, &s) == 0 && s.values == 4
       && s.containers == 2 && s.depth == 2,
       "shape: escapes, brackets and commas in strings count for nothing");

    m = "[[[[]]]]";
    s.depth = 0;
    none.depth = 3;
    ok(kva_event_shape(m, strlen(m), &none, &s) == -1 && s.depth == 4,
       "shape: stops at the first level over the bound");
}


static void
test_amplification(void)
{
    int                  i;
    char                 err[128], msg[1024], *m;
    size_t               len, n;
    kva_batch_t          b;
    kva_event_rc_e       rc;
    kva_event_limits_t   lim;

    /* the reported message: a 4 MB heartbeat with [{},{},...] ignored */
    m = filler("{}", (4 * 1024 * 1024 - 64) / 3, &len);
    lim.max_message = 4 * 1024 * 1024;
    lim.max_hashes = 65536;
    lim.max_events = 65536;
    rc = dec_len(m, len, &lim, &b, err);
    ok(rc == KVA_EVENT_TOO_BIG && zeroed(&b),
       "hostile [{},{},...] heartbeat of %zu bytes: too big (%s)", len, err);
    ok(kva_event_decode_resync(m, len, msg, sizeof(msg), NULL) == -1,
       "the same as a resync request: rejected");
    free(m);

    /* the same count of scalars is as big: values, not just containers */
    m = filler("0", (4 * 1024 * 1024 - 64) / 2, &len);
    rc = dec_len(m, len, &lim, &b, err);
    ok(rc == KVA_EVENT_TOO_BIG && strstr(err, "values") != NULL,
       "hostile [0,0,...] heartbeat: too big (%s)", err);
    free(m);

    /* exactly at each bound, and one over */
    lim.max_message = 0;
    lim.max_hashes = 100;
    lim.max_events = 10;
    n = lim.max_hashes + KVA_EVENT_VALUES_PER_EVENT * lim.max_events
        + KVA_EVENT_VALUES_ENVELOPE;

    m = filler("0", n - 5, &len);
    rc = dec_len(m, len, &lim, &b, err);
    ok(rc == KVA_EVENT_OK && b.heartbeat, "%zu values: at the bound", n);
    kva_batch_free(&b);
    free(m);

    m = filler("0", n - 4, &len);
    rc = dec_len(m, len, &lim, &b, err);
    ok(rc == KVA_EVENT_TOO_BIG && zeroed(&b), "%zu values: over (%s)",
       n + 1, err);
    free(m);

    n = KVA_EVENT_CONTAINERS_PER_EVENT * lim.max_events
        + KVA_EVENT_CONTAINERS_ENVELOPE;

    m = filler("[]", n - 2, &len);
    rc = dec_len(m, len, &lim, &b, err);
    ok(rc == KVA_EVENT_OK, "%zu objects and arrays: at the bound", n);
    kva_batch_free(&b);
    free(m);

    m = filler("{}", n - 1, &len);
    rc = dec_len(m, len, &lim, &b, err);
    ok(rc == KVA_EVENT_TOO_BIG && zeroed(&b),
       "%zu objects and arrays: over (%s)", n + 1, err);
    free(m);

    /* a full message at its limits passes the scan */
    lim.max_hashes = 3;
    lim.max_events = 3;
    strcpy(msg, "{" HDR ",\"snapshot\":\"full\",\"keyspace\":\"text\","
           "\"events\":[{\"type\":\"cleared\"},"
           "{\"type\":\"stored\",\"parent\":" H ",\"hashes\":[" H "," H "]},"
           "{\"type\":\"removed\",\"hashes\":[" H "]}],"
           "\"load\":{\"waiting\":1,\"running\":2,\"kv_usage\":0.5}}");
    rc = dec(msg, &lim, &b, err);
    ok(rc == KVA_EVENT_OK && b.nevents == 3 && b.hash_count == 3,
       "every field, at max_hashes and max_events: ok");
    kva_batch_free(&b);

    /* the protocol nests 4 deep; the bound allows 8, with or without limits */
    for (i = 8; i <= 9; i++) {
        n = sprintf(msg, "{" HDR ",\"x\":");
        memset(msg + n, '[', i - 1);
        memset(msg + n + i - 1, ']', i - 1);
        strcpy(msg + n + 2 * (i - 1), "}");
        rc = dec(msg, NULL, &b, err);
        ok(i == 8 ? rc == KVA_EVENT_OK
                  : rc == KVA_EVENT_TOO_BIG && zeroed(&b),
           "nested %d deep: %s (%s)", i, i == 8 ? "ok" : "too big", err);
        kva_batch_free(&b);
    }

    /* strings full of JSON syntax are not counted: they would be here */
    lim.max_hashes = 1;
    lim.max_events = 1;
    strcpy(msg, "{\"v\":1,\"server\":\"[{,\\\"}]\\\\,[\",\"seq\":1,"
           "\"events\":[{\"type\":\"stored\",\"hashes\":[" H "]}],"
           "\"pad\":\"");
    for (i = 0; i < 70; i++) {
        strcat(msg, "[{,");
    }

    strcat(msg, "\"}");
    rc = dec(msg, &lim, &b, err);
    ok(rc == KVA_EVENT_OK && b.server_len == 9
       && memcmp(b.server, "[{,\"}]\\,[", 9) == 0,
       "brackets, commas and escaped quotes in strings: decoded (%s)", err);
    kva_batch_free(&b);
}


/* the resident set in kB, from /proc/self/statm */
static long
rss_kb(void)
{
    long   size, resident;
    FILE  *f;

    f = fopen("/proc/self/statm", "r");
    if (f == NULL) {
        return -1;
    }

    if (fscanf(f, "%ld %ld", &size, &resident) != 2) {
        resident = -1;
    }

    fclose(f);

    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}


/*
 * A big message builds a tree of hundreds of megabytes; the worker keeps
 * allocating meanwhile (pinned here), so glibc does not shrink the heap by
 * itself.  After every decode the freed pages must be back with the
 * system: without the trim the resident set stays at the tree's size.
 */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVA_ASAN  1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KVA_ASAN  1
#endif


static void
test_memory(void)
{
    int           i;
    long          before, worst, now;
    char          err[128], *m;
    size_t        len;
    void         *pin[4];
    kva_batch_t   b;

#ifdef KVA_ASAN
    /* ASan's allocator keeps freed memory in quarantine: nothing to see */
    skip("the resident set means nothing under ASan");
    return;
#endif

    m = filler("{\"k\":[]}", 512 * 1024, &len);
    before = rss_kb();
    worst = before;

    for (i = 0; i < 4; i++) {
        if (dec_len(m, len, NULL, &b, err) != KVA_EVENT_OK) {
            break;
        }

        kva_batch_free(&b);
        pin[i] = malloc(64);
        now = rss_kb();
        worst = now > worst ? now : worst;
    }

    ok(i == 4 && worst - before < 32 * 1024,
       "4 decodes of a %zu byte message: rss %ld kB, %ld at most after one",
       len, before, worst);

    while (i-- > 0) {
        free(pin[i]);
    }

    free(m);
}

int
main(void)
{
    test_hex();
    test_fields();
    test_snapshots();
    test_errors();
    test_encode();
    test_round_trip();
    test_resync();
    test_strerror();
    test_fuzz();
    test_shape();
    test_amplification();
    test_memory();

    return done_testing();
}
