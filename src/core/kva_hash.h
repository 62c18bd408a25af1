/*
 * kv_aware core: canonical prompt bytes -> chained block hashes.
 *
 * The text key space: the canonical bytes are cut into blocks; block i is
 * hashed as a chain of pieces of at most KVA_HASH_PIECE bytes, the first
 * seeded with c[i-1] (c[-1] = KVA_KEYSPACE_TEXT), each next one with the
 * hash of the one before; the last is c[i].  Only full blocks count, so
 * each c[i] stands for the whole prefix before it.  The model comes in at
 * the end: h[i] = XXH3_64(c[i] as 8 bytes little-endian, seed = m), m =
 * kva_hash_seed(KVA_KEYSPACE_TEXT, model).  A body may name its model
 * after its messages (openai-python's order), and folding it in last lets
 * the scanner hash the prompt as it decodes it, in one pass.
 */

#ifndef _KVA_HASH_H_INCLUDED_
#define _KVA_HASH_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


/* key spaces never share hashes: a later token-id key space gets its own */
#define KVA_KEYSPACE_TEXT   0x6b76612d74657874ULL   /* "kva-text" */

/*
 * XXH3 derives a 192-byte secret from the seed on every call over 240
 * bytes, which costs more than hashing 256 bytes; up to 128 bytes it uses
 * the seed directly.  Pieces of 128 bytes hash a 256-byte block in 18 ns
 * instead of 26 (an 8k-token prompt: 2.3 us instead of 3.4).
 */
#define KVA_HASH_PIECE      128


/* short runs are gathered until this many bytes, then hashed together */
#define KVA_HASH_STAGE      1024

/*
 * A body in two pieces is lexed from a window this much past its seam
 * (kva_json_lex.h, kva_hash_body2() in kva_keys.h).
 */
#define KVA_HASH_SEAM       64


typedef struct kva_hash_stream_s  kva_hash_stream_t;


/*
 * The chain of one prompt fed as it is decoded (kva_prompt.c), a run of
 * bytes at a time.  Long runs are hashed where they lie; short ones (text
 * between escapes, separators, roles) are gathered in buf first, so that
 * a prompt full of escapes costs what hashing a copy of it would.
 */
struct kva_hash_stream_s {
    uint64_t        h;              /* the chain: c of the last piece */
    uint64_t       *out;            /* c[i] of each full block, then h[i] */
    size_t          n;              /* full blocks so far */
    size_t          max;            /* room in out: no more are hashed */
    size_t          block_size;
    size_t          block_off;      /* where the open piece starts */
    size_t          piece;          /* the open piece's size */
    size_t          fill;           /* bytes in buf, from the open piece on */
    uint8_t         buf[KVA_HASH_STAGE];
};


uint64_t kva_hash_seed(uint64_t keyspace, const uint8_t *model,
    size_t model_len);

/*
 * The raw chain: writes at most max_blocks chain values of the full blocks
 * of data, seeded with seed, into out and returns how many it wrote.  The
 * token key space (kva_token.h) uses it as it is.
 */
size_t kva_hash_blocks(uint64_t seed, const uint8_t *data, size_t len,
    size_t block_size, uint64_t *out, size_t max_blocks);

/* h[i] from c[i]: the model's seed m folded in */
uint64_t kva_hash_fold(uint64_t c, uint64_t m);

/*
 * The text key space over canonical bytes already in memory: the chain
 * from KVA_KEYSPACE_TEXT, then the model folded into every block.
 */
size_t kva_hash_text(const uint8_t *model, size_t model_len,
    const uint8_t *data, size_t len, size_t block_size, uint64_t *out,
    size_t max_blocks);

/* the streaming form of the same: init, feed runs, end with the model */
void kva_hash_stream_init(kva_hash_stream_t *hs, size_t block_size,
    uint64_t *out, size_t max_blocks);
void kva_hash_feed(kva_hash_stream_t *hs, const uint8_t *data, size_t len);
size_t kva_hash_stream_end(kva_hash_stream_t *hs, const uint8_t *model,
    size_t model_len);


#endif /* _KVA_HASH_H_INCLUDED_ */
