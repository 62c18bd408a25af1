/*
 * kv_aware core: the bodies of a disaggregated request in vLLM's NIXL
 * contract (the module's kv_aware_prefill mode=vllm): leg 1 to a prefill
 * server, what its answer hands over, leg 2 to a decode server; and in
 * SGLang's (mode=sglang): one body for both, with the bootstrap fields.
 *
 * Bodies are rewritten member by member at the top level of the object:
 * the members kept are copied byte for byte, those replaced are left out
 * (every occurrence, should a key come twice), the new ones are added at
 * the end.  Keys are compared decoded, as the engine's parser reads them.
 */

#ifndef _KVA_PD_BODY_H_INCLUDED_
#define _KVA_PD_BODY_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kva_prompt_rc.h"


/* what leg 1 asks of the prefill server, added to its body */
#define KVA_PD_PREFILL_PARAMS                                                 \
    "\"kv_transfer_params\":{\"do_remote_decode\":true,"                      \
    "\"do_remote_prefill\":false,\"remote_engine_id\":null,"                  \
    "\"remote_block_ids\":null,\"remote_host\":null,\"remote_port\":null}"

/* the most a rewritten body adds to the client's */
#define KVA_PD_BODY_EXTRA                                                     \
    (sizeof(KVA_PD_PREFILL_PARAMS)                                            \
     + sizeof(",\"stream\":false,\"max_tokens\":1,"                           \
              "\"max_completion_tokens\":1") + 8)


/*
 * Leg 1: the client's object with "stream": false, "max_tokens": 1 (and
 * "max_completion_tokens": 1 where the client sent one), without
 * "stream_options" and "min_tokens", and with KVA_PD_PREFILL_PARAMS in
 * place of any "kv_transfer_params" of the client's.  out holds at least
 * len + KVA_PD_BODY_EXTRA bytes; *out_len is what was written.
 * KVA_PROMPT_NOT_JSON and the like for a body that is not one valid
 * JSON object.
 */
kva_prompt_rc_e kva_pd_prefill_body(const uint8_t *body, size_t len,
    uint8_t *out, size_t *out_len);

/*
 * The prefill server's answer: the value of its top-level
 * "kv_transfer_params", which must be an object, as it lies in the
 * answer (*params, *params_len), for leg 2 to hand over verbatim.
 * KVA_PROMPT_NO_PROMPT: valid JSON, but no such object.
 */
kva_prompt_rc_e kva_pd_answer_params(const uint8_t *answer, size_t len,
    const uint8_t **params, size_t *params_len);

/*
 * Leg 2: the client's object with "kv_transfer_params": params (an
 * object, as kva_pd_answer_params() found it) first, the client's bytes
 * after it as they came; a "kv_transfer_params" of the client's is left
 * out (the body then rewritten member by member).  out holds at least
 * len + params_len + KVA_PD_BODY_EXTRA bytes.
 */
kva_prompt_rc_e kva_pd_decode_body(const uint8_t *body, size_t len,
    const uint8_t *params, size_t params_len, uint8_t *out,
    size_t *out_len);


/* the longest bootstrap_host taken (a DNS name's limit) */
#define KVA_PD_HOST_MAX  253

/* the most kva_pd_sglang_body() adds to the client's body */
#define KVA_PD_SGLANG_EXTRA                                                   \
    (sizeof("\"bootstrap_host\":\"\",\"bootstrap_port\":,"                   \
            "\"bootstrap_room\":,")                                          \
     + KVA_PD_HOST_MAX + sizeof("65535") + sizeof("18446744073709551615")    \
     + 8)

/*
 * SGLang's bootstrap: the client's object with "bootstrap_host": host
 * (a string), "bootstrap_port": port, "bootstrap_room": room (numbers)
 * first, the client's bytes after them as they came; the client's own
 * bootstrap fields, if any, are left out (the body then rewritten member
 * by member, the fields at the end).  host is an IP address or a name:
 * letters, digits, '.', '-', ':' (an IPv6 address), at most
 * KVA_PD_HOST_MAX bytes, else KVA_PROMPT_NOT_JSON.  out holds at least
 * len + KVA_PD_SGLANG_EXTRA bytes.
 */
kva_prompt_rc_e kva_pd_sglang_body(const uint8_t *body, size_t len,
    const uint8_t *host, size_t host_len, unsigned port, uint64_t room,
    uint8_t *out, size_t *out_len);


#endif /* _KVA_PD_BODY_H_INCLUDED_ */
