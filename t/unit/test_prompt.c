/*
 * Unit tests for kva_prompt_extract(): hand-written cases (shapes, key
 * orders, tools, escapes and UTF-8, errors, depth, truncation).  The
 * randomized differential test against jansson is in test_prompt_ref.c.
 * Prints TAP.
 *
 *   make $PWD/build/unit/test_prompt && build/unit/test_prompt
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kva_prompt.h"
#include "kva_token_answer.h"
#include "kva_token.h"
#include "tap.h"
#include "prompt_gen.h"


#define R                 "\x1f"        /* KVA_SEP_ROLE */
#define M                 "\x1e"        /* KVA_SEP_MESSAGE */
#define T                 "\x1d"        /* KVA_SEP_TOOLS */

#define S(s)              (const uint8_t *) (s), sizeof(s) - 1


static void expect_ok(const char *name, const uint8_t *body, size_t len,
    const uint8_t *want, size_t want_len, unsigned kind);
static void expect_rc(const char *name, const uint8_t *body, size_t len,
    kva_prompt_rc_e want);
static void expect_model(const char *name, const uint8_t *body, size_t len,
    kva_prompt_rc_e want_rc, const char *model, size_t model_len);
static void expect_prefixes(const char *name, const uint8_t *body,
    size_t len);
static void deep_body(buf_t *b, unsigned depth, const char *open,
    const char *close);
static void test_shapes(void);
static void test_tools(void);
static void test_strings(void);
static void test_first_hit(void);
static void test_errors(void);
static void test_truncation(void);
static void test_token_ids(void);
static void test_salt(void);
static void test_token_answer(void);


static void
expect_ok(const char *name, const uint8_t *body, size_t len,
    const uint8_t *want, size_t want_len, unsigned kind)
{
    int              good;
    size_t           at;
    buf_t            out;
    kva_prompt_t     p;
    kva_prompt_rc_e  rc;

    memset(&out, 0, sizeof(out));

    good = (run(body, len, len + KVA_PROMPT_OUT_SLACK, &p, &rc, &out) == 0)
           && rc == KVA_PROMPT_OK && p.kind == kind && !p.truncated
           && p.out == out.p && p.out_len == want_len
           && memcmp(out.p, want, want_len) == 0;

    ok(good, "%s", name);

    if (!good) {
        printf("# rc %d (%s) kind %u truncated %u\n", rc,
               kva_prompt_strerror(rc), (unsigned) p.kind,
               (unsigned) p.truncated);
        at = first_diff(out.p, p.out_len, want, want_len);
        hexdump("got", out.p, p.out_len, at);
        hexdump("want", want, want_len, at);
    }

    free(out.p);
}


static void
expect_rc(const char *name, const uint8_t *body, size_t len,
    kva_prompt_rc_e want)
{
    int              good;
    buf_t            out;
    kva_prompt_t     p;
    kva_prompt_rc_e  rc, rc2;

    memset(&out, 0, sizeof(out));

    good = (run(body, len, len + KVA_PROMPT_OUT_SLACK, &p, &rc, &out) == 0)
           && rc == want
           && (rc == KVA_PROMPT_OK || p.out_len == 0);

    /* validation alone must agree */
    rc2 = kva_prompt_extract(body, len, NULL, 0, &p);
    good = good && rc2 == want;

    ok(good, "%s: %s", name, kva_prompt_strerror(want));

    if (!good) {
        printf("# got %d (%s), validate-only %d (%s)\n", rc,
               kva_prompt_strerror(rc), rc2, kva_prompt_strerror(rc2));
    }

    free(out.p);
}


static void
expect_model(const char *name, const uint8_t *body, size_t len,
    kva_prompt_rc_e want_rc, const char *model, size_t model_len)
{
    int              good;
    kva_prompt_t     p;
    kva_prompt_rc_e  rc;

    rc = kva_prompt_extract(body, len, NULL, 0, &p);

    good = rc == want_rc && p.model_len == model_len
           && memcmp(p.model, model, model_len) == 0;

    ok(good, "%s", name);

    if (!good) {
        printf("# rc %d model_len %zu\n", rc, p.model_len);
    }
}


/* every out_cap from 0 to past the full length gives an exact prefix */

static void
expect_prefixes(const char *name, const uint8_t *body, size_t len)
{
    int              good;
    size_t           cap, full_len, want;
    buf_t            out, full;
    kva_prompt_t     p;
    kva_prompt_rc_e  rc;

    memset(&out, 0, sizeof(out));
    memset(&full, 0, sizeof(full));

    good = (run(body, len, len * 4 + 64, &p, &rc, &full) == 0)
           && rc == KVA_PROMPT_OK && !p.truncated;
    full_len = p.out_len;

    for (cap = 0; good && cap <= full_len + 2; cap++) {
        want = (cap < full_len) ? cap : full_len;

        good = (run(body, len, cap, &p, &rc, &out) == 0)
               && rc == KVA_PROMPT_OK && p.out_len == want
               && p.truncated == (full_len > cap)
               && memcmp(out.p, full.p, want) == 0;

        if (!good) {
            printf("# out_cap %zu: rc %d out_len %zu truncated %u\n", cap,
                   rc, p.out_len, (unsigned) p.truncated);
        }
    }

    rc = kva_prompt_extract(body, len, NULL, 0, &p);
    good = good && rc == KVA_PROMPT_OK && p.out_len == 0
           && p.truncated == (full_len > 0);

    ok(good, "%s: every out_cap 0..%zu is an exact prefix", name,
        full_len + 2);

    free(out.p);
    free(full.p);
}


static void
deep_body(buf_t *b, unsigned depth, const char *open, const char *close)
{
    unsigned  i;

    b->len = 0;
    buf_puts(b, "{\"prompt\":\"a\",\"x\":");

    for (i = 1; i < depth; i++) {
        buf_puts(b, open);
    }

    buf_puts(b, "1");

    for (i = 1; i < depth; i++) {
        buf_puts(b, close);
    }

    buf_puts(b, "}");
}


static void
test_shapes(void)
{
    expect_ok("messages: one message",
        S("{\"model\":\"gpt-4\",\"messages\":[{\"role\":\"user\","
          "\"content\":\"hi\"}]}"),
        S("hi" R "user" M), KVA_PROMPT_KIND_MESSAGES);

    expect_ok("messages: role after content",
        S("{\"messages\":[{\"content\":\"hi\",\"role\":\"user\"}]}"),
        S("hi" R "user" M), KVA_PROMPT_KIND_MESSAGES);

    expect_ok("messages: several, whitespace everywhere",
        S(" \r\n\t{ \"messages\" : [ { \"role\" : \"system\" , \"content\""
          " : \"be brief\" } ,\n {\"role\":\"user\",\"content\":\"hi\"} ] "
          "} \n"),
        S("be brief" R "system" M "hi" R "user" M), KVA_PROMPT_KIND_MESSAGES);

    expect_ok("messages: content parts",
        S("{\"messages\":[{\"role\":\"user\",\"content\":["
          "{\"type\":\"text\",\"text\":\"a\"},\"b\","
          "{\"type\":\"image_url\",\"image_url\":{\"url\":\"u\"}},"
          "{\"text\":\"c\",\"type\":\"whatever\"},5,null,[\"x\"],"
          "{\"text\":7},{\"text\":null,\"text\":\"dup\"}]}]}"),
        S("abc" R "user" M), KVA_PROMPT_KIND_MESSAGES);

    expect_ok("messages: null, missing and odd content and role",
        S("{\"messages\":[{\"role\":\"assistant\",\"content\":null},"
          "{\"content\":\"x\"},{\"role\":5,\"content\":{\"a\":1}},{},"
          "{\"role\":\"tool\",\"content\":true,\"name\":\"n\","
          "\"tool_calls\":[{\"id\":\"1\",\"function\":{\"a\":[]}}]}]}"),
        S(R "assistant" M "x" R M R M R M R "tool" M),
        KVA_PROMPT_KIND_MESSAGES);

    expect_ok("messages: non-object elements contribute nothing",
        S("{\"messages\":[1,\"str\",null,[],[{\"role\":\"r\"}],"
          "{\"role\":\"user\",\"content\":\"x\"}]}"),
        S("x" R "user" M), KVA_PROMPT_KIND_MESSAGES);

    expect_ok("messages: role keeps its first 64 bytes",
        S("{\"messages\":[{\"role\":\"0123456789012345678901234567890123"
          "456789012345678901234567890123456789\",\"content\":\"c\"}]}"),
        S("c" R "0123456789012345678901234567890123456789012345678901"
          "234567890123" M), KVA_PROMPT_KIND_MESSAGES);

    expect_ok("messages: empty array",
        S("{\"messages\":[]}"), S(""), KVA_PROMPT_KIND_MESSAGES);

    expect_ok("messages: duplicate keys, the first one wins",
        S("{\"model\":\"a\",\"model\":\"b\",\"messages\":[{\"content\":\"x\","
          "\"content\":\"y\",\"role\":\"r\",\"role\":\"s\"}],"
          "\"messages\":[{\"content\":\"z\"}]}"),
        S("x" R "r" M), KVA_PROMPT_KIND_MESSAGES);

    expect_ok("messages: escaped keys are decoded",
        S("{\"m\\u0065ssages\":[{\"r\\u006fle\":\"user\","
          "\"\\u0063ontent\":\"hi\"}]}"),
        S("hi" R "user" M), KVA_PROMPT_KIND_MESSAGES);

    expect_ok("prompt: string",
        S("{\"prompt\":\"hello\",\"max_tokens\":5}"),
        S("hello" M), KVA_PROMPT_KIND_PROMPT);

    expect_ok("prompt: array of strings",
        S("{\"prompt\":[\"a\",\"b\",\"\"]}"),
        S("a" M "b" M M), KVA_PROMPT_KIND_PROMPT);

    expect_ok("prompt: token ids, out of range and fractions skipped",
        S("{\"prompt\":[1,256,4294967295,4294967296,-1,1.5,1e2,-0,0,"
          "99999999999999999999999,18446744073709551621,true,null,"
          "{\"a\":1}]}"),
        S("\x01\x00\x00\x00" "\x00\x01\x00\x00" "\xff\xff\xff\xff"
          "\x00\x00\x00\x00" "\x00\x00\x00\x00"),
        KVA_PROMPT_KIND_PROMPT);

    expect_ok("prompt: nested token lists",
        S("{\"prompt\":[[1,2],[3,\"x\",4.0,[5],-2],[],\"s\",[7]]}"),
        S("\x01\x00\x00\x00" "\x02\x00\x00\x00" M "\x03\x00\x00\x00" M M
          "s" M "\x07\x00\x00\x00" M),
        KVA_PROMPT_KIND_PROMPT);

    expect_ok("input: string",
        S("{\"input\":\"hi\"}"), S("hi" M), KVA_PROMPT_KIND_INPUT);

    expect_ok("input: array of strings and messages",
        S("{\"input\":[\"s\",{\"role\":\"user\",\"content\":[{\"type\":"
          "\"input_text\",\"text\":\"x\"}]},5,{\"type\":\"message\"}]}"),
        S("s" M "x" R "user" M R M), KVA_PROMPT_KIND_INPUT);

    expect_ok("first prompt-bearing key decides: prompt before messages",
        S("{\"prompt\":\"p\",\"messages\":[{\"role\":\"u\","
          "\"content\":\"m\"}],\"input\":\"i\"}"),
        S("p" M), KVA_PROMPT_KIND_PROMPT);

    expect_ok("first prompt-bearing key decides: messages not an array",
        S("{\"messages\":\"str\",\"input\":5,\"prompt\":\"p\"}"),
        S("p" M), KVA_PROMPT_KIND_PROMPT);
}


static void
test_tools(void)
{
    expect_ok("tools: raw value before messages",
        S("{\"tools\":[{\"type\":\"function\"}],\"messages\":[{\"role\":"
          "\"user\",\"content\":\"hi\"}]}"),
        S("[{\"type\":\"function\"}]" T "hi" R "user" M),
        KVA_PROMPT_KIND_MESSAGES);

    expect_ok("tools: after messages, raw bytes kept",
        S("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
          "\"tools\" :  [ 1, \"\\u00e9\" ] \n}"),
        S("[ 1, \"\\u00e9\" ]" T "hi" R "user" M), KVA_PROMPT_KIND_MESSAGES);

    expect_ok("tools: with input",
        S("{\"input\":\"q\",\"tools\":{}}"),
        S("{}" T "q" M), KVA_PROMPT_KIND_INPUT);

    expect_ok("tools: ignored with prompt",
        S("{\"tools\":[1],\"prompt\":\"q\"}"),
        S("q" M), KVA_PROMPT_KIND_PROMPT);

    expect_ok("tools: first one wins",
        S("{\"tools\":1,\"tools\":2,\"messages\":[]}"),
        S("1" T), KVA_PROMPT_KIND_MESSAGES);
}


static void
test_strings(void)
{
    expect_ok("escapes: short forms",
        S("{\"prompt\":\"a\\\"b\\\\c\\/d\\be\\ff\\ng\\rh\\ti\"}"),
        S("a\"b\\c/d\be\ff\ng\rh\ti" M), KVA_PROMPT_KIND_PROMPT);

    expect_ok("escapes: \\u BMP and surrogate pairs",
        S("{\"prompt\":\"\\u0041\\u00e9\\u20AC\\uffff\\ud83d\\ude00"
          "\\uDBFF\\uDFFF\\u007f\\u0080\\u07ff\\u0800\"}"),
        S("A\xc3\xa9\xe2\x82\xac\xef\xbf\xbf\xf0\x9f\x98\x80"
          "\xf4\x8f\xbf\xbf\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80" M),
        KVA_PROMPT_KIND_PROMPT);

    expect_ok("escapes: \\u0000 emits a NUL byte",
        S("{\"prompt\":\"a\\u0000b\"}"), S("a\0b" M),
        KVA_PROMPT_KIND_PROMPT);

    expect_ok("raw UTF-8 of every length",
        S("{\"prompt\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf"
          "\xbf\xed\x9f\xbf\xee\x80\x80 plain ascii text\"}"),
        S("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\xed\x9f\xbf"
          "\xee\x80\x80 plain ascii text" M),
        KVA_PROMPT_KIND_PROMPT);

    expect_ok("long string crossing words, escapes at odd offsets",
        S("{\"prompt\":\"0123456789abcdef0123456\\n789abcdef\\\"0123456789"
          "abcdef\xc3\xa9" "0123456789abcdef\\u00e9xyz\"}"),
        S("0123456789abcdef0123456\n789abcdef\"0123456789abcdef\xc3\xa9"
          "0123456789abcdef\xc3\xa9xyz" M),
        KVA_PROMPT_KIND_PROMPT);

    expect_ok("numbers and literals elsewhere are validated",
        S("{\"t\":-0.5e+10,\"u\":0,\"v\":[1E5,2e-3,-12.50,0.0,1e0],"
          "\"w\":[true,false,null],\"prompt\":\"a\"}"),
        S("a" M), KVA_PROMPT_KIND_PROMPT);

    expect_model("model: decoded",
        S("{\"model\":\"m\\u00e9\",\"prompt\":\"a\"}"), KVA_PROMPT_OK,
        "m\xc3\xa9", 3);

    expect_model("model: non-string ignored",
        S("{\"model\":[\"x\"],\"prompt\":\"a\"}"), KVA_PROMPT_OK, "", 0);

    expect_model("model: kept without a prompt",
        S("{\"model\":\"m\"}"), KVA_PROMPT_NO_PROMPT, "m", 1);

    expect_model("model: first 256 bytes of a longer one",
        S("{\"model\":\""
          "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
          "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
          "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
          "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
          "XYZ\",\"prompt\":\"a\"}"), KVA_PROMPT_OK,
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        256);
}


/*
 * One special byte at every offset of a 400-byte plain run: the scan
 * steps 32, 16 and 8 bytes at a time (a wider step was tried), and
 * whichever step meets it must stop right there (an escape, a UTF-8
 * character, the closing quote or a raw control byte, which JSON
 * forbids).
 */
static void
test_first_hit(void)
{
    size_t           run_len, k, len, want_len, t, bad;
    uint8_t          body[512], want[512];
    buf_t            out;
    kva_prompt_t     p;
    kva_prompt_rc_e  rc, want_rc;

    static const struct {
        const char  *name;
        const char  *in;            /* what goes into the run at k */
        const char  *decoded;       /* what it decodes to */
        int          fails;
    } hits[] = {
        { "an escape", "\\n", "\n", 0 },
        { "a UTF-8 character", "\xc3\xa9", "\xc3\xa9", 0 },
        { "the closing quote", "\"}", NULL, 0 },
        { "a raw control byte", "\x01", NULL, 1 },
    };

    memset(&out, 0, sizeof(out));
    run_len = 400;

    for (t = 0; t < sizeof(hits) / sizeof(hits[0]); t++) {
        bad = 0;

        for (k = 0; k <= run_len && bad == 0; k++) {
            len = (size_t) sprintf((char *) body, "{\"prompt\":\"");
            memset(body + len, 'a', k);
            len += k;
            len += (size_t) sprintf((char *) body + len, "%s", hits[t].in);

            if (hits[t].decoded == NULL && !hits[t].fails) {
                /* the string ends at k */
                want_len = k;

            } else {
                memset(body + len, 'b', run_len - k);
                len += run_len - k;
                len += (size_t) sprintf((char *) body + len, "\"}");
                want_len = k;
            }

            memset(want, 'a', k);

            if (hits[t].decoded) {
                memcpy(want + k, hits[t].decoded, strlen(hits[t].decoded));
                want_len += strlen(hits[t].decoded);
                memset(want + want_len, 'b', run_len - k);
                want_len += run_len - k;
            }

            want[want_len++] = 0x1e;    /* M */
            want_rc = hits[t].fails ? KVA_PROMPT_NOT_JSON : KVA_PROMPT_OK;

            if (run(body, len, len + KVA_PROMPT_OUT_SLACK, &p, &rc, &out) != 0
                || rc != want_rc
                || (rc == KVA_PROMPT_OK
                    && (p.out_len != want_len
                        || memcmp(p.out, want, want_len) != 0)))
            {
                bad = k + 1;
            }
        }

        ok(bad == 0, "first hit in a long run: %s at every offset%s",
           hits[t].name, bad ? " (failed)" : "");

        if (bad) {
            printf("# at offset %zu: rc %d (%s)\n", bad - 1, rc,
                   kva_prompt_strerror(rc));
        }
    }

    free(out.p);
}


static void
test_errors(void)
{
    size_t  i;
    buf_t   b;

    static const struct {
        const char       *name;
        const char       *body;
        kva_prompt_rc_e   rc;
    } cases[] = {
        { "whitespace only", " \n\t\r ", KVA_PROMPT_NOT_JSON },
        { "top-level array", "[1,2]", KVA_PROMPT_NO_PROMPT },
        { "top-level string", "\"prompt\"", KVA_PROMPT_NO_PROMPT },
        { "top-level number", " 12 ", KVA_PROMPT_NO_PROMPT },
        { "no prompt key", "{\"model\":\"m\",\"x\":[]}", KVA_PROMPT_NO_PROMPT },
        { "empty object", "{}", KVA_PROMPT_NO_PROMPT },
        { "prompt not a string or array", "{\"prompt\":5}",
          KVA_PROMPT_NO_PROMPT },
        { "unterminated object", "{\"prompt\":\"a\"", KVA_PROMPT_NOT_JSON },
        { "unterminated string", "{\"prompt\":\"a}", KVA_PROMPT_NOT_JSON },
        { "missing colon", "{\"prompt\" \"a\"}", KVA_PROMPT_NOT_JSON },
        { "unquoted key", "{prompt:\"a\"}", KVA_PROMPT_NOT_JSON },
        { "trailing comma in object", "{\"prompt\":\"a\",}",
          KVA_PROMPT_NOT_JSON },
        { "trailing comma in array", "{\"prompt\":[\"a\",]}",
          KVA_PROMPT_NOT_JSON },
        { "leading comma in array", "{\"prompt\":[,\"a\"]}",
          KVA_PROMPT_NOT_JSON },
        { "missing comma", "{\"prompt\":[\"a\" \"b\"]}", KVA_PROMPT_NOT_JSON },
        { "extra close", "{\"prompt\":\"a\"}}", KVA_PROMPT_NOT_JSON },
        { "trailing garbage", "{\"prompt\":\"a\"} x", KVA_PROMPT_NOT_JSON },
        { "two values", "{\"prompt\":\"a\"}{}", KVA_PROMPT_NOT_JSON },
        { "mismatched brackets", "{\"prompt\":[\"a\"}}",
          KVA_PROMPT_NOT_JSON },
        { "leading zero", "{\"a\":01,\"prompt\":\"x\"}", KVA_PROMPT_NOT_JSON },
        { "bare fraction dot", "{\"a\":1.,\"prompt\":\"x\"}",
          KVA_PROMPT_NOT_JSON },
        { "bare minus", "{\"a\":-,\"prompt\":\"x\"}", KVA_PROMPT_NOT_JSON },
        { "leading dot", "{\"a\":.5,\"prompt\":\"x\"}", KVA_PROMPT_NOT_JSON },
        { "plus sign", "{\"a\":+1,\"prompt\":\"x\"}", KVA_PROMPT_NOT_JSON },
        { "empty exponent", "{\"a\":1e,\"prompt\":\"x\"}",
          KVA_PROMPT_NOT_JSON },
        { "signed empty exponent", "{\"a\":1e+,\"prompt\":\"x\"}",
          KVA_PROMPT_NOT_JSON },
        { "hex number", "{\"a\":0x10,\"prompt\":\"x\"}", KVA_PROMPT_NOT_JSON },
        { "NaN", "{\"a\":NaN,\"prompt\":\"x\"}", KVA_PROMPT_NOT_JSON },
        { "short literal", "{\"a\":tru,\"prompt\":\"x\"}",
          KVA_PROMPT_NOT_JSON },
        { "capital literal", "{\"a\":True,\"prompt\":\"x\"}",
          KVA_PROMPT_NOT_JSON },
        { "literal cut at end", "{\"prompt\":\"x\",\"a\":nul",
          KVA_PROMPT_NOT_JSON },
        { "raw newline in string", "{\"prompt\":\"a\nb\"}",
          KVA_PROMPT_NOT_JSON },
        { "raw tab in string", "{\"prompt\":\"a\tb\"}", KVA_PROMPT_NOT_JSON },
        { "raw 0x1f in key", "{\"a\x1f\":1,\"prompt\":\"x\"}",
          KVA_PROMPT_NOT_JSON },
        { "unknown escape", "{\"prompt\":\"\\x41\"}", KVA_PROMPT_NOT_JSON },
        { "escaped quote char", "{\"prompt\":\"\\'\"}", KVA_PROMPT_NOT_JSON },
        { "capital U escape", "{\"prompt\":\"\\U0041\"}",
          KVA_PROMPT_NOT_JSON },
        { "short \\u", "{\"prompt\":\"\\u12\"}", KVA_PROMPT_NOT_JSON },
        { "bad hex in \\u", "{\"prompt\":\"\\u12g4\"}", KVA_PROMPT_NOT_JSON },
        { "backslash at end", "{\"prompt\":\"\\", KVA_PROMPT_NOT_JSON },
        { "\\u at end", "{\"prompt\":\"\\u00", KVA_PROMPT_NOT_JSON },
        { "lone high surrogate", "{\"prompt\":\"\\ud800\"}",
          KVA_PROMPT_BAD_UTF8 },
        { "lone low surrogate", "{\"prompt\":\"\\udc00\"}",
          KVA_PROMPT_BAD_UTF8 },
        { "high surrogate then BMP", "{\"prompt\":\"\\ud800\\u0041\"}",
          KVA_PROMPT_BAD_UTF8 },
        { "high surrogate then text", "{\"prompt\":\"\\ud800xx\"}",
          KVA_PROMPT_BAD_UTF8 },
        { "two high surrogates", "{\"prompt\":\"\\ud800\\ud800\"}",
          KVA_PROMPT_BAD_UTF8 },
        { "lone surrogate in a skipped key",
          "{\"\\udfff\":1,\"prompt\":\"a\"}", KVA_PROMPT_BAD_UTF8 },
        { "continuation byte", "{\"prompt\":\"\x80\"}", KVA_PROMPT_BAD_UTF8 },
        { "overlong 2 bytes", "{\"prompt\":\"\xc0\xaf\"}",
          KVA_PROMPT_BAD_UTF8 },
        { "overlong 2 bytes c1", "{\"prompt\":\"\xc1\xbf\"}",
          KVA_PROMPT_BAD_UTF8 },
        { "overlong 3 bytes", "{\"prompt\":\"\xe0\x80\xaf\"}",
          KVA_PROMPT_BAD_UTF8 },
        { "overlong 4 bytes", "{\"prompt\":\"\xf0\x80\x80\xaf\"}",
          KVA_PROMPT_BAD_UTF8 },
        { "UTF-8 surrogate", "{\"prompt\":\"\xed\xa0\x80\"}",
          KVA_PROMPT_BAD_UTF8 },
        { "over U+10FFFF", "{\"prompt\":\"\xf4\x90\x80\x80\"}",
          KVA_PROMPT_BAD_UTF8 },
        { "f5 lead byte", "{\"prompt\":\"\xf5\x80\x80\x80\"}",
          KVA_PROMPT_BAD_UTF8 },
        { "ff byte", "{\"prompt\":\"\xff\"}", KVA_PROMPT_BAD_UTF8 },
        { "truncated sequence", "{\"prompt\":\"\xe2\x82\"}",
          KVA_PROMPT_BAD_UTF8 },
        { "bad continuation", "{\"prompt\":\"\xe2\x28\xa1\"}",
          KVA_PROMPT_BAD_UTF8 },
        { "invalid UTF-8 in a skipped value",
          "{\"prompt\":\"a\",\"x\":[\"\xc3\"]}", KVA_PROMPT_BAD_UTF8 },
        { "invalid UTF-8 in a role",
          "{\"messages\":[{\"role\":\"\xc3(\",\"content\":\"a\"}]}",
          KVA_PROMPT_BAD_UTF8 },
        { "non-ASCII outside strings", "{\"prompt\":\"a\"}\xc3\xa9",
          KVA_PROMPT_NOT_JSON },
        { "truncated sequence at the end", "{\"prompt\":\"\xf0\x9f\x98",
          KVA_PROMPT_BAD_UTF8 },
    };

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        expect_rc(cases[i].name, (const uint8_t *) cases[i].body,
                  strlen(cases[i].body), cases[i].rc);
    }

    expect_rc("empty body", S(""), KVA_PROMPT_EMPTY);
    expect_rc("raw NUL in string", S("{\"prompt\":\"a\0b\"}"),
              KVA_PROMPT_NOT_JSON);
    expect_rc("raw NUL after value", S("{\"prompt\":\"a\"}\0"),
              KVA_PROMPT_NOT_JSON);

    memset(&b, 0, sizeof(b));

    deep_body(&b, KVA_PROMPT_MAX_DEPTH, "[", "]");
    expect_rc("depth 64 arrays", b.p, b.len, KVA_PROMPT_OK);

    deep_body(&b, KVA_PROMPT_MAX_DEPTH + 1, "[", "]");
    expect_rc("depth 65 arrays", b.p, b.len, KVA_PROMPT_TOO_DEEP);

    deep_body(&b, KVA_PROMPT_MAX_DEPTH, "{\"k\":", "}");
    expect_rc("depth 64 objects", b.p, b.len, KVA_PROMPT_OK);

    deep_body(&b, KVA_PROMPT_MAX_DEPTH + 1, "{\"k\":", "}");
    expect_rc("depth 65 objects", b.p, b.len, KVA_PROMPT_TOO_DEEP);

    b.len = 0;

    for (i = 0; i < 1000000; i++) {
        buf_putc(&b, '[');
    }

    expect_rc("a million open brackets", b.p, b.len, KVA_PROMPT_TOO_DEEP);

    b.len = 0;
    buf_puts(&b, "{\"messages\":[{\"content\":[");

    for (i = 0; i < 70; i++) {
        buf_putc(&b, '[');
    }

    expect_rc("deep inside content parts", b.p, b.len, KVA_PROMPT_TOO_DEEP);

    free(b.p);
}


static void
test_truncation(void)
{
    expect_prefixes("truncation: messages",
        S("{\"messages\":[{\"role\":\"system\",\"content\":\"be brief and "
          "precise\"},{\"content\":[\"a\",{\"text\":\"bc\"}],\"role\":"
          "\"user\"}]}"));

    expect_prefixes("truncation: tools before messages",
        S("{\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"messages\":"
          "[{\"role\":\"user\",\"content\":\"hello there\"}]}"));

    expect_prefixes("truncation: tools after input",
        S("{\"input\":[\"one\",{\"role\":\"user\",\"content\":\"two\"}],"
          "\"tools\":[{\"type\":\"web_search\"}]}"));

    expect_prefixes("truncation: token ids",
        S("{\"prompt\":[[1,2,3],4,\"x\",[5]]}"));

    expect_prefixes("truncation: escapes and UTF-8",
        S("{\"prompt\":\"\\u00e9\\ud83d\\ude00\xe2\x82\xac\\n0123456789abcdef"
          "0123456789\"}"));
}


/* token_ids and nids: a flat array of ids only, for keys=tokens */
static void
test_token_ids(void)
{
    size_t           i;
    uint8_t          out[256];
    kva_prompt_t     p;
    kva_prompt_rc_e  rc;

    static const struct {
        const char  *body;
        unsigned     ids;
        size_t       n;
    } cases[] = {
        { "{\"prompt\":[1,2,3]}", 1, 3 },
        { "{\"model\":\"m\",\"prompt\":[ 0 , 4294967295 ]}", 1, 2 },
        { "{\"prompt\":[-0]}", 1, 1 },
        { "{\"prompt\":[]}", 0, 0 },
        { "{\"prompt\":[1,\"x\"]}", 0, 0 },
        { "{\"prompt\":[1,[2]]}", 0, 0 },
        { "{\"prompt\":[[1,2]]}", 0, 0 },
        { "{\"prompt\":[1,4294967296]}", 0, 0 },
        { "{\"prompt\":[1,-1]}", 0, 0 },
        { "{\"prompt\":[1,1.5]}", 0, 0 },
        { "{\"prompt\":[1,null]}", 0, 0 },
        { "{\"prompt\":\"1 2 3\"}", 0, 0 },
        { "{\"messages\":[{\"content\":\"x\"}],\"prompt\":[1]}", 0, 0 },
        { "{\"input\":[1,2]}", 0, 0 },
    };

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        rc = kva_prompt_extract((const uint8_t *) cases[i].body,
                                strlen(cases[i].body), out, sizeof(out), &p);

        ok(rc == KVA_PROMPT_OK && p.token_ids == cases[i].ids
           && p.nids == cases[i].n,
           "token ids: %s -> %u, %zu", cases[i].body, cases[i].ids,
           cases[i].n);
    }

    /* validation only gives the same verdict */
    rc = kva_prompt_extract(S("{\"prompt\":[7,8]}"), NULL, 0, &p);
    ok(rc == KVA_PROMPT_OK && p.token_ids && p.nids == 2,
       "token ids: validation only");

    rc = kva_prompt_extract(S("{\"prompt\":[7,8]"), out, sizeof(out), &p);
    ok(rc != KVA_PROMPT_OK && !p.token_ids && p.salt == NULL,
       "token ids: invalid JSON says nothing");

    /* 4 bytes out for each id, which takes 2 or more of the body */
    rc = kva_prompt_extract(S("{\"prompt\":[1,2,3,4,5,6,7,8,9,0]}"), out,
                            2 * 31 + KVA_PROMPT_OUT_SLACK, &p);
    ok(rc == KVA_PROMPT_OK && !p.truncated && p.out_len == 40
       && out[36] == 0 && out[4] == 2,
       "token ids: 2 * len + slack holds them all");
}


static void
test_salt(void)
{
    size_t           n;
    uint8_t          out[64], dec[64], scratch[64 + KVA_TOKEN_SALT_SLACK];
    uint8_t          want[300];
    uint64_t         a, b;
    kva_prompt_t     p;
    kva_prompt_rc_e  rc;

    rc = kva_prompt_extract(S("{\"cache_salt\":\"s\\u00e9\",\"prompt\":\"x\","
                              "\"cache_salt\":\"other\"}"),
                            out, sizeof(out), &p);
    ok(rc == KVA_PROMPT_OK && p.salt != NULL && p.salt_len == 9
       && memcmp(p.salt, "\"s\\u00e9\"", 9) == 0,
       "salt: the first top-level cache_salt, as it is in the body");

    n = kva_prompt_salt(p.salt, p.salt_len, dec);
    ok(n == 3 && memcmp(dec, "s\xc3\xa9", 3) == 0, "salt: decoded");

    rc = kva_prompt_extract(S("{\"cache_salt\":5,\"prompt\":\"x\","
                              "\"messages\":[{\"cache_salt\":\"no\"}]}"),
                            out, sizeof(out), &p);
    ok(rc == KVA_PROMPT_OK && p.salt == NULL,
       "salt: not a string, or not at the top: none");

    /* msgpack of ["s"]: 0x91 0xa1 's', as kvbridge packs extra keys */
    a = kva_token_salt((const uint8_t *) "s", 1, scratch);
    b = kva_token_extra((const uint8_t *) "\x91\xa1s", 3);
    ok(a == b, "salt: msgpack fixstr");

    memset(want, 'z', sizeof(want));
    want[0] = 0x91;
    want[1] = 0xd9;
    want[2] = 40;
    ok(kva_token_salt(want + 3, 40, scratch)
       == kva_token_extra(want, 43), "salt: msgpack str8");

    ok(kva_token_salt((const uint8_t *) "s", 1, scratch)
       != kva_token_salt((const uint8_t *) "t", 1, scratch),
       "salt: different salts, different keys");
}


static void
test_token_answer(void)
{
    size_t           i, n;
    uint32_t         ids[8];
    kva_prompt_rc_e  rc;

    static const struct {
        const char       *body;
        kva_prompt_rc_e   rc;
        size_t            n;
        uint32_t          first;
    } cases[] = {
        { "{\"count\":3,\"max_model_len\":9,\"tokens\":[5,6,7],"
          "\"token_strs\":null}", KVA_PROMPT_OK, 3, 5 },
        { "{\"token_ids\":[9]}", KVA_PROMPT_OK, 1, 9 },
        { "{\"request\":{\"x\":[{\"prompt_token_ids\":[4,4]}]}}",
          KVA_PROMPT_OK, 2, 4 },
        { "[{\"tokens\":[1]}]", KVA_PROMPT_OK, 1, 1 },
        { "{\"tokens\":[1,\"a\"],\"token_ids\":[2,3]}",
          KVA_PROMPT_OK, 2, 2 },
        { "{\"tokens\":[1,2.5]}", KVA_PROMPT_NO_PROMPT, 0, 0 },
        { "{\"tokens\":\"1 2\"}", KVA_PROMPT_NO_PROMPT, 0, 0 },
        { "{\"tokens\":[]}", KVA_PROMPT_OK, 0, 0 },
        { "{\"count\":0}", KVA_PROMPT_NO_PROMPT, 0, 0 },
        { "{\"tokens\":[1,2]", KVA_PROMPT_NOT_JSON, 0, 0 },
        { "{\"tokens\":[1,2]}x", KVA_PROMPT_NOT_JSON, 0, 0 },
        { "", KVA_PROMPT_EMPTY, 0, 0 },
        { "{\"tokens\":[1,2,3,4,5,6,7,8,9,10]}", KVA_PROMPT_OK, 8, 1 },
    };

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ids[0] = 0;
        rc = kva_prompt_token_answer((const uint8_t *) cases[i].body,
                                     strlen(cases[i].body), ids, 8, &n);

        ok(rc == cases[i].rc && n == cases[i].n
           && (n == 0 || ids[0] == cases[i].first),
           "answer: %s -> rc %d, %zu ids", cases[i].body, rc, n);
    }
}


int
main(void)
{
    /* one line at a time: what passed still shows if a check crashes */
    setvbuf(stdout, NULL, _IOLBF, 0);

    test_shapes();
    test_tools();
    test_strings();
    test_first_hit();
    test_errors();
    test_truncation();
    test_token_ids();
    test_salt();
    test_token_answer();

    return done_testing();
}
