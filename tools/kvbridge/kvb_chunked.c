/*
 * kvbridge: HTTP/1.1 chunked transfer coding undone, incrementally and in
 * place (kvb_chunked.h).
 */

#include <stdlib.h>
#include <string.h>

#include "kvb_chunked.h"


enum {
    KVB_CH_SIZE = 0,
    KVB_CH_EXT,
    KVB_CH_SIZE_LF,
    KVB_CH_DATA,
    KVB_CH_DATA_CR,
    KVB_CH_DATA_LF,
    KVB_CH_TRAILER,
    KVB_CH_TRAILER_LINE,
    KVB_CH_TRAILER_LF,
    KVB_CH_DONE
};



void
kvb_chunked_init(kvb_chunked_t *c)
{
    c->size = 0;
    c->state = KVB_CH_SIZE;
    c->digits = 0;
}


kvb_chunked_rc_e
kvb_chunked_decode(kvb_chunked_t *c, const char *in, size_t len, char *out,
    size_t *out_len, size_t *used)
{
    int     ch, d;
    size_t  i, o, n;

    i = 0;
    o = 0;

    while (i < len && c->state != KVB_CH_DONE) {

        if (c->state == KVB_CH_DATA) {
            n = len - i;
            if (n > c->size) {
                n = c->size;
            }

            /* out is at or before in + i: memmove, not memcpy */
            memmove(out + o, in + i, n);
            o += n;
            i += n;
            c->size -= n;

            if (c->size == 0) {
                c->state = KVB_CH_DATA_CR;
            }

            continue;
        }

        ch = (unsigned char) in[i++];

        switch (c->state) {

        case KVB_CH_SIZE:
            if (ch >= '0' && ch <= '9') {
                d = ch - '0';

            } else if ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f') {
                d = (ch | 0x20) - 'a' + 10;

            } else {
                d = -1;
            }

            if (d >= 0) {
                /* a size past 2^60 is a lie the body cap would catch late */
                if (c->size > (UINT64_MAX >> 4)) {
                    goto error;
                }

                c->size = c->size * 16 + d;
                c->digits++;
                break;
            }

            if (c->digits == 0) {
                goto error;
            }

            if (ch == ';' || ch == ' ' || ch == '\t') {
                c->state = KVB_CH_EXT;

            } else if (ch == '\r') {
                c->state = KVB_CH_SIZE_LF;

            } else if (ch == '\n') {
                goto size_line;

            } else {
                goto error;
            }

            break;

        case KVB_CH_EXT:
            /* chunk extensions: nobody sends them, nobody reads them */
            if (ch == '\n') {
                goto size_line;
            }

            break;

        case KVB_CH_SIZE_LF:
            if (ch != '\n') {
                goto error;
            }

        size_line:

            c->digits = 0;
            c->state = c->size ? KVB_CH_DATA : KVB_CH_TRAILER;
            break;

        case KVB_CH_DATA_CR:
            if (ch == '\r') {
                c->state = KVB_CH_DATA_LF;
                break;
            }

            if (ch != '\n') {
                goto error;
            }

            c->state = KVB_CH_SIZE;
            break;

        case KVB_CH_DATA_LF:
            if (ch != '\n') {
                goto error;
            }

            c->state = KVB_CH_SIZE;
            break;

        case KVB_CH_TRAILER:
            if (ch == '\r') {
                c->state = KVB_CH_TRAILER_LF;

            } else if (ch == '\n') {
                c->state = KVB_CH_DONE;

            } else {
                c->state = KVB_CH_TRAILER_LINE;
            }

            break;

        case KVB_CH_TRAILER_LINE:
            if (ch == '\n') {
                c->state = KVB_CH_TRAILER;
            }

            break;

        case KVB_CH_TRAILER_LF:
            if (ch != '\n') {
                goto error;
            }

            c->state = KVB_CH_DONE;
            break;

        default:
            goto error;
        }
    }

    *out_len = o;
    *used = i;

    return c->state == KVB_CH_DONE ? KVB_CHUNKED_DONE : KVB_CHUNKED_MORE;

error:

    *out_len = o;
    *used = i;

    return KVB_CHUNKED_ERROR;
}
