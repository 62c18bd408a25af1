/*
 * ngx_http_kv_aware_module: the Redis link, hiredis async on the nginx
 * event loop (ngx_http_kv_aware_redis_loop.c puts it there).
 *
 * Two connections per upstream, in one worker: a subscriber for the KV
 * events and a publisher for resync requests and liveness pings (a
 * subscribed connection cannot PUBLISH).
 *
 * hiredis 0.14 has no timeouts, so connect and read timeouts are nginx
 * timers.  A subscriber that is silent is normal, so liveness is checked
 * by publishing a ping to ourselves and waiting for it to come back.
 *
 * With cluster=on, each connection first asks the node it reached which
 * one owns the channel's slot and moves there (see
 * ngx_http_kv_aware_redis_cluster.c); the rest is the same.
 */

#include "ngx_http_kv_aware_redis.h"
#include "ngx_http_kv_aware_redis_cluster.h"


struct ngx_http_kv_aware_redis_s {
    ngx_http_kv_aware_redis_conf_t      *conf;
    ngx_http_kv_aware_redis_stats_t     *stats;
    ngx_http_kv_aware_redis_handlers_t   handlers;
    ngx_log_t                           *log;
    ngx_http_kv_aware_link_t             sub;
    ngx_http_kv_aware_link_t             pub;
    ngx_str_t                            ping_channel;   /* NUL-terminated */
    ngx_http_kv_aware_cluster_t          cluster;
    unsigned                             stopping:1;
};


static void ngx_http_kv_aware_link_connect(ngx_http_kv_aware_link_t *link);
static void ngx_http_kv_aware_link_lost(ngx_http_kv_aware_link_t *link,
    const char *why);
static void ngx_http_kv_aware_link_close(ngx_http_kv_aware_link_t *link);
static ngx_int_t ngx_http_kv_aware_link_closing(void *data);
static void ngx_http_kv_aware_link_send_setup(ngx_http_kv_aware_link_t *link);
static void ngx_http_kv_aware_on_connect(const redisAsyncContext *ac,
    int status);
static void ngx_http_kv_aware_on_disconnect(const redisAsyncContext *ac,
    int status);
static void ngx_http_kv_aware_on_auth(redisAsyncContext *ac, void *r,
    void *data);
static void ngx_http_kv_aware_retry_handler(ngx_event_t *ev);
static void ngx_http_kv_aware_watch_handler(ngx_event_t *ev);
static void ngx_http_kv_aware_set_state(ngx_http_kv_aware_redis_t *rd);


const char  *ngx_http_kv_aware_redis_state_names[] = {
    NGX_HTTP_KV_AWARE_REDIS_STATES(NGX_HTTP_KV_AWARE_KEY2)
};


ngx_http_kv_aware_redis_t *
ngx_http_kv_aware_redis_start(ngx_cycle_t *cycle,
    ngx_http_kv_aware_redis_conf_t *conf,
    ngx_http_kv_aware_redis_stats_t *stats,
    ngx_http_kv_aware_redis_handlers_t *handlers)
{
    u_char                       *p;
    ngx_uint_t                    i;
    ngx_http_kv_aware_redis_t    *rd;
    ngx_http_kv_aware_link_t     *links[2];
    ngx_http_kv_aware_cluster_t  *cl;

    rd = ngx_pcalloc(cycle->pool, sizeof(ngx_http_kv_aware_redis_t));
    if (rd == NULL) {
        return NULL;
    }

    rd->conf = conf;
    rd->stats = stats;
    rd->handlers = *handlers;
    rd->log = cycle->log;

    /* <channel>:ping:<pid>:<name>, unique to this worker */
    rd->ping_channel.len = conf->channel.len + sizeof(":ping::") - 1
                           + NGX_INT64_LEN + conf->name.len;
    rd->ping_channel.data = ngx_pnalloc(cycle->pool, rd->ping_channel.len + 1);
    if (rd->ping_channel.data == NULL) {
        return NULL;
    }

    p = ngx_sprintf(rd->ping_channel.data, "%V:ping:%P:%V",
                    &conf->channel, ngx_pid, &conf->name);
    *p = '\0';
    rd->ping_channel.len = p - rd->ping_channel.data;

    /* the seeds: where the links start, and go back to after failures */
    cl = &rd->cluster;
    ngx_memcpy(cl->nodes, conf->seeds,
               conf->nseeds * sizeof(ngx_http_kv_aware_redis_addr_t));
    cl->nnodes = conf->nseeds;
    cl->nseeds = conf->nseeds;
    cl->slot = conf->slot;
    cl->channel = &conf->channel;
    cl->ping = &rd->ping_channel;
    cl->second = &conf->second;
    cl->log = cycle->log;

    rd->sub.subscriber = 1;
    links[0] = &rd->sub;
    links[1] = &rd->pub;

    for (i = 0; i < 2; i++) {
        links[i]->redis = rd;
        links[i]->cluster = cl;
        links[i]->addr = cl->nodes[0];
        links[i]->backoff = NGX_HTTP_KV_AWARE_BACKOFF_MIN;

        links[i]->conn.log = cycle->log;
        links[i]->conn.closing = ngx_http_kv_aware_link_closing;
        links[i]->conn.data = links[i];

        links[i]->retry.handler = ngx_http_kv_aware_retry_handler;
        links[i]->retry.data = links[i];
        links[i]->retry.log = cycle->log;
        links[i]->retry.cancelable = 1;

        links[i]->watch.handler = ngx_http_kv_aware_watch_handler;
        links[i]->watch.data = links[i];
        links[i]->watch.log = cycle->log;
        links[i]->watch.cancelable = 1;
    }

    stats->state = NGX_HTTP_KV_AWARE_REDIS_CONNECTING;

    ngx_http_kv_aware_link_connect(&rd->pub);
    ngx_http_kv_aware_link_connect(&rd->sub);

    return rd;
}


void
ngx_http_kv_aware_redis_stop(ngx_http_kv_aware_redis_t *rd)
{
    if (rd == NULL || rd->stopping) {
        return;
    }

    rd->stopping = 1;

    ngx_http_kv_aware_link_close(&rd->sub);
    ngx_http_kv_aware_link_close(&rd->pub);

    rd->sub.ready = 0;
    rd->pub.ready = 0;

    /* the shared state now belongs to the worker that took over */
}


ngx_int_t
ngx_http_kv_aware_redis_publish(ngx_http_kv_aware_redis_t *rd,
    ngx_str_t *channel, u_char *data, size_t len)
{
    if (rd == NULL || !rd->pub.ready) {
        return NGX_DECLINED;
    }

    if (rd->conf->cluster) {
        return ngx_http_kv_aware_cluster_publish(&rd->pub, channel, data,
                                                 len);
    }

    if (redisAsyncCommand(rd->pub.conn.ac, NULL, NULL, "PUBLISH %b %b",
                          channel->data, channel->len, data, len)
        != REDIS_OK)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static void
ngx_http_kv_aware_link_connect(ngx_http_kv_aware_link_t *link)
{
    redisAsyncContext               *ac;
    ngx_http_kv_aware_redis_conf_t  *conf;

    conf = link->redis->conf;

    ac = redisAsyncConnect((char *) link->addr.ip, (int) link->addr.port);

    if (ac == NULL || ac->err) {
        ngx_http_kv_aware_link_lost(link, ac ? ac->errstr : "no memory");

        if (ac) {
            redisAsyncFree(ac);
        }

        return;
    }

    ac->data = link;
    link->conn.ac = ac;

    if (ngx_http_kv_aware_redis_loop_attach(&link->conn) != NGX_OK) {
        link->conn.ac = NULL;
        redisAsyncFree(ac);
        ngx_http_kv_aware_link_lost(link, "cannot attach to event loop");
        return;
    }

    redisAsyncSetConnectCallback(ac, ngx_http_kv_aware_on_connect);
    redisAsyncSetDisconnectCallback(ac, ngx_http_kv_aware_on_disconnect);

    ngx_http_kv_aware_link_send_setup(link);

    ngx_add_timer(&link->watch, conf->connect_timeout);
}


/* commands queue until the connection is up; hiredis sends them then */
static void
ngx_http_kv_aware_link_send_setup(ngx_http_kv_aware_link_t *link)
{
    redisAsyncContext               *ac;
    ngx_http_kv_aware_redis_t       *rd;
    ngx_http_kv_aware_redis_conf_t  *conf;

    ac = link->conn.ac;
    rd = link->redis;
    conf = rd->conf;

    if (conf->password.len) {
        if (conf->user.len) {
            (void) redisAsyncCommand(ac, ngx_http_kv_aware_on_auth, link,
                                     "AUTH %b %b",
                                     conf->user.data, conf->user.len,
                                     conf->password.data, conf->password.len);

        } else {
            (void) redisAsyncCommand(ac, ngx_http_kv_aware_on_auth, link,
                                     "AUTH %b", conf->password.data,
                                     conf->password.len);
        }
    }

    if (conf->cluster) {
        ngx_http_kv_aware_cluster_ask(link);
        return;
    }

    ngx_http_kv_aware_link_subscribe(link);
}


/* on the node that has the channel (any node, unless cluster=on) */
void
ngx_http_kv_aware_link_subscribe(ngx_http_kv_aware_link_t *link)
{
    redisAsyncContext               *ac;
    ngx_http_kv_aware_redis_t       *rd;
    ngx_http_kv_aware_redis_conf_t  *conf;

    ac = link->conn.ac;
    rd = link->redis;
    conf = rd->conf;

    if (!link->subscriber) {
        /* cluster=on: AUTH and CLUSTER SLOTS have been answered */
        if (conf->cluster) {
            link->ready = 1;
            link->backoff = NGX_HTTP_KV_AWARE_BACKOFF_MIN;

        } else if (conf->password.len == 0) {
            /* the publisher is ready once Redis answers; AUTH would do */
            (void) redisAsyncCommand(ac, ngx_http_kv_aware_on_auth, link,
                                     "PING");
        }

        return;
    }

    if (conf->cluster) {
        ngx_http_kv_aware_cluster_subscribe(link);
        return;
    }

    (void) redisAsyncCommand(ac, ngx_http_kv_aware_link_on_message, link,
                             conf->pattern ? "PSUBSCRIBE %b" : "SUBSCRIBE %b",
                             conf->channel.data, conf->channel.len);

    (void) redisAsyncCommand(ac, ngx_http_kv_aware_link_on_message, link,
                             "SUBSCRIBE %b", rd->ping_channel.data,
                             rd->ping_channel.len);

    if (conf->second.len) {
        (void) redisAsyncCommand(ac, ngx_http_kv_aware_link_on_message, link,
                                 "SUBSCRIBE %b", conf->second.data,
                                 conf->second.len);
    }
}


static void
ngx_http_kv_aware_on_connect(const redisAsyncContext *ac, int status)
{
    ngx_http_kv_aware_link_t  *link = ac->data;

    if (status != REDIS_OK) {
        /* hiredis frees the context after this callback */
        link->conn.ac = NULL;
        ngx_http_kv_aware_link_lost(link, ac->errstr);
        return;
    }

    link->connected = 1;

    /*
     * A hung Redis (or a proxy or firewall that swallows what follows the
     * handshake) accepts and answers nothing: the first answer is waited
     * for no longer than the connect, and the backoff starts over only
     * once it came (cluster=on: CLUSTER SLOTS, then the next node).
     */
    ngx_add_timer(&link->watch, link->redis->conf->connect_timeout);

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, link->redis->log, 0,
                   "kv_aware: redis %s connected",
                   link->subscriber ? "subscriber" : "publisher");
}


static void
ngx_http_kv_aware_on_disconnect(const redisAsyncContext *ac, int status)
{
    ngx_http_kv_aware_link_t  *link = ac->data;

    /* hiredis frees the context after this callback */
    link->conn.ac = NULL;

    if (!link->redis->stopping && !link->closing) {
        ngx_http_kv_aware_link_lost(link, status == REDIS_OK
                                          ? "connection closed"
                                          : ac->errstr);
    }
}


static void
ngx_http_kv_aware_on_auth(redisAsyncContext *ac, void *r, void *data)
{
    redisReply                *reply = r;
    ngx_http_kv_aware_link_t  *link = data;

    if (reply == NULL) {
        return;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, link->redis->log, 0,
                      "kv_aware: redis %V refused %s: %*s",
                      &link->redis->conf->addr_text,
                      link->redis->conf->password.len ? "AUTH" : "PING",
                      (size_t) reply->len, reply->str);

        /* what follows would fail too: start over after the backoff */
        link->backoff = NGX_HTTP_KV_AWARE_BACKOFF_MAX;
        redisAsyncDisconnect(ac);
        return;
    }

    if (!link->subscriber && !link->redis->conf->cluster) {
        link->ready = 1;
        link->backoff = NGX_HTTP_KV_AWARE_BACKOFF_MIN;
    }
}


void
ngx_http_kv_aware_link_on_message(redisAsyncContext *ac, void *r, void *data)
{
    redisReply                 *reply = r, *kind, *channel, *payload;
    ngx_http_kv_aware_link_t   *link = data;
    ngx_http_kv_aware_redis_t  *rd;

    if (reply == NULL) {
        return;
    }

    rd = link->redis;

    /*
     * An error reply never gets here: a refused SUBSCRIBE (an ACL user
     * without the channel) or, cluster=on, a MOVED or refused SSUBSCRIBE
     * (sent after a SUBSCRIBE, so hiredis 0.14 has no callback for its
     * error) makes hiredis drop the connection; link_lost() logs why, and
     * the link goes on to the next node, which tells where the slot is.
     */

    if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 3) {
        return;
    }

    kind = reply->element[0];
    channel = reply->element[reply->elements - 2];
    payload = reply->element[reply->elements - 1];

    if (kind->type != REDIS_REPLY_STRING) {
        return;
    }

    if (channel->type != REDIS_REPLY_STRING) {
        return;
    }

    if (kind->len == 12 && ngx_strncmp(kind->str, "sunsubscribe", 12) == 0) {
        /* Redis 7 says so when the slot moves, after a failover say */
        ngx_http_kv_aware_cluster_moved(link, "the slot moved", 14);
        return;
    }

    if ((size_t) channel->len == rd->ping_channel.len
        && ngx_strncmp(channel->str, rd->ping_channel.data,
                       rd->ping_channel.len) == 0)
    {
        /* our own ping came back, or its subscription was confirmed */
        link->ping_out = 0;
        return;
    }

    if (rd->conf->second.len
        && (size_t) channel->len == rd->conf->second.len
        && ngx_strncmp(channel->str, rd->conf->second.data,
                       rd->conf->second.len) == 0)
    {
        /* its confirmation is not the subscription the consumer waits for */
        if (link->ready && payload->type == REDIS_REPLY_STRING
            && ((kind->len == 7 && ngx_strncmp(kind->str, "message", 7) == 0)
                || (kind->len == 8
                    && ngx_strncmp(kind->str, "smessage", 8) == 0)))
        {
            rd->handlers.second(rd->handlers.data, (u_char *) payload->str,
                                payload->len);
        }

        return;
    }

    if ((kind->len == 9 && ngx_strncmp(kind->str, "subscribe", 9) == 0)
        || (kind->len == 10 && ngx_strncmp(kind->str, "psubscribe", 10) == 0)
        || (kind->len == 10 && ngx_strncmp(kind->str, "ssubscribe", 10) == 0))
    {
        if (rd->conf->cluster && kind->str[1] != 's') {
            /* hiredis' half of cluster_subscribe(): the sharded one counts */
            return;
        }

        link->ready = 1;
        link->backoff = NGX_HTTP_KV_AWARE_BACKOFF_MIN;
        link->moves = 0;
        (void) ngx_atomic_fetch_add(&rd->stats->connects, 1);
        ngx_http_kv_aware_set_state(rd);

        ngx_log_error(NGX_LOG_NOTICE, rd->log, 0,
                      "kv_aware: upstream \"%V\" subscribed to \"%V\" "
                      "on redis %s:%ui%s", &rd->conf->name,
                      &rd->conf->channel, link->addr.ip, link->addr.port,
                      rd->conf->cluster ? " (the slot's master)" : "");

        rd->handlers.subscribed(rd->handlers.data);

        /* from the setup's timeout to the first ping */
        ngx_add_timer(&link->watch, rd->conf->read_timeout);

        return;
    }

    if (!link->ready || payload->type != REDIS_REPLY_STRING) {
        return;
    }

    rd->handlers.message(rd->handlers.data, (u_char *) payload->str,
                         (size_t) payload->len);
}


static void
ngx_http_kv_aware_link_lost(ngx_http_kv_aware_link_t *link, const char *why)
{
    ngx_http_kv_aware_redis_t  *rd;

    rd = link->redis;

    if (link->watch.timer_set) {
        ngx_del_timer(&link->watch);
    }

    if ((link->connected || link->ready) && rd->conf->cluster) {
        ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                      "kv_aware: redis cluster node %s:%ui %s lost: %s, "
                      "reconnecting", link->addr.ip, link->addr.port,
                      link->subscriber ? "subscriber" : "publisher", why);

    } else if (link->connected || link->ready) {
        ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                      "kv_aware: redis %V %s lost: %s, reconnecting",
                      &rd->conf->addr_text,
                      link->subscriber ? "subscriber" : "publisher", why);
    }

    if (link->connected || link->ready) {
        if (link->subscriber) {
            rd->handlers.lost(rd->handlers.data);
        }

    } else if (rd->conf->cluster) {
        ngx_log_error(NGX_LOG_INFO, rd->log, 0,
                      "kv_aware: redis cluster node %s:%ui: %s, the %s "
                      "tries the next node", link->addr.ip, link->addr.port,
                      why, link->subscriber ? "subscriber" : "publisher");

    } else {
        ngx_log_debug3(NGX_LOG_DEBUG_HTTP, rd->log, 0,
                       "kv_aware: redis %V: %s, retry in %M ms",
                       &rd->conf->addr_text, why, link->backoff);
    }

    link->connected = 0;
    link->ready = 0;
    link->ping_out = 0;

    if (!link->moving) {
        (void) ngx_atomic_fetch_add(&rd->stats->failures, 1);
    }

    if (rd->conf->cluster) {
        ngx_http_kv_aware_cluster_lost(link);
    }

    ngx_http_kv_aware_set_state(rd);

    if (rd->stopping || ngx_exiting || ngx_quit || ngx_terminate) {
        return;
    }

    if (!link->retry.timer_set) {
        ngx_add_timer(&link->retry, link->backoff);
    }

    link->backoff = ngx_min(link->backoff * 2, NGX_HTTP_KV_AWARE_BACKOFF_MAX);
}


static void
ngx_http_kv_aware_link_close(ngx_http_kv_aware_link_t *link)
{
    redisAsyncContext  *ac;

    if (link->retry.timer_set) {
        ngx_del_timer(&link->retry);
    }

    if (link->watch.timer_set) {
        ngx_del_timer(&link->watch);
    }

    ac = link->conn.ac;
    link->conn.ac = NULL;

    if (ac) {
        /* never called from inside a hiredis callback */
        link->closing = 1;
        redisAsyncFree(ac);
        link->closing = 0;
    }
}


/* graceful shutdown: the consumer keeps the link or lets it go */
static ngx_int_t
ngx_http_kv_aware_link_closing(void *data)
{
    ngx_http_kv_aware_link_t  *link = data;

    ngx_http_kv_aware_redis_t  *rd;

    rd = link->redis;

    if (rd->stopping) {
        return NGX_OK;
    }

    rd->handlers.closing(rd->handlers.data);

    return rd->stopping ? NGX_DONE : NGX_OK;
}


static void
ngx_http_kv_aware_set_state(ngx_http_kv_aware_redis_t *rd)
{
    ngx_uint_t  state;

    if (rd->sub.ready) {
        state = NGX_HTTP_KV_AWARE_REDIS_UP;

    } else if (rd->sub.connected) {
        state = NGX_HTTP_KV_AWARE_REDIS_CONNECTING;

    } else {
        state = NGX_HTTP_KV_AWARE_REDIS_DOWN;
    }

    rd->stats->state = state;
}


static void
ngx_http_kv_aware_retry_handler(ngx_event_t *ev)
{
    ngx_http_kv_aware_link_t  *link = ev->data;

    if (link->redis->stopping || ngx_exiting || ngx_quit || ngx_terminate) {
        return;
    }

    ngx_http_kv_aware_link_connect(link);
}


/*
 * Until the first answer: the connect timeout.  Once subscribed: every
 * read_timeout a ping goes out through the publisher; if the previous one
 * has not come back, the subscriber is presumed dead.
 */
static void
ngx_http_kv_aware_watch_handler(ngx_event_t *ev)
{
    ngx_http_kv_aware_link_t        *link = ev->data;
    ngx_http_kv_aware_redis_t       *rd;
    ngx_http_kv_aware_redis_conf_t  *conf;

    rd = link->redis;
    conf = rd->conf;

    if (!link->connected) {
        ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                      "kv_aware: redis %V: connect timed out after %M ms",
                      &conf->addr_text, conf->connect_timeout);
        ngx_http_kv_aware_link_close(link);
        ngx_http_kv_aware_link_lost(link, "connect timed out");
        return;
    }

    if (!link->ready) {
        ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                      "kv_aware: redis %s%s:%ui: no answer in %M ms "
                      "after connecting, the %s retries",
                      conf->cluster ? "cluster node " : "", link->addr.ip,
                      link->addr.port, conf->connect_timeout,
                      link->subscriber ? "subscriber" : "publisher");
        ngx_http_kv_aware_link_close(link);
        link->connected = 0;
        ngx_http_kv_aware_link_lost(link, "no answer");
        return;
    }

    if (!link->subscriber || !link->ready) {
        return;
    }

    if (link->ping_out) {
        ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                      "kv_aware: redis %V did not answer in %M ms",
                      &conf->addr_text, conf->read_timeout);
        link->connected = 1;
        ngx_http_kv_aware_link_close(link);
        link->connected = 1;
        ngx_http_kv_aware_link_lost(link, "read timed out");

        /*
         * the ping went out on the publisher, which nothing else checks:
         * on a hung Redis its PUBLISHes would pile up in its output
         * buffer without end, so it starts over too
         */
        if (rd->pub.conn.ac != NULL) {
            ngx_http_kv_aware_link_close(&rd->pub);
            ngx_http_kv_aware_link_lost(&rd->pub, "ping not answered");
        }

        return;
    }

    if (ngx_http_kv_aware_redis_publish(rd, &rd->ping_channel,
                                        (u_char *) "ping", 4)
        == NGX_OK)
    {
        link->ping_out = 1;
    }

    ngx_add_timer(&link->watch, conf->read_timeout);
}
