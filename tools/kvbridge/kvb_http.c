/*
 * kvbridge: the metrics page's listener (kvb_http.h).
 */

/* accept4() */
#define _GNU_SOURCE

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvb_http.h"
#include "kvb_log.h"


typedef struct {
    int                     fd;         /* -1: free */
    unsigned                writing:1;
    uint64_t                deadline;
    size_t                  in;
    char                    req[KVB_HTTP_REQUEST_MAX];
    kvb_buf_t               out;
    size_t                  sent;
} kvb_http_conn_t;


struct kvb_http_s {
    int                     fd;
    kvb_http_render_pt      render;
    void                   *data;
    kvb_http_conn_t         conns[KVB_HTTP_CONNS];
    kvb_log_limit_t         log;
};


static int kvb_http_addr(const char *addr, struct sockaddr_storage *sa,
    socklen_t *len);
static void kvb_http_accept(kvb_http_t *h, uint64_t now_ms);
static void kvb_http_read(kvb_http_t *h, kvb_http_conn_t *c);
static void kvb_http_answer(kvb_http_t *h, kvb_http_conn_t *c);
static void kvb_http_write(kvb_http_conn_t *c);
static void kvb_http_close(kvb_http_conn_t *c);


kvb_http_t *
kvb_http_create(const char *addr, kvb_http_render_pt render, void *data,
    char *err, size_t errlen)
{
    int                      one, i;
    socklen_t                len;
    kvb_http_t              *h;
    struct sockaddr_storage  sa;

    if (kvb_http_addr(addr, &sa, &len) != 0) {
        snprintf(err, errlen, "\"%s\": not IPv4:PORT, [IPv6]:PORT or "
                 "localhost:PORT", addr);
        return NULL;
    }

    h = calloc(1, sizeof(kvb_http_t));
    if (h == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }

    h->render = render;
    h->data = data;

    for (i = 0; i < KVB_HTTP_CONNS; i++) {
        h->conns[i].fd = -1;
    }

    h->fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                   0);
    one = 1;

    if (h->fd < 0
        || setsockopt(h->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one))
           != 0
        || bind(h->fd, (struct sockaddr *) &sa, len) != 0
        || listen(h->fd, 16) != 0)
    {
        snprintf(err, errlen, "%s: %s", addr, strerror(errno));

        if (h->fd >= 0) {
            close(h->fd);
        }

        free(h);
        return NULL;
    }

    return h;
}


void
kvb_http_destroy(kvb_http_t *h)
{
    int  i;

    if (h == NULL) {
        return;
    }

    for (i = 0; i < KVB_HTTP_CONNS; i++) {
        kvb_http_close(&h->conns[i]);
    }

    close(h->fd);
    free(h);
}


static int
kvb_http_addr(const char *addr, struct sockaddr_storage *sa, socklen_t *len)
{
    char                  host[64], *end;
    const char           *colon;
    size_t                n;
    unsigned long         port;
    struct sockaddr_in   *sin;
    struct sockaddr_in6  *sin6;

    memset(sa, 0, sizeof(*sa));

    colon = strrchr(addr, ':');
    if (colon == NULL) {
        return -1;
    }

    errno = 0;
    port = strtoul(colon + 1, &end, 10);

    if (colon[1] == '\0' || *end != '\0' || errno != 0 || port > 65535) {
        return -1;
    }

    n = (size_t) (colon - addr);

    if (n >= 2 && addr[0] == '[' && addr[n - 1] == ']') {
        if (n - 2 >= sizeof(host)) {
            return -1;
        }

        memcpy(host, addr + 1, n - 2);
        host[n - 2] = '\0';

        sin6 = (struct sockaddr_in6 *) sa;
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t) port);
        *len = sizeof(struct sockaddr_in6);

        return inet_pton(AF_INET6, host, &sin6->sin6_addr) == 1 ? 0 : -1;
    }

    if (n >= sizeof(host)) {
        return -1;
    }

    memcpy(host, addr, n);
    host[n] = '\0';

    if (strcmp(host, "localhost") == 0) {
        strcpy(host, "127.0.0.1");
    }

    sin = (struct sockaddr_in *) sa;
    sin->sin_family = AF_INET;
    sin->sin_port = htons((uint16_t) port);
    *len = sizeof(struct sockaddr_in);

    return inet_pton(AF_INET, host, &sin->sin_addr) == 1 ? 0 : -1;
}


int
kvb_http_watch(void *data, uint64_t now_ms, zmq_pollitem_t *items, int max)
{
    int          i, n;
    kvb_http_t  *h = data;

    items[0].socket = NULL;
    items[0].fd = h->fd;
    items[0].events = ZMQ_POLLIN;
    n = 1;

    for (i = 0; i < KVB_HTTP_CONNS && n < max; i++) {
        if (h->conns[i].fd < 0) {
            continue;
        }

        items[n].socket = NULL;
        items[n].fd = h->conns[i].fd;
        items[n].events = h->conns[i].writing ? ZMQ_POLLOUT : ZMQ_POLLIN;
        n++;
    }

    return n;
}


void
kvb_http_io(void *data, const zmq_pollitem_t *items, int n,
    kvb_budget_t *b, uint64_t now_ms)
{
    int               i, k;
    kvb_http_t       *h = data;
    kvb_http_conn_t  *c;

    for (i = 1; i < n; i++) {
        if (items[i].revents == 0) {
            continue;
        }

        for (k = 0; k < KVB_HTTP_CONNS; k++) {
            c = &h->conns[k];

            if (c->fd != items[i].fd) {
                continue;
            }

            if (c->writing) {
                kvb_http_write(c);

            } else {
                kvb_http_read(h, c);
            }

            break;
        }
    }

    if (items[0].revents) {
        kvb_http_accept(h, now_ms);
    }
}


uint64_t
kvb_http_deadline(void *data)
{
    int          i;
    uint64_t     d;
    kvb_http_t  *h = data;

    d = UINT64_MAX;

    for (i = 0; i < KVB_HTTP_CONNS; i++) {
        if (h->conns[i].fd >= 0 && h->conns[i].deadline < d) {
            d = h->conns[i].deadline;
        }
    }

    return d;
}


/* a client too slow to ask or to take its answer is dropped */

void
kvb_http_tick(void *data, uint64_t now_ms)
{
    int          i;
    kvb_http_t  *h = data;

    for (i = 0; i < KVB_HTTP_CONNS; i++) {
        if (h->conns[i].fd >= 0 && now_ms >= h->conns[i].deadline) {
            kvb_http_close(&h->conns[i]);
        }
    }
}


/* with every connection busy, a new one is closed at once */

static void
kvb_http_accept(kvb_http_t *h, uint64_t now_ms)
{
    int               fd, i, k;
    kvb_http_conn_t  *c;

    for (k = 0; k < KVB_HTTP_CONNS + 1; k++) {
        fd = accept4(h->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR
                && errno != ECONNABORTED)
            {
                kvb_log_limited(&h->log, now_ms, KVB_LOG_WARN,
                                "metrics: accept: %s", strerror(errno));
            }

            return;
        }

        c = NULL;

        for (i = 0; i < KVB_HTTP_CONNS; i++) {
            if (h->conns[i].fd < 0) {
                c = &h->conns[i];
                break;
            }
        }

        if (c == NULL) {
            kvb_log_limited(&h->log, now_ms, KVB_LOG_WARN,
                            "metrics: %d requests at once, one refused",
                            KVB_HTTP_CONNS);
            close(fd);
            continue;
        }

        c->fd = fd;
        c->writing = 0;
        c->in = 0;
        c->sent = 0;
        c->deadline = now_ms + KVB_HTTP_TIMEOUT_MS;
    }
}


static void
kvb_http_read(kvb_http_t *h, kvb_http_conn_t *c)
{
    ssize_t  n;

    n = recv(c->fd, c->req + c->in, sizeof(c->req) - 1 - c->in, 0);

    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK
                  || errno == EINTR))
    {
        return;
    }

    if (n <= 0) {
        kvb_http_close(c);
        return;
    }

    c->in += (size_t) n;
    c->req[c->in] = '\0';

    if (strstr(c->req, "\r\n\r\n") != NULL
        || strstr(c->req, "\n\n") != NULL
        || c->in == sizeof(c->req) - 1)
    {
        kvb_http_answer(h, c);
    }
}


static void
kvb_http_answer(kvb_http_t *h, kvb_http_conn_t *c)
{
    int          status;
    size_t       n;
    kvb_buf_t    body;
    const char  *reason, *path;

    memset(&body, 0, sizeof(body));

    if (strstr(c->req, "\r\n\r\n") == NULL
        && strstr(c->req, "\n\n") == NULL)
    {
        status = 431;
        reason = "Request Header Fields Too Large";

    } else if (strncmp(c->req, "GET ", 4) != 0) {
        status = 405;
        reason = "Method Not Allowed";

    } else {
        path = c->req + 4;
        n = strcspn(path, " ?\r\n");

        if ((n == 8 && strncmp(path, "/metrics", 8) == 0)
            || (n == 1 && path[0] == '/'))
        {
            status = 200;
            reason = "OK";
            h->render(h->data, &body);

        } else {
            status = 404;
            reason = "Not Found";
        }
    }

    if (body.failed) {
        status = 500;
        reason = "Internal Server Error";
        kvb_buf_free(&body);
    }

    kvb_buf_printf(&c->out, "HTTP/1.1 %d %s\r\n"
                   "Content-Type: text/plain; version=0.0.4; "
                   "charset=utf-8\r\n"
                   "Content-Length: %zu\r\n"
                   "Connection: close\r\n\r\n", status, reason, body.len);

    if (body.len) {
        kvb_buf_printf(&c->out, "%.*s", (int) body.len, body.data);
    }

    kvb_buf_free(&body);

    if (c->out.failed) {
        kvb_http_close(c);
        return;
    }

    c->writing = 1;
    kvb_http_write(c);
}


static void
kvb_http_write(kvb_http_conn_t *c)
{
    ssize_t  n;

    n = send(c->fd, c->out.data + c->sent, c->out.len - c->sent,
             MSG_NOSIGNAL);

    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK
                  || errno == EINTR))
    {
        return;
    }

    if (n < 0) {
        kvb_http_close(c);
        return;
    }

    c->sent += (size_t) n;

    if (c->sent == c->out.len) {
        kvb_http_close(c);
    }
}


static void
kvb_http_close(kvb_http_conn_t *c)
{
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }

    kvb_buf_free(&c->out);
}
