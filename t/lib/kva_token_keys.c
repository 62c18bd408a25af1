/*
 * Test helper: prints the block keys of token ids in the token key space
 * (src/core/kva_token.c), one 16-hex line per full block: what nginx with
 * keys=tokens and kvbridge compute for the same ids.
 *
 *   kva_token_keys BLOCK_TOKENS MODEL < ids
 *
 * ids: decimal token ids separated by anything that is not a digit.
 */

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kva_token.h"


int
main(int argc, char **argv)
{
    int        c, in;
    size_t     n, cap, i, bs, nkeys;
    uint32_t  *ids, *more;
    uint64_t   v, *keys;

    if (argc != 3 || (bs = strtoul(argv[1], NULL, 10)) == 0) {
        fprintf(stderr, "usage: %s BLOCK_TOKENS MODEL < ids\n", argv[0]);
        return 1;
    }

    cap = 1024;
    n = 0;
    ids = malloc(cap * sizeof(uint32_t));
    in = 0;
    v = 0;

    while (ids != NULL) {
        c = getchar();

        if (c != EOF && isdigit(c)) {
            v = v * 10 + (uint64_t) (c - '0');
            in = 1;
            continue;
        }

        if (in) {
            if (n == cap) {
                cap *= 2;
                more = realloc(ids, cap * sizeof(uint32_t));
                if (more == NULL) {
                    free(ids);
                    return 1;
                }

                ids = more;
            }

            ids[n++] = (uint32_t) v;
            v = 0;
            in = 0;
        }

        if (c == EOF) {
            break;
        }
    }

    if (ids == NULL) {
        return 1;
    }

    keys = malloc((n / bs + 1) * sizeof(uint64_t));
    if (keys == NULL) {
        return 1;
    }

    nkeys = kva_token_blocks(kva_token_seed((const uint8_t *) argv[2],
                                            strlen(argv[2])),
                             ids, n, bs, NULL, keys, n / bs + 1);

    for (i = 0; i < nkeys; i++) {
        printf("%016" PRIx64 "\n", keys[i]);
    }

    return 0;
}
