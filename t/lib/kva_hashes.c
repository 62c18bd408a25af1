/*
 * Test helper: prints the block hashes ngx_http_kv_aware_module computes
 * for a request body, one 16-hex line per full block.
 *
 *   kva_hashes BLOCK_SIZE < body.json
 *
 * Linked with the project's own core, so that the hashes are exactly the
 * module's: make build/kva_hashes (with its absolute path).
 * Exit status 2 when the body has no usable prompt.
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "kva_hash.h"
#include "kva_prompt.h"


int
main(int argc, char **argv)
{
    size_t            len, cap, n, i, bs, max;
    uint8_t          *body, *out;
    uint64_t         *hashes;
    kva_prompt_t      p;
    kva_prompt_rc_e   rc;

    bs = argc > 1 ? (size_t) strtoul(argv[1], NULL, 10) : 256;

    if (bs < 16) {
        fprintf(stderr, "usage: %s BLOCK_SIZE < body\n", argv[0]);
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

    max = kva_hash_body_max(len, bs);
    out = malloc(len + KVA_PROMPT_OUT_SLACK);
    hashes = malloc((max + 1) * sizeof(uint64_t));

    if (out == NULL || hashes == NULL) {
        return 1;
    }

    rc = kva_hash_body(body, len, bs, out, hashes, &n, &p);

    if (rc != KVA_PROMPT_OK) {
        fprintf(stderr, "kva_hashes: %s\n", kva_prompt_strerror(rc));
        return 2;
    }

    for (i = 0; i < n; i++) {
        printf("%016" PRIx64 "\n", hashes[i]);
    }

    return 0;
}
