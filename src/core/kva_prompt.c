/*
 * kv_aware core: OpenAI-style request body -> canonical prompt bytes.
 *
 * One pass over the body: a strict RFC 8259 validator that decodes the few
 * string values routing cares about straight into the caller's buffer, and
 * skips (but still validates) everything else.  Recursion happens only on
 * '{' and '[', and every level is counted against KVA_PROMPT_MAX_DEPTH, so
 * hostile nesting cannot exhaust the stack.
 *
 * Duplicate keys: the first occurrence wins (jansson keeps the last one).
 * By the time a duplicate shows up the first value has already been streamed
 * into the output, and taking it back would need a second pass.
 */

#include <string.h>

#if (defined __SSE2__)
#include <emmintrin.h>
#endif

#include "kva_prompt.h"


#define KVA_ROLE_MAX      64
#define KVA_KEY_MAX       16        /* longer than any key we look for */

#define KVA_ONES          0x0101010101010101ULL
#define KVA_HIGHS         0x8080808080808080ULL

/*
 * The lowest flagged byte of kva_special() is always a real hit (borrows
 * only run towards the more significant bytes).  On big-endian hosts the
 * first byte in memory is the most significant one, so a false hit may come
 * first; that is harmless, the slow path copies plain bytes too.
 */
#if (defined __BYTE_ORDER__ && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__)
#define kva_first_hit(m)  ((size_t) __builtin_clzll(m) >> 3)
#else
#define kva_first_hit(m)  ((size_t) __builtin_ctzll(m) >> 3)
#endif

#define kva_is_digit(c)   ((unsigned) ((c) - '0') < 10)


typedef enum {
    KVA_KEY_OTHER = 0,
    KVA_KEY_MODEL,
    KVA_KEY_MESSAGES,
    KVA_KEY_PROMPT,
    KVA_KEY_INPUT,
    KVA_KEY_TOOLS,
    KVA_KEY_ROLE,
    KVA_KEY_CONTENT,
    KVA_KEY_TEXT
} kva_key_e;


typedef struct {
    uint8_t          *buf;
    size_t            len;          /* decoded length, may exceed cap */
    size_t            cap;
} kva_sink_t;


typedef struct {
    const uint8_t    *pos;
    const uint8_t    *end;
    kva_sink_t        out;
    unsigned          depth;
    kva_prompt_rc_e   rc;
    unsigned          model_seen;
    const uint8_t    *tools_start;
    const uint8_t    *tools_end;
} kva_parse_t;


typedef struct {
    kva_sink_t        role;
    uint8_t           role_buf[KVA_ROLE_MAX];
    unsigned          role_seen;
    unsigned          content_seen;
} kva_message_t;


/* called with ps->pos at a member's or an element's value */
typedef int (*kva_handler_pt)(kva_parse_t *ps, kva_key_e key, void *ctx);


static int kva_fail(kva_parse_t *ps, kva_prompt_rc_e rc);
static void kva_skip_ws(kva_parse_t *ps);
static size_t kva_put(uint8_t *buf, size_t len, size_t cap,
    const uint8_t *src, size_t n);
static void kva_emit_byte(kva_parse_t *ps, uint8_t c);
static uint64_t kva_special(uint64_t w);
static size_t kva_utf8_valid(const uint8_t *p, const uint8_t *end);
static size_t kva_utf8_encode(uint32_t cp, uint8_t *utf8);
static int kva_hex4(const uint8_t *p, const uint8_t *end, uint32_t *cp);
static int kva_parse_escape(kva_parse_t *ps, uint8_t *utf8, size_t *n);
static int kva_parse_string(kva_parse_t *ps, kva_sink_t *sink);
#if (defined __SSE2__)
static const uint8_t *kva_skip_plain16(const uint8_t *pos, const uint8_t *end);
#endif
static const uint8_t *kva_digits(const uint8_t *pos, const uint8_t *end);
static int kva_parse_number(kva_parse_t *ps, uint32_t *token,
    unsigned *is_token);
static int kva_parse_literal(kva_parse_t *ps, const char *lit, size_t n);
static kva_key_e kva_key_id(const uint8_t *key, size_t len);
static int kva_next(kva_parse_t *ps, kva_key_e *key, size_t *n);
static int kva_walk(kva_parse_t *ps, kva_handler_pt handler, void *ctx);
static int kva_skip_value(kva_parse_t *ps);
static int kva_skip_item(kva_parse_t *ps, kva_key_e key, void *ctx);
static int kva_top_item(kva_parse_t *ps, kva_key_e key, void *ctx);
static int kva_message_item(kva_parse_t *ps, kva_key_e key, void *ctx);
static int kva_message_member(kva_parse_t *ps, kva_key_e key, void *ctx);
static int kva_part_item(kva_parse_t *ps, kva_key_e key, void *ctx);
static int kva_parse_text(kva_parse_t *ps);
static int kva_prompt_item(kva_parse_t *ps, kva_key_e key, void *ctx);
static void kva_place_tools(kva_parse_t *ps);


static int
kva_fail(kva_parse_t *ps, kva_prompt_rc_e rc)
{
    ps->rc = rc;

    return -1;
}


static void
kva_skip_ws(kva_parse_t *ps)
{
    const uint8_t  *pos, *end;

    pos = ps->pos;
    end = ps->end;

    while (pos < end
           && (*pos == ' ' || *pos == '\n' || *pos == '\r' || *pos == '\t'))
    {
        pos++;
    }

    ps->pos = pos;
}


/* appends what still fits and returns the length the value would have */

static inline size_t
kva_put(uint8_t *buf, size_t len, size_t cap, const uint8_t *src, size_t n)
{
    if (len < cap) {
        memcpy(buf + len, src, (cap - len < n) ? cap - len : n);
    }

    return len + n;
}


static void
kva_emit_byte(kva_parse_t *ps, uint8_t c)
{
    if (ps->out.len < ps->out.cap) {
        ps->out.buf[ps->out.len] = c;
    }

    ps->out.len++;
}


/* flags '"', '\\', control bytes and non-ASCII bytes of an 8-byte word */

static inline uint64_t
kva_special(uint64_t w)
{
    uint64_t  q, b;

    q = w ^ (KVA_ONES * '"');
    b = w ^ (KVA_ONES * '\\');

    return (((q - KVA_ONES) & ~q)
            | ((b - KVA_ONES) & ~b)
            | ((w - KVA_ONES * 0x20) & ~w)
            | w)
           & KVA_HIGHS;
}


/*
 * Returns the length of the well-formed UTF-8 sequence at p, or 0: the
 * second byte ranges of Unicode table 3-7 rule out overlongs, surrogates
 * and code points over U+10FFFF without decoding.
 */

static size_t
kva_utf8_valid(const uint8_t *p, const uint8_t *end)
{
    size_t   n, i;
    uint8_t  c, lo, hi;

    c = p[0];
    lo = 0x80;
    hi = 0xbf;

    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;

    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        lo = (c == 0xe0) ? 0xa0 : 0x80;
        hi = (c == 0xed) ? 0x9f : 0xbf;

    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        lo = (c == 0xf0) ? 0x90 : 0x80;
        hi = (c == 0xf4) ? 0x8f : 0xbf;

    } else {
        return 0;
    }

    if ((size_t) (end - p) < n || p[1] < lo || p[1] > hi) {
        return 0;
    }

    for (i = 2; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            return 0;
        }
    }

    return n;
}


static size_t
kva_utf8_encode(uint32_t cp, uint8_t *utf8)
{
    if (cp < 0x80) {
        utf8[0] = (uint8_t) cp;
        return 1;
    }

    if (cp < 0x800) {
        utf8[0] = (uint8_t) (0xc0 | (cp >> 6));
        utf8[1] = (uint8_t) (0x80 | (cp & 0x3f));
        return 2;
    }

    if (cp < 0x10000) {
        utf8[0] = (uint8_t) (0xe0 | (cp >> 12));
        utf8[1] = (uint8_t) (0x80 | ((cp >> 6) & 0x3f));
        utf8[2] = (uint8_t) (0x80 | (cp & 0x3f));
        return 3;
    }

    utf8[0] = (uint8_t) (0xf0 | (cp >> 18));
    utf8[1] = (uint8_t) (0x80 | ((cp >> 12) & 0x3f));
    utf8[2] = (uint8_t) (0x80 | ((cp >> 6) & 0x3f));
    utf8[3] = (uint8_t) (0x80 | (cp & 0x3f));

    return 4;
}


static int
kva_hex4(const uint8_t *p, const uint8_t *end, uint32_t *cp)
{
    size_t    i;
    uint8_t   c;
    uint32_t  v;

    if (end - p < 4) {
        return -1;
    }

    v = 0;

    for (i = 0; i < 4; i++) {
        c = p[i];

        if (kva_is_digit(c)) {
            v = (v << 4) | (uint32_t) (c - '0');

        } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') {
            v = (v << 4) | (uint32_t) ((c | 0x20) - 'a' + 10);

        } else {
            return -1;
        }
    }

    *cp = v;

    return 0;
}


/* ps->pos is at the backslash; the decoded bytes go to utf8[0 .. *n) */

static int
kva_parse_escape(kva_parse_t *ps, uint8_t *utf8, size_t *n)
{
    uint32_t        cp, lo;
    const char     *hit;
    const uint8_t  *pos;

    static const char  from[] = "\"\\/bfnrt";
    static const char  to[] = "\"\\/\b\f\n\r\t";

    pos = ps->pos + 1;

    if (pos == ps->end) {
        return kva_fail(ps, KVA_PROMPT_NOT_JSON);
    }

    if (*pos != 'u') {
        hit = memchr(from, *pos, sizeof(from) - 1);

        if (hit == NULL) {
            return kva_fail(ps, KVA_PROMPT_NOT_JSON);
        }

        utf8[0] = (uint8_t) to[hit - from];
        *n = 1;
        ps->pos = pos + 1;
        return 0;
    }

    if (kva_hex4(pos + 1, ps->end, &cp) != 0) {
        return kva_fail(ps, KVA_PROMPT_NOT_JSON);
    }

    pos += 5;

    if (cp >= 0xdc00 && cp <= 0xdfff) {
        return kva_fail(ps, KVA_PROMPT_BAD_UTF8);
    }

    if (cp >= 0xd800 && cp <= 0xdbff) {

        if (ps->end - pos < 2 || pos[0] != '\\' || pos[1] != 'u') {
            return kva_fail(ps, KVA_PROMPT_BAD_UTF8);
        }

        if (kva_hex4(pos + 2, ps->end, &lo) != 0) {
            return kva_fail(ps, KVA_PROMPT_NOT_JSON);
        }

        if (lo < 0xdc00 || lo > 0xdfff) {
            return kva_fail(ps, KVA_PROMPT_BAD_UTF8);
        }

        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        pos += 6;
    }

    *n = kva_utf8_encode(cp, utf8);
    ps->pos = pos;

    return 0;
}


/*
 * ps->pos is at the opening quote.  Plain text is scanned a word at a time;
 * only words holding a quote, a backslash, a control or a non-ASCII byte
 * take the byte-wise path.  What needs no decoding (plain and validated
 * UTF-8 bytes alike) is copied in one go when a quote or a backslash ends
 * the run: this beat copying word by word, most of all on non-ASCII text.
 */

#if (defined __SSE2__)

/*
 * SSE2 is in every x86-64 CPU: 16 bytes a step.  A signed compare with
 * 0x20 flags control bytes and, being negative, every byte >= 0x80 too:
 * the same set as kva_special().  Returns the first such byte, or the
 * position where fewer than 16 bytes are left.
 */

static const uint8_t *
kva_skip_plain16(const uint8_t *pos, const uint8_t *end)
{
    int      mask;
    __m128i  v, quote, backslash, space, hits;

    quote = _mm_set1_epi8('"');
    backslash = _mm_set1_epi8('\\');
    space = _mm_set1_epi8(0x20);

    while (end - pos >= 16) {
        v = _mm_loadu_si128((const __m128i *) pos);
        hits = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote),
                                         _mm_cmpeq_epi8(v, backslash)),
                            _mm_cmplt_epi8(v, space));
        mask = _mm_movemask_epi8(hits);

        if (mask) {
            return pos + __builtin_ctz(mask);
        }

        pos += 16;
    }

    return pos;
}

#endif



static int
kva_parse_string(kva_parse_t *ps, kva_sink_t *sink)
{
    size_t          n;
    uint8_t         c, utf8[4];
    uint64_t        w, m;
    const uint8_t  *pos, *end, *run;

    pos = ps->pos + 1;
    end = ps->end;
    run = pos;

    for ( ;; ) {

#if (defined __SSE2__)
        pos = kva_skip_plain16(pos, end);
#endif

        while (end - pos >= 8) {
            memcpy(&w, pos, 8);
            m = kva_special(w);

            if (m != 0) {
                pos += kva_first_hit(m);
                break;
            }

            pos += 8;
        }

        if (pos == end) {
            return kva_fail(ps, KVA_PROMPT_NOT_JSON);
        }

        c = *pos;

        if (c >= 0x80) {

            /* a whole run: its words would only hit again at once */

            do {
                n = kva_utf8_valid(pos, end);

                if (n == 0) {
                    return kva_fail(ps, KVA_PROMPT_BAD_UTF8);
                }

                pos += n;

            } while (pos < end && *pos >= 0x80);

            continue;
        }

        if (c == '"' || c == '\\') {
            sink->len = kva_put(sink->buf, sink->len, sink->cap, run,
                                (size_t) (pos - run));

            if (c == '"') {
                break;
            }

            ps->pos = pos;

            if (kva_parse_escape(ps, utf8, &n) != 0) {
                return -1;
            }

            sink->len = kva_put(sink->buf, sink->len, sink->cap, utf8, n);
            pos = ps->pos;
            run = pos;
            continue;
        }

        if (c < 0x20) {
            return kva_fail(ps, KVA_PROMPT_NOT_JSON);
        }

        pos++;
    }

    ps->pos = pos + 1;

    return 0;
}


static const uint8_t *
kva_digits(const uint8_t *pos, const uint8_t *end)
{
    while (pos < end && kva_is_digit(*pos)) {
        pos++;
    }

    return pos;
}


/*
 * Sets *is_token for integers in 0 .. 2^32-1; "-0" counts, as jansson
 * reads it as the integer 0.
 */

static int
kva_parse_number(kva_parse_t *ps, uint32_t *token, unsigned *is_token)
{
    uint64_t        v;
    const uint8_t  *pos, *end, *digits, *p;

    end = ps->end;
    digits = ps->pos + (*ps->pos == '-');

    if (digits < end && *digits == '0') {
        pos = digits + 1;

    } else {
        pos = kva_digits(digits, end);

        if (pos == digits) {
            return kva_fail(ps, KVA_PROMPT_NOT_JSON);
        }
    }

    v = 0;

    if (pos - digits <= 10) {
        for (p = digits; p < pos; p++) {
            v = v * 10 + (uint64_t) (*p - '0');
        }
    }

    *is_token = (pos - digits <= 10 && v <= 0xffffffff
                 && (digits == ps->pos || v == 0));
    *token = (uint32_t) v;

    if (pos < end && *pos == '.') {
        p = pos + 1;
        pos = kva_digits(p, end);

        if (pos == p) {
            return kva_fail(ps, KVA_PROMPT_NOT_JSON);
        }

        *is_token = 0;
    }

    if (pos < end && (*pos | 0x20) == 'e') {
        p = pos + 1;
        p += (p < end && (*p == '+' || *p == '-'));
        pos = kva_digits(p, end);

        if (pos == p) {
            return kva_fail(ps, KVA_PROMPT_NOT_JSON);
        }

        *is_token = 0;
    }

    ps->pos = pos;

    return 0;
}


static int
kva_parse_literal(kva_parse_t *ps, const char *lit, size_t n)
{
    if ((size_t) (ps->end - ps->pos) < n || memcmp(ps->pos, lit, n) != 0) {
        return kva_fail(ps, KVA_PROMPT_NOT_JSON);
    }

    ps->pos += n;

    return 0;
}


static kva_key_e
kva_key_id(const uint8_t *key, size_t len)
{
    size_t  i;

    static const struct {
        const char  *name;
        size_t       len;
        kva_key_e    id;
    } keys[] = {
        { "model", 5, KVA_KEY_MODEL },
        { "messages", 8, KVA_KEY_MESSAGES },
        { "prompt", 6, KVA_KEY_PROMPT },
        { "input", 5, KVA_KEY_INPUT },
        { "tools", 5, KVA_KEY_TOOLS },
        { "role", 4, KVA_KEY_ROLE },
        { "content", 7, KVA_KEY_CONTENT },
        { "text", 4, KVA_KEY_TEXT }
    };

    for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        if (keys[i].len == len && memcmp(keys[i].name, key, len) == 0) {
            return keys[i].id;
        }
    }

    return KVA_KEY_OTHER;
}


/*
 * Steps to the next member (key != NULL) or element of a container: returns
 * 1 with ps->pos at its value, which is not at the end of the body, 0 after
 * the closing bracket, -1 on error.  A ']' right after a comma is left to
 * fail as a value.
 */

static int
kva_next(kva_parse_t *ps, kva_key_e *key, size_t *n)
{
    uint8_t     buf[KVA_KEY_MAX];
    kva_sink_t  sink;

    kva_skip_ws(ps);

    if (ps->pos == ps->end) {
        return kva_fail(ps, KVA_PROMPT_NOT_JSON);
    }

    if (*ps->pos == (key ? '}' : ']')) {
        ps->pos++;
        return 0;
    }

    if (*n > 0) {
        if (*ps->pos != ',') {
            return kva_fail(ps, KVA_PROMPT_NOT_JSON);
        }

        ps->pos++;
        kva_skip_ws(ps);
    }

    (*n)++;

    if (key == NULL) {
        return (ps->pos < ps->end) ? 1 : kva_fail(ps, KVA_PROMPT_NOT_JSON);
    }

    if (ps->pos == ps->end || *ps->pos != '"') {
        return kva_fail(ps, KVA_PROMPT_NOT_JSON);
    }

    sink.buf = buf;
    sink.len = 0;
    sink.cap = KVA_KEY_MAX;

    if (kva_parse_string(ps, &sink) != 0) {
        return -1;
    }

    *key = (sink.len <= KVA_KEY_MAX) ? kva_key_id(buf, sink.len)
                                     : KVA_KEY_OTHER;

    kva_skip_ws(ps);

    if (ps->pos == ps->end || *ps->pos != ':') {
        return kva_fail(ps, KVA_PROMPT_NOT_JSON);
    }

    ps->pos++;
    kva_skip_ws(ps);

    return (ps->pos < ps->end) ? 1 : kva_fail(ps, KVA_PROMPT_NOT_JSON);
}


/*
 * ps->pos is at '{' or '['.  Calls handler for each value with ps->pos at
 * it; array elements come with KVA_KEY_OTHER.  This is the only place the
 * depth grows, and every recursion goes through it.
 */

static int
kva_walk(kva_parse_t *ps, kva_handler_pt handler, void *ctx)
{
    int         rc;
    size_t      n;
    kva_key_e   key, *keyp;

    if (++ps->depth > KVA_PROMPT_MAX_DEPTH) {
        return kva_fail(ps, KVA_PROMPT_TOO_DEEP);
    }

    key = KVA_KEY_OTHER;
    keyp = (*ps->pos == '{') ? &key : NULL;
    ps->pos++;
    n = 0;

    while ((rc = kva_next(ps, keyp, &n)) == 1) {
        if (handler(ps, key, ctx) != 0) {
            return -1;
        }
    }

    ps->depth--;

    return rc;
}


static int
kva_skip_value(kva_parse_t *ps)
{
    uint32_t    token;
    unsigned    is_token;
    kva_sink_t  none;

    if (ps->pos == ps->end) {
        return kva_fail(ps, KVA_PROMPT_NOT_JSON);
    }

    switch (*ps->pos) {

    case '{':
    case '[':
        return kva_walk(ps, kva_skip_item, NULL);

    case '"':
        none.buf = NULL;
        none.len = 0;
        none.cap = 0;
        return kva_parse_string(ps, &none);

    case 't':
        return kva_parse_literal(ps, "true", 4);

    case 'f':
        return kva_parse_literal(ps, "false", 5);

    case 'n':
        return kva_parse_literal(ps, "null", 4);

    default:
        return kva_parse_number(ps, &token, &is_token);
    }
}


static int
kva_skip_item(kva_parse_t *ps, kva_key_e key, void *ctx)
{
    return kva_skip_value(ps);
}


/*
 * A messages/prompt/input key decides the kind only if its value has a type
 * a prompt can be taken from; otherwise it is skipped like any other key.
 */

static int
kva_top_item(kva_parse_t *ps, kva_key_e key, void *ctx)
{
    uint8_t        c;
    unsigned       none;
    kva_sink_t     sink;
    kva_prompt_t  *p;

    p = ctx;
    c = *ps->pos;
    none = (p->kind == KVA_PROMPT_KIND_NONE);

    if (key == KVA_KEY_MODEL && !ps->model_seen) {
        ps->model_seen = 1;

        if (c != '"') {
            return kva_skip_value(ps);
        }

        sink.buf = p->model;
        sink.len = 0;
        sink.cap = KVA_PROMPT_MODEL_MAX;

        if (kva_parse_string(ps, &sink) != 0) {
            return -1;
        }

        p->model_len = (sink.len < sink.cap) ? sink.len : sink.cap;
        return 0;
    }

    if (key == KVA_KEY_MESSAGES && none && c == '[') {
        p->kind = KVA_PROMPT_KIND_MESSAGES;
        return kva_walk(ps, kva_message_item, NULL);
    }

    if (key == KVA_KEY_PROMPT && none && (c == '"' || c == '[')) {
        p->kind = KVA_PROMPT_KIND_PROMPT;
        return (c == '"') ? kva_parse_text(ps)
                          : kva_walk(ps, kva_prompt_item, NULL);
    }

    if (key == KVA_KEY_INPUT && none && (c == '"' || c == '[')) {
        p->kind = KVA_PROMPT_KIND_INPUT;
        return (c == '"') ? kva_parse_text(ps)
                          : kva_walk(ps, kva_message_item, ps);
    }

    if (key == KVA_KEY_TOOLS && ps->tools_start == NULL) {
        ps->tools_start = ps->pos;

        if (kva_skip_value(ps) != 0) {
            return -1;
        }

        ps->tools_end = ps->pos;
        return 0;
    }

    return kva_skip_value(ps);
}


/* an element of messages, or of input (ctx != NULL), which takes strings */

static int
kva_message_item(kva_parse_t *ps, kva_key_e key, void *ctx)
{
    size_t         len;
    kva_message_t  msg;

    if (*ps->pos == '"' && ctx != NULL) {
        return kva_parse_text(ps);
    }

    if (*ps->pos != '{') {
        return kva_skip_value(ps);
    }

    msg.role.buf = msg.role_buf;
    msg.role.len = 0;
    msg.role.cap = KVA_ROLE_MAX;
    msg.role_seen = 0;
    msg.content_seen = 0;

    if (kva_walk(ps, kva_message_member, &msg) != 0) {
        return -1;
    }

    len = (msg.role.len < KVA_ROLE_MAX) ? msg.role.len : KVA_ROLE_MAX;

    kva_emit_byte(ps, KVA_SEP_ROLE);
    ps->out.len = kva_put(ps->out.buf, ps->out.len, ps->out.cap,
                          msg.role_buf, len);
    kva_emit_byte(ps, KVA_SEP_MESSAGE);

    return 0;
}


/*
 * Content goes straight to the output wherever it appears in the object;
 * the role is held back in a local buffer and written after it, which is
 * why the canonical form puts the role second.
 */

static int
kva_message_member(kva_parse_t *ps, kva_key_e key, void *ctx)
{
    kva_message_t  *msg;

    msg = ctx;

    if (key == KVA_KEY_ROLE && !msg->role_seen) {
        msg->role_seen = 1;

        return (*ps->pos == '"') ? kva_parse_string(ps, &msg->role)
                                 : kva_skip_value(ps);
    }

    if (key == KVA_KEY_CONTENT && !msg->content_seen) {
        msg->content_seen = 1;

        if (*ps->pos == '"') {
            return kva_parse_string(ps, &ps->out);
        }

        if (*ps->pos == '[') {
            return kva_walk(ps, kva_part_item, NULL);
        }
    }

    return kva_skip_value(ps);
}


/* a content part: a string, or an object whose "text" counts, any "type" */

static int
kva_part_item(kva_parse_t *ps, kva_key_e key, void *ctx)
{
    unsigned   text_seen;
    unsigned  *seen;

    seen = ctx;

    if (seen == NULL) {
        if (*ps->pos == '"') {
            return kva_parse_string(ps, &ps->out);
        }

        if (*ps->pos == '{') {
            text_seen = 0;
            return kva_walk(ps, kva_part_item, &text_seen);
        }

    } else if (key == KVA_KEY_TEXT && !*seen) {
        *seen = 1;

        if (*ps->pos == '"') {
            return kva_parse_string(ps, &ps->out);
        }
    }

    return kva_skip_value(ps);
}


/* a whole string as one prompt: the text and a message separator */

static int
kva_parse_text(kva_parse_t *ps)
{
    if (kva_parse_string(ps, &ps->out) != 0) {
        return -1;
    }

    kva_emit_byte(ps, KVA_SEP_MESSAGE);

    return 0;
}


/*
 * An element of a prompt array (ctx == NULL): a string, a token id or an
 * inner list of token ids; or an element of such an inner list (ctx != NULL),
 * where only token ids count.  Token ids go out as 4 bytes little-endian.
 */

static int
kva_prompt_item(kva_parse_t *ps, kva_key_e key, void *ctx)
{
    uint8_t   c, le[4];
    uint32_t  token;
    unsigned  is_token;

    c = *ps->pos;

    if (ctx == NULL && c == '"') {
        return kva_parse_text(ps);
    }

    if (ctx == NULL && c == '[') {
        if (kva_walk(ps, kva_prompt_item, ps) != 0) {
            return -1;
        }

        kva_emit_byte(ps, KVA_SEP_MESSAGE);
        return 0;
    }

    if (c != '-' && !kva_is_digit(c)) {
        return kva_skip_value(ps);
    }

    if (kva_parse_number(ps, &token, &is_token) != 0) {
        return -1;
    }

    if (is_token) {
        le[0] = (uint8_t) token;
        le[1] = (uint8_t) (token >> 8);
        le[2] = (uint8_t) (token >> 16);
        le[3] = (uint8_t) (token >> 24);
        ps->out.len = kva_put(ps->out.buf, ps->out.len, ps->out.cap, le, 4);
    }

    return 0;
}


/*
 * The tools value may come after the messages, so the messages are written
 * first and shifted once at the end.  Only the part of them that still fits
 * behind the tools is moved, which keeps out an exact prefix.
 */

static void
kva_place_tools(kva_parse_t *ps)
{
    size_t    tlen, head, cap, keep;
    uint8_t  *out;

    out = ps->out.buf;
    cap = ps->out.cap;
    tlen = (size_t) (ps->tools_end - ps->tools_start);
    head = tlen + 1;

    if (head < cap) {
        keep = cap - head;
        keep = (ps->out.len < keep) ? ps->out.len : keep;
        memmove(out + head, out, keep);
    }

    if (cap > 0) {
        memcpy(out, ps->tools_start, (tlen < cap) ? tlen : cap);
    }

    if (tlen < cap) {
        out[tlen] = KVA_SEP_TOOLS;
    }

    ps->out.len += head;
}


kva_prompt_rc_e
kva_prompt_extract(const uint8_t *body, size_t len, uint8_t *out,
    size_t out_cap, kva_prompt_t *p)
{
    int          rc;
    kva_parse_t  ps;

    p->out = out;
    p->out_len = 0;
    p->truncated = 0;
    p->kind = KVA_PROMPT_KIND_NONE;
    p->model_len = 0;

    if (len == 0) {
        return KVA_PROMPT_EMPTY;
    }

    ps.pos = body;
    ps.end = body + len;
    ps.out.buf = out;
    ps.out.len = 0;
    ps.out.cap = out_cap;
    ps.depth = 0;
    ps.rc = KVA_PROMPT_OK;
    ps.model_seen = 0;
    ps.tools_start = NULL;
    ps.tools_end = NULL;

    kva_skip_ws(&ps);

    if (ps.pos < ps.end && *ps.pos == '{') {
        rc = kva_walk(&ps, kva_top_item, p);

    } else {
        rc = kva_skip_value(&ps);
    }

    if (rc == 0) {
        kva_skip_ws(&ps);

        if (ps.pos != ps.end) {
            rc = kva_fail(&ps, KVA_PROMPT_NOT_JSON);
        }
    }

    if (rc != 0) {
        p->kind = KVA_PROMPT_KIND_NONE;
        p->model_len = 0;
        return ps.rc;
    }

    if (p->kind == KVA_PROMPT_KIND_NONE) {
        return KVA_PROMPT_NO_PROMPT;
    }

    if (ps.tools_start != NULL && p->kind != KVA_PROMPT_KIND_PROMPT) {
        kva_place_tools(&ps);
    }

    p->out_len = (ps.out.len < out_cap) ? ps.out.len : out_cap;
    p->truncated = (ps.out.len > out_cap);

    return KVA_PROMPT_OK;
}


const char *
kva_prompt_strerror(kva_prompt_rc_e rc)
{
    static const char  *reasons[] = {
        "ok", "not json", "invalid utf-8", "too deep", "no prompt",
        "empty body"
    };

    if ((unsigned) rc < sizeof(reasons) / sizeof(reasons[0])) {
        return reasons[rc];
    }

    return "unknown error";
}
