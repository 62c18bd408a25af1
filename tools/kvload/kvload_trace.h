/*
 * kvload trace replay: requests of a Mooncake-format trace (one JSON
 * object a line: timestamp in ms, input_length, output_length, hash_ids
 * of 512-token blocks) sent at their recorded times.
 */

#ifndef _KVLOAD_TRACE_H_INCLUDED_
#define _KVLOAD_TRACE_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


#define KVL_TRACE_BLOCK_TOKENS   512


typedef struct {
    const char         *path;
    double              start;          /* trace seconds skipped */
    double              seconds;        /* window length, 0: to the end */
    uint64_t            count;          /* requests at most, 0: all */
    unsigned            max_lines;      /* lines read at most (bound) */
} kvl_trace_conf_t;


typedef struct kvl_trace_s  kvl_trace_t;


/* the window, read whole; NULL with a message on stderr */
kvl_trace_t *kvl_trace_load(const kvl_trace_conf_t *conf);

/* requests in the window, and its length in trace seconds */
uint64_t kvl_trace_requests(kvl_trace_t *tr);
double kvl_trace_seconds(kvl_trace_t *tr);

/*
 * Trace seconds from the previous arrival (the window's start for the
 * first) to the next request's; a large value past the last.
 */
double kvl_trace_gap(kvl_trace_t *tr);

/*
 * The next request's body: a chat with one user message, each id a fixed
 * text of 512 4-byte pseudo-tokens (or with ids != 0 a completion whose
 * prompt is one token id a pseudo-token), max_tokens the trace's output.
 */
int kvl_trace_next(kvl_trace_t *tr, const char *model, unsigned ids,
    const char **body, size_t *len);

void kvl_trace_free(kvl_trace_t *tr);


#endif /* _KVLOAD_TRACE_H_INCLUDED_ */
