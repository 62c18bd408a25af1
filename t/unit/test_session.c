/*
 * Unit tests of the session bindings (src/core/kva_session.c): binding,
 * idle expiry, eviction of the least recently used, and the table kept
 * consistent against a plain model through many random operations.
 */

#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "kva_session.h"


static kva_session_t *make(uint32_t capacity);
static void test_random(void);


/* every table made, freed at the end (the sanitizers' leak check) */
static void   *made[8];
static int     nmade;


int
main(void)
{
    uint32_t        slot;
    kva_session_t  *t;

    t = make(4);
    ok(t != NULL, "a table of 4");

    ok(kva_session_get(t, 11, 1000, 0, &slot) == KVA_SESSION_NONE,
       "an unknown session is not bound");

    kva_session_bind(t, 11, 3, 1000);
    slot = 99;
    ok(kva_session_get(t, 11, 1001, 0, &slot) == KVA_SESSION_FOUND
       && slot == 3, "a bound session finds its server");

    kva_session_bind(t, 11, 5, 1002);
    ok(kva_session_get(t, 11, 1003, 0, &slot) == KVA_SESSION_FOUND
       && slot == 5 && t->used == 1, "rebinding moves it, one entry");

    /* idle expiry */
    ok(kva_session_get(t, 11, 1002 + 500, 600, &slot) == KVA_SESSION_FOUND,
       "within the timeout it stays");
    ok(kva_session_get(t, 11, 1002 + 700, 600, &slot) == KVA_SESSION_EXPIRED
       && t->used == 0 && t->expired == 1, "idle past it, it expires");
    ok(kva_session_get(t, 11, 1002 + 800, 600, &slot) == KVA_SESSION_NONE,
       "and is then unknown");

    /* a clock behind (another worker's) does not age an entry */
    kva_session_bind(t, 12, 1, 5000);
    kva_session_bind(t, 12, 1, 4990);
    ok(t->entries[t->head].used == 5000, "a clock behind keeps the time");

    /* full: the least recently used goes */
    t = make(3);
    kva_session_bind(t, 1, 0, 10);
    kva_session_bind(t, 2, 1, 20);
    kva_session_bind(t, 3, 2, 30);
    kva_session_bind(t, 1, 0, 40);          /* 2 is now the oldest */
    kva_session_bind(t, 4, 3, 50);

    ok(t->used == 3 && t->evicted == 1, "full: one evicted");
    ok(kva_session_get(t, 2, 60, 0, &slot) == KVA_SESSION_NONE,
       "the least recently used was evicted");
    ok(kva_session_get(t, 1, 60, 0, &slot) == KVA_SESSION_FOUND
       && kva_session_get(t, 3, 60, 0, &slot) == KVA_SESSION_FOUND
       && kva_session_get(t, 4, 60, 0, &slot) == KVA_SESSION_FOUND
       && slot == 3, "the others stay");

    /* the sweep: a lookup of anything removes a few idle ones */
    t = make(8);
    kva_session_bind(t, 1, 0, 10);
    kva_session_bind(t, 2, 0, 10);
    kva_session_bind(t, 3, 0, 10);
    kva_session_bind(t, 4, 0, 1000);
    (void) kva_session_get(t, 99, 1005, 100, &slot);
    ok(t->used == 4 - KVA_SESSION_SWEEP && t->expired == KVA_SESSION_SWEEP,
       "a lookup sweeps %d idle entries", KVA_SESSION_SWEEP);
    (void) kva_session_get(t, 99, 1005, 100, &slot);
    ok(t->used == 1, "then the rest, and never a live one");

    made[nmade] = malloc(16);
    ok(kva_session_init(made[nmade++], 16, 4) == NULL, "too small: refused");

    test_random();

    while (nmade) {
        free(made[--nmade]);
    }

    return done_testing();
}


static kva_session_t *
make(uint32_t capacity)
{
    size_t  size;

    size = kva_session_size(capacity);
    made[nmade] = malloc(size);

    return kva_session_init(made[nmade++], size, capacity);
}


/* against a model: which keys are in, with which slot, in what order */
static void
test_random(void)
{
    int             bad;
    uint32_t        i, k, slot, n, cap, model_slot[64];
    uint64_t        now, model_used[64];
    kva_session_t  *t;
    kva_session_rc_e  rc;

    cap = 16;
    t = make(cap);
    bad = 0;
    now = 1;
    n = 0;

    memset(model_used, 0, sizeof(model_used));

    srand(7);

    for (i = 0; i < 200000 && !bad; i++) {
        k = 1 + rand() % 63;
        now += 1 + rand() % 3;

        if (rand() % 2) {
            if (model_used[k] == 0) {
                if (n == cap) {
                    /* the model's least recently used */
                    uint32_t  j, lru = 0;

                    for (j = 1; j < 64; j++) {
                        if (model_used[j] && (lru == 0
                            || model_used[j] < model_used[lru]))
                        {
                            lru = j;
                        }
                    }

                    model_used[lru] = 0;
                    n--;
                }

                n++;
            }

            kva_session_bind(t, k, k % 7, now);
            model_used[k] = now;
            model_slot[k] = k % 7;

        } else {
            rc = kva_session_get(t, k, now, 0, &slot);

            if ((rc == KVA_SESSION_FOUND) != (model_used[k] != 0)
                || (rc == KVA_SESSION_FOUND && slot != model_slot[k]))
            {
                bad = 1;
            }
        }

        if (t->used != n) {
            bad = 2;
        }
    }

    ok(!bad, "200000 random binds and lookups agree with a model (%d)", bad);
}
