/*
 * kvload HTTP/1.1 client.
 *
 * One request per connection at a time; finished connections go to the
 * target's idle list.  A request that fails on a reused connection before
 * any byte of response (the server closed it while idle) is retried once
 * on a fresh one.  Every request has a timer; nothing waits forever.
 */

#define _GNU_SOURCE                    /* strcasestr() */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <arpa/inet.h>
#include <event2/bufferevent.h>

#include "kvload_http.h"


#define KVL_LINE_MAX   (64 * 1024)


typedef enum {
    KVL_ST_STATUS = 0,
    KVL_ST_HEADERS,
    KVL_ST_CHUNK_SIZE,
    KVL_ST_CHUNK_DATA,
    KVL_ST_CHUNK_END,
    KVL_ST_TRAILER,
    KVL_ST_BODY_LEN,
    KVL_ST_BODY_EOF
} kvl_state_e;


struct kvl_conn_s {
    struct bufferevent  *bev;
    kvl_target_t        *target;
    kvl_http_req_t      *req;
    kvl_conn_t          *next;
    struct evbuffer     *sse;
    kvl_state_e          state;
    size_t               remaining;
    long                 clen;
    unsigned             chunked:1;
    unsigned             close:1;
    unsigned             reused:1;
    unsigned             got_bytes:1;
};


static int kvl_http_start(kvl_http_req_t *r);
static kvl_conn_t *kvl_conn_open(kvl_target_t *t);
static void kvl_conn_free(kvl_conn_t *c);
static void kvl_conn_unidle(kvl_conn_t *c);
static void kvl_http_read(struct bufferevent *bev, void *arg);
static void kvl_http_event(struct bufferevent *bev, short what, void *arg);
static void kvl_http_timeout(evutil_socket_t fd, short what, void *arg);
static int kvl_http_parse(kvl_conn_t *c, kvl_http_req_t *r,
    struct evbuffer *in);
static int kvl_http_status(kvl_conn_t *c, kvl_http_req_t *r,
    const char *line);
static void kvl_http_header(kvl_conn_t *c, kvl_http_req_t *r, char *line);
static int kvl_http_body_start(kvl_conn_t *c, kvl_http_req_t *r);
static int kvl_http_feed(kvl_conn_t *c, kvl_http_req_t *r,
    struct evbuffer *in, size_t n);
static void kvl_http_finish(kvl_http_req_t *r, kvl_http_err_e err);


double
kvl_now(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);

    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}


int
kvl_target_init(kvl_target_t *t, struct event_base *base,
    const char *hostport)
{
    char        ip[48];
    const char *colon;
    long        port;

    memset(t, 0, sizeof(kvl_target_t));

    colon = strrchr(hostport, ':');
    if (colon == NULL || (size_t) (colon - hostport) >= sizeof(ip)) {
        return -1;
    }

    memcpy(ip, hostport, colon - hostport);
    ip[colon - hostport] = '\0';
    port = strtol(colon + 1, NULL, 10);

    if (port < 1 || port > 65535
        || inet_pton(AF_INET, ip, &t->sin.sin_addr) != 1)
    {
        return -1;
    }

    t->sin.sin_family = AF_INET;
    t->sin.sin_port = htons((uint16_t) port);
    t->base = base;
    snprintf(t->host, sizeof(t->host), "%s:%ld", ip, port);

    return 0;
}


void
kvl_target_close(kvl_target_t *t)
{
    while (t->idle) {
        kvl_conn_free(t->idle);
    }
}


int
kvl_http_send(kvl_http_req_t *r, const char *method, const char *path,
    const char *body, size_t len, double timeout)
{
    struct timeval  tv;

    r->status = 0;
    r->error = KVL_HTTP_OK;
    r->upstream[0] = '\0';
    r->retried = 0;
    r->conn = NULL;

    r->wire = evbuffer_new();
    r->timer = evtimer_new(r->target->base, kvl_http_timeout, r);

    if (r->wire == NULL || r->timer == NULL
        || (r->on_event == NULL && r->body == NULL
            && (r->body = evbuffer_new()) == NULL))
    {
        goto failed;
    }

    if (evbuffer_add_printf(r->wire, "%s %s HTTP/1.1\r\nHost: %s\r\n"
                            "Accept: */*\r\n", method, path, r->target->host)
        < 0)
    {
        goto failed;
    }

    if (body != NULL
        && (evbuffer_add_printf(r->wire, "Content-Type: application/json"
                                "\r\nContent-Length: %zu\r\n\r\n", len) < 0
            || evbuffer_add(r->wire, body, len) != 0))
    {
        goto failed;
    }

    if (body == NULL && evbuffer_add(r->wire, "\r\n", 2) != 0) {
        goto failed;
    }

    if (evbuffer_pullup(r->wire, -1) == NULL) {
        goto failed;
    }

    tv.tv_sec = (time_t) timeout;
    tv.tv_usec = (suseconds_t) ((timeout - (double) tv.tv_sec) * 1e6);

    if (evtimer_add(r->timer, &tv) != 0) {
        goto failed;
    }

    if (kvl_http_start(r) != 0) {
        goto failed;
    }

    return 0;

failed:

    if (r->timer) {
        event_free(r->timer);
        r->timer = NULL;
    }

    if (r->wire) {
        evbuffer_free(r->wire);
        r->wire = NULL;
    }

    return -1;
}


const char *
kvl_http_strerror(kvl_http_err_e err)
{
    static const char  *names[] = {
        "ok", "connect failed", "connection reset", "timeout",
        "protocol error", "out of memory"
    };

    return names[err];
}


static int
kvl_http_start(kvl_http_req_t *r)
{
    kvl_conn_t    *c;
    kvl_target_t  *t = r->target;

    c = t->idle;

    if (c != NULL && !r->retried) {
        kvl_conn_unidle(c);
        c->reused = 1;

    } else {
        c = kvl_conn_open(t);
        if (c == NULL) {
            return -1;
        }
    }

    c->req = r;
    c->state = KVL_ST_STATUS;
    c->chunked = 0;
    c->close = 0;
    c->got_bytes = 0;
    c->clen = -1;
    r->conn = c;

    if (evbuffer_add(bufferevent_get_output(c->bev),
                     evbuffer_pullup(r->wire, -1),
                     evbuffer_get_length(r->wire))
        != 0)
    {
        r->conn = NULL;
        kvl_conn_free(c);
        return -1;
    }

    return 0;
}


static kvl_conn_t *
kvl_conn_open(kvl_target_t *t)
{
    kvl_conn_t  *c;

    c = calloc(1, sizeof(kvl_conn_t));
    if (c == NULL) {
        return NULL;
    }

    c->target = t;
    c->sse = evbuffer_new();
    c->bev = bufferevent_socket_new(t->base, -1, BEV_OPT_CLOSE_ON_FREE);

    if (c->sse == NULL || c->bev == NULL) {
        kvl_conn_free(c);
        return NULL;
    }

    bufferevent_setcb(c->bev, kvl_http_read, NULL, kvl_http_event, c);

    if (bufferevent_enable(c->bev, EV_READ|EV_WRITE) != 0
        || bufferevent_socket_connect(c->bev, (struct sockaddr *) &t->sin,
                                      sizeof(t->sin))
           != 0)
    {
        kvl_conn_free(c);
        return NULL;
    }

    return c;
}


static void
kvl_conn_free(kvl_conn_t *c)
{
    if (c->req == NULL) {
        kvl_conn_unidle(c);
    }

    if (c->bev) {
        bufferevent_free(c->bev);
    }

    if (c->sse) {
        evbuffer_free(c->sse);
    }

    free(c);
}


static void
kvl_conn_unidle(kvl_conn_t *c)
{
    kvl_conn_t  **pp;

    for (pp = &c->target->idle; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }

    c->next = NULL;
}


static void
kvl_http_read(struct bufferevent *bev, void *arg)
{
    kvl_conn_t       *c = arg;
    kvl_http_req_t   *r = c->req;
    struct evbuffer  *in = bufferevent_get_input(bev);

    if (r == NULL) {
        /* an idle connection must stay silent */
        kvl_conn_free(c);
        return;
    }

    c->got_bytes = 1;

    if (kvl_http_parse(c, r, in) != 0) {
        kvl_http_finish(r, KVL_HTTP_EPROTO);
    }
}


static void
kvl_http_event(struct bufferevent *bev, short what, void *arg)
{
    kvl_conn_t      *c = arg;
    kvl_http_req_t  *r = c->req;

    if (what & BEV_EVENT_CONNECTED) {
        return;
    }

    if (r == NULL) {
        kvl_conn_free(c);
        return;
    }

    if ((what & BEV_EVENT_EOF) && c->state == KVL_ST_BODY_EOF) {
        kvl_http_finish(r, KVL_HTTP_OK);
        return;
    }

    if (c->reused && !c->got_bytes && !r->retried) {
        r->retried = 1;
        r->conn = NULL;
        c->req = NULL;
        kvl_conn_free(c);

        if (kvl_http_start(r) != 0) {
            kvl_http_finish(r, KVL_HTTP_ENOMEM);
        }

        return;
    }

    kvl_http_finish(r, c->got_bytes || c->reused ? KVL_HTTP_ERESET
                                                  : KVL_HTTP_ECONNECT);
}


static void
kvl_http_timeout(evutil_socket_t fd, short what, void *arg)
{
    kvl_http_finish(arg, KVL_HTTP_ETIMEOUT);
}


static int
kvl_http_parse(kvl_conn_t *c, kvl_http_req_t *r, struct evbuffer *in)
{
    char    *line;
    size_t   n, len;

    for ( ;; ) {

        switch (c->state) {

        case KVL_ST_BODY_LEN:
        case KVL_ST_CHUNK_DATA:
        case KVL_ST_BODY_EOF:
            len = evbuffer_get_length(in);
            if (len == 0) {
                return 0;
            }

            n = (c->state == KVL_ST_BODY_EOF || len < c->remaining)
                ? len : c->remaining;

            if (kvl_http_feed(c, r, in, n) != 0) {
                return -1;
            }

            if (c->state == KVL_ST_BODY_EOF) {
                return 0;
            }

            c->remaining -= n;

            if (c->remaining == 0) {
                if (c->state == KVL_ST_BODY_LEN) {
                    kvl_http_finish(r, KVL_HTTP_OK);
                    return 0;
                }

                c->state = KVL_ST_CHUNK_END;
            }

            continue;

        default:
            break;
        }

        line = evbuffer_readln(in, &n, EVBUFFER_EOL_CRLF);
        if (line == NULL) {
            return evbuffer_get_length(in) > KVL_LINE_MAX ? -1 : 0;
        }

        switch (c->state) {

        case KVL_ST_STATUS:
            if (kvl_http_status(c, r, line) != 0) {
                free(line);
                return -1;
            }

            c->state = KVL_ST_HEADERS;
            break;

        case KVL_ST_HEADERS:
            if (n > 0) {
                kvl_http_header(c, r, line);
                break;
            }

            free(line);
            return kvl_http_body_start(c, r);

        case KVL_ST_CHUNK_SIZE:
            c->remaining = strtoul(line, NULL, 16);
            c->state = c->remaining ? KVL_ST_CHUNK_DATA : KVL_ST_TRAILER;
            break;

        case KVL_ST_CHUNK_END:
            c->state = KVL_ST_CHUNK_SIZE;
            break;

        default: /* KVL_ST_TRAILER */
            if (n == 0) {
                free(line);
                kvl_http_finish(r, KVL_HTTP_OK);
                return 0;
            }
        }

        free(line);
    }
}


static int
kvl_http_status(kvl_conn_t *c, kvl_http_req_t *r, const char *line)
{
    if (strncmp(line, "HTTP/1.", 7) != 0 || strlen(line) < 12) {
        return -1;
    }

    if (line[7] == '0') {
        c->close = 1;
    }

    r->status = atoi(line + 9);

    return r->status >= 100 && r->status < 600 ? 0 : -1;
}


static void
kvl_http_header(kvl_conn_t *c, kvl_http_req_t *r, char *line)
{
    char    *v;
    size_t   n;

    v = strchr(line, ':');
    if (v == NULL) {
        return;
    }

    *v++ = '\0';
    v += strspn(v, " \t");

    if (strcasecmp(line, "content-length") == 0) {
        c->clen = strtol(v, NULL, 10);

    } else if (strcasecmp(line, "transfer-encoding") == 0) {
        c->chunked = strcasestr(v, "chunked") != NULL;

    } else if (strcasecmp(line, "connection") == 0) {
        c->close = c->close || strcasestr(v, "close") != NULL;

    } else if (strcasecmp(line, "x-upstream-addr") == 0) {
        n = strcspn(v, " ,");
        n = n < sizeof(r->upstream) ? n : sizeof(r->upstream) - 1;
        memcpy(r->upstream, v, n);
        r->upstream[n] = '\0';
    }
}


static int
kvl_http_body_start(kvl_conn_t *c, kvl_http_req_t *r)
{
    struct evbuffer  *in = bufferevent_get_input(c->bev);

    if (r->status == 204 || r->status == 304) {
        kvl_http_finish(r, KVL_HTTP_OK);
        return 0;
    }

    if (c->chunked) {
        c->state = KVL_ST_CHUNK_SIZE;

    } else if (c->clen >= 0) {
        if (c->clen == 0) {
            kvl_http_finish(r, KVL_HTTP_OK);
            return 0;
        }

        c->state = KVL_ST_BODY_LEN;
        c->remaining = (size_t) c->clen;

    } else {
        c->state = KVL_ST_BODY_EOF;
        c->close = 1;
    }

    return kvl_http_parse(c, r, in);
}


static int
kvl_http_feed(kvl_conn_t *c, kvl_http_req_t *r, struct evbuffer *in,
    size_t n)
{
    char    *line, *p;
    size_t   len;
    double   now;

    if (r->on_event == NULL || r->status != 200) {
        if (r->body && evbuffer_get_length(r->body) + n <= KVL_HTTP_BODY_MAX)
        {
            return evbuffer_remove_buffer(in, r->body, n) == (int) n ? 0
                                                                     : -1;
        }

        return evbuffer_drain(in, n);
    }

    if (evbuffer_remove_buffer(in, c->sse, n) != (int) n) {
        return -1;
    }

    now = kvl_now();

    while ((line = evbuffer_readln(c->sse, &len, EVBUFFER_EOL_LF)) != NULL) {

        if (len > 0 && line[len - 1] == '\r') {
            line[--len] = '\0';
        }

        if (len >= 5 && memcmp(line, "data:", 5) == 0) {
            p = line + 5;
            p += (*p == ' ');
            r->on_event(r, p, len - (p - line), now);
        }

        free(line);
    }

    return evbuffer_get_length(c->sse) > KVL_LINE_MAX ? -1 : 0;
}


static void
kvl_http_finish(kvl_http_req_t *r, kvl_http_err_e err)
{
    kvl_conn_t    *c = r->conn;
    kvl_target_t  *t = r->target;

    r->error = err;
    r->t_done = kvl_now();
    r->conn = NULL;

    if (c != NULL) {
        c->req = NULL;

        if (err == KVL_HTTP_OK && !c->close
            && evbuffer_get_length(bufferevent_get_input(c->bev)) == 0)
        {
            evbuffer_drain(c->sse, evbuffer_get_length(c->sse));
            c->reused = 0;
            c->next = t->idle;
            t->idle = c;

        } else {
            kvl_conn_free(c);
        }
    }

    event_free(r->timer);
    r->timer = NULL;
    evbuffer_free(r->wire);
    r->wire = NULL;

    r->done(r);
}
