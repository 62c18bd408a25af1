/*
 * kv_aware core: OpenAI-style request body -> canonical prompt bytes.
 *
 * One pass over the body: a strict RFC 8259 validator that decodes the few
 * string values routing cares about straight into the caller's buffer or
 * the hash chain, and skips (but still validates) everything else.
 * Recursion happens only on '{' and '[', and every level is counted
 * against KVA_PROMPT_MAX_DEPTH, so hostile nesting cannot exhaust the
 * stack.  The prompt's value is walked a second time when tools come
 * after it or when it opens the body (kva_prompt_value()).
 *
 * Duplicate keys: the first occurrence wins (jansson keeps the last one).
 * By the time a duplicate shows up the first value has already been streamed
 * into the output, and taking it back would need a second pass.
 */

#include <string.h>

#include "kva_json_lex.h"
#include "kva_json_walk.h"
#include "kva_prompt.h"


#define KVA_ROLE_MAX      64


typedef enum {
    KVA_KEY_MODEL = 1,
    KVA_KEY_MESSAGES,
    KVA_KEY_PROMPT,
    KVA_KEY_INPUT,
    KVA_KEY_TOOLS,
    KVA_KEY_ROLE,
    KVA_KEY_CONTENT,
    KVA_KEY_TEXT,
    KVA_KEY_CACHE_SALT
} kva_key_e;


static const kva_json_key_t  kva_prompt_keys[] = {
    { "model", 5, KVA_KEY_MODEL },
    { "messages", 8, KVA_KEY_MESSAGES },
    { "prompt", 6, KVA_KEY_PROMPT },
    { "input", 5, KVA_KEY_INPUT },
    { "tools", 5, KVA_KEY_TOOLS },
    { "role", 4, KVA_KEY_ROLE },
    { "content", 7, KVA_KEY_CONTENT },
    { "text", 4, KVA_KEY_TEXT },
    { "cache_salt", 10, KVA_KEY_CACHE_SALT }
};


/* the walker first: the handlers get it and cast back to the whole */
typedef struct {
    kva_json_walk_t   w;
    kva_sink_t        out;
    unsigned          model_seen;
    const uint8_t    *tools_start;
    const uint8_t    *tools_end;
    const uint8_t    *prompt_start; /* the value that decided the kind */
    unsigned          tools_at;     /* the members before them, with them */
    unsigned          prompt_at;
    const uint8_t    *win;          /* a split body (kva_json_lex.h): */
    const uint8_t    *win_end;      /*   the window, */
    const uint8_t    *seam;         /*   where the second piece's copy */
    const uint8_t    *next;         /*   begins, and that piece */
    unsigned          members;      /* of the top-level object so far */
    unsigned          deferred;     /* prompt_start only validated */
    unsigned          again;        /* its second pass */
    unsigned          ids_mixed;    /* a prompt element not a token id */
    size_t            nids;         /* token ids directly in "prompt" */
} kva_parse_t;


typedef struct {
    kva_sink_t        role;
    uint8_t           role_buf[KVA_ROLE_MAX];
    unsigned          role_seen;
    unsigned          content_seen;
} kva_message_t;


static void kva_emit_byte(kva_parse_t *ps, uint8_t c);
static int kva_top_item(kva_json_walk_t *w, unsigned key, void *ctx);
static int kva_message_item(kva_json_walk_t *w, unsigned key, void *ctx);
static int kva_message_member(kva_json_walk_t *w, unsigned key, void *ctx);
static int kva_part_item(kva_json_walk_t *w, unsigned key, void *ctx);
static int kva_parse_text(kva_parse_t *ps);
static int kva_prompt_item(kva_json_walk_t *w, unsigned key, void *ctx);
static int kva_prompt_value(kva_parse_t *ps, unsigned kind);
static unsigned kva_in_window(kva_parse_t *ps, const uint8_t *at);
static size_t kva_span_put(kva_parse_t *ps, kva_sink_t *sink,
    const uint8_t *start, const uint8_t *end);
static kva_prompt_rc_e kva_prompt_scan(kva_parse_t *ps,
    const uint8_t *body, size_t len, uint8_t *out, size_t out_cap,
    kva_hash_stream_t *hs, kva_prompt_t *p);


static void
kva_emit_byte(kva_parse_t *ps, uint8_t c)
{
    kva_sink_put(&ps->out, &c, 1);
}



/*
 * A messages/prompt/input key decides the kind only if its value has a type
 * a prompt can be taken from; otherwise it is skipped like any other key.
 */

static int
kva_top_item(kva_json_walk_t *w, unsigned key, void *ctx)
{
    uint8_t        c;
    unsigned       none;
    kva_sink_t     sink;
    kva_prompt_t  *p;
    kva_parse_t   *ps;

    ps = (kva_parse_t *) w;
    p = ctx;
    c = *ps->w.lx.pos;
    none = (p->kind == KVA_PROMPT_KIND_NONE);
    ps->members++;

    if (key == KVA_KEY_MODEL && !ps->model_seen) {
        ps->model_seen = 1;

        if (c != '"') {
            return kva_json_skip(&ps->w);
        }

        sink.buf = p->model;
        sink.len = 0;
        sink.cap = KVA_PROMPT_MODEL_MAX;
        sink.hs = NULL;

        if (kva_json_string(&ps->w.lx, &sink) != 0) {
            return -1;
        }

        p->model_len = (sink.len < sink.cap) ? sink.len : sink.cap;
        return 0;
    }

    if (key == KVA_KEY_MESSAGES && none && c == '[') {
        p->kind = KVA_PROMPT_KIND_MESSAGES;
        return kva_prompt_value(ps, p->kind);
    }

    if (key == KVA_KEY_PROMPT && none && (c == '"' || c == '[')) {
        p->kind = KVA_PROMPT_KIND_PROMPT;
        return kva_prompt_value(ps, p->kind);
    }

    if (key == KVA_KEY_INPUT && none && (c == '"' || c == '[')) {
        p->kind = KVA_PROMPT_KIND_INPUT;
        return kva_prompt_value(ps, p->kind);
    }

    if (key == KVA_KEY_CACHE_SALT && p->salt == NULL && c == '"') {
        p->salt = ps->w.lx.pos;

        if (kva_json_skip(&ps->w) != 0) {
            return -1;
        }

        p->salt_len = (size_t) (ps->w.lx.pos - p->salt);
        return 0;
    }

    if (key == KVA_KEY_TOOLS && ps->tools_start == NULL) {
        ps->tools_start = ps->w.lx.pos;
        ps->tools_at = ps->members;

        if (kva_json_skip(&ps->w) != 0) {
            return -1;
        }

        ps->tools_end = ps->w.lx.pos;
        return 0;
    }

    return kva_json_skip(&ps->w);
}


/*
 * The value that decided the kind, ps->w.lx.pos at it.  Messages and input
 * take the tools value in front, raw, when it came first; when it comes
 * after, the caller runs this again behind it at the end.
 *
 * Messages or input that open the body (openai-python's order: messages,
 * model, ..., tools) are only validated here and written (hashed) in that
 * second pass: tools are likely to follow, and a scan costs less than a
 * hash.  In any other order they are written at once.
 */

static int
kva_prompt_value(kva_parse_t *ps, unsigned kind)
{
    int         rc;
    uint8_t     c;
    kva_sink_t  saved;

    c = *ps->w.lx.pos;
    ps->prompt_start = ps->w.lx.pos;
    ps->prompt_at = ps->members;

    if (kind != KVA_PROMPT_KIND_PROMPT && ps->members == 1 && !ps->again
        && (ps->out.cap > 0 || ps->out.hs != NULL))
    {
        ps->deferred = 1;
        saved = ps->out;
        ps->out.buf = NULL;
        ps->out.cap = 0;
        ps->out.hs = NULL;

        rc = (kind == KVA_PROMPT_KIND_MESSAGES || c != '"')
             ? kva_json_walk(&ps->w, kva_message_item,
                        (kind == KVA_PROMPT_KIND_MESSAGES) ? NULL : ps)
             : kva_parse_text(ps);

        ps->out = saved;
        return rc;
    }

    if (kind != KVA_PROMPT_KIND_PROMPT && ps->tools_start != NULL) {
        (void) kva_span_put(ps, &ps->out, ps->tools_start, ps->tools_end);
        kva_emit_byte(ps, KVA_SEP_TOOLS);
    }

    if (kind == KVA_PROMPT_KIND_MESSAGES) {
        return kva_json_walk(&ps->w, kva_message_item, NULL);
    }

    if (c == '"') {
        return kva_parse_text(ps);
    }

    return (kind == KVA_PROMPT_KIND_PROMPT)
           ? kva_json_walk(&ps->w, kva_prompt_item, NULL)
           : kva_json_walk(&ps->w, kva_message_item, ps);
}


/* an element of messages, or of input (ctx != NULL), which takes strings */

static int
kva_message_item(kva_json_walk_t *w, unsigned key, void *ctx)
{
    size_t         len;
    kva_message_t  msg;
    kva_parse_t   *ps;

    ps = (kva_parse_t *) w;
    if (*ps->w.lx.pos == '"' && ctx != NULL) {
        return kva_parse_text(ps);
    }

    if (*ps->w.lx.pos != '{') {
        return kva_json_skip(&ps->w);
    }

    msg.role.buf = msg.role_buf;
    msg.role.len = 0;
    msg.role.cap = KVA_ROLE_MAX;
    msg.role.hs = NULL;
    msg.role_seen = 0;
    msg.content_seen = 0;

    if (kva_json_walk(&ps->w, kva_message_member, &msg) != 0) {
        return -1;
    }

    len = (msg.role.len < KVA_ROLE_MAX) ? msg.role.len : KVA_ROLE_MAX;

    kva_emit_byte(ps, KVA_SEP_ROLE);
    kva_sink_put(&ps->out, msg.role_buf, len);
    kva_emit_byte(ps, KVA_SEP_MESSAGE);

    return 0;
}


/*
 * Content goes straight to the output wherever it appears in the object;
 * the role is held back in a local buffer and written after it, which is
 * why the canonical form puts the role second.
 */

static int
kva_message_member(kva_json_walk_t *w, unsigned key, void *ctx)
{
    kva_message_t  *msg;
    kva_parse_t    *ps;

    ps = (kva_parse_t *) w;
    msg = ctx;

    if (key == KVA_KEY_ROLE && !msg->role_seen) {
        msg->role_seen = 1;

        return (*ps->w.lx.pos == '"')
               ? kva_json_string(&ps->w.lx, &msg->role)
               : kva_json_skip(&ps->w);
    }

    if (key == KVA_KEY_CONTENT && !msg->content_seen) {
        msg->content_seen = 1;

        if (*ps->w.lx.pos == '"') {
            return kva_json_string(&ps->w.lx, &ps->out);
        }

        if (*ps->w.lx.pos == '[') {
            return kva_json_walk(&ps->w, kva_part_item, NULL);
        }
    }

    return kva_json_skip(&ps->w);
}


/* a content part: a string, or an object whose "text" counts, any "type" */

static int
kva_part_item(kva_json_walk_t *w, unsigned key, void *ctx)
{
    unsigned   text_seen;
    unsigned  *seen;
    kva_parse_t  *ps;

    ps = (kva_parse_t *) w;
    seen = ctx;

    if (seen == NULL) {
        if (*ps->w.lx.pos == '"') {
            return kva_json_string(&ps->w.lx, &ps->out);
        }

        if (*ps->w.lx.pos == '{') {
            text_seen = 0;
            return kva_json_walk(&ps->w, kva_part_item, &text_seen);
        }

    } else if (key == KVA_KEY_TEXT && !*seen) {
        *seen = 1;

        if (*ps->w.lx.pos == '"') {
            return kva_json_string(&ps->w.lx, &ps->out);
        }
    }

    return kva_json_skip(&ps->w);
}


/* a whole string as one prompt: the text and a message separator */

static int
kva_parse_text(kva_parse_t *ps)
{
    if (kva_json_string(&ps->w.lx, &ps->out) != 0) {
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
kva_prompt_item(kva_json_walk_t *w, unsigned key, void *ctx)
{
    uint8_t   c, le[4];
    uint32_t  token;
    unsigned  is_token;
    kva_parse_t  *ps;

    ps = (kva_parse_t *) w;
    c = *ps->w.lx.pos;

    if (ctx == NULL && (c != '-' && !kva_is_digit(c))) {
        ps->ids_mixed = 1;
    }

    if (ctx == NULL && c == '"') {
        return kva_parse_text(ps);
    }

    if (ctx == NULL && c == '[') {
        if (kva_json_walk(&ps->w, kva_prompt_item, ps) != 0) {
            return -1;
        }

        kva_emit_byte(ps, KVA_SEP_MESSAGE);
        return 0;
    }

    if (c != '-' && !kva_is_digit(c)) {
        return kva_json_skip(&ps->w);
    }

    if (kva_json_number(&ps->w.lx, &token, &is_token) != 0) {
        return -1;
    }

    if (ctx == NULL) {
        if (is_token) {
            ps->nids++;

        } else {
            ps->ids_mixed = 1;
        }
    }

    if (is_token) {
        le[0] = (uint8_t) token;
        le[1] = (uint8_t) (token >> 8);
        le[2] = (uint8_t) (token >> 16);
        le[3] = (uint8_t) (token >> 24);
        kva_sink_put(&ps->out, le, 4);
    }

    return 0;
}


kva_prompt_rc_e
kva_prompt_extract(const uint8_t *body, size_t len, uint8_t *out,
    size_t out_cap, kva_prompt_t *p)
{
    return kva_prompt_hash(body, len, out, out_cap, NULL, p);
}


/* a split body: whether at lies in the window rather than the second piece */

static unsigned
kva_in_window(kva_parse_t *ps, const uint8_t *at)
{
    return ps->seam == NULL
           || ((uintptr_t) at >= (uintptr_t) ps->win
               && (uintptr_t) at <= (uintptr_t) ps->win_end);
}


/*
 * The raw bytes [start, end) of the body into sink (NULL: none), the
 * first in the window and the last past the seam when they straddle it;
 * returns their number.
 */

static size_t
kva_span_put(kva_parse_t *ps, kva_sink_t *sink, const uint8_t *start,
    const uint8_t *end)
{
    size_t  a;

    if (kva_in_window(ps, start) && !kva_in_window(ps, end)) {
        a = (size_t) (ps->seam - start);

        if (sink != NULL) {
            kva_sink_put(sink, start, a);
            kva_sink_put(sink, ps->next, (size_t) (end - ps->next));
        }

        return a + (size_t) (end - ps->next);
    }

    if (sink != NULL) {
        kva_sink_put(sink, start, (size_t) (end - start));
    }

    return (size_t) (end - start);
}


kva_prompt_rc_e
kva_prompt_hash(const uint8_t *body, size_t len, uint8_t *out,
    size_t out_cap, kva_hash_stream_t *hs, kva_prompt_t *p)
{
    kva_parse_t  ps;

    ps.w.lx.seam = NULL;
    ps.seam = NULL;

    return kva_prompt_scan(&ps, body, len, out, out_cap, hs, p);
}


kva_prompt_rc_e
kva_prompt_hash_split(const uint8_t *win, size_t win_len, size_t seam,
    const uint8_t *next, size_t next_len, kva_hash_stream_t *hs,
    kva_prompt_t *p)
{
    kva_prompt_rc_e  rc;
    kva_parse_t      ps;

    ps.w.lx.seam = win + seam;
    ps.w.lx.next = next;
    ps.w.lx.next_end = next + next_len;
    ps.seam = ps.w.lx.seam;
    ps.next = next;

    rc = kva_prompt_scan(&ps, win, win_len, NULL, 0, hs, p);

    /* it may lie in the window, which is the caller's scratch */
    p->salt = NULL;
    p->salt_len = 0;

    return rc;
}


/*
 * The scan itself: ps->w.lx.seam and ps->seam are set for a split body
 * (kva_prompt_hash_split()), NULL otherwise.
 */

static kva_prompt_rc_e
kva_prompt_scan(kva_parse_t *ps, const uint8_t *body, size_t len,
    uint8_t *out, size_t out_cap, kva_hash_stream_t *hs, kva_prompt_t *p)
{
    int          rc;
    unsigned     late;

    p->out = out;
    p->out_len = 0;
    p->len = 0;
    p->truncated = 0;
    p->kind = KVA_PROMPT_KIND_NONE;
    p->model_len = 0;
    p->token_ids = 0;
    p->nids = 0;
    p->salt = NULL;
    p->salt_len = 0;

    if (len == 0) {
        return KVA_PROMPT_EMPTY;
    }

    ps->w.lx.pos = body;
    ps->w.lx.end = body + len;
    ps->win = body;
    ps->win_end = body + len;
    ps->out.buf = out;
    ps->out.len = 0;
    ps->out.cap = out_cap;
    ps->out.hs = hs;
    ps->w.depth = 0;
    ps->w.keys = kva_prompt_keys;
    ps->w.nkeys = sizeof(kva_prompt_keys) / sizeof(kva_prompt_keys[0]);
    ps->w.lx.rc = KVA_PROMPT_OK;
    ps->model_seen = 0;
    ps->tools_start = NULL;
    ps->tools_end = NULL;
    ps->prompt_start = NULL;
    ps->tools_at = 0;
    ps->prompt_at = 0;
    ps->members = 0;
    ps->deferred = 0;
    ps->again = 0;
    ps->ids_mixed = 0;
    ps->nids = 0;

    rc = kva_json_walk_body(&ps->w, "{", kva_top_item, p);

    if (rc != 0) {
        p->kind = KVA_PROMPT_KIND_NONE;
        p->model_len = 0;
        p->salt = NULL;
        p->salt_len = 0;
        return ps->w.lx.rc;
    }

    if (p->kind == KVA_PROMPT_KIND_NONE) {
        return KVA_PROMPT_NO_PROMPT;
    }

    late = (ps->tools_start != NULL && ps->tools_at > ps->prompt_at
            && p->kind != KVA_PROMPT_KIND_PROMPT);

    if (late && out_cap == 0 && hs == NULL) {
        /* validation only: the length is all there is to tell */
        ps->out.len += kva_span_put(ps, NULL, ps->tools_start, ps->tools_end)
                      + 1;

    } else if (late || ps->deferred) {
        /*
         * The tools came after the prompt (openai-python's order) and go
         * in front of it, or the prompt was only validated: its value is
         * scanned again, behind the tools.  Only that value, and it is
         * valid by now; the chain starts over, as a prefix must hash the
         * same whatever follows.
         */
        ps->out.len = 0;

        if (hs != NULL) {
            kva_hash_stream_init(hs, hs->block_size, hs->out, hs->max);
        }

        ps->w.lx.pos = ps->prompt_start;

        if (kva_in_window(ps, ps->prompt_start)) {
            ps->w.lx.end = body + len;
            ps->w.lx.seam = ps->seam;

        } else {
            ps->w.lx.end = ps->w.lx.next_end;
            ps->w.lx.seam = NULL;
        }

        ps->w.depth = 1;
        ps->again = 1;

        if (kva_prompt_value(ps, p->kind) != 0) {
            p->kind = KVA_PROMPT_KIND_NONE;
            p->model_len = 0;
            return ps->w.lx.rc;
        }
    }

    p->len = ps->out.len;
    p->out_len = (ps->out.len < out_cap) ? ps->out.len : out_cap;
    p->truncated = (ps->out.len > out_cap);

    if (p->kind == KVA_PROMPT_KIND_PROMPT && !ps->ids_mixed && ps->nids) {
        p->token_ids = 1;
        p->nids = ps->nids;
    }

    return KVA_PROMPT_OK;
}


size_t
kva_prompt_salt(const uint8_t *str, size_t len, uint8_t *out)
{
    kva_sink_t      sink;
    kva_json_lex_t  lx;

    lx.pos = str;
    lx.end = str + len;
    lx.rc = KVA_PROMPT_OK;
    lx.seam = NULL;

    sink.buf = out;
    sink.len = 0;
    sink.cap = len;
    sink.hs = NULL;

    /* the scan that found it has validated it */
    if (kva_json_string(&lx, &sink) != 0) {
        return 0;
    }

    return (sink.len < len) ? sink.len : len;
}


const char *
kva_prompt_strerror(kva_prompt_rc_e rc)
{
    static const char  *reasons[] = {
        "ok", "not json", "invalid utf-8", "too deep", "no prompt",
        "empty body", "number across the seam"
    };

    if ((unsigned) rc < sizeof(reasons) / sizeof(reasons[0])) {
        return reasons[rc];
    }

    return "unknown error";
}
