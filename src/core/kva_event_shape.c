/*
 * kv_aware core: KV event protocol v1, the pre-scan that bounds a message
 * before jansson builds its tree (kva_event.c, kva_event.h).
 */

#include <stdint.h>

#include "kva_event.h"


/*
 * One pass, no allocation: the cost that every message pays before its
 * limits are known to hold.  A value is counted where it starts: the
 * first byte after "{", "[" that does not close it, and every ",".
 * Strings are skipped whole, a backslash escaping the byte after it, so
 * brackets and commas in them count for nothing.  2 GB/s over hash
 * lists, 0.5 GB/s over "{},{},..." (bench/bench_event_cost.c).
 */

int
kva_event_shape(const char *msg, size_t len, const kva_event_shape_t *max,
    kva_event_shape_t *s)
{
    size_t          i, depth, max_values, max_containers, max_depth;
    unsigned        opened;
    unsigned char   c;

    max_values = max->values ? max->values : SIZE_MAX;
    max_containers = max->containers ? max->containers : SIZE_MAX;
    max_depth = max->depth ? max->depth : SIZE_MAX;

    s->values = 0;
    s->containers = 0;
    s->depth = 0;

    depth = 0;

    /* the root is a value where it starts, as an element is */
    opened = 1;

    for (i = 0; i < len; i++) {
        c = (unsigned char) msg[i];

        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
            continue;
        }

        if (opened) {
            opened = 0;

            if (c != '}' && c != ']' && ++s->values > max_values) {
                return -1;
            }
        }

        switch (c) {

        case '"':
            for (i++; i < len; i++) {
                if (msg[i] == '\\') {
                    i++;

                } else if (msg[i] == '"') {
                    break;
                }
            }

            break;

        case '{':
        case '[':
            opened = 1;

            if (++depth > s->depth) {
                s->depth = depth;

                if (depth > max_depth) {
                    return -1;
                }
            }

            if (++s->containers > max_containers) {
                return -1;
            }

            break;

        case '}':
        case ']':
            if (depth > 0) {
                depth--;
            }

            break;

        case ',':
            if (++s->values > max_values) {
                return -1;
            }

            break;
        }
    }

    return 0;
}
