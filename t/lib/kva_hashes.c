/*
 * Test helper: prints the block hashes ngx_http_kv_aware_module computes
 * for a request body, one 16-hex line per full block.
 *
 *   kva_hashes BLOCK_SIZE < body.json                   keys=text
 *   kva_hashes BLOCK_SIZE BLOCK_TOKENS < body.json      keys=tokens
 *
 * keys=tokens as the module keys a body no tokenizer answered for: its
 * own token ids, or else the text keys (kva_keys.h).
 *
 * Linked with the project's own core, so that the hashes are exactly the
 * module's: make build/kva_hashes (with its absolute path).
 * Exit status 2 when the body has no usable prompt.
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "kva_keys.h"


int
main(int argc, char **argv)
{
    size_t             len, cap, n, i, bs, bt, max;
    uint8_t           *body, *out;
    uint64_t          *hashes;
    kva_prompt_t       p;
    kva_prompt_rc_e    rc;
    kva_token_body_t   tb;

    bs = argc > 1 ? (size_t) strtoul(argv[1], NULL, 10) : 256;
    bt = argc > 2 ? (size_t) strtoul(argv[2], NULL, 10) : 0;

    if (bs < 16 || (argc > 2 && bt == 0)) {
        fprintf(stderr, "usage: %s BLOCK_SIZE [BLOCK_TOKENS] < body\n",
                argv[0]);
        return 1;
    }

    cap = 1 << 16;
    len = 0;
    body = malloc(cap);

    while (body != NULL) {
        n = fread(body + len, 1, cap - len, stdin);
        len += n;

        if (n == 0) {
            break;
        }

        if (len == cap) {
            cap *= 2;
            body = realloc(body, cap);
        }
    }

    if (body == NULL) {
        return 1;
    }

    if (bt) {
        tb.block_size = bs;
        tb.block_tokens = bt;
        tb.model = NULL;
        tb.model_len = 0;

        out = malloc(kva_token_body_scratch(len));
        if (out == NULL) {
            return 1;
        }

        rc = kva_token_body(body, len, out, &tb);
        max = (rc == KVA_PROMPT_OK) ? kva_token_body_max(&tb, NULL, 0) : 0;

        hashes = malloc((max + 1) * sizeof(uint64_t));
        if (hashes == NULL) {
            return 1;
        }

        n = (rc == KVA_PROMPT_OK) ? kva_token_body_keys(&tb, hashes, max) : 0;

    } else {
        max = kva_hash_body_max(len, bs);
        out = malloc(len + KVA_PROMPT_OUT_SLACK);
        hashes = malloc((max + 1) * sizeof(uint64_t));

        if (out == NULL || hashes == NULL) {
            return 1;
        }

        rc = kva_hash_body(body, len, bs, out, hashes, &n, &p);
    }

    if (rc != KVA_PROMPT_OK) {
        fprintf(stderr, "kva_hashes: %s\n", kva_prompt_strerror(rc));
        return 2;
    }

    for (i = 0; i < n; i++) {
        printf("%016" PRIx64 "\n", hashes[i]);
    }

    return 0;
}
