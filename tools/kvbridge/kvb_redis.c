/*
 * kvbridge: the two Redis links (kvb_redis.h).
 *
 * hiredis' asynchronous client asks its event library to start and stop
 * watching the socket through hooks; here the hooks only set flags that
 * kvb_redis_watch() turns into zmq_poll() items, so hiredis runs on the
 * bridge's one loop with no adapter library.
 *
 * Each link knows, on the loop's clock, since when it has been waiting
 * for a reply: Redis answers a PUBLISH or a PING within milliseconds, so
 * one waited on past the timeout is hung, and is dropped (with an RST,
 * so that the kernel does not keep sending stale messages) and made
 * again.  A link waiting on nothing is asked something (the publisher a
 * PING, the subscriber its SUBSCRIBE again), so that a hang is seen even
 * when nothing is published and nobody asks for a resync.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* stdlib.h has told whether this is glibc, whose malloc_trim() we use */
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "kva_cluster.h"
#include "kva_event.h"
#include "kvb_log.h"
#include "kvb_redis.h"


#define KVB_REDIS_CONNECT_MS    2000
#define KVB_REDIS_BACKOFF_MIN   100
#define KVB_REDIS_BACKOFF_MAX   2000
#define KVB_REDIS_MOVES_FREE    2       /* moves in a row without a wait */
#define KVB_REDIS_TIMEOUT       5000
/* an idle link is PINGed this often (at most half the timeout) */
#define KVB_REDIS_PING_MS       1000
/* a PUBLISH's bytes besides its message: the command, the channel's
   length and the RESP framing, as hiredis' buffer holds them */
#define KVB_REDIS_PUB_OVERHEAD  48
/* having held this much, the link gives the memory back once drained */
#define KVB_REDIS_TRIM_BYTES    (1024 * 1024)

/* the cluster's nodes a link tries when the one it knew is gone */
#define KVB_REDIS_NODES         16


typedef struct kvb_link_s  kvb_link_t;

struct kvb_link_s {
    kvb_redis_t            *r;
    redisAsyncContext      *ac;
    const char             *name;       /* "publish" or "subscribe" */
    unsigned                reading:1;
    unsigned                writing:1;
    unsigned                up:1;
    unsigned                subscriber:1;
    unsigned                moving:1;   /* to host: not a failure */
    char                    host[KVA_CLUSTER_HOST_LEN];  /* where to */
    int                     port;
    uint64_t                deadline;   /* connect timeout, or retry */
    unsigned                backoff;
    unsigned                moves;      /* since subscribed or published */

    /* once up: commands sent and not answered, since when, last reply */
    uint64_t                outstanding;
    uint64_t                wait_from;
    uint64_t                heard;
};


struct kvb_redis_s {
    kvb_redis_conf_t        conf;
    kvb_redis_handler_t     h;
    char                   *resync_channel;
    kvb_link_t              pub;
    kvb_link_t              sub;
    size_t                  overhead;   /* a PUBLISH's bytes but its message */
    unsigned                ping_ms;
    unsigned                trim:1;     /* held a lot since the last trim */

    /* conf.cluster: the channel's slot; the seeds, then the nodes named */
    unsigned                slot;
    kva_cluster_node_t      nodes[KVB_REDIS_NODES];
    size_t                  nnodes;
    size_t                  nseeds;     /* first in nodes, always kept */
    size_t                  next;
    kvb_redis_stats_t       st;
    kvb_log_limit_t         drop_log;
    kvb_log_limit_t         error_log;
};


static void kvb_link_connect(kvb_link_t *l, uint64_t now_ms);
static void kvb_link_down(kvb_link_t *l, const char *why, uint64_t now_ms);
static void kvb_link_free(kvb_link_t *l);
static void kvb_redis_trim(kvb_redis_t *r);
static void kvb_link_state(kvb_link_t *l, kvb_redis_state_e state);
static void kvb_link_up(kvb_link_t *l, uint64_t now_ms);
static void kvb_link_heard(kvb_link_t *l, uint64_t now_ms);
static void kvb_link_sent(kvb_link_t *l, uint64_t now_ms);
static void kvb_link_check(kvb_link_t *l, uint64_t now_ms);
static void kvb_link_abort(kvb_link_t *l, const char *why, uint64_t now_ms);
static uint64_t kvb_link_deadline(const kvb_link_t *l);
static void kvb_on_connect(const redisAsyncContext *ac, int status);
static void kvb_on_disconnect(const redisAsyncContext *ac, int status);
static void kvb_on_auth(redisAsyncContext *ac, void *reply, void *data);
static void kvb_on_published(redisAsyncContext *ac, void *reply, void *data);
static void kvb_on_pong(redisAsyncContext *ac, void *reply, void *data);
static void kvb_on_message(redisAsyncContext *ac, void *reply, void *data);
static void kvb_on_slots(redisAsyncContext *ac, void *reply, void *data);
static void kvb_link_placed(kvb_link_t *l);
static void kvb_link_moved(kvb_link_t *l, const char *why);
static void kvb_add_read(void *data);
static void kvb_del_read(void *data);
static void kvb_add_write(void *data);
static void kvb_del_write(void *data);
static void kvb_cleanup(void *data);


kvb_redis_t *
kvb_redis_create(const kvb_redis_conf_t *conf, const kvb_redis_handler_t *h)
{
    size_t        i, n;
    kvb_redis_t  *r;

    r = calloc(1, sizeof(kvb_redis_t));
    if (r == NULL) {
        return NULL;
    }

    n = strlen(conf->channel);
    r->resync_channel = malloc(n + sizeof(":resync"));
    if (r->resync_channel == NULL) {
        free(r);
        return NULL;
    }

    memcpy(r->resync_channel, conf->channel, n);
    memcpy(r->resync_channel + n, ":resync", sizeof(":resync"));

    r->conf = *conf;
    r->h = *h;

    if (r->conf.timeout_ms == 0) {
        r->conf.timeout_ms = KVB_REDIS_TIMEOUT;
    }

    r->ping_ms = r->conf.timeout_ms / 2;
    r->ping_ms = (r->ping_ms > KVB_REDIS_PING_MS) ? KVB_REDIS_PING_MS
                                                  : r->ping_ms;
    r->overhead = KVB_REDIS_PUB_OVERHEAD + n;
    r->pub.r = r;
    r->pub.name = "publish";
    r->sub.r = r;
    r->sub.name = "subscribe";
    r->sub.subscriber = 1;

    snprintf(r->nodes[0].host, sizeof(r->nodes[0].host), "%s", conf->host);
    r->nodes[0].port = (unsigned) conf->port;
    r->nnodes = 1;

    /* the other seeds (the first is host:port), before any node named */
    for (i = 1; conf->cluster && i < conf->nseeds && i < KVB_REDIS_NODES;
         i++)
    {
        snprintf(r->nodes[i].host, sizeof(r->nodes[i].host), "%s",
                 conf->seed_hosts[i]);
        r->nodes[i].port = (unsigned) conf->seed_ports[i];
        r->nnodes++;
    }

    r->nseeds = r->nnodes;
    r->slot = kva_cluster_slot((const unsigned char *) conf->channel, n);
    snprintf(r->pub.host, sizeof(r->pub.host), "%s", conf->host);
    snprintf(r->sub.host, sizeof(r->sub.host), "%s", conf->host);
    r->pub.port = conf->port;
    r->sub.port = conf->port;

    /* both connect on the first tick */
    return r;
}


void
kvb_redis_destroy(kvb_redis_t *r)
{
    if (r == NULL) {
        return;
    }

    kvb_link_free(&r->pub);
    kvb_link_free(&r->sub);
    free(r->resync_channel);
    free(r);
}


/*
 * What a message costs until Redis answers it rides along as the
 * callback's data, so that the answer gives back exactly that.  One
 * message bigger than the cap still goes when nothing waits: a snapshot's
 * part must never be refused for good.
 */

int
kvb_redis_publish(kvb_redis_t *r, const char *msg, size_t len)
{
    size_t    cost;
    uint64_t  now;

    now = kvb_now_ms();
    cost = len + r->overhead;

    if (!r->pub.up
        || (r->st.pending_bytes != 0
            && r->st.pending_bytes + cost > r->conf.max_pending_bytes))
    {
        r->st.dropped++;
        r->st.dropped_bytes += len;
        kvb_log_limited(&r->drop_log, now, KVB_LOG_WARN,
                        "redis %s:%d %s: message dropped (%llu bytes "
                        "waiting for an answer, at most %zu)",
                        r->pub.host, r->pub.port,
                        r->pub.up ? "behind" : "down",
                        (unsigned long long) r->st.pending_bytes,
                        r->conf.max_pending_bytes);
        return -1;
    }

    if (redisAsyncCommand(r->pub.ac, kvb_on_published,
                          (void *) (uintptr_t) cost,
                          r->conf.cluster ? "SPUBLISH %s %b" : "PUBLISH %s %b",
                          r->conf.channel, msg, len)
        != REDIS_OK)
    {
        r->st.dropped++;
        r->st.dropped_bytes += len;
        return -1;
    }

    kvb_link_sent(&r->pub, now);
    r->st.pending++;
    r->st.pending_bytes += cost;
    r->st.published++;

    if (r->st.pending_bytes >= KVB_REDIS_TRIM_BYTES) {
        r->trim = 1;
    }

    return 0;
}


int
kvb_redis_up(const kvb_redis_t *r)
{
    return r->pub.up;
}


int
kvb_redis_watch(kvb_redis_t *r, zmq_pollitem_t *items)
{
    int          n;
    kvb_link_t  *l, *links[2];
    unsigned     i;

    links[0] = &r->pub;
    links[1] = &r->sub;
    n = 0;

    for (i = 0; i < 2; i++) {
        l = links[i];

        if (l->ac == NULL || !(l->reading || l->writing)) {
            continue;
        }

        items[n].socket = NULL;
        items[n].fd = l->ac->c.fd;
        items[n].events = (short) ((l->reading ? ZMQ_POLLIN : 0)
                                   | (l->writing ? ZMQ_POLLOUT : 0));
        items[n].revents = 0;
        n++;
    }

    return n;
}


void
kvb_redis_io(kvb_redis_t *r, const zmq_pollitem_t *items, int n)
{
    int          i;
    kvb_link_t  *l;

    for (i = 0; i < n; i++) {
        l = NULL;

        if (r->pub.ac != NULL && items[i].fd == r->pub.ac->c.fd) {
            l = &r->pub;

        } else if (r->sub.ac != NULL && items[i].fd == r->sub.ac->c.fd) {
            l = &r->sub;
        }

        if (l == NULL) {
            continue;
        }

        /* either may free the context: look again after each */

        if (items[i].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) {
            redisAsyncHandleRead(l->ac);
        }

        if (l->ac != NULL && (items[i].revents & ZMQ_POLLOUT)) {
            redisAsyncHandleWrite(l->ac);
        }
    }
}


uint64_t
kvb_redis_deadline(const kvb_redis_t *r)
{
    uint64_t  d, s;

    d = kvb_link_deadline(&r->pub);
    s = kvb_link_deadline(&r->sub);

    return (s < d) ? s : d;
}


void
kvb_redis_tick(kvb_redis_t *r, uint64_t now_ms)
{
    kvb_link_t  *l, *links[2];
    unsigned     i;

    links[0] = &r->pub;
    links[1] = &r->sub;

    for (i = 0; i < 2; i++) {
        l = links[i];

        if (l->up) {
            kvb_link_check(l, now_ms);
            continue;
        }

        if (now_ms < l->deadline) {
            continue;
        }

        if (l->ac != NULL) {
            /* connected (a stopped Redis' kernel accepts), no answer */
            kvb_link_abort(l, "connect timed out", now_ms);
            continue;
        }

        kvb_link_connect(l, now_ms);
    }
}


const kvb_redis_stats_t *
kvb_redis_stats(const kvb_redis_t *r)
{
    return &r->st;
}


const char *
kvb_redis_state_name(kvb_redis_state_e state)
{
    switch (state) {
    case KVB_REDIS_UP:
        return "up";
    case KVB_REDIS_CONNECTING:
        return "connecting";
    default:
        return "down";
    }
}


static void
kvb_link_connect(kvb_link_t *l, uint64_t now_ms)
{
    redisAsyncContext  *ac;

    ac = redisAsyncConnect(l->host, l->port);

    if (ac == NULL || ac->err) {
        if (ac != NULL) {
            kvb_log(KVB_LOG_WARN, "redis %s:%d (%s): %s", l->host, l->port,
                    l->name, ac->errstr);
            redisAsyncFree(ac);
        }

        l->deadline = now_ms + (l->backoff ? l->backoff
                                           : KVB_REDIS_BACKOFF_MIN);
        l->backoff = l->backoff ? l->backoff * 2 : KVB_REDIS_BACKOFF_MIN;
        l->backoff = (l->backoff > KVB_REDIS_BACKOFF_MAX)
                     ? KVB_REDIS_BACKOFF_MAX : l->backoff;
        return;
    }

    l->ac = ac;
    ac->data = l;
    ac->ev.data = l;
    ac->ev.addRead = kvb_add_read;
    ac->ev.delRead = kvb_del_read;
    ac->ev.addWrite = kvb_add_write;
    ac->ev.delWrite = kvb_del_write;
    ac->ev.cleanup = kvb_cleanup;

    redisAsyncSetConnectCallback(ac, kvb_on_connect);
    redisAsyncSetDisconnectCallback(ac, kvb_on_disconnect);

    /* the connect completes when the socket turns writable */
    l->writing = 1;
    l->deadline = now_ms + KVB_REDIS_CONNECT_MS;
    l->r->st.reconnects++;
    kvb_link_state(l, KVB_REDIS_CONNECTING);

    if (l->r->conf.password != NULL) {
        if (l->r->conf.user != NULL) {
            (void) redisAsyncCommand(ac, kvb_on_auth, l, "AUTH %s %s",
                                     l->r->conf.user, l->r->conf.password);
        } else {
            (void) redisAsyncCommand(ac, kvb_on_auth, l, "AUTH %s",
                                     l->r->conf.password);
        }
    }

    if (l->r->conf.cluster) {
        /* which node has the slot, first */
        (void) redisAsyncCommand(ac, kvb_on_slots, l, "CLUSTER SLOTS");
        return;
    }

    kvb_link_placed(l);
}


/* on the node that has the channel (any node, unless on a cluster) */
static void
kvb_link_placed(kvb_link_t *l)
{
    redisAsyncContext  *ac;

    ac = l->ac;

    if (l->subscriber) {
        (void) redisAsyncCommand(ac, kvb_on_message, l, "SUBSCRIBE %s",
                                 l->r->resync_channel);

        if (l->r->conf.cluster) {
            /* hiredis 0.14 calls back for the channels it SUBSCRIBEd */
            (void) redisAsyncCommand(ac, kvb_on_message, l, "SSUBSCRIBE %s",
                                     l->r->resync_channel);
        }

    } else {
        /* up once Redis answers, so that AUTH has been judged */
        (void) redisAsyncCommand(ac, kvb_on_auth, l, "PING");
    }
}


static void
kvb_on_slots(redisAsyncContext *ac, void *reply, void *data)
{
    int                  stay;
    size_t               i, k, n;
    const char          *here;
    kvb_link_t          *l = data;
    kvb_redis_t         *r;
    redisReply          *rep = reply;
    kva_cluster_node_t   owner, nodes[KVB_REDIS_NODES - 1];

    if (rep == NULL) {
        return;
    }

    r = l->r;
    n = KVB_REDIS_NODES - 1;

    /* this connection's node ("" in the reply) */
    here = ac->c.tcp.host ? ac->c.tcp.host : l->host;

    if (kva_cluster_place(rep, r->slot, here, (unsigned) ac->c.tcp.port,
                          &owner, &stay, nodes, &n)
        != KVA_CLUSTER_OK)
    {
        kvb_log(KVB_LOG_ERR, "redis %s:%d (%s): CLUSTER SLOTS names no "
                "master for slot %u%s%s", l->host, l->port, l->name,
                r->slot, rep->type == REDIS_REPLY_ERROR ? ": " : "",
                rep->type == REDIS_REPLY_ERROR ? rep->str : "");
        redisAsyncDisconnect(ac);
        return;
    }

    r->nnodes = r->nseeds;

    for (i = 0; i < n && r->nnodes < KVB_REDIS_NODES; i++) {
        for (k = 0; k < r->nseeds; k++) {
            if (r->nodes[k].port == nodes[i].port
                && strcmp(r->nodes[k].host, nodes[i].host) == 0)
            {
                break;
            }
        }

        if (k == r->nseeds) {
            r->nodes[r->nnodes++] = nodes[i];
        }
    }

    r->next %= r->nnodes;

    if (stay) {
        kvb_link_placed(l);
        return;
    }

    kvb_log(KVB_LOG_INFO, "redis %s:%d (%s): slot %u of %s is on %s:%u, "
            "moving there", l->host, l->port, l->name, r->slot,
            r->conf.channel, owner.host, owner.port);

    snprintf(l->host, sizeof(l->host), "%s", owner.host);
    l->port = (int) owner.port;
    l->moving = 1;
    redisAsyncDisconnect(ac);
}


/* the node says the slot is no longer its own: ask again where it went */
static void
kvb_link_moved(kvb_link_t *l, const char *why)
{
    if (l->moving || l->ac == NULL) {
        return;
    }

    kvb_log(KVB_LOG_INFO, "redis %s:%d (%s): %s: asking the cluster where "
            "slot %u went", l->host, l->port, l->name, why, l->r->slot);

    l->moving = 1;
    redisAsyncDisconnect(l->ac);
}


static void
kvb_link_down(kvb_link_t *l, const char *why, uint64_t now_ms)
{
    kvb_redis_t  *r = l->r;

    if (l->moving) {
        /*
         * To the slot's master, or back to ask: at once, no failure; but
         * nodes that disagree on the owner (each names the other, a MOVED
         * from a stale view) would have the link bounce between them:
         * past a few moves with no subscription nor publish in between,
         * it waits as after failures.
         */
        l->moving = 0;
        l->moves++;
        kvb_link_free(l);
        l->backoff = (l->moves <= KVB_REDIS_MOVES_FREE)
                     ? 0 : KVB_REDIS_BACKOFF_MIN
                           << (l->moves - KVB_REDIS_MOVES_FREE < 8
                               ? l->moves - KVB_REDIS_MOVES_FREE - 1 : 7);
        l->backoff = (l->backoff > KVB_REDIS_BACKOFF_MAX)
                     ? KVB_REDIS_BACKOFF_MAX : l->backoff;
        l->deadline = now_ms + l->backoff;
        return;
    }

    if (l->up || l->backoff == 0) {
        kvb_log(KVB_LOG_WARN, "redis %s:%d (%s) down: %s", l->host, l->port,
                l->name, why);
    }

    if (r->conf.cluster) {
        /* the node is gone or hung: the seeds and the others, in turn */
        r->next = (r->next + 1) % r->nnodes;
        snprintf(l->host, sizeof(l->host), "%s", r->nodes[r->next].host);
        l->port = (int) r->nodes[r->next].port;
    }

    kvb_link_free(l);

    l->backoff = l->backoff ? l->backoff * 2 : KVB_REDIS_BACKOFF_MIN;
    l->backoff = (l->backoff > KVB_REDIS_BACKOFF_MAX)
                 ? KVB_REDIS_BACKOFF_MAX : l->backoff;
    l->deadline = now_ms + l->backoff;
}


/*
 * The messages sent and not answered are lost, or at least unconfirmed:
 * each took a seq, so nginx sees the gap at the next message that gets
 * through and asks for a resync.
 */

static void
kvb_link_free(kvb_link_t *l)
{
    kvb_redis_t        *r;
    redisAsyncContext  *ac;

    r = l->r;
    ac = l->ac;

    if (ac != NULL) {
        /* no disconnect callback for a context freed on purpose */
        ac->onDisconnect = NULL;
        l->ac = NULL;
        redisAsyncFree(ac);
    }

    if (!l->subscriber) {
        /* the replies that will not come */
        r->st.lost += r->st.pending;
        r->st.pending = 0;
        r->st.pending_bytes = 0;
        kvb_redis_trim(r);
    }

    l->up = 0;
    l->reading = 0;
    l->writing = 0;
    l->outstanding = 0;
    kvb_link_state(l, KVB_REDIS_DOWN);
}


/*
 * hiredis' output buffer is freed once written or with its context, but
 * glibc keeps the top of its heap, or an arena it grew: what a slow or
 * hung Redis made us hold is given back once nothing waits any more, not
 * at the next growth.
 */

static void
kvb_redis_trim(kvb_redis_t *r)
{
    if (!r->trim || r->st.pending_bytes != 0) {
        return;
    }

    r->trim = 0;

#ifdef __GLIBC__
    (void) malloc_trim(0);
#endif
}


static void
kvb_link_state(kvb_link_t *l, kvb_redis_state_e state)
{
    if (l->subscriber) {
        l->r->st.subscribe_state = state;

    } else {
        l->r->st.publish_state = state;
    }
}


static void
kvb_link_up(kvb_link_t *l, uint64_t now_ms)
{
    l->up = 1;
    l->backoff = 0;
    l->outstanding = 0;
    l->wait_from = now_ms;
    l->heard = now_ms;
    kvb_link_state(l, KVB_REDIS_UP);
}


/*
 * Any reply tells Redis is alive.  The publishing link's replies come in
 * the order of its commands; the subscriber's confirmation may come after
 * a message: any reply it gets answers all it asked.
 */

static void
kvb_link_heard(kvb_link_t *l, uint64_t now_ms)
{
    l->heard = now_ms;
    l->wait_from = now_ms;

    if (l->subscriber) {
        l->outstanding = 0;

    } else if (l->outstanding) {
        l->outstanding--;
    }
}


static void
kvb_link_sent(kvb_link_t *l, uint64_t now_ms)
{
    if (l->outstanding++ == 0) {
        l->wait_from = now_ms;
    }
}


/* an up link: hung if a reply is overdue; PINGed when idle */

static void
kvb_link_check(kvb_link_t *l, uint64_t now_ms)
{
    int           rc;
    char          why[64];
    kvb_redis_t  *r;

    r = l->r;

    if (l->outstanding) {
        if (now_ms >= l->wait_from + r->conf.timeout_ms) {
            r->st.timeouts++;
            snprintf(why, sizeof(why), "no reply in %u ms, hung",
                     r->conf.timeout_ms);
            kvb_link_abort(l, why, now_ms);
        }

        return;
    }

    if (now_ms < l->heard + r->ping_ms) {
        return;
    }

    /*
     * hiredis (0.14) gives a subscriber's PONG to no callback: it asks
     * again for the channel it has, which Redis confirms, a no-op
     */
    rc = l->subscriber
         ? redisAsyncCommand(l->ac, kvb_on_message, l, "SUBSCRIBE %s",
                             r->resync_channel)
         : redisAsyncCommand(l->ac, kvb_on_pong, l, "PING");

    if (rc != REDIS_OK) {
        kvb_link_abort(l, "cannot PING", now_ms);
        return;
    }

    kvb_link_sent(l, now_ms);
}


/*
 * Dropped on our side: the socket is reset, so that what the kernel
 * still holds to send is not delivered to a Redis that resumes, long
 * after the messages that came since.
 */

static void
kvb_link_abort(kvb_link_t *l, const char *why, uint64_t now_ms)
{
    struct linger  lg;

    if (l->ac != NULL && l->ac->c.fd != -1) {
        lg.l_onoff = 1;
        lg.l_linger = 0;
        (void) setsockopt(l->ac->c.fd, SOL_SOCKET, SO_LINGER, &lg,
                          sizeof(lg));
    }

    kvb_link_down(l, why, now_ms);
}


static uint64_t
kvb_link_deadline(const kvb_link_t *l)
{
    if (!l->up) {
        return l->deadline;
    }

    return l->outstanding ? l->wait_from + l->r->conf.timeout_ms
                          : l->heard + l->r->ping_ms;
}


static void
kvb_on_connect(const redisAsyncContext *ac, int status)
{
    kvb_link_t  *l = ac->data;

    if (status != REDIS_OK) {
        /* hiredis frees the context after this */
        l->ac = NULL;
        kvb_link_down(l, ac->errstr, kvb_now_ms());
    }
}


static void
kvb_on_disconnect(const redisAsyncContext *ac, int status)
{
    kvb_link_t  *l = ac->data;

    l->ac = NULL;
    kvb_link_down(l, status == REDIS_OK ? "closed" : ac->errstr,
                  kvb_now_ms());
}


static void
kvb_on_auth(redisAsyncContext *ac, void *reply, void *data)
{
    kvb_link_t  *l = data;
    redisReply  *rep = reply;

    if (rep == NULL) {
        return;
    }

    if (rep->type == REDIS_REPLY_ERROR) {
        kvb_log(KVB_LOG_ERR, "redis %s:%d (%s) refused: %s",
                l->host, l->port, l->name, rep->str);
        redisAsyncDisconnect(ac);
        return;
    }

    if (!l->subscriber && rep->type == REDIS_REPLY_STATUS
        && strcmp(rep->str, "PONG") == 0)
    {
        kvb_link_up(l, kvb_now_ms());
        kvb_log(KVB_LOG_INFO, "redis %s:%d: publishing on %s",
                l->host, l->port, l->r->conf.channel);
    }
}


static void
kvb_on_published(redisAsyncContext *ac, void *reply, void *data)
{
    size_t        cost = (uintptr_t) data;
    uint64_t      now;
    kvb_link_t   *l = ac->data;
    kvb_redis_t  *r;
    redisReply   *rep = reply;

    /* NULL: the context is being freed; kvb_link_free() counts the rest */
    if (rep == NULL) {
        return;
    }

    r = l->r;
    now = kvb_now_ms();
    kvb_link_heard(l, now);

    if (r->st.pending) {
        r->st.pending--;
    }

    r->st.pending_bytes -= (r->st.pending_bytes >= cost)
                           ? cost : r->st.pending_bytes;
    kvb_redis_trim(r);

    if (rep->type == REDIS_REPLY_ERROR && r->conf.cluster
        && strncmp(rep->str, "MOVED ", 6) == 0)
    {
        /* a failover, a resharding: nginx resyncs */
        r->st.publish_errors++;
        kvb_link_moved(l, rep->str);
        return;
    }

    if (rep->type == REDIS_REPLY_ERROR) {
        /* an ACL without PUBLISH, a Redis out of memory: nginx resyncs */
        r->st.publish_errors++;
        kvb_log_limited(&r->error_log, now, KVB_LOG_WARN,
                        "redis %s:%d: PUBLISH on %s refused: %s",
                        r->pub.host, r->pub.port, r->conf.channel,
                        rep->str);
        return;
    }

    /* the publisher is where the slot is */
    l->moves = 0;
}


static void
kvb_on_pong(redisAsyncContext *ac, void *reply, void *data)
{
    if (reply != NULL) {
        kvb_link_heard(data, kvb_now_ms());
    }
}


static void
kvb_on_message(redisAsyncContext *ac, void *reply, void *data)
{
    char          server[KVA_EVENT_SERVER_MAX];
    size_t        len;
    unsigned      rank;
    kvb_link_t   *l = data;
    redisReply   *rep = reply, *kind, *msg;

    if (rep == NULL) {
        return;
    }

    if (l->up) {
        /* a message, a confirmation: the link lives */
        kvb_link_heard(l, kvb_now_ms());
    }

    if (rep->type == REDIS_REPLY_ERROR && l->r->conf.cluster) {
        /* MOVED: the slot went elsewhere since CLUSTER SLOTS */
        kvb_link_moved(l, rep->str);
        return;
    }

    if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 3) {
        return;
    }

    kind = rep->element[0];
    msg = rep->element[2];

    if (kind->type != REDIS_REPLY_STRING) {
        return;
    }

    if (strcmp(kind->str, "sunsubscribe") == 0) {
        /* Redis 7 says so when the slot leaves the node (a failover) */
        kvb_link_moved(l, "the slot moved");
        return;
    }

    if (strcmp(kind->str, "subscribe") == 0
        || strcmp(kind->str, "ssubscribe") == 0)
    {
        if (l->up || (l->r->conf.cluster && kind->str[1] != 's')) {
            /* the keepalive's answer; on a cluster, the sharded one counts */
            return;
        }

        l->moves = 0;
        kvb_link_up(l, kvb_now_ms());
        kvb_log(KVB_LOG_INFO, "redis %s:%d: answering resyncs on %s",
                l->host, l->port, l->r->resync_channel);
        return;
    }

    if ((strcmp(kind->str, "message") != 0
         && strcmp(kind->str, "smessage") != 0)
        || msg->type != REDIS_REPLY_STRING)
    {
        return;
    }

    /* a request without "rank" asks for rank 0 */

    if (kva_event_decode_resync(msg->str, msg->len, server, sizeof(server),
                                &len, &rank)
        != 0)
    {
        l->r->st.bad_requests++;
        return;
    }

    l->r->st.resyncs++;
    l->r->h.resync(l->r->h.data, server, len, rank);
}


static void
kvb_add_read(void *data)
{
    ((kvb_link_t *) data)->reading = 1;
}


static void
kvb_del_read(void *data)
{
    ((kvb_link_t *) data)->reading = 0;
}


static void
kvb_add_write(void *data)
{
    ((kvb_link_t *) data)->writing = 1;
}


static void
kvb_del_write(void *data)
{
    ((kvb_link_t *) data)->writing = 0;
}


static void
kvb_cleanup(void *data)
{
    kvb_link_t  *l = data;

    l->reading = 0;
    l->writing = 0;
}
