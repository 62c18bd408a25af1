/*
 * Randomized differential test of kva_prompt_extract() against jansson:
 * random request bodies, mutated ones, and random out_cap, each checked
 * against a reference canonicalizer built on jansson's tree.  The
 * hand-written cases are in test_prompt.c.  Each body is also hashed as
 * the module hashes it (while scanning, kva_hash_body()) and checked
 * against the text key space over its canonical bytes (kva_hash_text()),
 * and given a "tools" value first and last, which must hash the same.
 * Prints TAP.
 *
 * KVA_TEST_BODIES and KVA_TEST_SEED set the number of bodies and the seed;
 * KVA_TEST_DUMP names a file that receives the first failing body.
 *
 *   make $PWD/build/unit/test_prompt_ref && build/unit/test_prompt_ref
 */

#define _GNU_SOURCE

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "json_depth.h"

#include "kva_keys.h"
#include "kva_prompt.h"
#include "tap.h"
#include "prompt_gen.h"
#include "prompt_rand.h"
#include "prompt_rand_json.h"


#define RANDOM_BODIES     6000
#define RANDOM_SEED       0x6b76612d70726f6dULL

#define REF_INVALID       -1            /* jansson rejects */
#define REF_SKIP          -2            /* jansson cannot tell: see ref_run */


typedef struct {
    int             rc;                 /* kva_prompt_rc_e or REF_* */
    unsigned        kind;
    buf_t           out;
    const uint8_t  *model;
    size_t          model_len;
    json_t         *root;
} ref_t;


typedef struct {
    const char     *name;
    unsigned        total;
    unsigned        failed;
    unsigned        skipped;
    unsigned        rejected;
    unsigned        split;              /* bodies hashed in two pieces */
    unsigned        seam;               /* of them, sent back whole */
} group_t;


static void ref_string(buf_t *out, json_t *s);
static void ref_message(buf_t *out, json_t *msg);
static void ref_token(buf_t *out, json_t *v);
static void ref_prompt(buf_t *out, json_t *v);
static void ref_messages(buf_t *out, json_t *v, int input);
static void ref_run(const uint8_t *body, size_t len, ref_t *r);
static void report(group_t *g, unsigned i, const buf_t *body,
    const char *why, kva_prompt_rc_e rc, const ref_t *ref,
    const kva_prompt_t *p);
static void check_body(group_t *g, unsigned i, const buf_t *body,
    buf_t *scratch);
static void check_prefix(group_t *g, unsigned i, const buf_t *body,
    buf_t *scratch);
static void check_hashes(group_t *g, unsigned i, const buf_t *body,
    buf_t *scratch);
static void check_split(group_t *g, unsigned i, const buf_t *body,
    size_t bs, kva_prompt_rc_e rc, size_t n, const uint64_t *h,
    const kva_prompt_t *p);
static void with_tools(const buf_t *body, const buf_t *tools, int last,
    buf_t *out);
static void check_tools(group_t *g, group_t *pg, unsigned i,
    const buf_t *body, buf_t *scratch);
static void test_random(void);


/* the reference: jansson's tree walked with the same rules */

static void
ref_string(buf_t *out, json_t *s)
{
    buf_put(out, json_string_value(s), json_string_length(s));
}


static void
ref_message(buf_t *out, json_t *msg)
{
    size_t   i, len;
    json_t  *content, *role, *part, *text;

    content = json_object_get(msg, "content");

    if (json_is_string(content)) {
        ref_string(out, content);

    } else if (json_is_array(content)) {
        json_array_foreach(content, i, part) {
            text = json_is_object(part) ? json_object_get(part, "text")
                                        : part;

            if (json_is_string(text)) {
                ref_string(out, text);
            }
        }
    }

    buf_putc(out, KVA_SEP_ROLE);

    role = json_object_get(msg, "role");

    if (json_is_string(role)) {
        len = json_string_length(role);
        buf_put(out, json_string_value(role), (len < 64) ? len : 64);
    }

    buf_putc(out, KVA_SEP_MESSAGE);
}


static void
ref_token(buf_t *out, json_t *v)
{
    uint8_t     le[4];
    json_int_t  t;

    if (!json_is_integer(v)) {
        return;
    }

    t = json_integer_value(v);

    if (t < 0 || t > 4294967295LL) {
        return;
    }

    le[0] = (uint8_t) t;
    le[1] = (uint8_t) (t >> 8);
    le[2] = (uint8_t) (t >> 16);
    le[3] = (uint8_t) (t >> 24);
    buf_put(out, le, 4);
}


static void
ref_prompt(buf_t *out, json_t *v)
{
    size_t   i, j;
    json_t  *e, *t;

    if (json_is_string(v)) {
        ref_string(out, v);
        buf_putc(out, KVA_SEP_MESSAGE);
        return;
    }

    json_array_foreach(v, i, e) {
        if (json_is_string(e)) {
            ref_string(out, e);
            buf_putc(out, KVA_SEP_MESSAGE);

        } else if (json_is_array(e)) {
            json_array_foreach(e, j, t) {
                ref_token(out, t);
            }

            buf_putc(out, KVA_SEP_MESSAGE);

        } else {
            ref_token(out, e);
        }
    }
}


static void
ref_messages(buf_t *out, json_t *v, int input)
{
    size_t   i;
    json_t  *e;

    if (input && json_is_string(v)) {
        ref_string(out, v);
        buf_putc(out, KVA_SEP_MESSAGE);
        return;
    }

    json_array_foreach(v, i, e) {
        if (json_is_object(e)) {
            ref_message(out, e);

        } else if (input && json_is_string(e)) {
            ref_string(out, e);
            buf_putc(out, KVA_SEP_MESSAGE);
        }
    }
}


/*
 * Fills r from jansson's view of the body.  REF_SKIP: jansson rejected the
 * body for a reason RFC 8259 does not share (duplicate keys, which we
 * reject here only to compare like with like; integers over 64 bits or
 * reals out of range; NUL in keys), or it has a tools key, whose raw bytes
 * a tree cannot give back.  A raw NUL byte is invalid anywhere in JSON, but
 * jansson 2.14 drops one that directly follows a number or a literal, so
 * such bodies count as rejected without asking it.
 */

static void
ref_run(const uint8_t *body, size_t len, ref_t *r)
{
    size_t        key_len;
    json_t       *v, *model;
    const char   *key;
    json_error_t  err;

    r->out.len = 0;
    r->kind = KVA_PROMPT_KIND_NONE;
    r->model_len = 0;

    if (memchr(body, 0, len) != NULL) {
        r->rc = REF_INVALID;
        return;
    }

    r->root = json_loadb((const char *) body, len,
                         JSON_ALLOW_NUL | JSON_DECODE_ANY
                         | JSON_REJECT_DUPLICATES, &err);

    if (r->root == NULL) {
        switch (json_error_code(&err)) {
        case json_error_duplicate_key:
        case json_error_numeric_overflow:
        case json_error_null_byte_in_key:
            r->rc = REF_SKIP;
            break;
        default:
            r->rc = REF_INVALID;
        }

        return;
    }

    if (json_depth(r->root) > KVA_PROMPT_MAX_DEPTH) {
        r->rc = KVA_PROMPT_TOO_DEEP;
        return;
    }

    r->rc = KVA_PROMPT_NO_PROMPT;

    if (!json_is_object(r->root)) {
        return;
    }

    model = json_object_get(r->root, "model");

    if (json_is_string(model)) {
        r->model = (const uint8_t *) json_string_value(model);
        r->model_len = json_string_length(model);
        r->model_len = (r->model_len < KVA_PROMPT_MODEL_MAX)
                       ? r->model_len : KVA_PROMPT_MODEL_MAX;
    }

    json_object_keylen_foreach(r->root, key, key_len, v) {

        if (key_len == 8 && memcmp(key, "messages", 8) == 0
            && json_is_array(v))
        {
            r->kind = KVA_PROMPT_KIND_MESSAGES;
            ref_messages(&r->out, v, 0);
            break;
        }

        if (key_len == 6 && memcmp(key, "prompt", 6) == 0
            && (json_is_string(v) || json_is_array(v)))
        {
            r->kind = KVA_PROMPT_KIND_PROMPT;
            ref_prompt(&r->out, v);
            break;
        }

        if (key_len == 5 && memcmp(key, "input", 5) == 0
            && (json_is_string(v) || json_is_array(v)))
        {
            r->kind = KVA_PROMPT_KIND_INPUT;
            ref_messages(&r->out, v, 1);
            break;
        }
    }

    if (r->kind == KVA_PROMPT_KIND_NONE) {
        return;
    }

    if (json_object_get(r->root, "tools") != NULL
        && r->kind != KVA_PROMPT_KIND_PROMPT)
    {
        r->rc = REF_SKIP;
        return;
    }

    r->rc = KVA_PROMPT_OK;
}


static void
report(group_t *g, unsigned i, const buf_t *body, const char *why,
    kva_prompt_rc_e rc, const ref_t *ref, const kva_prompt_t *p)
{
    FILE        *f;
    size_t       at;
    const char  *dump;

    g->failed++;

    if (g->failed > 1) {
        return;
    }

    printf("# %s: body #%u (len %zu): %s; ours %d (%s), reference %d\n",
           g->name, i, body->len, why, rc, kva_prompt_strerror(rc), ref->rc);

    at = first_diff(p->out, p->out_len, ref->out.p, ref->out.len);

    if (rc == KVA_PROMPT_OK && ref->rc == KVA_PROMPT_OK) {
        printf("# first difference at byte %zu\n", at);
        hexdump("ours", p->out, p->out_len, at);
        hexdump("reference", ref->out.p, ref->out.len, at);
    }

    hexdump("body", body->p, body->len, 0);

    dump = getenv("KVA_TEST_DUMP");

    if (dump != NULL && (f = fopen(dump, "wb")) != NULL) {
        fwrite(body->p, 1, body->len, f);
        fclose(f);
        printf("# body written to %s\n", dump);
    }
}


/*
 * Compares one body with the reference.  Mutated bodies may be rejected by
 * jansson; then all we ask is not to accept them.
 */

static void
check_body(group_t *g, unsigned i, const buf_t *body, buf_t *scratch)
{
    size_t           cap;
    ref_t            ref;
    kva_prompt_t     p, p2;
    kva_prompt_rc_e  rc, rc2;

    memset(&ref, 0, sizeof(ref));
    memset(&p, 0, sizeof(p));

    g->total++;
    cap = body->len + KVA_PROMPT_OUT_SLACK;

    ref_run(body->p, body->len, &ref);

    if (run(body->p, body->len, cap, &p, &rc, scratch) != 0) {
        report(g, i, body, "wrote past out_cap", rc, &ref, &p);
        goto done;
    }

    rc2 = kva_prompt_extract(body->p, body->len, NULL, 0, &p2);

    if (rc2 != rc) {
        report(g, i, body, "validate-only rc differs", rc2, &ref, &p);
        goto done;
    }

    if (ref.rc == REF_SKIP) {
        g->skipped++;
        goto done;
    }

    if (ref.rc == REF_INVALID) {
        g->rejected++;

        if (rc == KVA_PROMPT_OK || rc == KVA_PROMPT_NO_PROMPT) {
            report(g, i, body, "jansson rejects, we accept", rc, &ref, &p);
        }

        goto done;
    }

    if ((int) rc != ref.rc) {
        report(g, i, body, "rc differs", rc, &ref, &p);
        goto done;
    }

    if (rc != KVA_PROMPT_OK && rc != KVA_PROMPT_NO_PROMPT) {
        goto done;
    }

    if (p.model_len != ref.model_len
        || (ref.model_len > 0
            && memcmp(p.model, ref.model, ref.model_len) != 0))
    {
        report(g, i, body, "model differs", rc, &ref, &p);
        goto done;
    }

    if (rc == KVA_PROMPT_OK
        && (p.kind != ref.kind || p.truncated || p.out_len != ref.out.len
            || (ref.out.len > 0
                && memcmp(p.out, ref.out.p, ref.out.len) != 0)))
    {
        report(g, i, body, "canonical bytes differ", rc, &ref, &p);
    }

done:

    json_decref(ref.root);
    free(ref.out.p);
}


/* a random out_cap: the output must be an exact prefix of the full one */

static void
check_prefix(group_t *g, unsigned i, const buf_t *body, buf_t *scratch)
{
    size_t           cap, full_len;
    buf_t            full;
    kva_prompt_t     p;
    kva_prompt_rc_e  rc;

    memset(&full, 0, sizeof(full));

    if (run(body->p, body->len, body->len + KVA_PROMPT_OUT_SLACK, &p, &rc,
            &full) != 0
        || rc != KVA_PROMPT_OK || p.out_len == 0)
    {
        free(full.p);
        return;
    }

    g->total++;
    full_len = p.out_len;
    cap = prompt_rand_n(2)
          ? prompt_rand_u64() % full_len
          : prompt_rand_u64() % (full_len < 64 ? full_len : 64);

    if (run(body->p, body->len, cap, &p, &rc, scratch) != 0
        || rc != KVA_PROMPT_OK || p.out_len != cap || !p.truncated
        || memcmp(scratch->p, full.p, cap) != 0)
    {
        g->failed++;

        if (g->failed == 1) {
            printf("# %s: body #%u out_cap %zu of %zu: rc %d out_len %zu\n",
                   g->name, i, cap, full_len, rc, p.out_len);
        }
    }

    free(full.p);
}


/*
 * The hashes of the streaming scan against the text key space over the
 * canonical bytes, for a random block size; a body that fails fails the
 * same way and hashes nothing.
 */

static void
check_hashes(group_t *g, unsigned i, const buf_t *body, buf_t *scratch)
{
    size_t           bs, max, n, m, nref;
    uint64_t        *h, *ref;
    kva_prompt_t     p, p2;
    kva_prompt_rc_e  rc, rc2;

    static const size_t  sizes[] = { 1, 5, 64, 127, 128, 129, 200, 256,
                                     384, 4096 };

    bs = sizes[prompt_rand_n(sizeof(sizes) / sizeof(sizes[0]))];
    max = kva_hash_body_max(body->len, bs);
    h = malloc((max + 1) * sizeof(uint64_t));
    ref = malloc((max + 1) * sizeof(uint64_t));

    if (h == NULL || ref == NULL) {
        abort();
    }

    g->total++;

    if (run(body->p, body->len, body->len + KVA_PROMPT_OUT_SLACK, &p, &rc,
            scratch)
        != 0)
    {
        g->failed++;
        goto done;
    }

    rc2 = kva_hash_body(body->p, body->len, bs, NULL, h, &n, &p2);

    check_split(g, i, body, bs, rc2, n, h, &p2);

    if (rc2 != rc) {
        g->failed++;
        printf("# %s: body #%u: rc %d scanning, %d hashing\n", g->name, i,
               rc, rc2);
        goto done;
    }

    if (rc != KVA_PROMPT_OK) {
        if (n != 0) {
            g->failed++;
        }

        goto done;
    }

    nref = kva_hash_text(p.model, p.model_len, scratch->p, p.out_len, bs,
                         ref, max);

    if (n != nref || p2.len != p.len
        || (n > 0 && memcmp(h, ref, n * sizeof(uint64_t)) != 0))
    {
        g->failed++;

        if (g->failed == 1) {
            printf("# %s: body #%u, block %zu: %zu blocks hashed, %zu "
                   "over the %zu canonical bytes\n", g->name, i, bs, n,
                   nref, p.out_len);
            hexdump("body", body->p, body->len, 0);
        }

        goto done;
    }

    /* validation only tells the same length */
    if (kva_prompt_extract(body->p, body->len, NULL, 0, &p2) != rc
        || p2.len != p.len)
    {
        g->failed++;
        goto done;
    }

    /* with scratch: the same hashes, and the canonical bytes as well */
    memset(scratch->p, 0, p.out_len);
    rc2 = kva_hash_body(body->p, body->len, bs, scratch->p, h, &m, &p2);

    if (rc2 != rc || m != n
        || (n > 0 && memcmp(h, ref, n * sizeof(uint64_t)) != 0)
        || p2.out_len != p.out_len)
    {
        g->failed++;
    }

done:

    free(h);
    free(ref);
}


/*
 * The body in two pieces, as nginx may hold it (the part read with the
 * headers, then the rest), cut anywhere: the same verdict, length, model
 * and hashes as in one piece (rc, n, h, p), or KVA_PROMPT_SEAM.
 */

static void
check_split(group_t *g, unsigned i, const buf_t *body, size_t bs,
    kva_prompt_rc_e rc, size_t n, const uint64_t *h, const kva_prompt_t *p)
{
    size_t           m, cut, n2;
    uint8_t         *win;
    uint64_t        *h2;
    kva_prompt_t     p2;
    kva_prompt_rc_e  rc2;

    h2 = malloc((kva_hash_body_max(body->len, bs) + 1) * sizeof(uint64_t));

    if (h2 == NULL) {
        abort();
    }

    for (m = 0; m < 3; m++) {
        cut = (m == 2) ? body->len / 2 : prompt_rand_u64() % (body->len + 1);
        win = malloc(cut + KVA_HASH_SEAM);

        if (win == NULL) {
            abort();
        }

        g->split++;
        rc2 = kva_hash_body2(body->p, cut, body->p + cut, body->len - cut,
                             bs, win, h2, &n2, &p2);
        free(win);

        if (rc2 == KVA_PROMPT_SEAM) {
            g->seam++;
            continue;
        }

        if (rc2 != rc
            || (rc == KVA_PROMPT_OK
                && (n2 != n || p2.len != p->len
                    || p2.model_len != p->model_len
                    || memcmp(p2.model, p->model, p->model_len) != 0
                    || (n > 0 && memcmp(h2, h, n * sizeof(uint64_t)) != 0))))
        {
            g->failed++;

            if (g->failed == 1) {
                printf("# %s: body #%u cut at %zu of %zu, block %zu: rc %d, "
                       "%zu blocks; in one piece rc %d, %zu blocks\n",
                       g->name, i, cut, body->len, bs, rc2, n2, rc, n);
                hexdump("body", body->p, body->len, cut);
            }

            break;
        }
    }

    free(h2);
}


/* the body with "tools": value spliced in as its first or last member */

static void
with_tools(const buf_t *body, const buf_t *tools, int last, buf_t *out)
{
    size_t  at;

    out->len = 0;

    if (last) {
        for (at = body->len; body->p[at - 1] != '}'; at--) { /* void */ }

        buf_put(out, body->p, at - 1);
        buf_puts(out, ",\"tools\":");
        buf_put(out, tools->p, tools->len);
        buf_put(out, body->p + at - 1, body->len - at + 1);
        return;
    }

    for (at = 0; body->p[at] != '{'; at++) { /* void */ }

    buf_put(out, body->p, at + 1);
    buf_puts(out, "\"tools\":");
    buf_put(out, tools->p, tools->len);
    buf_putc(out, ',');
    buf_put(out, body->p + at + 1, body->len - at - 1);
}


/*
 * Tools first or last in the body: the same canonical bytes (the raw
 * value, 0x1d, then the prompt) and the same hashes; an out_cap cut still
 * gives an exact prefix when the prompt is scanned again behind them.
 */

static void
check_tools(group_t *g, group_t *pg, unsigned i, const buf_t *body,
    buf_t *scratch)
{
    size_t           bs, n1, n2, max;
    buf_t            tools, first, last, canon;
    uint64_t        *h1, *h2;
    kva_prompt_t     p;
    kva_prompt_rc_e  rc;

    if (run(body->p, body->len, body->len + KVA_PROMPT_OUT_SLACK, &p, &rc,
            scratch)
        != 0
        || rc != KVA_PROMPT_OK || p.kind == KVA_PROMPT_KIND_PROMPT
        || memmem(body->p, body->len, "tools", 5) != NULL)
    {
        return;
    }

    memset(&tools, 0, sizeof(tools));
    memset(&first, 0, sizeof(first));
    memset(&last, 0, sizeof(last));
    memset(&canon, 0, sizeof(canon));

    g->total++;

    gen_json(&tools, 1, 1 + prompt_rand_n(4));
    buf_put(&canon, tools.p, tools.len);
    buf_putc(&canon, 0x1d);
    buf_put(&canon, scratch->p, p.out_len);

    with_tools(body, &tools, 0, &first);
    with_tools(body, &tools, 1, &last);

    bs = 1 + prompt_rand_n(300);
    max = kva_hash_body_max(last.len, bs);
    h1 = malloc((max + 1) * sizeof(uint64_t));
    h2 = malloc((max + 1) * sizeof(uint64_t));

    if (h1 == NULL || h2 == NULL) {
        abort();
    }

    if (run(first.p, first.len, first.len + KVA_PROMPT_OUT_SLACK, &p, &rc,
            scratch)
        != 0 || rc != KVA_PROMPT_OK || p.out_len != canon.len
        || memcmp(scratch->p, canon.p, canon.len) != 0)
    {
        g->failed++;
        printf("# %s: body #%u: tools first, canonical bytes differ\n",
               g->name, i);
        goto done;
    }

    if (run(last.p, last.len, last.len + KVA_PROMPT_OUT_SLACK, &p, &rc,
            scratch)
        != 0 || rc != KVA_PROMPT_OK || p.out_len != canon.len
        || memcmp(scratch->p, canon.p, canon.len) != 0)
    {
        g->failed++;
        printf("# %s: body #%u: tools last, canonical bytes differ\n",
               g->name, i);
        goto done;
    }

    if (kva_prompt_extract(last.p, last.len, NULL, 0, &p) != KVA_PROMPT_OK
        || p.len != canon.len)
    {
        g->failed++;
        printf("# %s: body #%u: tools last, validation only: length %zu, "
               "not %zu\n", g->name, i, p.len, canon.len);
        goto done;
    }

    n1 = 0;
    n2 = 0;

    if (kva_hash_body(first.p, first.len, bs, NULL, h1, &n1, &p)
        != KVA_PROMPT_OK
        || kva_hash_body(last.p, last.len, bs, NULL, h2, &n2, &p)
           != KVA_PROMPT_OK
        || n1 != n2 || n1 != canon.len / bs
        || (n1 > 0 && memcmp(h1, h2, n1 * sizeof(uint64_t)) != 0))
    {
        g->failed++;
        printf("# %s: body #%u, block %zu: hashes differ (%zu, %zu blocks)"
               "\n", g->name, i, bs, n1, n2);
        goto done;
    }

    check_prefix(pg, i, &last, scratch);

done:

    free(h1);
    free(h2);
    free(tools.p);
    free(first.p);
    free(last.p);
    free(canon.p);
}


/* KVA_TEST_BODIES and KVA_TEST_SEED override the defaults for longer runs */

static void
test_random(void)
{
    uint64_t     seed;
    unsigned     i, bodies;
    buf_t        body, scratch;
    group_t      valid, mutated, prefix, hashed, tools;
    const char  *env;

    memset(&body, 0, sizeof(body));
    memset(&scratch, 0, sizeof(scratch));
    memset(&valid, 0, sizeof(valid));
    memset(&mutated, 0, sizeof(mutated));
    memset(&prefix, 0, sizeof(prefix));
    memset(&hashed, 0, sizeof(hashed));
    memset(&tools, 0, sizeof(tools));

    valid.name = "random";
    mutated.name = "mutated";
    prefix.name = "prefix";
    hashed.name = "hashed";
    tools.name = "tools";

    env = getenv("KVA_TEST_BODIES");
    bodies = (env != NULL) ? (unsigned) strtoul(env, NULL, 10) : RANDOM_BODIES;

    env = getenv("KVA_TEST_SEED");
    seed = (env != NULL) ? strtoull(env, NULL, 0) : RANDOM_SEED;

    prompt_rand_seed(seed);

    for (i = 0; i < bodies; i++) {
        prompt_gen_body(&body);
        check_body(&valid, i, &body, &scratch);

        check_hashes(&hashed, i, &body, &scratch);

        if (i % 4 == 0) {
            check_prefix(&prefix, i, &body, &scratch);
        }

        if (i % 2 == 0) {
            check_tools(&tools, &prefix, i, &body, &scratch);
        }

        if (prompt_rand_n(2)) {
            prompt_mutate(&body);
            check_body(&mutated, i, &body, &scratch);
            check_hashes(&hashed, i, &body, &scratch);
        }
    }

    ok(valid.failed == 0 && valid.skipped == 0 && valid.rejected == 0,
        "random bodies match jansson byte for byte "
        "(%u bodies, %u failed, %u skipped, %u rejected by jansson)",
        valid.total, valid.failed, valid.skipped, valid.rejected);

    ok(mutated.failed == 0,
        "mutated bodies: never accept what jansson rejects, else match "
        "(%u bodies, %u failed, %u rejected by jansson, %u skipped)",
        mutated.total, mutated.failed, mutated.rejected, mutated.skipped);

    ok(prefix.failed == 0 && prefix.total > 0,
        "random out_cap gives an exact prefix (%u bodies, %u failed)",
        prefix.total, prefix.failed);

    ok(hashed.failed == 0 && hashed.total > 0,
        "hashed while scanning = the text key space over the canonical "
        "bytes (%u bodies, %u failed)", hashed.total, hashed.failed);

    ok(hashed.split > 0 && hashed.seam * 100 < hashed.split,
        "in two pieces: sent back whole %u times of %u (numbers across "
        "the seam)", hashed.seam, hashed.split);

    ok(tools.failed == 0 && tools.total > 0,
        "tools first or last: same canonical bytes, same hashes "
        "(%u bodies, %u failed)", tools.total, tools.failed);

    free(body.p);
    free(scratch.p);
}


int
main(void)
{
    test_random();

    return done_testing();
}
