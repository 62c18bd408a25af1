/*
 * kv_aware core: the JSON lexer under the prompt scanner (kva_prompt.c).
 *
 * Strict RFC 8259 tokens, strings decoded straight into a bounded sink.
 * Plain text is what a prompt is mostly made of, so strings are scanned a
 * word (or 16 bytes) at a time and only the bytes that need it take the
 * byte-wise path.
 */

#include <string.h>

#if (defined __SSE2__)
#include <emmintrin.h>
#endif

/*
 * AVX2 where the CPU has it, chosen at run time: the build stays for any
 * x86-64, and the scan of a long prompt takes half the steps.
 */
#if (defined __x86_64__ && defined __GNUC__ && !defined KVA_NO_AVX2)
#define KVA_AVX2  1
#include <immintrin.h>
#endif

#include "kva_json_lex.h"


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


static uint64_t kva_special(uint64_t w);
static size_t kva_utf8_valid(const uint8_t *p, const uint8_t *end);
static size_t kva_utf8_encode(uint32_t cp, uint8_t *utf8);
static int kva_hex4(const uint8_t *p, const uint8_t *end, uint32_t *cp);
static int kva_json_escape(kva_json_lex_t *lx, uint8_t *utf8, size_t *n);
#if (defined __SSE2__)
static const uint8_t *kva_skip_plain16(const uint8_t *pos, const uint8_t *end);
#endif
#if (KVA_AVX2)
static const uint8_t *kva_skip_plain32(const uint8_t *pos, const uint8_t *end)
    __attribute__((target("avx2")));
#endif
static const uint8_t *kva_digits(const uint8_t *pos, const uint8_t *end);


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


/* lx->pos is at the backslash; the decoded bytes go to utf8[0 .. *n) */

static int
kva_json_escape(kva_json_lex_t *lx, uint8_t *utf8, size_t *n)
{
    uint32_t        cp, lo;
    const char     *hit;
    const uint8_t  *pos;

    static const char  from[] = "\"\\/bfnrt";
    static const char  to[] = "\"\\/\b\f\n\r\t";

    pos = lx->pos + 1;

    if (pos == lx->end) {
        return kva_json_fail(lx, KVA_PROMPT_NOT_JSON);
    }

    if (*pos != 'u') {
        hit = memchr(from, *pos, sizeof(from) - 1);

        if (hit == NULL) {
            return kva_json_fail(lx, KVA_PROMPT_NOT_JSON);
        }

        utf8[0] = (uint8_t) to[hit - from];
        *n = 1;
        lx->pos = pos + 1;
        return 0;
    }

    if (kva_hex4(pos + 1, lx->end, &cp) != 0) {
        return kva_json_fail(lx, KVA_PROMPT_NOT_JSON);
    }

    pos += 5;

    if (cp >= 0xdc00 && cp <= 0xdfff) {
        return kva_json_fail(lx, KVA_PROMPT_BAD_UTF8);
    }

    if (cp >= 0xd800 && cp <= 0xdbff) {

        if (lx->end - pos < 2 || pos[0] != '\\' || pos[1] != 'u') {
            return kva_json_fail(lx, KVA_PROMPT_BAD_UTF8);
        }

        if (kva_hex4(pos + 2, lx->end, &lo) != 0) {
            return kva_json_fail(lx, KVA_PROMPT_NOT_JSON);
        }

        if (lo < 0xdc00 || lo > 0xdfff) {
            return kva_json_fail(lx, KVA_PROMPT_BAD_UTF8);
        }

        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        pos += 6;
    }

    *n = kva_utf8_encode(cp, utf8);
    lx->pos = pos;

    return 0;
}


/*
 * lx->pos is at the opening quote.  Plain text is scanned a word at a time;
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


#if (KVA_AVX2)

/*
 * The same as kva_skip_plain16(), 32 bytes a step; 64 while nothing is
 * found, two loads tested at once: a long plain string (a system prompt)
 * takes half the tests and branches.
 */

static const uint8_t *
kva_skip_plain32(const uint8_t *pos, const uint8_t *end)
{
    int      mask;
    __m256i  v, w, quote, backslash, space, hits, hits2, any;

    quote = _mm256_set1_epi8('"');
    backslash = _mm256_set1_epi8('\\');
    space = _mm256_set1_epi8(0x20);

    while (end - pos >= 64) {
        v = _mm256_loadu_si256((const __m256i *) pos);
        w = _mm256_loadu_si256((const __m256i *) (pos + 32));
        hits = _mm256_or_si256(_mm256_or_si256(_mm256_cmpeq_epi8(v, quote),
                                  _mm256_cmpeq_epi8(v, backslash)),
                               _mm256_cmpgt_epi8(space, v));
        hits2 = _mm256_or_si256(_mm256_or_si256(_mm256_cmpeq_epi8(w, quote),
                                   _mm256_cmpeq_epi8(w, backslash)),
                                _mm256_cmpgt_epi8(space, w));
        any = _mm256_or_si256(hits, hits2);

        if (!_mm256_testz_si256(any, any)) {
            mask = _mm256_movemask_epi8(hits);

            if (mask) {
                return pos + __builtin_ctz((unsigned) mask);
            }

            mask = _mm256_movemask_epi8(hits2);

            return pos + 32 + __builtin_ctz((unsigned) mask);
        }

        pos += 64;
    }

    while (end - pos >= 32) {
        v = _mm256_loadu_si256((const __m256i *) pos);
        hits = _mm256_or_si256(_mm256_or_si256(_mm256_cmpeq_epi8(v, quote),
                                  _mm256_cmpeq_epi8(v, backslash)),
                               _mm256_cmpgt_epi8(space, v));
        mask = _mm256_movemask_epi8(hits);

        if (mask) {
            return pos + __builtin_ctz((unsigned) mask);
        }

        pos += 32;
    }

    return pos;
}


static int  kva_avx2 = -1;

#endif


int
kva_json_string(kva_json_lex_t *lx, kva_sink_t *sink)
{
    size_t          n;
    uint8_t         c, utf8[4];
    uint64_t        w, m;
    const uint8_t  *pos, *end, *run;

    pos = lx->pos + 1;
    end = lx->end;
    run = pos;

#if (KVA_AVX2)
    if (kva_avx2 < 0) {
        kva_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
#endif

    for ( ;; ) {

        if (lx->seam != NULL && end - pos < KVA_SEAM_K) {
            /* near the window's end: on in the second piece */
            kva_sink_put(sink, run, (size_t) (pos - run));
            lx->pos = pos;
            kva_json_jump(lx);
            pos = lx->pos;
            end = lx->end;
            run = pos;
        }

#if (KVA_AVX2)
        if (kva_avx2 && end - pos >= 64) {
            pos = kva_skip_plain32(pos, end);

            /* stopped at a hit, not for want of 32 bytes: it is the one */
            if (end - pos >= 32) {
                goto hit;
            }
        }
#endif

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

#if (KVA_AVX2)
    hit:
#endif

        if (lx->seam != NULL && end - pos < KVA_SEAM_K) {
            continue;
        }

        if (pos == end) {
            return kva_json_fail(lx, KVA_PROMPT_NOT_JSON);
        }

        c = *pos;

        if (c >= 0x80) {

            /* a whole run: its words would only hit again at once */

            do {
                n = kva_utf8_valid(pos, end);

                if (n == 0) {
                    return kva_json_fail(lx, KVA_PROMPT_BAD_UTF8);
                }

                pos += n;

            } while (pos < end && *pos >= 0x80
                     && (lx->seam == NULL || end - pos >= KVA_SEAM_K));

            continue;
        }

        if (c == '"' || c == '\\') {
            kva_sink_put(sink, run, (size_t) (pos - run));

            if (c == '"') {
                break;
            }

            lx->pos = pos;

            if (kva_json_escape(lx, utf8, &n) != 0) {
                return -1;
            }

            kva_sink_put(sink, utf8, n);
            pos = lx->pos;
            run = pos;
            continue;
        }

        if (c < 0x20) {
            return kva_json_fail(lx, KVA_PROMPT_NOT_JSON);
        }

        pos++;
    }

    lx->pos = pos + 1;

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

int
kva_json_number(kva_json_lex_t *lx, uint32_t *token, unsigned *is_token)
{
    uint64_t        v;
    const uint8_t  *pos, *end, *digits, *p;

    end = lx->end;

    if (lx->seam != NULL) {
        /* a number that may run past the window: a copy must lex it */
        for (p = lx->pos;
             p < end && (kva_is_digit(*p) || *p == '-' || *p == '+'
                         || *p == '.' || (*p | 0x20) == 'e');
             p++)
        { /* void */ }

        if (p == end) {
            return kva_json_fail(lx, KVA_PROMPT_SEAM);
        }
    }

    digits = lx->pos + (*lx->pos == '-');

    if (digits < end && *digits == '0') {
        pos = digits + 1;

    } else {
        pos = kva_digits(digits, end);

        if (pos == digits) {
            return kva_json_fail(lx, KVA_PROMPT_NOT_JSON);
        }
    }

    v = 0;

    if (pos - digits <= 10) {
        for (p = digits; p < pos; p++) {
            v = v * 10 + (uint64_t) (*p - '0');
        }
    }

    *is_token = (pos - digits <= 10 && v <= 0xffffffff
                 && (digits == lx->pos || v == 0));
    *token = (uint32_t) v;

    if (pos < end && *pos == '.') {
        p = pos + 1;
        pos = kva_digits(p, end);

        if (pos == p) {
            return kva_json_fail(lx, KVA_PROMPT_NOT_JSON);
        }

        *is_token = 0;
    }

    if (pos < end && (*pos | 0x20) == 'e') {
        p = pos + 1;
        p += (p < end && (*p == '+' || *p == '-'));
        pos = kva_digits(p, end);

        if (pos == p) {
            return kva_json_fail(lx, KVA_PROMPT_NOT_JSON);
        }

        *is_token = 0;
    }

    lx->pos = pos;

    return 0;
}


void
kva_json_jump(kva_json_lex_t *lx)
{
    lx->pos = lx->next + (lx->pos - lx->seam);
    lx->end = lx->next_end;
    lx->seam = NULL;
}


int
kva_json_literal(kva_json_lex_t *lx, const char *lit, size_t n)
{
    if ((size_t) (lx->end - lx->pos) < n || memcmp(lx->pos, lit, n) != 0) {
        return kva_json_fail(lx, KVA_PROMPT_NOT_JSON);
    }

    lx->pos += n;

    return 0;
}
