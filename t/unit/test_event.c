/*
 * Unit tests of the KV event decoder (src/core/kva_event.c): fields,
 * snapshots, errors.  TAP output.  Also meant to run under
 * -fsanitize=address,undefined: the decoder gets exactly-sized heap
 * copies, so an overread shows.
 */

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "event_gen.h"


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
             "\"load\":{\"waiting\":3,\"running\":12,\"kv_usage\":0.43,"
             "\"kv_tokens\":307328},"
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
       && b.kv_usage == 0.43 && b.kv_tokens == 307328, "load");
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
    expect("{" HDR ",\"load\":{\"kv_tokens\":307328}}", KVA_EVENT_OK,
           "kv_tokens 307328");
    expect("{" HDR ",\"load\":{\"kv_tokens\":-1}}", KVA_EVENT_BAD_FIELD,
           "kv_tokens -1");
    expect("{" HDR ",\"load\":{\"kv_tokens\":281474976710657}}",
           KVA_EVENT_BAD_FIELD, "kv_tokens 2^48 + 1");
    expect("{" HDR ",\"keyspace\":\"text\"}", KVA_EVENT_OK,
           "keyspace text");
    expect("{" HDR ",\"keyspace\":\"tokens\"}", KVA_EVENT_OK,
           "keyspace tokens");
    expect("{" HDR ",\"keyspace\":\"bytes\"}", KVA_EVENT_BAD_FIELD,
           "keyspace bytes");
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


/*
 * "medium": a stored block's tier, any case; anything else is refused.
 * A removal's medium means nothing (the server no longer holds the block).
 */
static void
test_tiers(void)
{
    char            err[128], msg[2048];
    size_t          i;
    kva_batch_t     b, back;
    kva_event_rc_e  rc;
    char           *enc;
    size_t          len;

    rc = dec("{" HDR ",\"events\":["
             "{\"type\":\"stored\",\"hashes\":[\"0000000000000001\"]},"
             "{\"type\":\"stored\",\"medium\":\"CPU\","
             "\"hashes\":[\"0000000000000002\"]},"
             "{\"type\":\"stored\",\"medium\":\"disk\","
             "\"hashes\":[\"0000000000000003\"]},"
             "{\"type\":\"stored\",\"medium\":\"Gpu\","
             "\"hashes\":[\"0000000000000004\"]},"
             "{\"type\":\"removed\",\"medium\":\"cpu\","
             "\"hashes\":[\"0000000000000002\"]}]}", NULL, &b, err);
    ok(rc == KVA_EVENT_OK && b.nevents == 5 && b.events[0].tier == 0
       && b.events[1].tier == KVA_EVENT_TIER_CPU
       && b.events[2].tier == KVA_EVENT_TIER_DISK && b.events[3].tier == 0,
       "medium: none and Gpu are GPU, CPU and disk their tiers");

    enc = (rc == KVA_EVENT_OK) ? kva_event_encode(&b, &len) : NULL;
    ok(enc != NULL && strstr(enc, "\"medium\":\"cpu\"") != NULL
       && strstr(enc, "\"medium\":\"gpu\"") == NULL,
       "encoded: a slower tier said, GPU left unsaid");

    if (enc != NULL) {
        rc = dec(enc, NULL, &back, err);
        ok(rc == KVA_EVENT_OK && kva_batch_equal(&b, &back),
           "and decoded back alike");
        kva_batch_free(&back);
        free(enc);
    }

    kva_batch_free(&b);

    expect("{" HDR ",\"events\":[{\"type\":\"stored\",\"medium\":1,"
           "\"hashes\":[]}]}", KVA_EVENT_BAD_FIELD, "medium a number");
    expect("{" HDR ",\"events\":[{\"type\":\"stored\","
           "\"medium\":\"STORAGE\",\"hashes\":[]}]}",
           KVA_EVENT_BAD_FIELD, "medium an unknown name");
    expect("{" HDR ",\"events\":[{\"type\":\"stored\","
           "\"medium\":\"gpu\\u0000x\",\"hashes\":[]}]}",
           KVA_EVENT_MALFORMED, "medium with a NUL inside");

    i = (size_t) snprintf(msg, sizeof(msg), "{" HDR ",\"events\":[{"
                          "\"type\":\"stored\",\"medium\":\"");
    memset(msg + i, 'c', 1024);
    i += 1024;
    (void) snprintf(msg + i, sizeof(msg) - i, "\",\"hashes\":[]}]}");
    expect(msg, KVA_EVENT_BAD_FIELD, "medium a 1 KB string");
}


int
main(void)
{
    test_hex();
    test_tiers();
    test_fields();
    test_snapshots();
    test_errors();
    test_strerror();

    return done_testing();
}
