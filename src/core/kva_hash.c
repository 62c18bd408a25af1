/*
 * kv_aware core: chained XXH3-64 block hashes.
 */

#include <string.h>

#include <xxhash.h>

#include "kva_hash.h"


static void kva_hash_piece_done(kva_hash_stream_t *hs);
static size_t kva_hash_pieces(kva_hash_stream_t *hs, const uint8_t *data,
    size_t len);


uint64_t
kva_hash_seed(uint64_t keyspace, const uint8_t *model, size_t model_len)
{
    return XXH3_64bits_withSeed(model, model_len, keyspace);
}


size_t
kva_hash_blocks(uint64_t seed, const uint8_t *data, size_t len,
    size_t block_size, uint64_t *out, size_t max_blocks)
{
    size_t          n, i, off, piece;
    uint64_t        h;
    const uint8_t  *block;

    if (block_size == 0) {
        return 0;
    }

    n = len / block_size;

    if (n > max_blocks) {
        n = max_blocks;
    }

    h = seed;

    for (i = 0; i < n; i++) {
        block = data + i * block_size;

        for (off = 0; off < block_size; off += piece) {
            piece = block_size - off < KVA_HASH_PIECE
                    ? block_size - off : KVA_HASH_PIECE;
            h = XXH3_64bits_withSeed(block + off, piece, h);
        }

        out[i] = h;
    }

    return n;
}


/*
 * The fold is XXH3_64 of 8 bytes with a seed, which XXH3 computes without
 * its loops: the seed and two words of its default secret make a mask,
 * the input's halves are swapped and masked, and the result is mixed
 * (XXH3's rrmxmx).  Written out here for the mask to be computed once per
 * prompt and the mix inlined: 128 library calls were a tenth of hashing
 * an 8k-token prompt.  test_hash checks it against the library.
 */

#define KVA_XXH3_SECRET_8   0x1cad21f72c81017cULL   /* its bytes 8 .. 15 */
#define KVA_XXH3_SECRET_16  0xdb979083e96dd4deULL   /* its bytes 16 .. 23 */
#define KVA_XXH3_RRMXMX     0x9fb21c651e98df25ULL

#define kva_rotl64(x, r)    (((x) << (r)) | ((x) >> (64 - (r))))


static uint64_t
kva_hash_fold_mask(uint64_t m)
{
    uint32_t  lo;

    lo = (uint32_t) m;
    m ^= (uint64_t) __builtin_bswap32(lo) << 32;

    return (KVA_XXH3_SECRET_8 ^ KVA_XXH3_SECRET_16) - m;
}


static inline uint64_t
kva_hash_fold_masked(uint64_t c, uint64_t mask)
{
    uint64_t  h;

    /* XXH3 reads the 8 bytes as two little-endian halves, low one high */
    h = kva_rotl64(c, 32) ^ mask;

    h ^= kva_rotl64(h, 49) ^ kva_rotl64(h, 24);
    h *= KVA_XXH3_RRMXMX;
    h ^= (h >> 35) + 8;
    h *= KVA_XXH3_RRMXMX;

    return h ^ (h >> 28);
}


uint64_t
kva_hash_fold(uint64_t c, uint64_t m)
{
    return kva_hash_fold_masked(c, kva_hash_fold_mask(m));
}


size_t
kva_hash_text(const uint8_t *model, size_t model_len, const uint8_t *data,
    size_t len, size_t block_size, uint64_t *out, size_t max_blocks)
{
    size_t    n, i;
    uint64_t  mask;

    n = kva_hash_blocks(KVA_KEYSPACE_TEXT, data, len, block_size, out,
                        max_blocks);
    mask = kva_hash_fold_mask(kva_hash_seed(KVA_KEYSPACE_TEXT, model,
                                            model_len));

    for (i = 0; i < n; i++) {
        out[i] = kva_hash_fold_masked(out[i], mask);
    }

    return n;
}


void
kva_hash_stream_init(kva_hash_stream_t *hs, size_t block_size, uint64_t *out,
    size_t max_blocks)
{
    hs->h = KVA_KEYSPACE_TEXT;
    hs->out = out;
    hs->n = 0;
    hs->max = (block_size && out) ? max_blocks : 0;
    hs->block_size = block_size;
    hs->block_off = 0;
    hs->piece = block_size < KVA_HASH_PIECE ? block_size : KVA_HASH_PIECE;
    hs->fill = 0;
}


/* the open piece is hashed: the next one opens, a full block is noted */

static void
kva_hash_piece_done(kva_hash_stream_t *hs)
{
    size_t  left;

    hs->block_off += hs->piece;

    if (hs->block_off == hs->block_size) {
        hs->out[hs->n++] = hs->h;
        hs->block_off = 0;
    }

    left = hs->block_size - hs->block_off;
    hs->piece = left < KVA_HASH_PIECE ? left : KVA_HASH_PIECE;
}


/*
 * Hashes the whole pieces at the start of data, from the open piece on;
 * returns the bytes it took.
 */

static size_t
kva_hash_pieces(kva_hash_stream_t *hs, const uint8_t *data, size_t len)
{
    size_t          off, bs;
    uint64_t        h;
    const uint8_t  *start;

    start = data;

    while (len >= hs->piece && hs->n < hs->max) {

        if (hs->block_off == 0 && len >= hs->block_size) {
            /* whole blocks inside a long string: kva_hash_blocks' loop */
            bs = hs->block_size;
            h = hs->h;

            do {
                for (off = 0; off < bs; off += KVA_HASH_PIECE) {
                    h = XXH3_64bits_withSeed(data + off,
                                             (bs - off < KVA_HASH_PIECE)
                                             ? bs - off : KVA_HASH_PIECE,
                                             h);
                }

                hs->out[hs->n++] = h;
                data += bs;
                len -= bs;

            } while (len >= bs && hs->n < hs->max);

            hs->h = h;
            continue;
        }

        hs->h = XXH3_64bits_withSeed(data, hs->piece, hs->h);
        data += hs->piece;
        len -= hs->piece;
        kva_hash_piece_done(hs);
    }

    return (size_t) (data - start);
}


void
kva_hash_feed(kva_hash_stream_t *hs, const uint8_t *data, size_t len)
{
    size_t  take, used;

    while (len && hs->n < hs->max) {

        if (hs->fill == 0 && len >= hs->piece) {
            used = kva_hash_pieces(hs, data, len);
            data += used;
            len -= used;
            continue;
        }

        if (hs->fill + len < KVA_HASH_STAGE) {
            memcpy(hs->buf + hs->fill, data, len);
            hs->fill += len;
            return;
        }

        /* the stage is full: hash it, then close the open piece from data */

        used = kva_hash_pieces(hs, hs->buf, hs->fill);
        hs->fill -= used;
        memmove(hs->buf, hs->buf + used, hs->fill);

        if (hs->n == hs->max) {
            return;
        }

        take = hs->piece - hs->fill;
        take = (len < take) ? len : take;

        memcpy(hs->buf + hs->fill, data, take);
        hs->fill += take;
        data += take;
        len -= take;

        if (hs->fill == hs->piece) {
            hs->h = XXH3_64bits_withSeed(hs->buf, hs->piece, hs->h);
            hs->fill = 0;
            kva_hash_piece_done(hs);
        }
    }
}


size_t
kva_hash_stream_end(kva_hash_stream_t *hs, const uint8_t *model,
    size_t model_len)
{
    size_t    i;
    uint64_t  mask;

    /* what is still gathered: its whole pieces */
    (void) kva_hash_pieces(hs, hs->buf, hs->fill);
    hs->fill = 0;

    mask = kva_hash_fold_mask(kva_hash_seed(KVA_KEYSPACE_TEXT, model,
                                            model_len));

    for (i = 0; i < hs->n; i++) {
        hs->out[i] = kva_hash_fold_masked(hs->out[i], mask);
    }

    return hs->n;
}

