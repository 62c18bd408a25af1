/*
 * kv_aware core: the JSON lexer under the prompt scanner, one token at a
 * time over a byte range.  Errors are the scanner's own codes: the lexer
 * only ever says KVA_PROMPT_NOT_JSON or KVA_PROMPT_BAD_UTF8.
 */

#ifndef _KVA_JSON_LEX_H_INCLUDED_
#define _KVA_JSON_LEX_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kva_hash.h"
#include "kva_prompt_rc.h"


#define kva_is_digit(c)   ((unsigned) ((c) - '0') < 10)


/*
 * decoded bytes go to buf[0 .. cap), and to the hash chain hs unless it
 * is NULL; len counts them all, it may pass cap
 */
typedef struct {
    uint8_t            *buf;
    size_t              len;
    size_t              cap;
    kva_hash_stream_t  *hs;
} kva_sink_t;


/*
 * A body in two pieces (kva_hash_body2()) is lexed from a window: the
 * first piece and a copy of the second's first KVA_SEAM_K bytes, from
 * seam on.  Once a token starts past the seam, or a string runs to within
 * KVA_SEAM_K bytes of the window's end, the lexer goes on in the second
 * piece itself at the same offset: the bytes there are the same.  Only a
 * number longer than KVA_SEAM_K bytes across the seam cannot be lexed so
 * (KVA_PROMPT_SEAM): the caller then copies the body into one piece.
 */
#define KVA_SEAM_K        KVA_HASH_SEAM

typedef struct {
    const uint8_t    *pos;
    const uint8_t    *end;
    kva_prompt_rc_e   rc;           /* why the last call returned -1 */
    const uint8_t    *seam;         /* NULL: one piece, or after the jump */
    const uint8_t    *next;         /* the second piece */
    const uint8_t    *next_end;
} kva_json_lex_t;


/*
 * Each returns 0 with lx->pos past the token, or -1 with lx->rc set.
 * kva_json_string() starts at the opening quote; kva_json_number() sets
 * *is_token for integers in 0 .. 2^32-1 ("-0" counts, as jansson reads it
 * as the integer 0).
 */
int kva_json_string(kva_json_lex_t *lx, kva_sink_t *sink);
int kva_json_number(kva_json_lex_t *lx, uint32_t *token, unsigned *is_token);
int kva_json_literal(kva_json_lex_t *lx, const char *lit, size_t n);

/* lx->pos (past lx->seam) to the same byte in the second piece */
void kva_json_jump(kva_json_lex_t *lx);


/* the helpers below run between every two tokens: inline */

static inline int
kva_json_fail(kva_json_lex_t *lx, kva_prompt_rc_e rc)
{
    lx->rc = rc;

    return -1;
}


static inline void
kva_json_skip_ws(kva_json_lex_t *lx)
{
    const uint8_t  *pos, *end;

again:

    pos = lx->pos;
    end = lx->end;

    while (pos < end
           && (*pos == ' ' || *pos == '\n' || *pos == '\r' || *pos == '\t'))
    {
        pos++;
    }

    lx->pos = pos;

    /* the next token starts past the seam: it is lexed in the second piece */
    if (lx->seam != NULL && pos >= lx->seam) {
        kva_json_jump(lx);
        goto again;
    }
}


/* appends what still fits and returns the length the value would have */

static inline size_t
kva_json_put(uint8_t *buf, size_t len, size_t cap, const uint8_t *src,
    size_t n)
{
    if (len < cap) {
        memcpy(buf + len, src, (cap - len < n) ? cap - len : n);
    }

    return len + n;
}


static inline void
kva_sink_put(kva_sink_t *sink, const uint8_t *src, size_t n)
{
    kva_hash_stream_t  *hs;

    hs = sink->hs;

    if (hs != NULL) {

        if (hs->fill + n < KVA_HASH_STAGE) {
            /* gathered: text between escapes, separators, roles */
            memcpy(hs->buf + hs->fill, src, n);
            hs->fill += n;

        } else {
            kva_hash_feed(hs, src, n);
        }
    }

    sink->len = kva_json_put(sink->buf, sink->len, sink->cap, src, n);
}


#endif /* _KVA_JSON_LEX_H_INCLUDED_ */
