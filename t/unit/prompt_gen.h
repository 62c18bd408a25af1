/*
 * Helpers shared by the kva_prompt_extract() tests, test_prompt.c and
 * test_prompt_ref.c: a growable buffer, hex dumps for failure reports, and
 * a run of the extractor with a canary behind out_cap.
 */

#ifndef _KVA_PROMPT_GEN_H_INCLUDED_
#define _KVA_PROMPT_GEN_H_INCLUDED_


#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kva_prompt.h"


#define CANARY            0xa5
#define CANARY_LEN        16


typedef struct {
    uint8_t        *p;
    size_t          len;
    size_t          cap;
} buf_t;


static inline void hexdump(const char *what, const uint8_t *p, size_t len,
    size_t at);
static inline size_t first_diff(const uint8_t *a, size_t alen,
    const uint8_t *b, size_t blen);
static inline void buf_put(buf_t *b, const void *s, size_t n);
static inline void buf_putc(buf_t *b, int c);
static inline void buf_puts(buf_t *b, const char *s);
static inline int run(const uint8_t *body, size_t len, size_t out_cap,
    kva_prompt_t *p, kva_prompt_rc_e *rc, buf_t *scratch);


/* diagnostics */

static inline void
hexdump(const char *what, const uint8_t *p, size_t len, size_t at)
{
    size_t  i, from, to;

    from = (at > 24) ? at - 24 : 0;
    to = (at + 24 < len) ? at + 24 : len;

    printf("# %s (len %zu) [%zu..%zu):", what, len, from, to);

    for (i = from; i < to; i++) {
        printf("%s%02x", (i == at) ? " >" : " ", p[i]);
    }

    printf("\n");
}


static inline size_t
first_diff(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    size_t  i;

    for (i = 0; i < alen && i < blen; i++) {
        if (a[i] != b[i]) {
            break;
        }
    }

    return i;
}


/* growable buffer */

static inline void
buf_put(buf_t *b, const void *s, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);

        if (b->p == NULL) {
            abort();
        }
    }

    if (n > 0) {
        memcpy(b->p + b->len, s, n);
    }

    b->len += n;
}


static inline void
buf_putc(buf_t *b, int c)
{
    uint8_t  ch;

    ch = (uint8_t) c;
    buf_put(b, &ch, 1);
}


static inline void
buf_puts(buf_t *b, const char *s)
{
    buf_put(b, s, strlen(s));
}


/*
 * Runs the extractor with a canary behind out_cap; returns -1 when the
 * canary was overwritten.
 */

static inline int
run(const uint8_t *body, size_t len, size_t out_cap, kva_prompt_t *p,
    kva_prompt_rc_e *rc, buf_t *scratch)
{
    size_t  i;

    if (scratch->cap < out_cap + CANARY_LEN) {
        scratch->cap = out_cap + CANARY_LEN;
        scratch->p = realloc(scratch->p, scratch->cap);

        if (scratch->p == NULL) {
            abort();
        }
    }

    memset(scratch->p, CANARY, out_cap + CANARY_LEN);

    *rc = kva_prompt_extract(body, len, scratch->p, out_cap, p);

    for (i = out_cap; i < out_cap + CANARY_LEN; i++) {
        if (scratch->p[i] != CANARY) {
            return -1;
        }
    }

    return 0;
}


#endif /* _KVA_PROMPT_GEN_H_INCLUDED_ */
