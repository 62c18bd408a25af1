/*
 * kvsim: vLLM's KV cache event batches as its ZeroMQ publisher sends them
 * (the payload frame, msgpack), and block hashes as an engine makes them.
 * Pure: no sockets.  tools/kvbridge/kvb_vllm.h describes the format the
 * other way round; t/unit/test_kvsim_vllm.c checks that the two agree.
 */

#ifndef _KVSIM_VLLM_H_INCLUDED_
#define _KVSIM_VLLM_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>


typedef enum {
    KVS_VENC_MAP = 0,                   /* vLLM from mid 2026 */
    KVS_VENC_ARRAY                      /* before it, and SGLang */
} kvs_venc_e;


typedef enum {
    KVS_VHASH_UINT64 = 0,               /* vLLM's default */
    KVS_VHASH_INT64,
    KVS_VHASH_BYTES                     /* a 32-byte digest */
} kvs_vhash_e;


typedef enum {
    KVS_VEV_STORED = 0,
    KVS_VEV_REMOVED,
    KVS_VEV_CLEARED
} kvs_vev_type_e;


typedef struct {
    kvs_vev_type_e      type;
    const uint64_t     *hashes;         /* the engine's */
    uint32_t            nhashes;
    unsigned            has_parent:1;
    uint64_t            parent;

    /* stored: nhashes * block_size ids */
    const uint32_t     *tokens;
    uint32_t            block_size;
    const char         *lora_name;      /* NULL: the base model */
} kvs_vev_t;


/*
 * An engine's hash of a block: XXH3-64 over its ids, seeded with the hash
 * of the block before it (the process's random seed for a first block)
 * XORed with salt (see kvs_vllm_salt()).  Like vLLM's, its value means
 * nothing outside the process.
 */
uint64_t kvs_vllm_hash(uint64_t prev, uint64_t salt, const uint32_t *ids,
    size_t n);
/* what keeps one model's or adapter's chains apart from another's */
uint64_t kvs_vllm_salt(const char *name, size_t len);

/* a batch [ts, events, rank] or {ts, events, data_parallel_rank} into sb */
int kvs_vllm_encode(msgpack_sbuffer *sb, kvs_venc_e enc, kvs_vhash_e hform,
    double ts, unsigned rank, const kvs_vev_t *evs, size_t nevs);


#endif /* _KVSIM_VLLM_H_INCLUDED_ */
