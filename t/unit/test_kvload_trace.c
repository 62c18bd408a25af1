/*
 * Unit tests for kvload's trace replay (tools/kvload/kvload_trace.c): the
 * window, the gaps, the bodies (equal ids give equal bytes and equal token
 * ids, the last block cut to input_length), bad lines skipped.  Prints TAP.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"
#include "kvload_trace.h"


static char  path[] = "/tmp/kvload-trace-XXXXXX";


static kvl_trace_t *
load(double start, double seconds, uint64_t count)
{
    kvl_trace_conf_t  c = { path, start, seconds, count, 1000 };

    return kvl_trace_load(&c);
}


/* the prompt of a chat body: between the content's quotes */
static char *
content(const char *body, size_t *len)
{
    const char  *p, *q;

    p = strstr(body, "\"content\":\"");
    if (p == NULL) {
        return NULL;
    }

    p += 11;
    q = strchr(p, '"');
    *len = q ? (size_t) (q - p) : 0;

    return q ? strndup(p, *len) : NULL;
}


int
main(void)
{
    int           fd;
    char         *a, *b, *c;
    double        gap;
    size_t        len, la, lb, lc;
    const char   *body;
    kvl_trace_t  *tr;
    static const char  lines[] =
        "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 7,"
        " \"hash_ids\": [0, 1, 2]}\n"
        "not json\n"
        "{\"timestamp\": 500, \"input_length\": 600, \"output_length\": 9,"
        " \"hash_ids\": [0, 3]}\n"
        "{\"timestamp\": 1500, \"input_length\": 2000, \"output_length\": 1,"
        " \"hash_ids\": [0]}\n"
        "\n"
        "{\"timestamp\": 2000, \"input_length\": 512, \"output_length\": 3,"
        " \"hash_ids\": [5]}\n"
        "{\"timestamp\": 4000, \"input_length\": 40, \"output_length\": 3,"
        " \"hash_ids\": [0, 1]}\n";

    fd = mkstemp(path);
    if (fd < 0 || write(fd, lines, sizeof(lines) - 1)
                  != (ssize_t) sizeof(lines) - 1)
    {
        printf("Bail out! cannot write %s\n", path);
        return 1;
    }

    close(fd);

    /* the whole file: the line longer than its blocks is skipped too */
    tr = load(0, 0, 0);
    ok(tr && kvl_trace_requests(tr) == 4, "4 requests of 7 lines: not "
       "json, an empty line and 2000 tokens in 1 block are skipped");
    ok(tr && kvl_trace_seconds(tr) == 4.0, "the window ends at the last");

    ok(tr && kvl_trace_gap(tr) == 0.0
       && kvl_trace_next(tr, "m", 0, &body, &len) == 0,
       "the first at once");
    a = content(body, &la);
    ok(a && la == 1100 * 4, "1100 tokens: 4,400 bytes (%zu)", la);
    ok(strstr(body, "\"max_tokens\":7,") != NULL, "max_tokens: its output");

    ok(kvl_trace_gap(tr) == 0.5 && kvl_trace_next(tr, "m", 0, &body, &len)
       == 0, "the second 0.5 s later");
    b = content(body, &lb);
    ok(b && lb == 600 * 4 && memcmp(a, b, 2048) == 0
       && memcmp(a + 2048, b + 2048, 64) != 0,
       "id 0 gives the same 2,048 bytes, ids 1 and 3 differ");

    ok(kvl_trace_gap(tr) == 1.5 && kvl_trace_next(tr, "m", 0, &body, &len)
       == 0, "the third 1.5 s later");
    ok(kvl_trace_gap(tr) == 2.0 && kvl_trace_next(tr, "m", 0, &body, &len)
       == 0, "the last 2 s later");
    c = content(body, &lc);
    ok(c && lc == 40 * 4 && memcmp(a, c, lc) == 0,
       "a prompt shorter than one block: the first 40 tokens of id 0");
    ok(kvl_trace_gap(tr) > 1e6 && kvl_trace_next(tr, "m", 0, &body, &len)
       == -1, "then nothing");

    free(a);
    free(b);
    free(c);
    kvl_trace_free(tr);

    /* a window: from 0.4 s for 2 s, then at most 1 request */
    tr = load(0.4, 2.0, 0);
    gap = tr ? kvl_trace_gap(tr) : 0.0;
    ok(tr && kvl_trace_requests(tr) == 2 && kvl_trace_seconds(tr) == 2.0
       && gap > 0.0999 && gap < 0.1001,
       "from 0.4 s for 2 s: 2 requests, the first 0.1 s in");
    kvl_trace_free(tr);

    tr = load(0, 0, 1);
    ok(tr && kvl_trace_requests(tr) == 1, "--trace-count 1: one");
    kvl_trace_free(tr);

    ok(load(10, 0, 0) == NULL, "a window past the end: an error");

    /* token ids: id 0's block is the same 512 ids in both requests */
    tr = load(0, 0, 2);
    ok(tr && kvl_trace_next(tr, "m", 1, &body, &len) == 0
       && strncmp(body, "{\"model\":\"m\",\"prompt\":[", 23) == 0,
       "--prompt-ids: a completion with token ids");
    a = strndup(body, len);
    ok(kvl_trace_next(tr, "m", 1, &body, &len) == 0, "and the next");
    b = strndup(body, len);

    {
        int          n;
        const char  *p, *q;

        /* the first 512 commas of the ids agree */
        for (p = a, q = b, n = 0; *p && *p == *q && n < 512; p++, q++) {
            n += (*p == ',');
        }

        ok(n == 512, "equal ids give equal token ids (%d agree)", n);
    }

    free(a);
    free(b);
    kvl_trace_free(tr);

    unlink(path);

    return done_testing();
}
