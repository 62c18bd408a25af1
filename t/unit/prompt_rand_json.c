/*
 * Random JSON for the body generator of test_prompt_ref.c: whitespace,
 * string contents with every kind of escape and UTF-8, keys, numbers, any
 * value to a depth, and objects whose members come out shuffled.
 */

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prompt_rand_json.h"


static void put_utf8(buf_t *b, uint32_t cp);
static void put_u_escape(buf_t *b, uint32_t v);
static uint32_t rand_bmp(void);


/* formatted output into a growable buffer */

void
buf_printf(buf_t *b, const char *fmt, ...)
{
    int      n;
    char     tmp[128];
    va_list  args;

    va_start(args, fmt);
    n = vsnprintf(tmp, sizeof(tmp), fmt, args);
    va_end(args);

    buf_put(b, tmp, (size_t) n);
}


void
gen_ws(buf_t *b)
{
    unsigned  n;

    if (rn(3) != 0) {
        return;
    }

    for (n = 1 + rn(3); n > 0; n--) {
        buf_putc(b, " \t\n\r"[rn(4)]);
    }
}


static void
put_utf8(buf_t *b, uint32_t cp)
{
    if (cp < 0x80) {
        buf_putc(b, (int) cp);

    } else if (cp < 0x800) {
        buf_putc(b, (int) (0xc0 | (cp >> 6)));
        buf_putc(b, (int) (0x80 | (cp & 0x3f)));

    } else if (cp < 0x10000) {
        buf_putc(b, (int) (0xe0 | (cp >> 12)));
        buf_putc(b, (int) (0x80 | ((cp >> 6) & 0x3f)));
        buf_putc(b, (int) (0x80 | (cp & 0x3f)));

    } else {
        buf_putc(b, (int) (0xf0 | (cp >> 18)));
        buf_putc(b, (int) (0x80 | ((cp >> 12) & 0x3f)));
        buf_putc(b, (int) (0x80 | ((cp >> 6) & 0x3f)));
        buf_putc(b, (int) (0x80 | (cp & 0x3f)));
    }
}


static void
put_u_escape(buf_t *b, uint32_t v)
{
    buf_printf(b, rn(2) ? "\\u%04x" : "\\u%04X", v);
}


static uint32_t
rand_bmp(void)
{
    uint32_t  cp;

    do {
        cp = 0x80 + rn(0x10000 - 0x80);
    } while (cp >= 0xd800 && cp <= 0xdfff);

    return cp;
}


/* the inside of a JSON string, about target bytes of it */

void
gen_text(buf_t *b, size_t target, int allow_nul)
{
    size_t    start, n;
    uint32_t  cp;

    static const char  *esc[] = {
        "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"
    };

    start = b->len;

    while (b->len - start < target) {

        switch (rn(20)) {

        case 11:
            buf_puts(b, esc[rn(8)]);
            break;

        case 12:
            cp = rn(0x80);
            put_u_escape(b, (cp == 0 && !allow_nul) ? 1 : cp);
            break;

        case 13:
            put_u_escape(b, rand_bmp());
            break;

        case 14:
            cp = rn(0x100000);
            put_u_escape(b, 0xd800 + (cp >> 10));
            put_u_escape(b, 0xdc00 + (cp & 0x3ff));
            break;

        case 15:
            put_utf8(b, 0x80 + rn(0x800 - 0x80));
            break;

        case 16:
            do {
                cp = rand_bmp();
            } while (cp < 0x800);

            put_utf8(b, cp);
            break;

        case 17:
            put_utf8(b, 0x10000 + rn(0x100000));
            break;

        default:
            for (n = 1 + rn(rn(4) ? 16 : 64); n > 0; n--) {
                do {
                    cp = 0x20 + rn(0x5f);
                } while (cp == '"' || cp == '\\');

                buf_putc(b, (int) cp);
            }
        }
    }
}


void
gen_string(buf_t *b, size_t max)
{
    buf_putc(b, '"');
    gen_text(b, rn((unsigned) max + 1), 1);
    buf_putc(b, '"');
}


/* mostly plain text with an escape now and then, 100 KB or more */

void
gen_huge_string(buf_t *b)
{
    size_t  start, target, n;

    target = 100000 + rn(100000);
    start = b->len;

    buf_putc(b, '"');

    while (b->len - start < target) {
        for (n = 20 + rn(200); n > 0; n--) {
            buf_putc(b, 'a' + rn(26));
        }

        if (rn(2)) {
            gen_text(b, 1, 1);
        }
    }

    buf_putc(b, '"');
}


/* a key; some of its characters written as \u escapes */

void
gen_key(buf_t *b, const char *name)
{
    buf_putc(b, '"');

    for ( ; *name; name++) {
        if (rn(10) == 0) {
            put_u_escape(b, (uint8_t) *name);

        } else {
            buf_putc(b, *name);
        }
    }

    buf_putc(b, '"');
    gen_ws(b);
    buf_putc(b, ':');
    gen_ws(b);
}


/* a unique key no prompt rule looks at */

void
gen_other_key(buf_t *b, unsigned i)
{
    buf_printf(b, "\"x%u_", i);
    gen_text(b, rn(8), 0);
    buf_putc(b, '"');
    gen_ws(b);
    buf_putc(b, ':');
    gen_ws(b);
}


void
gen_number(buf_t *b)
{
    switch (rn(8)) {

    case 0:
        buf_puts(b, rn(2) ? "0" : "-0");
        break;

    case 1:
        buf_printf(b, "-%u", rn(1000000000));
        break;

    case 2:
        buf_printf(b, "%u.%u", rn(100000), rn(1000));
        break;

    case 3:
        buf_printf(b, "%s%u%c%s%u", rn(2) ? "-" : "", rn(1000),
                   rn(2) ? 'e' : 'E', rn(2) ? "-" : (rn(2) ? "+" : ""),
                   rn(10));
        break;

    case 4:
        buf_printf(b, "%u.%02ue%u", rn(10), rn(100), rn(10));
        break;

    default:
        buf_printf(b, "%u", rn(1000000000));
    }
}


void
gen_json(buf_t *b, unsigned depth, unsigned max_depth)
{
    unsigned  i, n, r;

    r = rn(10);

    if (depth >= max_depth && r < 4) {
        r += 4;
    }

    switch (r) {

    case 0:
    case 1:
        buf_putc(b, '{');
        gen_ws(b);

        for (i = 0, n = rn(5); i < n; i++) {
            if (i > 0) {
                buf_putc(b, ',');
                gen_ws(b);
            }

            gen_other_key(b, i);
            gen_json(b, depth + 1, max_depth);
            gen_ws(b);
        }

        buf_putc(b, '}');
        break;

    case 2:
    case 3:
        buf_putc(b, '[');
        gen_ws(b);

        for (i = 0, n = rn(5); i < n; i++) {
            if (i > 0) {
                buf_putc(b, ',');
                gen_ws(b);
            }

            gen_json(b, depth + 1, max_depth);
            gen_ws(b);
        }

        buf_putc(b, ']');
        break;

    case 4:
    case 5:
        gen_string(b, 24);
        break;

    case 6:
    case 7:
        gen_number(b);
        break;

    default:
        buf_puts(b, (r == 8) ? (rn(2) ? "true" : "false") : "null");
    }
}


buf_t *
members_next(members_t *ms)
{
    buf_t  *b;

    b = &ms->m[ms->n++];
    b->len = 0;

    return b;
}


void
members_emit(buf_t *b, members_t *ms)
{
    unsigned  i, j;
    buf_t     tmp;

    for (i = ms->n; i > 1; i--) {
        j = rn(i);
        tmp = ms->m[i - 1];
        ms->m[i - 1] = ms->m[j];
        ms->m[j] = tmp;
    }

    buf_putc(b, '{');
    gen_ws(b);

    for (i = 0; i < ms->n; i++) {
        if (i > 0) {
            buf_putc(b, ',');
            gen_ws(b);
        }

        buf_put(b, ms->m[i].p, ms->m[i].len);
        gen_ws(b);
    }

    buf_putc(b, '}');
    ms->n = 0;
}
