/*
 * The random request body generator of test_prompt_ref.c: chat, prompt
 * and input bodies with shuffled keys, odd whitespace, escapes and
 * unusable types, and byte-level mutations of them.  Deterministic for a
 * given seed, so a failing body can be reproduced from KVA_TEST_SEED.
 */

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prompt_rand.h"


/* members of an object: serialized apart, then shuffled and joined */

typedef struct {
    buf_t     m[12];
    unsigned  n;
} members_t;


static void buf_printf(buf_t *b, const char *fmt, ...);
static uint64_t rnd(void);
static unsigned rn(unsigned n);
static void gen_ws(buf_t *b);
static void put_utf8(buf_t *b, uint32_t cp);
static void put_u_escape(buf_t *b, uint32_t v);
static uint32_t rand_bmp(void);
static void gen_text(buf_t *b, size_t target, int allow_nul);
static void gen_string(buf_t *b, size_t max);
static void gen_huge_string(buf_t *b);
static void gen_key(buf_t *b, const char *name);
static void gen_other_key(buf_t *b, unsigned i);
static void gen_number(buf_t *b);
static void gen_json(buf_t *b, unsigned depth, unsigned max_depth);
static buf_t *member(members_t *ms);
static void emit_members(buf_t *b, members_t *ms);
static void gen_part(buf_t *b, unsigned huge);
static void gen_message(buf_t *b, unsigned huge);
static void gen_token(buf_t *b);
static void gen_messages_value(buf_t *b, unsigned huge, unsigned input);
static void gen_prompt_value(buf_t *b, unsigned huge);


static uint64_t   rng;


/* formatted output into a growable buffer */

static void
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


/* deterministic random generation: xorshift64* */

void
prompt_rand_seed(uint64_t seed)
{
    rng = seed;
}


uint64_t
prompt_rand_u64(void)
{
    return rnd();
}


unsigned
prompt_rand_n(unsigned n)
{
    return rn(n);
}


static uint64_t
rnd(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;

    return rng * 0x2545f4914f6cdd1dULL;
}


static unsigned
rn(unsigned n)
{
    return (unsigned) (rnd() % n);
}


static void
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

static void
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


static void
gen_string(buf_t *b, size_t max)
{
    buf_putc(b, '"');
    gen_text(b, rn((unsigned) max + 1), 1);
    buf_putc(b, '"');
}


/* mostly plain text with an escape now and then, 100 KB or more */

static void
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

static void
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

static void
gen_other_key(buf_t *b, unsigned i)
{
    buf_printf(b, "\"x%u_", i);
    gen_text(b, rn(8), 0);
    buf_putc(b, '"');
    gen_ws(b);
    buf_putc(b, ':');
    gen_ws(b);
}


static void
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


static void
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


static buf_t *
member(members_t *ms)
{
    buf_t  *b;

    b = &ms->m[ms->n++];
    b->len = 0;

    return b;
}


static void
emit_members(buf_t *b, members_t *ms)
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


static void
gen_part(buf_t *b, unsigned huge)
{
    members_t  ms;

    memset(&ms, 0, sizeof(ms));

    switch (rn(10)) {

    case 0:
    case 1:
    case 2:
    case 3:
    case 9:
        gen_key(member(&ms), "type");
        buf_puts(&ms.m[ms.n - 1], rn(4) ? "\"text\"" : "\"input_text\"");
        gen_key(member(&ms), "text");

        if (huge) {
            gen_huge_string(&ms.m[ms.n - 1]);

        } else {
            gen_string(&ms.m[ms.n - 1], 200);
        }

        if (rn(4) == 0) {
            gen_other_key(member(&ms), 0);
            gen_json(&ms.m[ms.n - 1], 3, 5);
        }

        emit_members(b, &ms);
        break;

    case 4:
    case 5:
        gen_string(b, 100);
        break;

    case 6:
        buf_puts(b, "{\"type\":\"image_url\",\"image_url\":{\"url\":");
        gen_string(b, 40);
        buf_puts(b, "}}");
        break;

    case 7:
        gen_key(member(&ms), "text");
        gen_number(&ms.m[ms.n - 1]);
        gen_key(member(&ms), "type");
        buf_puts(&ms.m[ms.n - 1], "\"text\"");
        emit_members(b, &ms);
        break;

    default:
        gen_json(b, 3, 6);
    }

    for (ms.n = 0; ms.n < 12; ms.n++) {
        free(ms.m[ms.n].p);
    }
}


static void
gen_message(buf_t *b, unsigned huge)
{
    unsigned    i, n, r;
    buf_t      *v;
    members_t   ms;

    static const char  *roles[] = {
        "user", "system", "assistant", "tool", "developer"
    };

    if (rn(12) == 0) {
        if (rn(2)) {
            gen_string(b, 40);

        } else {
            gen_json(b, 2, 5);
        }

        return;
    }

    memset(&ms, 0, sizeof(ms));

    r = rn(20);

    if (r != 0) {
        gen_key(member(&ms), "role");
        v = &ms.m[ms.n - 1];

        if (r == 1) {
            gen_json(v, 2, 4);

        } else if (r == 2) {
            buf_putc(v, '"');
            gen_text(v, 60 + rn(60), 1);
            buf_putc(v, '"');

        } else if (r < 6) {
            gen_string(v, 20);

        } else {
            buf_printf(v, "\"%s\"", roles[rn(5)]);
        }
    }

    r = huge ? 19 : rn(20);

    if (r != 0) {
        gen_key(member(&ms), "content");
        v = &ms.m[ms.n - 1];

        if (r == 1) {
            buf_puts(v, "null");

        } else if (r == 2) {
            gen_json(v, 2, 5);

        } else if (r < 11) {
            gen_string(v, rn(8) ? 200 : 3000);

        } else if (huge && rn(2)) {
            gen_huge_string(v);

        } else {
            buf_putc(v, '[');
            gen_ws(v);

            for (i = 0, n = rn(5) + huge; i < n; i++) {
                if (i > 0) {
                    buf_putc(v, ',');
                    gen_ws(v);
                }

                gen_part(v, huge && i == 0);
                gen_ws(v);
            }

            buf_putc(v, ']');
        }
    }

    for (i = 0, n = rn(3); i < n; i++) {
        r = rn(3);

        if (r == 0 && i == 0) {
            gen_key(member(&ms), "name");
            gen_string(&ms.m[ms.n - 1], 20);

        } else if (r == 1 && i == 1) {
            gen_key(member(&ms), "tool_calls");
            gen_json(&ms.m[ms.n - 1], 2, 8);

        } else {
            gen_other_key(member(&ms), i);
            gen_json(&ms.m[ms.n - 1], 2, 8);
        }
    }

    emit_members(b, &ms);

    for (ms.n = 0; ms.n < 12; ms.n++) {
        free(ms.m[ms.n].p);
    }
}


static void
gen_token(buf_t *b)
{
    static const char  *odd[] = {
        "4294967295", "4294967296", "9999999999", "-1", "-0", "0", "1.0",
        "1e2", "-4294967295", "null", "true", "{}", "\"s\""
    };

    if (rn(6) == 0) {
        buf_puts(b, odd[rn(sizeof(odd) / sizeof(odd[0]))]);

    } else {
        buf_printf(b, "%u", rn(2) ? rn(200000) : (unsigned) rnd());
    }
}


static void
gen_messages_value(buf_t *b, unsigned huge, unsigned input)
{
    unsigned  i, n;

    buf_putc(b, '[');
    gen_ws(b);

    for (i = 0, n = rn(6) + huge; i < n; i++) {
        if (i > 0) {
            buf_putc(b, ',');
            gen_ws(b);
        }

        if (input && rn(6) == 0) {
            gen_string(b, 100);

        } else {
            gen_message(b, huge && i == n - 1);
        }

        gen_ws(b);
    }

    buf_putc(b, ']');
}


static void
gen_prompt_value(buf_t *b, unsigned huge)
{
    unsigned  i, j, n, m;

    if (huge || rn(3) == 0) {
        if (huge) {
            gen_huge_string(b);

        } else {
            gen_string(b, 500);
        }

        return;
    }

    buf_putc(b, '[');
    gen_ws(b);

    for (i = 0, n = rn(8); i < n; i++) {
        if (i > 0) {
            buf_putc(b, ',');
            gen_ws(b);
        }

        switch (rn(4)) {

        case 0:
            gen_string(b, 100);
            break;

        case 1:
            buf_putc(b, '[');

            for (j = 0, m = rn(12); j < m; j++) {
                if (j > 0) {
                    buf_putc(b, ',');
                    gen_ws(b);
                }

                if (rn(20) == 0) {
                    gen_json(b, 3, 5);

                } else {
                    gen_token(b);
                }
            }

            buf_putc(b, ']');
            break;

        default:
            gen_token(b);
        }

        gen_ws(b);
    }

    buf_putc(b, ']');
}


void
prompt_gen_body(buf_t *b)
{
    unsigned   r, huge, i, n;
    buf_t     *v;
    members_t  ms;

    memset(&ms, 0, sizeof(ms));
    b->len = 0;
    gen_ws(b);

    huge = (rn(80) == 0);
    r = rn(100);

    if (r >= 84 && r < 88) {
        gen_json(b, 0, 1 + rn(18));
        gen_ws(b);
        return;
    }

    r = rn(10);

    if (r < 8) {
        gen_key(member(&ms), "model");
        v = &ms.m[ms.n - 1];

        if (r == 0) {
            gen_json(v, 1, 3);

        } else if (r == 1) {
            buf_putc(v, '"');
            gen_text(v, 250 + rn(60), 1);
            buf_putc(v, '"');

        } else {
            gen_string(v, 30);
        }
    }

    r = rn(100);

    if (r >= 96) {
        gen_key(member(&ms), "messages");
        gen_json(&ms.m[ms.n - 1], 1, 4);

    } else if (r < 45 || r >= 88) {
        gen_key(member(&ms), "messages");
        gen_messages_value(&ms.m[ms.n - 1], huge, 0);

    } else if (r < 62) {
        gen_key(member(&ms), "prompt");
        gen_prompt_value(&ms.m[ms.n - 1], huge);

    } else if (r < 78) {
        gen_key(member(&ms), "input");

        if (rn(4) == 0) {
            gen_string(&ms.m[ms.n - 1], 300);

        } else {
            gen_messages_value(&ms.m[ms.n - 1], huge, 1);
        }
    }

    if (r >= 88) {
        /* several prompt-bearing keys, some of unusable types */
        gen_key(member(&ms), "prompt");

        if (rn(3) == 0) {
            gen_number(&ms.m[ms.n - 1]);

        } else {
            gen_prompt_value(&ms.m[ms.n - 1], 0);
        }

        gen_key(member(&ms), "input");
        gen_json(&ms.m[ms.n - 1], 1, 4);
    }

    for (i = 0, n = rn(4); i < n; i++) {
        gen_other_key(member(&ms), i);
        gen_json(&ms.m[ms.n - 1], 1, 1 + rn(18));
    }

    if (rn(3) == 0) {
        gen_key(member(&ms), "temperature");
        gen_number(&ms.m[ms.n - 1]);
    }

    emit_members(b, &ms);
    gen_ws(b);

    for (ms.n = 0; ms.n < 12; ms.n++) {
        free(ms.m[ms.n].p);
    }
}


void
prompt_mutate(buf_t *b)
{
    size_t    at;
    unsigned  n;
    uint8_t   c;

    static const uint8_t  bytes[] = {
        '"', '\\', '{', '}', '[', ']', ':', ',', '0', '1', '-', '.', 'e',
        'u', 'n', ' ', 0x00, 0x1f, 0x7f, 0x80, 0xbf, 0xc0, 0xc3, 0xe0, 0xed,
        0xf0, 0xf4, 0xff
    };

    for (n = 1 + rn(rn(4) ? 1 : 4); n > 0; n--) {
        at = (b->len > 0) ? rnd() % b->len : 0;
        c = rn(3) ? bytes[rn(sizeof(bytes))] : (uint8_t) rnd();

        switch (rn(3)) {

        case 0:
            if (b->len > 0) {
                b->p[at] = c;
            }

            break;

        case 1:
            if (b->len > 0) {
                memmove(b->p + at, b->p + at + 1, b->len - at - 1);
                b->len--;
            }

            break;

        default:
            buf_putc(b, 0);
            memmove(b->p + at + 1, b->p + at, b->len - at - 1);
            b->p[at] = c;
        }
    }
}
