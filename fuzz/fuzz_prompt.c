/*
 * libFuzzer target: the prompt scanner (src/core/kva_prompt.c).
 *
 * (1) Its verdict on validity agrees with jansson's, with the exceptions
 *     t/unit/test_prompt_ref.c documents: bodies jansson rejects for
 *     reasons RFC 8259 does not share are skipped, a raw NUL is invalid
 *     whatever jansson says, and nesting past KVA_PROMPT_MAX_DEPTH is
 *     TOO_DEEP.  Validation alone (no output buffer) agrees too.
 * (2) A smaller output cap gives an exact prefix of the full output.
 * (3) A prompt of token ids fits in 2 * len + slack, 4 bytes an id, and
 *     validation alone finds the same ids and the same cache_salt, which
 *     lies in the body and decodes within its length.
 * (4) A tokenizer's answer (kva_prompt_token_answer) is valid JSON when
 *     the prompt scanner says so, and never writes past its ids' cap.
 * (5) The hashes made while scanning (kva_hash_body, as the module does)
 *     are the text key space's over the canonical bytes (kva_hash_text),
 *     for a block size taken from the input; a rejected body hashes
 *     nothing.  In two pieces cut anywhere (kva_hash_body2) it gets the
 *     same verdict and hashes, or KVA_PROMPT_SEAM.
 * (6) keys=tokens (kva_token_body, as the module does) gets the same
 *     verdict, keeps the body's ids and its cache_salt within its
 *     scratch, and keys them as kva_token_blocks() does with the salt
 *     decoded apart; without ids of its own, a tokenizer's ids, and
 *     without those the text keys over the canonical bytes.
 *
 * Output buffers are sized exactly, so ASan sees a write past out_cap.
 *
 *   make build/fuzz/fuzz_prompt && build/fuzz/fuzz_prompt fuzz/corpus/prompt
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "json_depth.h"

#include "kva_keys.h"
#include "kva_prompt.h"
#include "kva_token.h"
#include "kva_token_answer.h"


/* out_cap of len + 64 never truncates text prompts (kva_prompt.h) */
#define FZ_SLACK  64

#define FZ_INVALID  0
#define FZ_VALID    1
#define FZ_SKIP     2


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fz_jansson(const uint8_t *data, size_t size, int *too_deep);
static uint8_t *fz_extract(const uint8_t *data, size_t size, size_t cap,
    kva_prompt_t *p, kva_prompt_rc_e *rc);
static void fz_tokens(const uint8_t *data, size_t size, kva_prompt_t *v,
    int accepted);
static void fz_prefix(const uint8_t *data, size_t size, const uint8_t *full,
    size_t full_len, size_t cap);
static void fz_token_keys(const uint8_t *data, size_t size,
    const kva_prompt_t *p, kva_prompt_rc_e rc);


/* jansson's verdict, with test_prompt_ref.c's exceptions */
static int
fz_jansson(const uint8_t *data, size_t size, int *too_deep)
{
    json_t        *root;
    json_error_t   err;

    *too_deep = 0;

    /* jansson 2.14 drops a NUL right after a number or a literal */
    if (memchr(data, 0, size) != NULL) {
        return FZ_INVALID;
    }

    root = json_loadb((const char *) data, size,
                      JSON_ALLOW_NUL | JSON_DECODE_ANY
                      | JSON_REJECT_DUPLICATES, &err);

    if (root == NULL) {
        switch (json_error_code(&err)) {
        case json_error_duplicate_key:      /* we let the first one win */
        case json_error_numeric_overflow:   /* numbers are not ours to read */
        case json_error_null_byte_in_key:
        case json_error_out_of_memory:
            return FZ_SKIP;
        default:
            return FZ_INVALID;
        }
    }

    *too_deep = (json_depth(root) > KVA_PROMPT_MAX_DEPTH);
    json_decref(root);

    return FZ_VALID;
}


/* the output in a buffer of exactly cap bytes (NULL and 0 stay so) */
static uint8_t *
fz_extract(const uint8_t *data, size_t size, size_t cap, kva_prompt_t *p,
    kva_prompt_rc_e *rc)
{
    uint8_t  *out;

    out = NULL;

    if (cap > 0) {
        out = malloc(cap);

        if (out == NULL) {
            abort();
        }
    }

    memset(p, 0, sizeof(kva_prompt_t));
    *rc = kva_prompt_extract(data, size, out, cap, p);

    if (p->out_len > cap) {
        abort();
    }

    return out;
}


static void
fz_prefix(const uint8_t *data, size_t size, const uint8_t *full,
    size_t full_len, size_t cap)
{
    uint8_t          *out;
    kva_prompt_t      p;
    kva_prompt_rc_e   rc;

    out = fz_extract(data, size, cap, &p, &rc);

    if (rc != KVA_PROMPT_OK || p.out_len != cap || !p.truncated
        || (cap > 0 && memcmp(out, full, cap) != 0))
    {
        abort();
    }

    free(out);
}


static void
fz_tokens(const uint8_t *data, size_t size, kva_prompt_t *v, int accepted)
{
    size_t            cap, n;
    uint8_t          *out, *dec;
    uint32_t          ids[4];
    kva_prompt_t      p;
    kva_prompt_rc_e   rc;

    cap = 2 * size + FZ_SLACK;
    out = fz_extract(data, size, cap, &p, &rc);

    if (p.token_ids != v->token_ids || p.nids != v->nids
        || p.salt != v->salt || p.salt_len != v->salt_len)
    {
        abort();
    }

    if (p.token_ids && (p.truncated || p.out_len != 4 * p.nids)) {
        abort();
    }

    if (p.salt != NULL) {
        if (p.salt < data || p.salt + p.salt_len > data + size) {
            abort();
        }

        dec = malloc(p.salt_len);

        if (dec == NULL
            || kva_prompt_salt(p.salt, p.salt_len, dec) > p.salt_len)
        {
            abort();
        }

        free(dec);
    }

    free(out);

    rc = kva_prompt_token_answer(data, size, ids, 4, &n);

    if ((rc == KVA_PROMPT_OK || rc == KVA_PROMPT_NO_PROMPT) != accepted
        || n > 4)
    {
        abort();
    }
}


/* the body in two pieces, cut where its first byte says: as in one */
static void
fz_split(const uint8_t *data, size_t size, size_t bs, kva_prompt_rc_e rc,
    size_t n, const uint64_t *h, const kva_prompt_t *whole)
{
    size_t            cut, max, n2;
    uint8_t          *win, *a, *b;
    uint64_t         *h2;
    kva_prompt_t      q;
    kva_prompt_rc_e   hrc;

    cut = (size > 0) ? (data[0] * 131 + size / 3) % (size + 1) : 0;
    max = kva_hash_body_max(size, bs);

    /* each piece in its own allocation: ASan sees a read past either */
    a = malloc(cut ? cut : 1);
    b = malloc(size - cut ? size - cut : 1);
    win = malloc(cut + KVA_HASH_SEAM);
    h2 = malloc((max ? max : 1) * sizeof(uint64_t));

    if (a == NULL || b == NULL || win == NULL || h2 == NULL) {
        abort();
    }

    memcpy(a, data, cut);
    memcpy(b, data + cut, size - cut);

    hrc = kva_hash_body2(a, cut, b, size - cut, bs, win, max ? h2 : NULL,
                         &n2, &q);

    if (hrc != KVA_PROMPT_SEAM
        && (hrc != rc
            || (rc == KVA_PROMPT_OK
                && (n2 != n || q.len != whole->len
                    || (n > 0 && memcmp(h, h2, n * sizeof(uint64_t)) != 0)))))
    {
        abort();
    }

    free(a);
    free(b);
    free(win);
    free(h2);
}


static void
fz_hashes(const uint8_t *data, size_t size, const uint8_t *full,
    const kva_prompt_t *p, kva_prompt_rc_e rc)
{
    size_t            bs, max, n, nref;
    uint64_t         *h, *ref;
    kva_prompt_t      q;
    kva_prompt_rc_e   hrc;

    bs = (size > 0) ? 1 + (data[size - 1] * 7 + size) % 300 : 64;
    max = kva_hash_body_max(size, bs);

    /* exactly max entries: ASan sees a write past them */
    h = malloc((max ? max : 1) * sizeof(uint64_t));
    ref = malloc((max ? max : 1) * sizeof(uint64_t));

    if (h == NULL || ref == NULL) {
        abort();
    }

    hrc = kva_hash_body(data, size, bs, NULL, max ? h : NULL, &n, &q);

    if (hrc != rc || (rc != KVA_PROMPT_OK && n != 0)) {
        abort();
    }

    fz_split(data, size, bs, rc, n, h, &q);

    if (rc == KVA_PROMPT_OK) {
        nref = kva_hash_text(p->model, p->model_len, full, p->out_len, bs,
                             ref, max);

        if (n != nref || q.len != p->len
            || (n > 0 && memcmp(h, ref, n * sizeof(uint64_t)) != 0))
        {
            abort();
        }
    }

    free(h);
    free(ref);
}


static void
fz_token_keys(const uint8_t *data, size_t size, const kva_prompt_t *p,
    kva_prompt_rc_e rc)
{
    size_t             bt, bs, max, n, nref, slen;
    uint8_t           *scratch, *salt;
    uint32_t           given[3] = { 1, 2, 3 };
    uint64_t          *h, *ref, seed;
    kva_prompt_rc_e    trc;
    kva_token_body_t   tb;

    bt = (size > 1) ? 1 + data[size - 2] % 5 : 1;
    bs = 1 + (size * 13) % 64;

    tb.block_size = bs;
    tb.block_tokens = bt;
    tb.model = NULL;
    tb.model_len = 0;

    /* exactly the scratch it asks for: ASan sees the salt pass it */
    scratch = malloc(kva_token_body_scratch(size));
    if (scratch == NULL) {
        abort();
    }

    trc = kva_token_body(data, size, scratch, &tb);

    if (trc != rc || (rc == KVA_PROMPT_OK && tb.from_body != p->token_ids)) {
        abort();
    }

    if (rc != KVA_PROMPT_OK) {
        free(scratch);
        return;
    }

    max = kva_token_body_max(&tb, (size & 1) ? given : NULL, 3);
    h = malloc((max ? max : 1) * sizeof(uint64_t));
    ref = malloc((max ? max : 1) * sizeof(uint64_t));

    if (h == NULL || ref == NULL) {
        abort();
    }

    seed = kva_token_seed(tb.p.model, tb.p.model_len);

    if (tb.ids != NULL && tb.p.salt != NULL) {
        salt = malloc(2 * tb.p.salt_len + KVA_TOKEN_SALT_SLACK);
        if (salt == NULL) {
            abort();
        }

        slen = kva_prompt_salt(tb.p.salt, tb.p.salt_len, salt);
        seed ^= kva_token_salt(salt, slen, salt + tb.p.salt_len);
        free(salt);
    }

    nref = (tb.ids == NULL)
           ? kva_hash_text(tb.p.model, tb.p.model_len, tb.p.out,
                           tb.p.out_len, bs, ref, max)
           : kva_token_blocks(seed, tb.ids, tb.nids, bt, NULL, ref, max);

    n = kva_token_body_keys(&tb, h, max);

    if (n != nref || (n > 0 && memcmp(h, ref, n * sizeof(uint64_t)) != 0)) {
        abort();
    }

    free(h);
    free(ref);
    free(scratch);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int               verdict, too_deep, accepted;
    uint8_t          *full;
    size_t            cap;
    kva_prompt_t      p, v;
    kva_prompt_rc_e   rc, vrc;

    cap = size + FZ_SLACK;
    full = fz_extract(data, size, cap, &p, &rc);

    (void) fz_extract(data, size, 0, &v, &vrc);

    if (vrc != rc) {
        abort();
    }

    accepted = (rc == KVA_PROMPT_OK || rc == KVA_PROMPT_NO_PROMPT);
    verdict = fz_jansson(data, size, &too_deep);

    switch (verdict) {

    case FZ_INVALID:
        if (accepted) {
            abort();
        }

        break;

    case FZ_VALID:
        if (too_deep ? rc != KVA_PROMPT_TOO_DEEP : !accepted) {
            abort();
        }

        break;
    }

    fz_tokens(data, size, &v, accepted);
    fz_hashes(data, size, full, &p, rc);
    fz_token_keys(data, size, &p, rc);

    /* out_cap 0 is validation only, which says nothing of truncation */
    if (rc == KVA_PROMPT_OK && p.out_len > 1) {
        fz_prefix(data, size, full, p.out_len, p.out_len - 1);
        fz_prefix(data, size, full, p.out_len, p.out_len / 2);
        fz_prefix(data, size, full, p.out_len, 1);
    }

    free(full);

    return 0;
}
