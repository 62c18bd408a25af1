/*
 * kvload HTTP client.
 *
 * A request takes an idle connection of its target or opens one, and gives
 * it back when done, whatever happened: evhttp reconnects a connection that
 * was closed.  The timeout is evhttp's, an idle timeout: a response that
 * keeps streaming is not cut, one that stalls is.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <event2/bufferevent.h>
#include <event2/keyvalq_struct.h>

#include "kvload_http.h"


static void kvl_http_chunk(struct evhttp_request *req, void *arg);
static int kvl_http_again(kvl_http_req_t *r);
static void kvl_http_error(enum evhttp_request_error err, void *arg);
static void kvl_http_done(struct evhttp_request *req, void *arg);


double
kvl_now(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);

    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}


int
kvl_target_init(kvl_target_t *t, struct event_base *base,
    const char *hostport, size_t max_conns)
{
    char  *end;
    long   port;

    memset(t, 0, sizeof(kvl_target_t));

    end = strrchr(hostport, ':');
    if (end == NULL || (size_t) (end - hostport) >= sizeof(t->ip)) {
        return -1;
    }

    port = strtol(end + 1, NULL, 10);
    if (port < 1 || port > 65535) {
        return -1;
    }

    t->idle = malloc(max_conns * sizeof(struct evhttp_connection *));
    if (t->idle == NULL) {
        return -1;
    }

    memcpy(t->ip, hostport, end - hostport);
    t->max_conns = max_conns;
    t->port = (unsigned short) port;
    t->base = base;
    snprintf(t->host, sizeof(t->host), "%s:%ld", t->ip, port);

    return 0;
}


int
kvl_http_send(kvl_http_req_t *r, const char *path, const char *body,
    size_t len, double timeout)
{
    int                     one = 1;
    kvl_target_t           *t = r->target;
    evutil_socket_t         fd;
    struct timeval          tv;
    struct evkeyvalq       *h;
    struct evhttp_request  *req;

    r->status = 0;
    r->error = 0;
    r->upstream[0] = '\0';
    r->server[0] = '\0';
    r->path = path;
    r->timeout = timeout;
    r->reused = 0;

    if (r->buf == NULL && (r->buf = evbuffer_new()) == NULL) {
        return -1;
    }

    if (t->nidle && !r->retries) {
        r->conn = t->idle[--t->nidle];
        r->reused = 1;

        if ((r->again == NULL && (r->again = evbuffer_new()) == NULL)
            || (body && evbuffer_add(r->again, body, len) != 0))
        {
            t->idle[t->nidle++] = r->conn;
            r->conn = NULL;
            return -1;
        }

    } else {
        if (t->nconns == t->max_conns) {
            return -1;
        }

        r->conn = evhttp_connection_base_new(t->base, NULL, t->ip, t->port);
        if (r->conn == NULL) {
            return -1;
        }

        t->nconns++;

        tv.tv_sec = (time_t) timeout;
        tv.tv_usec = (suseconds_t) ((timeout - (double) tv.tv_sec) * 1e6);
        evhttp_connection_set_timeout_tv(r->conn, &tv);
    }

    req = evhttp_request_new(kvl_http_done, r);
    if (req == NULL) {
        goto failed;
    }

    evhttp_request_set_error_cb(req, kvl_http_error);

    if (r->on_event) {
        evhttp_request_set_chunked_cb(req, kvl_http_chunk);
    }

    h = evhttp_request_get_output_headers(req);

    if (evhttp_add_header(h, "Host", t->host) != 0
        || (r->hname && evhttp_add_header(h, r->hname, r->hvalue) != 0)
        || (body && (evhttp_add_header(h, "Content-Type", "application/json")
                     != 0
                     || evbuffer_add(evhttp_request_get_output_buffer(req),
                                     body, len) != 0)))
    {
        evhttp_request_free(req);
        goto failed;
    }

    if (evhttp_make_request(r->conn, req, body ? EVHTTP_REQ_POST
                                               : EVHTTP_REQ_GET, path)
        != 0)
    {
        goto failed;
    }

    /*
     * as an asyncio client (the OpenAI SDK) does: without TCP_NODELAY a
     * body longer than one write leaves its tail to Nagle, held for the
     * proxy's delayed ACK, 40 ms of every TTFT, times the time scale
     */
    if (!r->reused) {
        fd = bufferevent_getfd(evhttp_connection_get_bufferevent(r->conn));

        if (fd >= 0) {
            (void) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one,
                              sizeof(int));
        }
    }

    return 0;

failed:

    evhttp_connection_free(r->conn);
    r->conn = NULL;
    t->nconns--;

    return -1;
}


const char *
kvl_http_strerror(int err)
{
    static const char  *names[] = {
        "ok", "timeout", "connection closed or refused", "invalid header",
        "buffer error", "cancelled", "body too long", "no response"
    };

    return names[err < 0 || err > 7 ? 7 : err];
}


static void
kvl_http_chunk(struct evhttp_request *req, void *arg)
{
    char             *line, *p;
    size_t            len;
    double            now;
    const char       *v;
    kvl_http_req_t   *r = arg;
    struct evbuffer  *in = evhttp_request_get_input_buffer(req);

    /* evhttp drains the input after this call: keep partial lines */

    if (r->status == 0) {
        r->status = evhttp_request_get_response_code(req);
        v = evhttp_find_header(evhttp_request_get_input_headers(req),
                               "X-Upstream-Addr");
        if (v) {
            snprintf(r->upstream, sizeof(r->upstream), "%.*s",
                     (int) strcspn(v, " ,"), v);
        }

        v = evhttp_find_header(evhttp_request_get_input_headers(req),
                               "X-Kvsim-Server");
        if (v) {
            snprintf(r->server, sizeof(r->server), "%s", v);
        }
    }

    if (r->status != 200 || evbuffer_add_buffer(r->buf, in) != 0) {
        return;
    }

    now = kvl_now();

    while ((line = evbuffer_readln(r->buf, &len, EVBUFFER_EOL_CRLF))
           != NULL)
    {
        if (len >= 5 && memcmp(line, "data:", 5) == 0) {
            p = line + 5;
            p += (*p == ' ');
            r->on_event(r, p, len - (p - line), now);
        }

        free(line);
    }
}


/*
 * The request again on a new connection; the old one goes back to the
 * pool, where evhttp reconnects it on its next use.
 */
static int
kvl_http_again(kvl_http_req_t *r)
{
    int              rc;
    size_t           len;
    kvl_target_t    *t = r->target;
    struct evbuffer  *body;

    t->idle[t->nidle++] = r->conn;
    r->conn = NULL;
    r->retries++;

    body = r->again;
    r->again = NULL;
    len = evbuffer_get_length(body);

    rc = kvl_http_send(r, r->path,
                       len ? (const char *) evbuffer_pullup(body, -1) : NULL,
                       len, r->timeout);

    r->again = body;
    evbuffer_drain(body, len);

    return rc;
}


static void
kvl_http_error(enum evhttp_request_error err, void *arg)
{
    ((kvl_http_req_t *) arg)->error = 1 + (int) err;
}


static void
kvl_http_done(struct evhttp_request *req, void *arg)
{
    kvl_http_req_t   *r = arg;
    kvl_target_t     *t = r->target;
    struct evbuffer  *in;

    r->t_done = kvl_now();

    if ((req == NULL || evhttp_request_get_response_code(req) == 0)
        && r->reused && r->again && kvl_http_again(r) == 0)
    {
        return;
    }

    if (r->again) {
        evbuffer_drain(r->again, evbuffer_get_length(r->again));
    }

    if (req == NULL || evhttp_request_get_response_code(req) == 0) {
        r->error = r->error ? r->error : 7;

    } else {
        r->status = evhttp_request_get_response_code(req);
        in = evhttp_request_get_input_buffer(req);

        if (r->on_event == NULL
            && evbuffer_get_length(in) <= KVL_HTTP_BODY_MAX
            && evbuffer_add_buffer(r->buf, in) != 0)
        {
            r->error = 1 + EVREQ_HTTP_BUFFER_ERROR;
        }
    }

    if (r->on_event) {
        evbuffer_drain(r->buf, evbuffer_get_length(r->buf));
    }

    /* back to the pool, closed or not: evhttp reconnects on next use */

    t->idle[t->nidle++] = r->conn;
    r->conn = NULL;

    r->done(r);
}
