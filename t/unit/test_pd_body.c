/*
 * Unit tests: the bodies of a disaggregated request (kva_pd_body.h):
 * leg 1's rewrite, the prefill answer's kv_transfer_params, leg 2's
 * splice, byte for byte, and what they refuse; SGLang's bootstrap
 * fields, the one body of both legs.
 */

#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "kva_pd_body.h"


static char  out[65536];


static const char *
prefill(const char *body, kva_prompt_rc_e *rc)
{
    size_t  n;

    n = 0;
    *rc = kva_pd_prefill_body((const uint8_t *) body, strlen(body),
                              (uint8_t *) out, &n);
    out[n] = '\0';

    return out;
}


static const char *
decode(const char *body, const char *params, kva_prompt_rc_e *rc)
{
    size_t  n;

    n = 0;
    *rc = kva_pd_decode_body((const uint8_t *) body, strlen(body),
                             (const uint8_t *) params, strlen(params),
                             (uint8_t *) out, &n);
    out[n] = '\0';

    return out;
}


static const char *
sglang(const char *body, const char *host, unsigned port, uint64_t room,
    kva_prompt_rc_e *rc)
{
    size_t   n;
    uint8_t  *o;

    /* exactly the room promised, so that a write past it shows (ASan) */
    o = malloc(strlen(body) + KVA_PD_SGLANG_EXTRA);
    n = 0;
    *rc = kva_pd_sglang_body((const uint8_t *) body, strlen(body),
                             (const uint8_t *) host, strlen(host), port,
                             room, o, &n);
    memcpy(out, o, n);
    out[n] = '\0';
    free(o);

    return out;
}


static kva_prompt_rc_e
answer(const char *a, char *params)
{
    size_t           n;
    const uint8_t   *p;
    kva_prompt_rc_e  rc;

    params[0] = '\0';
    rc = kva_pd_answer_params((const uint8_t *) a, strlen(a), &p, &n);

    if (rc == KVA_PROMPT_OK) {
        memcpy(params, p, n);
        params[n] = '\0';
    }

    return rc;
}


#define P  KVA_PD_PREFILL_PARAMS


int
main(void)
{
    int               i;
    char              params[4096], *deep;
    const char       *s;
    kva_prompt_rc_e   rc;

    /* leg 1 */

    s = prefill("{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                "\"content\":\"hi\"}],\"stream\":true,\"stream_options\":"
                "{\"include_usage\":true},\"max_tokens\":200,"
                "\"min_tokens\":5,\"temperature\":0.5}", &rc);
    ok(rc == KVA_PROMPT_OK && strcmp(s,
       "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
       "\"hi\"}],\"temperature\":0.5,\"stream\":false,\"max_tokens\":1,"
       P "}") == 0,
       "leg 1: stream false, max_tokens 1, stream_options and min_tokens "
       "gone, the params added: %s", s);

    s = prefill(" { \"prompt\" : [1, 2, 3] ,\n \"max_completion_tokens\""
                ": 9 } \n", &rc);
    ok(rc == KVA_PROMPT_OK && strcmp(s,
       "{\"prompt\" : [1, 2, 3],\"stream\":false,\"max_tokens\":1,"
       "\"max_completion_tokens\":1," P "}") == 0,
       "leg 1: members kept byte for byte, max_completion_tokens 1 where "
       "it was: %s", s);

    s = prefill("{}", &rc);
    ok(rc == KVA_PROMPT_OK && strcmp(s,
       "{\"stream\":false,\"max_tokens\":1," P "}") == 0,
       "leg 1: an empty object: %s", s);

    s = prefill("{\"kv_transfer_params\":{\"remote_host\":\"evil\"},"
                "\"stream\":true,\"stream\":false,\"p\":1}", &rc);
    ok(rc == KVA_PROMPT_OK && strcmp(s,
       "{\"p\":1,\"stream\":false,\"max_tokens\":1," P "}") == 0,
       "leg 1: the client's kv_transfer_params and a twice-given key "
       "left out: %s", s);

    s = prefill("{\"kv_transfer_param\\u0073\":1,\"x\":2}", &rc);
    ok(rc == KVA_PROMPT_OK && strstr(s, "\\u0073") == NULL,
       "leg 1: keys compared decoded (an escaped kv_transfer_params)");

    prefill("[1,2]", &rc);
    ok(rc == KVA_PROMPT_NOT_JSON, "leg 1: an array is refused");
    prefill("{\"a\":1", &rc);
    ok(rc == KVA_PROMPT_NOT_JSON, "leg 1: a truncated object is refused");
    prefill("{\"a\":1} x", &rc);
    ok(rc == KVA_PROMPT_NOT_JSON, "leg 1: trailing bytes are refused");
    prefill("", &rc);
    ok(rc == KVA_PROMPT_EMPTY, "leg 1: an empty body is refused");

    deep = malloc(400);
    strcpy(deep, "{\"a\":");
    for (i = 0; i < 100; i++) {
        strcat(deep, "[");
    }
    for (i = 0; i < 100; i++) {
        strcat(deep, "]");
    }
    strcat(deep, "}");
    prefill(deep, &rc);
    ok(rc == KVA_PROMPT_TOO_DEEP, "leg 1: 100 levels deep are refused");

    /* the answer */

    rc = answer("{\"id\":\"cmpl-1\",\"choices\":[{\"text\":\"x\"}],"
                "\"kv_transfer_params\": {\"do_remote_prefill\": true,"
                " \"remote_block_ids\": [1, 2, 3], \"remote_engine_id\":"
                " \"e1\", \"remote_host\": \"10.0.1.11\", \"remote_port\":"
                " 5600, \"tp_size\": 1} ,\"usage\":{}}", params);
    ok(rc == KVA_PROMPT_OK && strcmp(params,
       "{\"do_remote_prefill\": true, \"remote_block_ids\": [1, 2, 3], "
       "\"remote_engine_id\": \"e1\", \"remote_host\": \"10.0.1.11\", "
       "\"remote_port\": 5600, \"tp_size\": 1}") == 0,
       "answer: the params as they lie: %s", params);

    rc = answer("{\"choices\":[{\"kv_transfer_params\":{}}]}", params);
    ok(rc == KVA_PROMPT_NO_PROMPT, "answer: only a top-level one counts");
    rc = answer("{\"kv_transfer_params\":null}", params);
    ok(rc == KVA_PROMPT_NO_PROMPT, "answer: null is no params");
    rc = answer("{\"kv_transfer_params\":[1]}", params);
    ok(rc == KVA_PROMPT_NO_PROMPT, "answer: an array is no params");
    rc = answer("{\"kv_transfer_params\":\"{}\"}", params);
    ok(rc == KVA_PROMPT_NO_PROMPT, "answer: a string is no params");
    rc = answer("{\"kv_transfer_params\":{\"a\":1}", params);
    ok(rc == KVA_PROMPT_NOT_JSON, "answer: a truncated answer is refused");
    rc = answer("<html>502</html>", params);
    ok(rc == KVA_PROMPT_NOT_JSON, "answer: an error page is refused");
    rc = answer(deep, params);
    ok(rc == KVA_PROMPT_TOO_DEEP, "answer: 100 levels deep are refused");
    rc = answer("{\"kv_transfer_params\":{\"a\":1},"
                "\"kv_transfer_params\":{\"b\":2}}", params);
    ok(rc == KVA_PROMPT_OK && strcmp(params, "{\"b\":2}") == 0,
       "answer: the last of two wins, as the engine's parser reads it");

    /* leg 2 */

    s = decode("{\"model\":\"m\", \"stream\":true,\"max_tokens\":200}",
               "{\"do_remote_prefill\": true}", &rc);
    ok(rc == KVA_PROMPT_OK && strcmp(s,
       "{\"kv_transfer_params\":{\"do_remote_prefill\": true},"
       "\"model\":\"m\", \"stream\":true,\"max_tokens\":200}") == 0,
       "leg 2: the params verbatim, then the client's body byte for byte: "
       "%s", s);

    s = decode(" {\n} \n", "{\"a\":1}", &rc);
    ok(rc == KVA_PROMPT_OK && strcmp(s,
       "{\"kv_transfer_params\":{\"a\":1}\n} \n") == 0,
       "leg 2: an empty object, its spaces kept: %s", s);

    s = decode("{\"kv_transfer_params\":{\"remote_host\":\"evil\"},"
               "\"a\":1}", "{\"x\":1}", &rc);
    ok(rc == KVA_PROMPT_OK && strcmp(s,
       "{\"a\":1,\"kv_transfer_params\":{\"x\":1}}") == 0,
       "leg 2: the client's own params replaced: %s", s);

    s = decode("{}", "{}", &rc);
    ok(rc == KVA_PROMPT_OK && strcmp(s, "{\"kv_transfer_params\":{}}") == 0,
       "leg 2: an empty object: %s", s);

    decode("\"a\"", "{}", &rc);
    ok(rc == KVA_PROMPT_NOT_JSON, "leg 2: a string is refused");

    /* SGLang's bootstrap fields */

    s = sglang("{\"model\":\"m\", \"stream\":true,\n \"max_tokens\":200}",
               "10.0.1.11", 8998, 9223372036854775807ULL, &rc);
    ok(rc == KVA_PROMPT_OK && strcmp(s,
       "{\"bootstrap_host\":\"10.0.1.11\",\"bootstrap_port\":8998,"
       "\"bootstrap_room\":9223372036854775807,"
       "\"model\":\"m\", \"stream\":true,\n \"max_tokens\":200}") == 0,
       "sglang: the fields first, the client's bytes after them as they "
       "came (2^63-1 room): %s", s);

    s = sglang(" {\n} \n", "prefill-0.svc", 1, 0, &rc);
    ok(rc == KVA_PROMPT_OK && strcmp(s,
       "{\"bootstrap_host\":\"prefill-0.svc\",\"bootstrap_port\":1,"
       "\"bootstrap_room\":0\n} \n") == 0,
       "sglang: an empty object, its spaces kept, a host name: %s", s);

    s = sglang("{\"bootstrap_room\":1,\"a\":1,\"bootstrap_host\":\"evil\","
               "\"bootstrap_port\":\"x\",\"bootstrap_room\":2}",
               "::1", 65535, 7, &rc);
    ok(rc == KVA_PROMPT_OK && strcmp(s,
       "{\"a\":1,\"bootstrap_host\":\"::1\",\"bootstrap_port\":65535,"
       "\"bootstrap_room\":7}") == 0,
       "sglang: the client's own fields (twice, any type) replaced, an "
       "IPv6 host: %s", s);

    s = sglang("{\"bootstrap_roo\\u006d\":1}", "h", 2, 3, &rc);
    ok(rc == KVA_PROMPT_OK && strstr(s, "u006d") == NULL,
       "sglang: keys compared decoded: %s", s);

    sglang("[1]", "h", 8998, 1, &rc);
    ok(rc == KVA_PROMPT_NOT_JSON, "sglang: an array is refused");
    sglang("{\"a\":1", "h", 8998, 1, &rc);
    ok(rc == KVA_PROMPT_NOT_JSON, "sglang: a truncated object is refused");
    sglang("{\"a\":1}{}", "h", 8998, 1, &rc);
    ok(rc == KVA_PROMPT_NOT_JSON, "sglang: trailing bytes are refused");
    sglang("{\"a\":\"\xff\"}", "h", 8998, 1, &rc);
    ok(rc == KVA_PROMPT_BAD_UTF8, "sglang: bad UTF-8 is refused");
    sglang("", "h", 8998, 1, &rc);
    ok(rc == KVA_PROMPT_EMPTY, "sglang: an empty body is refused");
    sglang(deep, "h", 8998, 1, &rc);
    ok(rc == KVA_PROMPT_TOO_DEEP, "sglang: 100 levels deep are refused");

    sglang("{}", "a\"b", 8998, 1, &rc);
    ok(rc == KVA_PROMPT_NOT_JSON, "sglang: a host that needs escaping is "
       "refused");
    sglang("{}", "", 8998, 1, &rc);
    ok(rc == KVA_PROMPT_NOT_JSON, "sglang: an empty host is refused");
    sglang("{}", "h", 0, 1, &rc);
    ok(rc == KVA_PROMPT_NOT_JSON, "sglang: port 0 is refused");
    sglang("{}", "h", 65536, 1, &rc);
    ok(rc == KVA_PROMPT_NOT_JSON, "sglang: port 65536 is refused");

    {
        char  host[KVA_PD_HOST_MAX + 2];

        memset(host, 'a', KVA_PD_HOST_MAX);
        host[KVA_PD_HOST_MAX] = '\0';
        s = sglang("{}", host, 65535, 18446744073709551615ULL, &rc);
        ok(rc == KVA_PROMPT_OK && strlen(s) < 2 + KVA_PD_SGLANG_EXTRA,
           "sglang: the longest host, port and room fit the room "
           "promised (%zu bytes)", strlen(s));

        host[KVA_PD_HOST_MAX] = 'a';
        host[KVA_PD_HOST_MAX + 1] = '\0';
        sglang("{}", host, 8998, 1, &rc);
        ok(rc == KVA_PROMPT_NOT_JSON, "sglang: a longer host is refused");
    }

    free(deep);

    return done_testing();
}
