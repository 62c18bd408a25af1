/*
 * kvbridge: a bound on what a msgpack message may cost before msgpack-c
 * unpacks it.
 *
 * msgpack-c allocates a container's elements when it reads the
 * container's header, before it has seen them: a five-byte array header
 * claiming four billion elements asks for about 100 GB, one claiming a
 * million asks for 24 MB.  An engine's port is reachable by whoever can
 * reach the engine, so the bridge walks the bytes first, without
 * allocating, and refuses a message in which any container claims more
 * elements than bytes remain, nests deeper than the bridge's decoder
 * reads, or does not end where the frame ends.  What passes unpacks into
 * at most one object per byte.
 */

#ifndef _KVB_SCAN_H_INCLUDED_
#define _KVB_SCAN_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


/*
 * batch, events, event, extra_keys, one block's keys, and what an engine
 * nests inside a key (a multimodal hash with its offsets): 6; 16 is room
 * for fields yet to come and is still half of msgpack-c's own limit
 */
#define KVB_SCAN_DEPTH_MAX  16


typedef enum {
    KVB_SCAN_OK = 0,
    KVB_SCAN_TRUNCATED,     /* the frame ends inside a value */
    KVB_SCAN_TRAILING,      /* bytes after the one value */
    KVB_SCAN_BAD_BYTE,      /* 0xc1, which msgpack never uses */
    KVB_SCAN_TOO_DEEP,
    KVB_SCAN_CLAIMS_TOO_MANY, /* more elements than bytes left */
    KVB_SCAN_TOO_MANY_VALUES
} kvb_scan_rc_e;


/*
 * Checks that buf holds exactly one msgpack value within the bounds;
 * *values receives how many values it holds (containers included).
 */
kvb_scan_rc_e kvb_scan(const unsigned char *buf, size_t len,
    size_t max_values, size_t *values);
const char *kvb_scan_strerror(kvb_scan_rc_e rc);


#endif /* _KVB_SCAN_H_INCLUDED_ */
