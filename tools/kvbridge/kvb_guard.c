/*
 * kvbridge: the collector's trust boundary (kvb_guard.h).
 */

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvb_guard.h"
#include "kvb_log.h"


/* a ZAP request: version, id, domain, address, identity, mechanism */
#define KVB_ZAP_PARTS  8


typedef struct {
    char                    addr[64];
    double                  tokens;
    uint64_t                last_ms;
} kvb_guard_peer_t;


struct kvb_guard_s {
    void                   *zap;        /* REP; NULL: no allow list */
    struct in6_addr         allow[KVB_GUARD_ALLOW_MAX];
    size_t                  nallow;
    size_t                  rate;
    kvb_guard_peer_t       *peers;      /* KVB_GUARD_PEERS, with a rate */
    size_t                  npeers;
    kvb_guard_stats_t       st;
    kvb_log_limit_t         deny_log;
    kvb_log_limit_t         rate_log;
};


static int kvb_guard_ip(const char *s, size_t len, struct in6_addr *a);
static int kvb_guard_allowed(kvb_guard_t *g, const char *addr, size_t len);
static void kvb_guard_answer(kvb_guard_t *g, zmq_msg_t *part, size_t n,
    uint64_t now_ms);


kvb_guard_t *
kvb_guard_create(void *zctx, const char *allow, size_t rate, char *err,
    size_t errlen)
{
    size_t        len;
    const char   *p, *end;
    kvb_guard_t  *g;

    g = calloc(1, sizeof(kvb_guard_t));
    if (g == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }

    g->rate = rate;

    if (rate) {
        g->peers = calloc(KVB_GUARD_PEERS, sizeof(kvb_guard_peer_t));
        if (g->peers == NULL) {
            snprintf(err, errlen, "out of memory");
            free(g);
            return NULL;
        }
    }

    if (allow == NULL) {
        return g;
    }

    for (p = allow; *p; p = *end ? end + 1 : end) {
        end = strchr(p, ',');
        end = end ? end : p + strlen(p);
        len = (size_t) (end - p);

        if (g->nallow == KVB_GUARD_ALLOW_MAX) {
            snprintf(err, errlen, "invalid collect-allow: more than %d "
                     "addresses", KVB_GUARD_ALLOW_MAX);
            goto failed;
        }

        if (kvb_guard_ip(p, len, &g->allow[g->nallow]) != 0) {
            snprintf(err, errlen, "invalid collect-allow \"%.*s\", "
                     "expected an IPv4 or IPv6 address", (int) len, p);
            goto failed;
        }

        g->nallow++;
    }

    if (g->nallow == 0) {
        snprintf(err, errlen, "invalid collect-allow \"\", expected "
                 "addresses");
        goto failed;
    }

    /* the one handler of the context: every socket with a domain asks it */

    g->zap = zmq_socket(zctx, ZMQ_REP);

    if (g->zap == NULL || zmq_bind(g->zap, "inproc://zeromq.zap.01") != 0) {
        snprintf(err, errlen, "the ZAP handler: %s",
                 zmq_strerror(zmq_errno()));
        goto failed;
    }

    return g;

failed:

    kvb_guard_destroy(g);
    return NULL;
}


void
kvb_guard_destroy(kvb_guard_t *g)
{
    if (g == NULL) {
        return;
    }

    if (g->zap != NULL) {
        zmq_close(g->zap);
    }

    free(g->peers);
    free(g);
}


int
kvb_guard_socket(kvb_guard_t *g, void *collect)
{
    if (g->zap == NULL) {
        return 0;
    }

    return zmq_setsockopt(collect, ZMQ_ZAP_DOMAIN, KVB_GUARD_DOMAIN,
                          strlen(KVB_GUARD_DOMAIN));
}


/* an address, IPv4 as IPv4-mapped IPv6, so that both compare alike */

static int
kvb_guard_ip(const char *s, size_t len, struct in6_addr *a)
{
    char            buf[INET6_ADDRSTRLEN + 2];
    struct in_addr  v4;

    if (len >= 2 && s[0] == '[' && s[len - 1] == ']') {
        s++;
        len -= 2;
    }

    if (len == 0 || len >= sizeof(buf)) {
        return -1;
    }

    memcpy(buf, s, len);
    buf[len] = '\0';

    if (inet_pton(AF_INET, buf, &v4) == 1) {
        memset(a, 0, sizeof(*a));
        a->s6_addr[10] = 0xff;
        a->s6_addr[11] = 0xff;
        memcpy(&a->s6_addr[12], &v4, 4);
        return 0;
    }

    return inet_pton(AF_INET6, buf, a) == 1 ? 0 : -1;
}


static int
kvb_guard_allowed(kvb_guard_t *g, const char *addr, size_t len)
{
    size_t           i;
    struct in6_addr  a;

    if (kvb_guard_ip(addr, len, &a) != 0) {
        return 0;
    }

    for (i = 0; i < g->nallow; i++) {
        if (memcmp(&a, &g->allow[i], sizeof(a)) == 0) {
            return 1;
        }
    }

    return 0;
}


int
kvb_guard_watch(void *data, uint64_t now_ms, zmq_pollitem_t *items, int max)
{
    kvb_guard_t  *g = data;

    if (g->zap == NULL) {
        return 0;
    }

    items[0].socket = g->zap;
    items[0].events = ZMQ_POLLIN;

    return 1;
}


void
kvb_guard_io(void *data, const zmq_pollitem_t *items, int n,
    kvb_budget_t *b, uint64_t now_ms)
{
    int           more;
    size_t        k, i;
    zmq_msg_t     part[KVB_ZAP_PARTS], skip;
    kvb_guard_t  *g = data;

    while (kvb_budget_left(b)) {
        k = 0;
        more = 1;

        while (more && k < KVB_ZAP_PARTS) {
            zmq_msg_init(&part[k]);

            if (zmq_msg_recv(&part[k], g->zap, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&part[k]);
                break;
            }

            more = zmq_msg_more(&part[k]);
            k++;
        }

        while (more && k > 0) {
            zmq_msg_init(&skip);
            more = zmq_msg_recv(&skip, g->zap, ZMQ_DONTWAIT) >= 0
                   && zmq_msg_more(&skip);
            zmq_msg_close(&skip);
        }

        if (k == 0) {
            return;
        }

        kvb_budget_spend(b, 0);
        kvb_guard_answer(g, part, k, now_ms);

        for (i = 0; i < k; i++) {
            zmq_msg_close(&part[i]);
        }
    }
}


/* ZAP (RFC 27): 200 for an allowed address, 400 for any other */

static void
kvb_guard_answer(kvb_guard_t *g, zmq_msg_t *part, size_t n,
    uint64_t now_ms)
{
    int          ok;
    size_t       len;
    const char  *status, *text, *addr;

    ok = 0;
    addr = "";
    len = 0;

    if (n >= 6 && zmq_msg_size(&part[0]) == 3
        && memcmp(zmq_msg_data(&part[0]), "1.0", 3) == 0)
    {
        addr = zmq_msg_data(&part[3]);
        len = zmq_msg_size(&part[3]);
        ok = kvb_guard_allowed(g, addr, len);
    }

    if (ok) {
        g->st.allowed++;
        status = "200";
        text = "OK";

    } else {
        g->st.denied++;
        status = "400";
        text = "not in --collect-allow";
        kvb_log_limited(&g->deny_log, now_ms, KVB_LOG_WARN,
                        "collect: a peer from %.*s refused: not in "
                        "--collect-allow", (int) (len > 64 ? 64 : len),
                        addr);
    }

    /* version, the request's id, status, its text, user id, metadata */

    zmq_send(g->zap, "1.0", 3, ZMQ_SNDMORE);

    if (n >= 2) {
        zmq_send(g->zap, zmq_msg_data(&part[1]), zmq_msg_size(&part[1]),
                 ZMQ_SNDMORE);
    } else {
        zmq_send(g->zap, "", 0, ZMQ_SNDMORE);
    }

    zmq_send(g->zap, status, 3, ZMQ_SNDMORE);
    zmq_send(g->zap, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(g->zap, "", 0, ZMQ_SNDMORE);
    zmq_send(g->zap, "", 0, 0);
}


/* a token bucket a peer, of one second's worth */

int
kvb_guard_rate(kvb_guard_t *g, zmq_msg_t *msg, uint64_t now_ms)
{
    size_t             i;
    const char        *addr;
    kvb_guard_peer_t  *p, *oldest;

    if (g->rate == 0) {
        return 1;
    }

    addr = zmq_msg_gets(msg, "Peer-Address");
    if (addr == NULL) {
        return 1;
    }

    p = NULL;
    oldest = NULL;

    for (i = 0; i < g->npeers; i++) {
        if (strcmp(g->peers[i].addr, addr) == 0) {
            p = &g->peers[i];
            break;
        }

        if (oldest == NULL || g->peers[i].last_ms < oldest->last_ms) {
            oldest = &g->peers[i];
        }
    }

    if (p == NULL) {
        p = (g->npeers < KVB_GUARD_PEERS) ? &g->peers[g->npeers++] : oldest;
        snprintf(p->addr, sizeof(p->addr), "%s", addr);
        p->tokens = (double) g->rate;
        p->last_ms = now_ms;
    }

    p->tokens += (double) (now_ms - p->last_ms) * (double) g->rate / 1000;
    p->tokens = (p->tokens > (double) g->rate) ? (double) g->rate
                                               : p->tokens;
    p->last_ms = now_ms;

    if (p->tokens >= 1) {
        p->tokens -= 1;
        return 1;
    }

    g->st.limited++;
    kvb_log_limited(&g->rate_log, now_ms, KVB_LOG_WARN,
                    "collect: a peer from %s is past --collect-rate %zu "
                    "messages a second: dropped", addr, g->rate);

    return 0;
}


const kvb_guard_stats_t *
kvb_guard_stats(const kvb_guard_t *g)
{
    return &g->st;
}
