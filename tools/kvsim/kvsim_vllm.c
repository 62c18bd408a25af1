/*
 * kvsim: vLLM's KV cache event batches (kvsim_vllm.h).
 */

#include <string.h>

#include <xxhash.h>

#include "kvsim_vllm.h"


#define kvs_pack_str(pk, s)                                                 \
    (msgpack_pack_str(pk, sizeof(s) - 1)                                    \
     || msgpack_pack_str_body(pk, s, sizeof(s) - 1))


static int kvs_pack_event(msgpack_packer *pk, kvs_venc_e enc,
    kvs_vhash_e hform, const kvs_vev_t *ev);
static int kvs_pack_hash(msgpack_packer *pk, kvs_vhash_e hform,
    uint64_t h);
static int kvs_pack_name(msgpack_packer *pk, const char *s);


uint64_t
kvs_vllm_hash(uint64_t prev, uint64_t salt, const uint32_t *ids, size_t n)
{
    return XXH3_64bits_withSeed(ids, n * sizeof(uint32_t), prev ^ salt);
}


uint64_t
kvs_vllm_salt(const char *name, size_t len)
{
    return XXH3_64bits(name, len);
}


int
kvs_vllm_encode(msgpack_sbuffer *sb, kvs_venc_e enc, kvs_vhash_e hform,
    double ts, unsigned rank, const kvs_vev_t *evs, size_t nevs)
{
    size_t          i;
    msgpack_packer  pk;

    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);

    if (enc == KVS_VENC_MAP) {
        if (msgpack_pack_map(&pk, 3) || kvs_pack_str(&pk, "ts")) {
            return -1;
        }

    } else if (msgpack_pack_array(&pk, 3)) {
        return -1;
    }

    if (msgpack_pack_double(&pk, ts)
        || (enc == KVS_VENC_MAP && kvs_pack_str(&pk, "events"))
        || msgpack_pack_array(&pk, nevs))
    {
        return -1;
    }

    for (i = 0; i < nevs; i++) {
        if (kvs_pack_event(&pk, enc, hform, &evs[i]) != 0) {
            return -1;
        }
    }

    if ((enc == KVS_VENC_MAP && kvs_pack_str(&pk, "data_parallel_rank"))
        || msgpack_pack_unsigned_int(&pk, rank))
    {
        return -1;
    }

    return 0;
}


/*
 * By name, the fields vLLM 0.26 sends; positional, in the order of its
 * structs before PR #42892, the optional tail up to kv_cache_spec_kind.
 */

static int
kvs_pack_event(msgpack_packer *pk, kvs_venc_e enc, kvs_vhash_e hform,
    const kvs_vev_t *ev)
{
    int       map;
    size_t    i, n;

    map = (enc == KVS_VENC_MAP);

    switch (ev->type) {

    case KVS_VEV_CLEARED:
        return map ? (msgpack_pack_map(pk, 1) || kvs_pack_str(pk, "type")
                      || kvs_pack_str(pk, "AllBlocksCleared"))
                   : (msgpack_pack_array(pk, 1)
                      || kvs_pack_str(pk, "AllBlocksCleared"));

    case KVS_VEV_REMOVED:
        if (map ? (msgpack_pack_map(pk, 3) || kvs_pack_str(pk, "type")
                   || kvs_pack_str(pk, "BlockRemoved")
                   || kvs_pack_str(pk, "block_hashes"))
                : (msgpack_pack_array(pk, 4)
                   || kvs_pack_str(pk, "BlockRemoved")))
        {
            return -1;
        }

        if (msgpack_pack_array(pk, ev->nhashes)) {
            return -1;
        }

        for (i = 0; i < ev->nhashes; i++) {
            if (kvs_pack_hash(pk, hform, ev->hashes[i]) != 0) {
                return -1;
            }
        }

        if ((map && kvs_pack_str(pk, "medium")) || kvs_pack_str(pk, "GPU")) {
            return -1;
        }

        return map ? 0 : msgpack_pack_int(pk, 0);

    case KVS_VEV_STORED:
        break;
    }

    if (map ? (msgpack_pack_map(pk, ev->lora_name ? 11 : 10)
               || kvs_pack_str(pk, "type") || kvs_pack_str(pk, "BlockStored")
               || kvs_pack_str(pk, "block_hashes"))
            : (msgpack_pack_array(pk, 11)
               || kvs_pack_str(pk, "BlockStored")))
    {
        return -1;
    }

    if (msgpack_pack_array(pk, ev->nhashes)) {
        return -1;
    }

    for (i = 0; i < ev->nhashes; i++) {
        if (kvs_pack_hash(pk, hform, ev->hashes[i]) != 0) {
            return -1;
        }
    }

    if ((map && kvs_pack_str(pk, "parent_block_hash"))
        || (ev->has_parent ? kvs_pack_hash(pk, hform, ev->parent)
                           : msgpack_pack_nil(pk)))
    {
        return -1;
    }

    n = (size_t) ev->nhashes * ev->block_size;

    if ((map && kvs_pack_str(pk, "token_ids")) || msgpack_pack_array(pk, n)) {
        return -1;
    }

    for (i = 0; i < n; i++) {
        if (msgpack_pack_uint32(pk, ev->tokens[i])) {
            return -1;
        }
    }

    if ((map && kvs_pack_str(pk, "block_size"))
        || msgpack_pack_uint32(pk, ev->block_size)
        || (map && kvs_pack_str(pk, "lora_id")) || msgpack_pack_nil(pk)
        || (map && kvs_pack_str(pk, "medium")) || kvs_pack_str(pk, "GPU")
        || (map && kvs_pack_str(pk, "lora_name"))
        || kvs_pack_name(pk, ev->lora_name))
    {
        return -1;
    }

    /* vLLM puts the adapter's name first in each block's extra keys */

    if (ev->lora_name) {
        if ((map && kvs_pack_str(pk, "extra_keys"))
            || msgpack_pack_array(pk, ev->nhashes))
        {
            return -1;
        }

        for (i = 0; i < ev->nhashes; i++) {
            if (msgpack_pack_array(pk, 1)
                || kvs_pack_name(pk, ev->lora_name))
            {
                return -1;
            }
        }

    } else if (!map && msgpack_pack_nil(pk)) {
        return -1;
    }

    return (map && kvs_pack_str(pk, "group_idx")) || msgpack_pack_int(pk, 0)
           || (map && kvs_pack_str(pk, "kv_cache_spec_kind"))
           || kvs_pack_str(pk, "full_attention");
}


static int
kvs_pack_hash(msgpack_packer *pk, kvs_vhash_e hform, uint64_t h)
{
    int       i;
    uint8_t   d[32];
    uint64_t  v;

    switch (hform) {

    case KVS_VHASH_INT64:
        return msgpack_pack_int64(pk, (int64_t) h);

    case KVS_VHASH_BYTES:
        /* a digest's look: filler first, the hash in its last 8 bytes */
        for (i = 0; i < 4; i++) {
            v = (i < 3) ? XXH3_64bits_withSeed(&h, sizeof(h), i) : h;
            d[8 * i] = (uint8_t) (v >> 56);
            d[8 * i + 1] = (uint8_t) (v >> 48);
            d[8 * i + 2] = (uint8_t) (v >> 40);
            d[8 * i + 3] = (uint8_t) (v >> 32);
            d[8 * i + 4] = (uint8_t) (v >> 24);
            d[8 * i + 5] = (uint8_t) (v >> 16);
            d[8 * i + 6] = (uint8_t) (v >> 8);
            d[8 * i + 7] = (uint8_t) v;
        }

        return msgpack_pack_bin(pk, sizeof(d))
               || msgpack_pack_bin_body(pk, d, sizeof(d));

    default:
        return msgpack_pack_uint64(pk, h);
    }
}


static int
kvs_pack_name(msgpack_packer *pk, const char *s)
{
    size_t  len;

    if (s == NULL) {
        return msgpack_pack_nil(pk);
    }

    len = strlen(s);

    return msgpack_pack_str(pk, len) || msgpack_pack_str_body(pk, s, len);
}
