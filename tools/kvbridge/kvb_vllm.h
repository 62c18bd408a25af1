/*
 * kvbridge: the KV cache events of vLLM and SGLang, as their ZeroMQ
 * publishers send them (the payload frame, msgpack), decoded into plain
 * structs.  No state, no I/O: the bridge feeds it frames, the fuzz target
 * feeds it anything.
 *
 * Both encodings in the wild are read:
 *
 *   positional (vLLM before PR #42892, every SGLang release): a batch is
 *   [ts, events, data_parallel_rank?], an event is an array with its tag
 *   first, ["BlockStored", block_hashes, parent_block_hash, token_ids,
 *   block_size, lora_id, medium, lora_name, extra_keys, group_idx,
 *   kv_cache_spec_kind, kv_cache_spec_sliding_window], trailing fields
 *   optional;
 *
 *   by name (vLLM from mid 2026): a batch is {ts, events,
 *   data_parallel_rank}, an event is a map with its tag under "type" and
 *   the fields equal to their default left out.
 *
 * Fields are read by name or position; fields and events this decoder
 * does not know are skipped, so the next field an engine adds breaks
 * nothing.  An event whose known fields are wrong (a hash that is not a
 * number or bytes, token ids that do not fill its blocks) is skipped and
 * counted in malformed; a payload that is not a batch is refused whole.
 */

#ifndef _KVB_VLLM_H_INCLUDED_
#define _KVB_VLLM_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>


typedef enum {
    KVB_EV_STORED = 0,
    KVB_EV_REMOVED,
    KVB_EV_CLEARED
} kvb_ev_type_e;


typedef struct {
    const char             *data;       /* not terminated; NULL if absent */
    uint32_t                len;
} kvb_str_t;


typedef struct {
    kvb_ev_type_e           type;
    unsigned                has_hashes:1;  /* [] is there, NULL ptr */
    unsigned                has_tokens:1;
    unsigned                has_parent:1;
    unsigned                has_lora_id:1;
    unsigned                has_group:1;

    /* the engine's hashes, read with kvb_engine_hash() */
    const msgpack_object   *hashes;
    uint32_t                nhashes;
    uint64_t                parent;     /* the engine's, as kvb_engine_hash */

    /*
     * stored only: nhashes * block_size token ids, each below 2^32; or
     * none and block_size 0 (an offload tier naming blocks by hash only)
     */
    const msgpack_object   *tokens;
    uint32_t                ntokens;
    uint32_t                block_size;

    int64_t                 lora_id;
    kvb_str_t               lora_name;
    kvb_str_t               medium;     /* "GPU", an offload tier, or none */
    int64_t                 group_idx;  /* 0 when absent */
    kvb_str_t               spec_kind;  /* "full_attention", ... or none */

    /* NULL, or nhashes entries, each nil or an array (one block's keys) */
    const msgpack_object   *extra_keys;
} kvb_ev_t;


typedef struct {
    size_t                  max_bytes;
    size_t                  max_events;
    size_t                  max_hashes;  /* block hashes, all events */
} kvb_limits_t;


typedef struct {
    double                  ts;
    unsigned                has_rank:1;
    int64_t                 rank;

    kvb_ev_t               *events;
    uint32_t                nevents;
    uint32_t                unknown;    /* events of a type not known */
    uint32_t                malformed;  /* events skipped as wrong */

    /* owned: the unpacked message the events point into */
    msgpack_unpacked        msg;
    unsigned                unpacked:1;
} kvb_batch_t;


typedef enum {
    KVB_OK = 0,
    KVB_ERR_TOO_BIG,
    KVB_ERR_MSGPACK,        /* not msgpack, or past the scan's bounds */
    KVB_ERR_NOT_BATCH,      /* msgpack, but not [ts, events, ...] */
    KVB_ERR_TOO_MANY,       /* past max_events or max_hashes */
    KVB_ERR_NOMEM
} kvb_rc_e;


/*
 * Decodes one payload frame into b, which kvb_batch_free() releases on
 * every return; err receives a reason a log line can quote.
 */
kvb_rc_e kvb_decode(const char *buf, size_t len, const kvb_limits_t *lim,
    kvb_batch_t *b, char *err, size_t errlen);
void kvb_batch_free(kvb_batch_t *b);

/*
 * A batch's data_parallel_rank (0 when it says none), for the collector,
 * which must pick a rank's stream before the stream decodes the batch:
 * a whole decode, paid twice by collected data-parallel engines only.
 */
int kvb_decode_rank(const char *buf, size_t len, const kvb_limits_t *lim,
    int64_t *rank);
const char *kvb_strerror(kvb_rc_e rc);

/*
 * An engine's block hash as 64 bits: an unsigned integer as it is, a
 * negative one as its two's complement, bytes (a digest) by their last 8
 * bytes big-endian.  Returns -1 for anything else.
 */
int kvb_engine_hash(const msgpack_object *o, uint64_t *hash);


#endif /* _KVB_VLLM_H_INCLUDED_ */
