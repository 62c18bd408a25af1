/*
 * kvbridge: the two Redis links (kvb_redis.h).
 *
 * hiredis' asynchronous client asks its event library to start and stop
 * watching the socket through hooks; here the hooks only set flags that
 * kvb_redis_watch() turns into zmq_poll() items, so hiredis runs on the
 * bridge's one loop with no adapter library.
 */

#include <stdlib.h>
#include <string.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "kva_event.h"
#include "kvb_log.h"
#include "kvb_redis.h"


#define KVB_REDIS_CONNECT_MS    2000
#define KVB_REDIS_BACKOFF_MIN   100
#define KVB_REDIS_BACKOFF_MAX   2000


typedef struct kvb_link_s  kvb_link_t;

struct kvb_link_s {
    kvb_redis_t            *r;
    redisAsyncContext      *ac;
    const char             *name;       /* "publish" or "subscribe" */
    unsigned                reading:1;
    unsigned                writing:1;
    unsigned                up:1;
    unsigned                subscriber:1;
    uint64_t                deadline;   /* connect timeout, or retry */
    unsigned                backoff;
};


struct kvb_redis_s {
    kvb_redis_conf_t        conf;
    kvb_redis_handler_t     h;
    char                   *resync_channel;
    kvb_link_t              pub;
    kvb_link_t              sub;
    size_t                  pending;
    kvb_redis_stats_t       st;
    kvb_log_limit_t         drop_log;
};


static void kvb_link_connect(kvb_link_t *l, uint64_t now_ms);
static void kvb_link_down(kvb_link_t *l, const char *why, uint64_t now_ms);
static void kvb_link_free(kvb_link_t *l);
static void kvb_on_connect(const redisAsyncContext *ac, int status);
static void kvb_on_disconnect(const redisAsyncContext *ac, int status);
static void kvb_on_auth(redisAsyncContext *ac, void *reply, void *data);
static void kvb_on_published(redisAsyncContext *ac, void *reply, void *data);
static void kvb_on_message(redisAsyncContext *ac, void *reply, void *data);
static void kvb_add_read(void *data);
static void kvb_del_read(void *data);
static void kvb_add_write(void *data);
static void kvb_del_write(void *data);
static void kvb_cleanup(void *data);


kvb_redis_t *
kvb_redis_create(const kvb_redis_conf_t *conf, const kvb_redis_handler_t *h)
{
    size_t        n;
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
    r->pub.r = r;
    r->pub.name = "publish";
    r->sub.r = r;
    r->sub.name = "subscribe";
    r->sub.subscriber = 1;

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


int
kvb_redis_publish(kvb_redis_t *r, const char *msg, size_t len)
{
    if (!r->pub.up || r->pending >= r->conf.max_pending) {
        r->st.dropped++;
        kvb_log_limited(&r->drop_log, kvb_now_ms(), KVB_LOG_WARN,
                        "redis %s:%d %s: message dropped",
                        r->conf.host, r->conf.port,
                        r->pub.up ? "behind" : "down");
        return -1;
    }

    if (redisAsyncCommand(r->pub.ac, kvb_on_published, r, "PUBLISH %s %b",
                          r->conf.channel, msg, len)
        != REDIS_OK)
    {
        r->st.dropped++;
        return -1;
    }

    r->pending++;
    r->st.published++;

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
    uint64_t  d;

    d = UINT64_MAX;

    if (!r->pub.up && r->pub.deadline < d) {
        d = r->pub.deadline;
    }

    if (!r->sub.up && r->sub.deadline < d) {
        d = r->sub.deadline;
    }

    return d;
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

        if (l->up || now_ms < l->deadline) {
            continue;
        }

        if (l->ac != NULL) {
            kvb_link_down(l, "connect timed out", now_ms);
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


static void
kvb_link_connect(kvb_link_t *l, uint64_t now_ms)
{
    redisAsyncContext  *ac;

    ac = redisAsyncConnect(l->r->conf.host, l->r->conf.port);

    if (ac == NULL || ac->err) {
        if (ac != NULL) {
            kvb_log(KVB_LOG_WARN, "redis %s:%d (%s): %s", l->r->conf.host,
                    l->r->conf.port, l->name, ac->errstr);
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

    if (l->r->conf.password != NULL) {
        if (l->r->conf.user != NULL) {
            (void) redisAsyncCommand(ac, kvb_on_auth, l, "AUTH %s %s",
                                     l->r->conf.user, l->r->conf.password);
        } else {
            (void) redisAsyncCommand(ac, kvb_on_auth, l, "AUTH %s",
                                     l->r->conf.password);
        }
    }

    if (l->subscriber) {
        (void) redisAsyncCommand(ac, kvb_on_message, l, "SUBSCRIBE %s",
                                 l->r->resync_channel);

    } else {
        /* up once Redis answers, so that AUTH has been judged */
        (void) redisAsyncCommand(ac, kvb_on_auth, l, "PING");
    }
}


static void
kvb_link_down(kvb_link_t *l, const char *why, uint64_t now_ms)
{
    if (l->up || l->backoff == 0) {
        kvb_log(KVB_LOG_WARN, "redis %s:%d (%s) down: %s", l->r->conf.host,
                l->r->conf.port, l->name, why);
    }

    kvb_link_free(l);

    l->backoff = l->backoff ? l->backoff * 2 : KVB_REDIS_BACKOFF_MIN;
    l->backoff = (l->backoff > KVB_REDIS_BACKOFF_MAX)
                 ? KVB_REDIS_BACKOFF_MAX : l->backoff;
    l->deadline = now_ms + l->backoff;
}


static void
kvb_link_free(kvb_link_t *l)
{
    redisAsyncContext  *ac;

    ac = l->ac;

    if (ac != NULL) {
        /* no disconnect callback for a context freed on purpose */
        ac->onDisconnect = NULL;
        l->ac = NULL;
        redisAsyncFree(ac);
    }

    if (!l->subscriber) {
        /* the replies that will not come */
        l->r->pending = 0;
    }

    l->up = 0;
    l->reading = 0;
    l->writing = 0;
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
                l->r->conf.host, l->r->conf.port, l->name, rep->str);
        redisAsyncDisconnect(ac);
        return;
    }

    if (!l->subscriber && rep->type == REDIS_REPLY_STATUS
        && strcmp(rep->str, "PONG") == 0)
    {
        l->up = 1;
        l->backoff = 0;
        kvb_log(KVB_LOG_INFO, "redis %s:%d: publishing on %s",
                l->r->conf.host, l->r->conf.port, l->r->conf.channel);
    }
}


static void
kvb_on_published(redisAsyncContext *ac, void *reply, void *data)
{
    kvb_redis_t  *r = data;

    if (r->pending) {
        r->pending--;
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

    if (rep == NULL || rep->type != REDIS_REPLY_ARRAY || rep->elements < 3) {
        return;
    }

    kind = rep->element[0];
    msg = rep->element[2];

    if (kind->type != REDIS_REPLY_STRING) {
        return;
    }

    if (strcmp(kind->str, "subscribe") == 0) {
        l->up = 1;
        l->backoff = 0;
        kvb_log(KVB_LOG_INFO, "redis %s:%d: answering resyncs on %s",
                l->r->conf.host, l->r->conf.port, l->r->resync_channel);
        return;
    }

    if (strcmp(kind->str, "message") != 0 || msg->type != REDIS_REPLY_STRING) {
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
