/*
 * The random request body generator of test_prompt_ref.c: chat, prompt
 * and input bodies with shuffled keys, odd whitespace, escapes and
 * unusable types, and byte-level mutations of them.  Deterministic for a
 * given seed, so a failing body can be reproduced from KVA_TEST_SEED.
 * Here the OpenAI shapes; the JSON they are made of in prompt_rand_json.c.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kva_rand.h"
#include "prompt_rand_json.h"


static void gen_part(buf_t *b, unsigned huge);
static void gen_message(buf_t *b, unsigned huge);
static void gen_token(buf_t *b);
static void gen_messages_value(buf_t *b, unsigned huge, unsigned input);
static void gen_prompt_value(buf_t *b, unsigned huge);


/* one state for the bodies and the test's own choices: a seed replays all */
static uint64_t  rng;


void
prompt_rand_seed(uint64_t seed)
{
    rng = seed;
}


uint64_t
prompt_rand_u64(void)
{
    return kva_rand_next(&rng);
}


unsigned
prompt_rand_n(unsigned n)
{
    return (unsigned) kva_rand_below(&rng, n);
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
        gen_key(members_next(&ms), "type");
        buf_puts(&ms.m[ms.n - 1], rn(4) ? "\"text\"" : "\"input_text\"");
        gen_key(members_next(&ms), "text");

        if (huge) {
            gen_huge_string(&ms.m[ms.n - 1]);

        } else {
            gen_string(&ms.m[ms.n - 1], 200);
        }

        if (rn(4) == 0) {
            gen_other_key(members_next(&ms), 0);
            gen_json(&ms.m[ms.n - 1], 3, 5);
        }

        members_emit(b, &ms);
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
        gen_key(members_next(&ms), "text");
        gen_number(&ms.m[ms.n - 1]);
        gen_key(members_next(&ms), "type");
        buf_puts(&ms.m[ms.n - 1], "\"text\"");
        members_emit(b, &ms);
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
        gen_key(members_next(&ms), "role");
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
        gen_key(members_next(&ms), "content");
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
            gen_key(members_next(&ms), "name");
            gen_string(&ms.m[ms.n - 1], 20);

        } else if (r == 1 && i == 1) {
            gen_key(members_next(&ms), "tool_calls");
            gen_json(&ms.m[ms.n - 1], 2, 8);

        } else {
            gen_other_key(members_next(&ms), i);
            gen_json(&ms.m[ms.n - 1], 2, 8);
        }
    }

    members_emit(b, &ms);

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
        gen_key(members_next(&ms), "model");
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
        gen_key(members_next(&ms), "messages");
        gen_json(&ms.m[ms.n - 1], 1, 4);

    } else if (r < 45 || r >= 88) {
        gen_key(members_next(&ms), "messages");
        gen_messages_value(&ms.m[ms.n - 1], huge, 0);

    } else if (r < 62) {
        gen_key(members_next(&ms), "prompt");
        gen_prompt_value(&ms.m[ms.n - 1], huge);

    } else if (r < 78) {
        gen_key(members_next(&ms), "input");

        if (rn(4) == 0) {
            gen_string(&ms.m[ms.n - 1], 300);

        } else {
            gen_messages_value(&ms.m[ms.n - 1], huge, 1);
        }
    }

    if (r >= 88) {
        /* several prompt-bearing keys, some of unusable types */
        gen_key(members_next(&ms), "prompt");

        if (rn(3) == 0) {
            gen_number(&ms.m[ms.n - 1]);

        } else {
            gen_prompt_value(&ms.m[ms.n - 1], 0);
        }

        gen_key(members_next(&ms), "input");
        gen_json(&ms.m[ms.n - 1], 1, 4);
    }

    for (i = 0, n = rn(4); i < n; i++) {
        gen_other_key(members_next(&ms), i);
        gen_json(&ms.m[ms.n - 1], 1, 1 + rn(18));
    }

    if (rn(3) == 0) {
        gen_key(members_next(&ms), "temperature");
        gen_number(&ms.m[ms.n - 1]);
    }

    members_emit(b, &ms);
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
