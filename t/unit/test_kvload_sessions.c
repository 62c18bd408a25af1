/*
 * Unit tests for kvload's sessions reader and bodies
 * (tools/kvload/kvload_sessions_load.c): sub-agents merged in time order,
 * each request's ids packed against its thread's previous ones, the
 * selection (too long, malformed, skipped, counted, cut), pauses
 * shortened, and the bodies: blocks the same text for the same (session,
 * id), apart between sessions, shared with --sessions-shared-prefix.
 * Prints TAP.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"
#include "kvload_sessions.h"


static char  dir[] = "/tmp/kvload-sessions-XXXXXX";


static const char  session_a[] =
    "{\"id\": \"%s\", \"system_tokens\": 64, \"tool_tokens\": 64,"
    " \"requests\": ["
    "  {\"t\": 0.0, \"type\": \"n\", \"in\": 200, \"out\": 5,"
    "   \"hash_ids\": [1, 2, 3], \"think_time\": 0.0},"
    "  {\"t\": 10.0, \"type\": \"subagent\", \"subagent_type\": \"Explore\","
    "   \"system_tokens\": 64, \"tool_tokens\": 0, \"requests\": ["
    "    {\"t\": 0.0, \"type\": \"n\", \"in\": 130, \"out\": 3,"
    "     \"hash_ids\": [50, 51]},"
    "    {\"t\": 2.0, \"type\": \"n\", \"in\": 200, \"out\": 0,"
    "     \"hash_ids\": [50, 51, 52], \"think_time\": 0.5}]},"
    "  {\"t\": 11.0, \"type\": \"n\", \"in\": 300, \"out\": 4,"
    "   \"hash_ids\": [1, 2, 3, 4], \"think_time\": 1.0},"
    "  {\"t\": 100.0, \"type\": \"n\", \"in\": 260, \"out\": 2,"
    "   \"hash_ids\": [1, 2, 9, 10], \"think_time\": 50.0}]}";


static void
put(const char *name, const char *text)
{
    char   path[256];
    FILE  *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "w");

    if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
        printf("Bail out! cannot write %s\n", path);
        exit(1);
    }
}


/* a request's ids, as kvload's replay rebuilds them thread by thread */
static uint32_t  cur[8][64];

static const uint32_t *
ids_of(const kvl_ss_session_t *s, uint32_t k)
{
    uint32_t             i;
    const kvl_ss_req_t  *r;

    memset(cur, 0, sizeof(cur));

    for (i = 0; i <= k; i++) {
        r = &s->reqs[i];
        memcpy(cur[r->thread] + r->keep, s->ids + r->first,
               r->nnew * sizeof(uint32_t));
    }

    return cur[s->reqs[k].thread];
}


/* the prompt of request k: the content of its one message */
static char *
prompt(const kvl_ss_session_t *s, uint32_t k, size_t *len, char **body)
{
    char        *p, *q;
    size_t       cap = 0, blen;

    *body = NULL;

    if (kvl_ss_body(s, &s->reqs[k], ids_of(s, k), "m", body, &cap, &blen)
        != 0)
    {
        return NULL;
    }

    p = strstr(*body, "\"content\":\"");
    q = p ? strchr(p + 11, '"') : NULL;
    *len = q ? (size_t) (q - p - 11) : 0;

    return q ? p + 11 : NULL;
}


static int
load(kvl_ss_conf_t *c, kvl_ss_set_t *set)
{
    return kvl_ss_load(c, set);
}


int
main(void)
{
    char              text[4096], *ba, *bb, *bc, *a, *b, *c, cmd[512];
    size_t            la, lb, lc;
    kvl_ss_set_t      set;
    kvl_ss_conf_t     conf;
    kvl_ss_session_t *s;

    if (mkdtemp(dir) == NULL) {
        printf("Bail out! cannot make %s\n", dir);
        return 1;
    }

    snprintf(text, sizeof(text), session_a, "sa");
    put("s_a.json", text);
    snprintf(text, sizeof(text), session_a, "sb");
    put("s_b.json", text);
    put("s_bad.json", "{\"id\": \"bad\", \"requests\": [{\"t\": 0,"
        " \"in\": 10, \"out\": 1}]}");
    put("s_long.json", "{\"id\": \"long\", \"requests\": [{\"t\": 0,"
        " \"in\": 5000, \"out\": 1, \"hash_ids\": [1, 2]}]}");
    put("notes.txt", "not a session");

    memset(&conf, 0, sizeof(conf));
    conf.dir = dir;
    conf.max_tokens = 1000;

    ok(load(&conf, &set) == 0 && set.n == 2 && set.broken == 1
       && set.too_long == 1 && set.read == 4,
       "2 sessions of 4 files: one malformed, one too long, the .txt "
       "not read");

    s = &set.s[0];
    ok(strcmp(s->id, "sa") == 0 && s->nreqs == 5 && s->nthreads == 2
       && s->subagents == 1 && s->max_in == 300,
       "sa: 5 requests, a sub-agent, 300 tokens at most");
    ok(s->reqs[0].thread == 0 && s->reqs[1].thread == 1
       && s->reqs[2].thread == 0 && s->reqs[3].thread == 1
       && s->reqs[4].thread == 0 && s->reqs[1].t == 10.0
       && s->reqs[3].t == 12.0 && s->reqs[2].t == 11.0,
       "the sub-agent's requests among the main agent's, at its entry's "
       "time plus theirs");
    ok(s->reqs[0].keep == 0 && s->reqs[0].nnew == 3
       && s->reqs[2].keep == 3 && s->reqs[2].nnew == 1
       && s->reqs[3].keep == 2 && s->reqs[3].nnew == 1
       && s->reqs[4].keep == 2 && s->reqs[4].nnew == 2 && s->nids == 9,
       "ids packed against the thread's previous request: 9 of 16 held");
    ok(s->reqs[3].out == 1 && s->reqs[3].think == 0.5
       && s->reqs[0].out == 5, "out 0 asks for one token");
    ok(s->reqs[0].shared == 0, "no shared prefix unless asked");

    a = prompt(s, 0, &la, &ba);
    b = prompt(&set.s[1], 0, &lb, &bb);
    c = prompt(s, 4, &lc, &bc);
    ok(a && la == 200 * 4 && strstr(ba, "\"max_tokens\":5,") != NULL,
       "200 tokens: 800 bytes, max_tokens its out");
    ok(a && b && lb == la && memcmp(a, b, 256) != 0
       && memcmp(a + 256, b + 256, 256) != 0,
       "the same ids in another session: other text");
    ok(a && c && lc == 260 * 4 && memcmp(a, c, 512) == 0
       && memcmp(a + 512, c + 512, 256) != 0,
       "a later turn: its first two blocks the same bytes, the third not");
    free(ba);
    free(bb);
    free(bc);

    a = prompt(s, 3, &la, &ba);
    ok(a && la == 200 * 4 && strstr(ba, "\"max_tokens\":1,") != NULL,
       "the sub-agent's second request rebuilt from its own thread");
    free(ba);

    kvl_ss_set_free(&set);

    /* the shared prefix: system + tools of each kind of thread */
    conf.shared_prefix = 1;
    ok(load(&conf, &set) == 0 && set.s[0].reqs[0].shared == 2
       && set.s[0].reqs[4].shared == 2 && set.s[0].reqs[1].shared == 1,
       "shared: 2 blocks of the main agent, 1 of the sub-agent");

    a = prompt(&set.s[0], 0, &la, &ba);
    b = prompt(&set.s[1], 0, &lb, &bb);
    c = prompt(&set.s[1], 1, &lc, &bc);
    ok(a && b && memcmp(a, b, 512) == 0 && memcmp(a + 512, b + 512, 256)
       != 0, "two sessions share their first two blocks, not the third");
    ok(a && c && memcmp(a, c, 256) != 0,
       "a sub-agent's shared block is not the main agent's");
    free(ba);
    free(bb);
    free(bc);
    kvl_ss_set_free(&set);

    /* the selection: skipped, counted, cut, pauses shortened */
    conf.shared_prefix = 0;
    conf.skip = 1;
    ok(load(&conf, &set) == 0 && set.n == 1
       && strcmp(set.s[0].id, "sb") == 0, "--sessions-skip 1: sb alone");
    kvl_ss_set_free(&set);

    conf.skip = 0;
    conf.count = 1;
    conf.requests = 3;
    conf.idle_max = 0.5;
    ok(load(&conf, &set) == 0 && set.n == 1 && set.s[0].nreqs == 3
       && set.s[0].reqs[1].t == 0.5 && set.s[0].reqs[2].t == 1.0
       && set.s[0].reqs[1].think == 0.0 && set.s[0].reqs[2].think == 0.5,
       "--sessions 1, 3 requests, pauses over 0.5 s shortened");
    kvl_ss_set_free(&set);

    /* an archive, read through tar */
    snprintf(cmd, sizeof(cmd), "tar -czf %s/all.tgz -C %s s_a.json "
             "s_bad.json s_b.json 2>/dev/null", dir, dir);
    memset(&conf, 0, sizeof(conf));
    snprintf(text, sizeof(text), "%s/all.tgz", dir);
    conf.tar = text;

    if (system(cmd) == 0) {
        ok(load(&conf, &set) == 0 && set.n == 2 && set.broken == 1
           && strcmp(set.s[1].id, "sb") == 0 && set.s[1].nreqs == 5,
           "from a .tar.gz: 2 sessions in the archive's order");
        kvl_ss_set_free(&set);

    } else {
        skip("tar failed");
    }

    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    (void) system(cmd);

    printf("1..%d\n", tap_n);

    return tap_failed ? 1 : 0;
}
