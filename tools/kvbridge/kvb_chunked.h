/*
 * kvbridge: HTTP/1.1 chunked transfer coding undone, incrementally and in
 * place (uvicorn, vLLM's server, sends /metrics chunked).  Pure.
 */

#ifndef _KVB_CHUNKED_H_INCLUDED_
#define _KVB_CHUNKED_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


typedef enum {
    KVB_CHUNKED_MORE = 0,       /* all input used, the body goes on */
    KVB_CHUNKED_DONE,           /* the last chunk and trailers are read */
    KVB_CHUNKED_ERROR
} kvb_chunked_rc_e;

typedef struct {
    uint64_t  size;             /* the chunk's size, then its bytes left */
    unsigned  state;
    unsigned  digits;
} kvb_chunked_t;


void kvb_chunked_init(kvb_chunked_t *c);

/*
 * Decodes in[0, len) and writes the data to out; out may be in itself or
 * any place before it (data never outruns its encoding).  *out_len
 * receives the bytes written, *used the bytes read: len, except after
 * DONE, where the bytes past the body are left.
 */
kvb_chunked_rc_e kvb_chunked_decode(kvb_chunked_t *c, const char *in,
    size_t len, char *out, size_t *out_len, size_t *used);


#endif /* _KVB_CHUNKED_H_INCLUDED_ */
