/*
 * kvbridge's chunked transfer decoder (tools/kvbridge/kvb_chunked.c), as
 * uvicorn sends vLLM's /metrics: uneven chunks, extensions, a trailer;
 * split in two at every byte and decoded in place; bad sizes.
 */

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tap.h"
#include "kva_rand.h"
#include "kvb_chunked.h"


static size_t
chunk(char *out, const char *data, size_t n, const char *ext)
{
    return sprintf(out, "%zx%s\r\n%.*s\r\n", n, ext, (int) n, data);
}


static void
test_chunked(void)
{
    char              enc[4096], out[4096], body[2048];
    size_t            n, e, o, used, i, split, total;
    uint64_t          seed;
    unsigned          bad;
    kvb_chunked_t     c;
    kvb_chunked_rc_e  rc;

    seed = 42;

    for (i = 0; i < sizeof(body); i++) {
        body[i] = 'a' + kva_rand_below(&seed, 26);
    }

    /* uvicorn's shape: chunks of uneven size, extensions, a trailer */
    e = 0;
    e += chunk(enc + e, body, 1, "");
    e += chunk(enc + e, body + 1, 700, ";name=value");
    e += chunk(enc + e, body + 701, 300, "");
    e += chunk(enc + e, body + 1001, 1047, " ");
    e += sprintf(enc + e, "0\r\nX-Trailer: 1\r\n\r\nNEXT");

    kvb_chunked_init(&c);
    rc = kvb_chunked_decode(&c, enc, e, out, &o, &used);

    ok(rc == KVB_CHUNKED_DONE && o == sizeof(body)
       && memcmp(out, body, o) == 0 && used == e - 4,
       "chunked: decoded whole, the bytes after it left (%zu of %zu)",
       used, e);

    /* split in two at every byte, decoded in place, the client's way */
    bad = 0;

    for (split = 0; split <= e - 4; split++) {
        char  buf[4096];

        memcpy(buf, enc, e);
        kvb_chunked_init(&c);

        rc = kvb_chunked_decode(&c, buf, split, buf, &o, &used);
        total = o;

        if (rc != KVB_CHUNKED_MORE && split < e - 4) {
            bad++;
            continue;
        }

        rc = kvb_chunked_decode(&c, buf + split, e - 4 - split, buf + total,
                                &o, &used);
        total += o;

        if (rc != KVB_CHUNKED_DONE || total != sizeof(body)
            || memcmp(buf, body, total) != 0)
        {
            bad++;
        }
    }

    ok(bad == 0, "chunked: split at each of %zu bytes, in place", e - 4);

    /* bare LF line ends (lenient) */
    kvb_chunked_init(&c);
    rc = kvb_chunked_decode(&c, "3\nabc\n0\n\n", 10, out, &o, &used);
    ok(rc == KVB_CHUNKED_DONE && o == 3 && memcmp(out, "abc", 3) == 0,
       "chunked: bare LF accepted");

    kvb_chunked_init(&c);
    rc = kvb_chunked_decode(&c, "3\r\nabc\r\n", 8, out, &o, &used);
    ok(rc == KVB_CHUNKED_MORE && o == 3, "chunked: no last chunk: more");

    kvb_chunked_init(&c);
    ok(kvb_chunked_decode(&c, "zz\r\n", 4, out, &o, &used)
       == KVB_CHUNKED_ERROR, "chunked: bad size: error");

    kvb_chunked_init(&c);
    ok(kvb_chunked_decode(&c, "\r\n", 2, out, &o, &used)
       == KVB_CHUNKED_ERROR, "chunked: empty size: error");

    kvb_chunked_init(&c);
    ok(kvb_chunked_decode(&c, "3\r\nabcX\r\n", 9, out, &o, &used)
       == KVB_CHUNKED_ERROR, "chunked: data longer than its size: error");

    kvb_chunked_init(&c);
    ok(kvb_chunked_decode(&c, "fffffffffffffffff\r\n", 19, out, &o, &used)
       == KVB_CHUNKED_ERROR, "chunked: a size past 2^64: error");

    n = 0;
    kvb_chunked_init(&c);
    ok(kvb_chunked_decode(&c, "00000000000000000000001\r\nZ\r\n0\r\n\r\n", 33,
                          out, &n, &used) == KVB_CHUNKED_DONE
       && n == 1 && out[0] == 'Z', "chunked: leading zeros in a size");
}


int
main(void)
{
    test_chunked();

    return done_testing();
}
