/*
 * kvbridge: the allocation-free walk over a msgpack message (kvb_scan.h).
 */

#include "kvb_scan.h"


static uint64_t kvb_scan_be(const unsigned char *p, unsigned n);


kvb_scan_rc_e
kvb_scan(const unsigned char *buf, size_t len, size_t max_values,
    size_t *values)
{
    int             depth;
    size_t          pos, count, children, skip;
    unsigned        hdr;
    unsigned char   b;
    uint64_t        n;
    size_t          left[KVB_SCAN_DEPTH_MAX + 1];

    pos = 0;
    count = 0;
    depth = 0;
    left[0] = 1;

    while (depth >= 0) {

        if (left[depth] == 0) {
            depth--;
            continue;
        }

        left[depth]--;

        if (pos >= len) {
            return KVB_SCAN_TRUNCATED;
        }

        if (++count > max_values) {
            return KVB_SCAN_TOO_MANY_VALUES;
        }

        b = buf[pos++];
        children = 0;
        skip = 0;
        hdr = 0;

        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
            /* fixint, nil, false, true: the byte is the value */

        } else if (b <= 0x8f) {
            children = 2 * (size_t) (b & 0x0f);

        } else if (b <= 0x9f) {
            children = b & 0x0f;

        } else if (b <= 0xbf) {
            skip = b & 0x1f;

        } else {
            switch (b) {

            case 0xc4: case 0xd9: hdr = 1; break;   /* bin8, str8 */
            case 0xc5: case 0xda: hdr = 2; break;   /* bin16, str16 */
            case 0xc6: case 0xdb: hdr = 4; break;   /* bin32, str32 */

            case 0xc7: hdr = 1; skip = 1; break;    /* ext8: type byte */
            case 0xc8: hdr = 2; skip = 1; break;
            case 0xc9: hdr = 4; skip = 1; break;

            case 0xcc: case 0xd0: skip = 1; break;
            case 0xcd: case 0xd1: skip = 2; break;
            case 0xca: case 0xce: case 0xd2: skip = 4; break;
            case 0xcb: case 0xcf: case 0xd3: skip = 8; break;

            case 0xd4: skip = 2; break;             /* fixext: type + data */
            case 0xd5: skip = 3; break;
            case 0xd6: skip = 5; break;
            case 0xd7: skip = 9; break;
            case 0xd8: skip = 17; break;

            case 0xdc: case 0xde: hdr = 2; break;   /* array16, map16 */
            case 0xdd: case 0xdf: hdr = 4; break;   /* array32, map32 */

            default:                                /* 0xc1 */
                return KVB_SCAN_BAD_BYTE;
            }

            if (hdr) {
                if (hdr > len - pos) {
                    return KVB_SCAN_TRUNCATED;
                }

                n = kvb_scan_be(buf + pos, hdr);
                pos += hdr;

                if (b == 0xdc || b == 0xdd) {
                    children = (size_t) n;

                } else if (b == 0xde || b == 0xdf) {
                    children = 2 * (size_t) n;

                } else {
                    skip += (size_t) n;
                }
            }
        }

        if (skip > len - pos) {
            return KVB_SCAN_TRUNCATED;
        }

        pos += skip;

        if (children == 0) {
            continue;
        }

        /* every element takes at least a byte */

        if (children > len - pos) {
            return KVB_SCAN_CLAIMS_TOO_MANY;
        }

        if (depth == KVB_SCAN_DEPTH_MAX) {
            return KVB_SCAN_TOO_DEEP;
        }

        left[++depth] = children;
    }

    if (pos != len) {
        return KVB_SCAN_TRAILING;
    }

    *values = count;

    return KVB_SCAN_OK;
}


const char *
kvb_scan_strerror(kvb_scan_rc_e rc)
{
    switch (rc) {
    case KVB_SCAN_OK:               return "ok";
    case KVB_SCAN_TRUNCATED:        return "truncated msgpack";
    case KVB_SCAN_TRAILING:         return "bytes after the msgpack value";
    case KVB_SCAN_BAD_BYTE:         return "invalid msgpack byte 0xc1";
    case KVB_SCAN_TOO_DEEP:         return "msgpack nested too deep";
    case KVB_SCAN_CLAIMS_TOO_MANY:
        return "msgpack container claims more elements than bytes left";
    case KVB_SCAN_TOO_MANY_VALUES:  return "too many msgpack values";
    }

    return "unknown";
}


static uint64_t
kvb_scan_be(const unsigned char *p, unsigned n)
{
    uint64_t  v;

    v = 0;

    while (n--) {
        v = (v << 8) | *p++;
    }

    return v;
}
