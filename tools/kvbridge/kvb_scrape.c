/*
 * kvbridge: a non-blocking HTTP/1.1 GET of an engine's /metrics on the
 * bridge's poll loop (kvb_scrape.h).
 */

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include "kvb_log.h"
#include "kvb_scrape.h"


typedef enum {
    KVB_SCRAPE_IDLE = 0,
    KVB_SCRAPE_CONNECTING,
    KVB_SCRAPE_WRITING,
    KVB_SCRAPE_READING
} kvb_scrape_state_e;

typedef enum {
    KVB_BODY_LENGTH = 0,
    KVB_BODY_CHUNKED,
    KVB_BODY_CLOSE
} kvb_body_e;


struct kvb_scrape_s {
    int                      fd;
    kvb_scrape_state_e       state;

    struct sockaddr_storage  addr;
    socklen_t                addrlen;

    char                    *req;
    size_t                   req_len;
    size_t                   req_sent;

    /* the headers, then the body alone (decoded when chunked) */
    char                    *buf;
    size_t                   len;
    size_t                   cap;
    size_t                   raw;       /* bytes received, encoding too */
    size_t                   scanned;   /* of buf, for the headers' end */
    unsigned                 have_head:1;
    kvb_body_e               body;
    uint64_t                 content_length;
    kvb_chunked_t            chunked;

    unsigned                 interval_ms;
    unsigned                 timeout_ms;
    uint64_t                 started_ms;
    uint64_t                 next_ms;

    kvb_load_t               load;
    kvb_load_t               ranks[KVB_METRICS_RANKS];
    uint64_t                 load_ms;
    unsigned                 have_load:1;

    uint64_t                 ok;
    uint64_t                 failed;
    uint64_t                 failures[KVB_SCRAPE_ERR_KINDS];
    uint64_t                 failed_since;  /* since the last good one */
    unsigned                 last_failed:1;
    unsigned                 last_kind;
    unsigned                 last_status;
    kvb_scrape_err_e         head_kind;     /* why kvb_scrape_head() */
    char                     error[160];

    char                    *url;
    const char              *label;
    kvb_log_limit_t          fail_log[KVB_SCRAPE_ERR_KINDS];
};

static const char  *kvb_scrape_err_names[] = {
    "connect", "timeout", "status", "encoding", "parse", "closed", "size",
    "other"
};

static int kvb_url_parse(kvb_scrape_t *s, const char *url, char *err,
    size_t errlen);
static void kvb_scrape_start(kvb_scrape_t *s, uint64_t now);
static void kvb_scrape_expire(kvb_scrape_t *s, uint64_t now);
static void kvb_scrape_connected(kvb_scrape_t *s, uint64_t now);
static void kvb_scrape_write(kvb_scrape_t *s, uint64_t now);
static void kvb_scrape_read(kvb_scrape_t *s, uint64_t now);
static int kvb_scrape_received(kvb_scrape_t *s, size_t n, uint64_t now);
static int kvb_scrape_body(kvb_scrape_t *s, size_t from, size_t n,
    uint64_t now);
static int kvb_scrape_head(kvb_scrape_t *s, size_t head_len);
static int kvb_scrape_room(kvb_scrape_t *s, uint64_t now);
static void kvb_scrape_closed(kvb_scrape_t *s, uint64_t now);
static void kvb_scrape_done(kvb_scrape_t *s, uint64_t now);
static void kvb_scrape_fail(kvb_scrape_t *s, uint64_t now,
    kvb_scrape_err_e kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void kvb_scrape_end(kvb_scrape_t *s, uint64_t now);
static int kvb_token_eq(const char *p, size_t len, const char *lower);


kvb_scrape_t *
kvb_scrape_create(const char *url, unsigned interval_ms, unsigned timeout_ms,
    char *err, size_t errlen)
{
    kvb_scrape_t  *s;

    if (interval_ms == 0 || timeout_ms == 0) {
        snprintf(err, errlen, "scrape interval and timeout must be above 0");
        return NULL;
    }

    s = calloc(1, sizeof(kvb_scrape_t));
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }

    s->fd = -1;
    s->interval_ms = interval_ms;
    s->timeout_ms = timeout_ms;
    s->label = "";

    s->url = strdup(url);
    if (s->url == NULL) {
        snprintf(err, errlen, "out of memory");
        free(s);
        return NULL;
    }

    /* the first scrape is due at once */
    s->next_ms = 0;

    if (kvb_url_parse(s, url, err, errlen) != 0) {
        free(s->req);
        free(s->url);
        free(s);
        return NULL;
    }

    return s;
}


void
kvb_scrape_destroy(kvb_scrape_t *s)
{
    if (s == NULL) {
        return;
    }

    if (s->fd != -1) {
        close(s->fd);
    }

    free(s->req);
    free(s->buf);
    free(s->url);
    free(s);
}


void
kvb_scrape_label(kvb_scrape_t *s, const char *engine)
{
    if (s != NULL) {
        s->label = engine ? engine : "";
    }
}


static int
kvb_url_parse(kvb_scrape_t *s, const char *url, char *err, size_t errlen)
{
    char                 host[64];
    size_t               n, hostlen, hostport_len;
    unsigned long        port;
    const char          *p, *h, *path, *hostport;
    struct sockaddr_in  *sin;
    struct sockaddr_in6 *sin6;

    if (strncmp(url, "http://", 7) != 0) {
        snprintf(err, errlen, "\"%s\": not an http:// URL", url);
        return -1;
    }

    p = url + 7;
    hostport = p;

    if (*p == '[') {
        h = ++p;
        while (*p && *p != ']') {
            p++;
        }

        if (*p != ']') {
            snprintf(err, errlen, "\"%s\": no \"]\" after the IPv6 address",
                     url);
            return -1;
        }

        hostlen = p++ - h;

    } else {
        h = p;
        while (*p && *p != ':' && *p != '/') {
            p++;
        }

        hostlen = p - h;
    }

    if (hostlen == 0 || hostlen >= sizeof(host)) {
        snprintf(err, errlen, "\"%s\": bad host", url);
        return -1;
    }

    memcpy(host, h, hostlen);
    host[hostlen] = '\0';

    port = 80;

    if (*p == ':') {
        p++;
        port = 0;
        n = 0;

        while (*p >= '0' && *p <= '9' && port <= 65535) {
            port = port * 10 + (*p++ - '0');
            n++;
        }

        if (n == 0 || port == 0 || port > 65535) {
            snprintf(err, errlen, "\"%s\": bad port", url);
            return -1;
        }
    }

    if (*p != '\0' && *p != '/') {
        snprintf(err, errlen, "\"%s\": bad URL after the host", url);
        return -1;
    }

    hostport_len = p - hostport;

    memset(&s->addr, 0, sizeof(s->addr));

    sin = (struct sockaddr_in *) &s->addr;
    sin6 = (struct sockaddr_in6 *) &s->addr;

    if (hostport[0] == '[') {
        if (inet_pton(AF_INET6, host, &sin6->sin6_addr) != 1) {
            snprintf(err, errlen, "\"%s\": bad IPv6 address", url);
            return -1;
        }

        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t) port);
        s->addrlen = sizeof(struct sockaddr_in6);

    } else {
        /* no resolver: getaddrinfo() would stall every engine's events */
        if (strcmp(host, "localhost") == 0) {
            sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);

        } else if (inet_pton(AF_INET, host, &sin->sin_addr) != 1) {
            snprintf(err, errlen, "\"%s\": the host must be an IPv4 address, "
                     "[IPv6] or localhost (no name lookups)", url);
            return -1;
        }

        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t) port);
        s->addrlen = sizeof(struct sockaddr_in);
    }

    path = *p ? p : "/metrics";

    for (p = path; *p; p++) {
        if ((unsigned char) *p <= ' ' || *p == 0x7f || *p == '#') {
            snprintf(err, errlen, "\"%s\": bad character in the path", url);
            return -1;
        }
    }

    n = strlen(path) + hostport_len + 256;

    s->req = malloc(n);
    if (s->req == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }

    /* identity: prometheus_client gzips when asked, and we do not inflate */
    s->req_len = snprintf(s->req, n,
                          "GET %s HTTP/1.1\r\n"
                          "Host: %.*s\r\n"
                          "User-Agent: kvbridge\r\n"
                          "Accept: text/plain;version=0.0.4\r\n"
                          "Accept-Encoding: identity\r\n"
                          "Connection: close\r\n"
                          "\r\n",
                          path, (int) hostport_len, hostport);

    return 0;
}


int
kvb_scrape_want(kvb_scrape_t *s, uint64_t now_ms, short *events)
{
    kvb_scrape_expire(s, now_ms);

    if (s->state == KVB_SCRAPE_IDLE) {
        if (now_ms < s->next_ms) {
            return -1;
        }

        kvb_scrape_start(s, now_ms);

        if (s->state == KVB_SCRAPE_IDLE) {
            return -1;
        }
    }

    *events = (s->state == KVB_SCRAPE_READING) ? ZMQ_POLLIN : ZMQ_POLLOUT;

    return s->fd;
}


void
kvb_scrape_io(kvb_scrape_t *s, short revents, uint64_t now_ms)
{
    kvb_scrape_expire(s, now_ms);

    if (s->state == KVB_SCRAPE_IDLE || revents == 0) {
        return;
    }

    switch (s->state) {

    case KVB_SCRAPE_CONNECTING:
        kvb_scrape_connected(s, now_ms);
        break;

    case KVB_SCRAPE_WRITING:
        kvb_scrape_write(s, now_ms);
        break;

    default: /* KVB_SCRAPE_READING */
        kvb_scrape_read(s, now_ms);
        break;
    }
}


uint64_t
kvb_scrape_deadline(const kvb_scrape_t *s)
{
    if (s->state == KVB_SCRAPE_IDLE) {
        return s->next_ms;
    }

    return s->started_ms + s->timeout_ms;
}


int
kvb_scrape_load(const kvb_scrape_t *s, kvb_load_t *load, uint64_t *taken_ms)
{
    if (!s->have_load) {
        return -1;
    }

    *load = s->load;
    *taken_ms = s->load_ms;

    return 0;
}


int
kvb_scrape_rank_load(const kvb_scrape_t *s, unsigned rank, kvb_load_t *load,
    uint64_t *taken_ms)
{
    if (!s->have_load || rank >= KVB_METRICS_RANKS
        || !(s->ranks[rank].have_running || s->ranks[rank].have_waiting
             || s->ranks[rank].have_usage))
    {
        return -1;
    }

    *load = s->ranks[rank];
    *taken_ms = s->load_ms;

    return 0;
}


void
kvb_scrape_stats(const kvb_scrape_t *s, kvb_scrape_stats_t *st)
{
    st->ok = s->ok;
    st->failed = s->failed;
    memcpy(st->failures, s->failures, sizeof(st->failures));
    st->last_error = s->error;
    st->last_failed = s->last_failed;
    st->last_kind = s->last_kind;
    st->last_status = s->last_status;
}


const char *
kvb_scrape_err_name(unsigned kind)
{
    return kind < KVB_SCRAPE_ERR_KINDS ? kvb_scrape_err_names[kind]
                                       : "other";
}


void
kvb_scrape_feed_start(kvb_scrape_t *s, uint64_t now_ms)
{
    if (s->state != KVB_SCRAPE_IDLE) {
        kvb_scrape_end(s, now_ms);
    }

    s->started_ms = now_ms;
    s->len = 0;
    s->raw = 0;
    s->scanned = 0;
    s->have_head = 0;
    s->req_sent = s->req_len;
    kvb_chunked_init(&s->chunked);

    s->state = KVB_SCRAPE_READING;
}


int
kvb_scrape_feed(kvb_scrape_t *s, const char *p, size_t n, uint64_t now_ms)
{
    size_t  take;

    while (n && s->state == KVB_SCRAPE_READING) {
        if (kvb_scrape_room(s, now_ms) != 0) {
            return 0;
        }

        take = s->cap - s->len;
        if (take == 0) {
            return -1;
        }

        take = (take < n) ? take : n;
        memcpy(s->buf + s->len, p, take);
        p += take;
        n -= take;

        if (kvb_scrape_received(s, take, now_ms) != 0) {
            return 0;
        }
    }

    return s->state == KVB_SCRAPE_READING;
}


void
kvb_scrape_feed_eof(kvb_scrape_t *s, uint64_t now_ms)
{
    if (s->state == KVB_SCRAPE_READING) {
        kvb_scrape_closed(s, now_ms);
    }
}


static void
kvb_scrape_start(kvb_scrape_t *s, uint64_t now)
{
    s->started_ms = now;
    s->len = 0;
    s->raw = 0;
    s->scanned = 0;
    s->have_head = 0;
    s->req_sent = 0;
    kvb_chunked_init(&s->chunked);

    s->fd = socket(s->addr.ss_family,
                   SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->fd == -1) {
        kvb_scrape_fail(s, now, KVB_SCRAPE_ERR_OTHER, "socket(): %s",
                        strerror(errno));
        return;
    }

    if (connect(s->fd, (struct sockaddr *) &s->addr, s->addrlen) == 0) {
        s->state = KVB_SCRAPE_WRITING;
        return;
    }

    if (errno != EINPROGRESS) {
        kvb_scrape_fail(s, now, KVB_SCRAPE_ERR_CONNECT, "connect(): %s",
                        strerror(errno));
        return;
    }

    s->state = KVB_SCRAPE_CONNECTING;
}


static void
kvb_scrape_expire(kvb_scrape_t *s, uint64_t now)
{
    if (s->state != KVB_SCRAPE_IDLE
        && now >= s->started_ms + s->timeout_ms)
    {
        kvb_scrape_fail(s, now, KVB_SCRAPE_ERR_TIMEOUT,
                        "timed out after %u ms %s", s->timeout_ms,
                        s->state == KVB_SCRAPE_CONNECTING ? "connecting"
                        : s->state == KVB_SCRAPE_WRITING ? "sending"
                        : s->have_head ? "reading the body"
                        : "waiting for the response");
    }
}


static void
kvb_scrape_connected(kvb_scrape_t *s, uint64_t now)
{
    int        e;
    socklen_t  elen;

    e = 0;
    elen = sizeof(e);

    if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &e, &elen) == -1) {
        e = errno;
    }

    if (e == EINPROGRESS || e == EALREADY) {
        return;
    }

    if (e != 0) {
        kvb_scrape_fail(s, now, KVB_SCRAPE_ERR_CONNECT, "connect(): %s",
                        strerror(e));
        return;
    }

    s->state = KVB_SCRAPE_WRITING;

    /* a fresh socket has room for a few hundred bytes: no second poll */
    kvb_scrape_write(s, now);
}


static void
kvb_scrape_write(kvb_scrape_t *s, uint64_t now)
{
    ssize_t  n;

    while (s->req_sent < s->req_len) {
        n = send(s->fd, s->req + s->req_sent, s->req_len - s->req_sent,
                 MSG_NOSIGNAL);

        if (n == -1) {
            if (errno == EINTR) {
                continue;
            }

            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                return;
            }

            kvb_scrape_fail(s, now,
                            errno == ECONNRESET || errno == EPIPE
                            ? KVB_SCRAPE_ERR_CONNECT : KVB_SCRAPE_ERR_OTHER,
                            "send(): %s", strerror(errno));
            return;
        }

        s->req_sent += n;
    }

    s->state = KVB_SCRAPE_READING;
}


static void
kvb_scrape_read(kvb_scrape_t *s, uint64_t now)
{
    ssize_t   n;
    unsigned  i;

    /* a bound on one call, so that a fast sender cannot hold the loop */
    for (i = 0; i < 64; i++) {

        if (kvb_scrape_room(s, now) != 0) {
            return;
        }

        /*
         * the headers end within HEADER_MAX and the body within BODY_MAX,
         * or the scrape has failed: there is always room
         */
        n = recv(s->fd, s->buf + s->len, s->cap - s->len, 0);

        if (n > 0) {
            if (kvb_scrape_received(s, n, now) != 0) {
                return;
            }

            continue;
        }

        if (n == 0) {
            kvb_scrape_closed(s, now);
            return;
        }

        if (errno == EINTR) {
            continue;
        }

        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            kvb_scrape_fail(s, now,
                            errno == ECONNRESET ? KVB_SCRAPE_ERR_CLOSED
                                                : KVB_SCRAPE_ERR_OTHER,
                            "recv(): %s", strerror(errno));
        }

        return;
    }
}


/* at least 16 KB free in buf, or all it may ever hold; -1: failed */

static int
kvb_scrape_room(kvb_scrape_t *s, uint64_t now)
{
    char    *nb;
    size_t   cap;

    if (s->cap - s->len >= 16384
        || s->cap >= KVB_SCRAPE_BODY_MAX + KVB_SCRAPE_HEADER_MAX)
    {
        return 0;
    }

    cap = s->cap ? s->cap * 2 : 65536;
    if (cap > KVB_SCRAPE_BODY_MAX + KVB_SCRAPE_HEADER_MAX) {
        cap = KVB_SCRAPE_BODY_MAX + KVB_SCRAPE_HEADER_MAX;
    }

    nb = realloc(s->buf, cap);
    if (nb == NULL) {
        kvb_scrape_fail(s, now, KVB_SCRAPE_ERR_OTHER, "out of memory");
        return -1;
    }

    s->buf = nb;
    s->cap = cap;

    return 0;
}


/* the server closed: the end of a body without a length, else truncated */

static void
kvb_scrape_closed(kvb_scrape_t *s, uint64_t now)
{
    if (!s->have_head) {
        kvb_scrape_fail(s, now, KVB_SCRAPE_ERR_CLOSED, "connection closed "
                        "before the response headers (%zu bytes)", s->len);

    } else if (s->body == KVB_BODY_CLOSE) {
        kvb_scrape_done(s, now);

    } else {
        kvb_scrape_fail(s, now, KVB_SCRAPE_ERR_CLOSED, "connection closed "
                        "inside the body (%zu bytes)", s->len);
    }
}


/* n new bytes at buf + len: 0 to read on, -1 when the scrape ended */

static int
kvb_scrape_received(kvb_scrape_t *s, size_t n, uint64_t now)
{
    size_t       i, head_len, start;
    const char  *b;

    s->raw += n;

    /* chunk extensions and trailers decode to nothing; bound them too */
    if (s->raw > 2 * (size_t) KVB_SCRAPE_BODY_MAX) {
        kvb_scrape_fail(s, now, KVB_SCRAPE_ERR_SIZE, "response over %u bytes",
                        2 * KVB_SCRAPE_BODY_MAX);
        return -1;
    }

    if (s->have_head) {
        return kvb_scrape_body(s, s->len, n, now);
    }

    s->len += n;
    b = s->buf;
    head_len = 0;

    start = s->scanned > 3 ? s->scanned - 3 : 0;

    for (i = start; i < s->len; i++) {
        if (b[i] != '\n') {
            continue;
        }

        if (i >= 1 && b[i - 1] == '\n') {
            head_len = i + 1;
            break;
        }

        if (i >= 2 && b[i - 1] == '\r' && b[i - 2] == '\n') {
            head_len = i + 1;
            break;
        }
    }

    s->scanned = s->len;

    if (head_len == 0) {
        if (s->len > KVB_SCRAPE_HEADER_MAX) {
            kvb_scrape_fail(s, now, KVB_SCRAPE_ERR_SIZE,
                            "response headers over %u bytes",
                            KVB_SCRAPE_HEADER_MAX);
            return -1;
        }

        return 0;
    }

    /* the same cap whether the end came in this read or a later one */
    if (head_len > KVB_SCRAPE_HEADER_MAX) {
        kvb_scrape_fail(s, now, KVB_SCRAPE_ERR_SIZE,
                        "response headers over %u bytes",
                        KVB_SCRAPE_HEADER_MAX);
        return -1;
    }

    if (kvb_scrape_head(s, head_len) != 0) {
        kvb_scrape_fail(s, now, s->head_kind, "%s", s->error);
        return -1;
    }

    s->have_head = 1;

    /* the body alone from here on, decoded in place */
    n = s->len - head_len;
    memmove(s->buf, s->buf + head_len, n);
    s->len = 0;

    return kvb_scrape_body(s, 0, n, now);
}


static int
kvb_scrape_body(kvb_scrape_t *s, size_t from, size_t n, uint64_t now)
{
    size_t            out, used;
    kvb_chunked_rc_e  rc;

    switch (s->body) {

    case KVB_BODY_CHUNKED:
        rc = kvb_chunked_decode(&s->chunked, s->buf + from, n, s->buf + from,
                                &out, &used);
        s->len = from + out;

        if (rc == KVB_CHUNKED_ERROR) {
            kvb_scrape_fail(s, now, KVB_SCRAPE_ERR_PARSE,
                            "bad chunked encoding");
            return -1;
        }

        if (s->len > KVB_SCRAPE_BODY_MAX) {
            break;
        }

        if (rc == KVB_CHUNKED_DONE) {
            kvb_scrape_done(s, now);
            return -1;
        }

        return 0;

    case KVB_BODY_LENGTH:
        s->len = from + n;

        if (s->len >= s->content_length) {
            /* what a server sends past its length is not ours to read */
            s->len = s->content_length;
            kvb_scrape_done(s, now);
            return -1;
        }

        return 0;

    default: /* KVB_BODY_CLOSE */
        s->len = from + n;
        break;
    }

    if (s->len > KVB_SCRAPE_BODY_MAX) {
        kvb_scrape_fail(s, now, KVB_SCRAPE_ERR_SIZE,
                        "response body over %u bytes",
                        KVB_SCRAPE_BODY_MAX);
        return -1;
    }

    return 0;
}


/* the status line and the headers we act on; s->error says why not */

static int
kvb_scrape_head(kvb_scrape_t *s, size_t head_len)
{
    int          status, have_length;
    size_t       i, nlen;
    uint64_t     length;
    const char  *p, *end, *eol, *colon, *v, *ve;

    p = s->buf;
    end = s->buf + head_len;

    if (head_len < 12 || memcmp(p, "HTTP/1.", 7) != 0
        || (p[7] != '0' && p[7] != '1') || p[8] != ' '
        || p[9] < '0' || p[9] > '9' || p[10] < '0' || p[10] > '9'
        || p[11] < '0' || p[11] > '9')
    {
        snprintf(s->error, sizeof(s->error), "not an HTTP/1.x response");
        s->head_kind = KVB_SCRAPE_ERR_PARSE;
        return -1;
    }

    status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    s->last_status = (unsigned) status;

    if (status != 200) {
        snprintf(s->error, sizeof(s->error), "HTTP status %d", status);
        s->head_kind = KVB_SCRAPE_ERR_STATUS;
        return -1;
    }

    s->body = KVB_BODY_CLOSE;
    have_length = 0;
    length = 0;

    eol = memchr(p, '\n', end - p);

    for (p = eol + 1; p < end; p = eol + 1) {
        eol = memchr(p, '\n', end - p);

        colon = memchr(p, ':', eol - p);
        if (colon == NULL) {
            continue;
        }

        nlen = colon - p;

        v = colon + 1;
        ve = eol;

        while (v < ve && (*v == ' ' || *v == '\t')) {
            v++;
        }

        while (ve > v && (ve[-1] == '\r' || ve[-1] == ' '
                          || ve[-1] == '\t'))
        {
            ve--;
        }

        if (kvb_token_eq(p, nlen, "transfer-encoding")) {
            /* "gzip, chunked" would still need inflating */
            if (!kvb_token_eq(v, ve - v, "chunked")) {
                snprintf(s->error, sizeof(s->error),
                         "unsupported Transfer-Encoding \"%.*s\"",
                         (int) (ve - v > 40 ? 40 : ve - v), v);
                s->head_kind = KVB_SCRAPE_ERR_ENCODING;
                return -1;
            }

            s->body = KVB_BODY_CHUNKED;

        } else if (kvb_token_eq(p, nlen, "content-encoding")) {
            if (ve > v && !kvb_token_eq(v, ve - v, "identity")) {
                snprintf(s->error, sizeof(s->error),
                         "unsupported Content-Encoding \"%.*s\"",
                         (int) (ve - v > 40 ? 40 : ve - v), v);
                s->head_kind = KVB_SCRAPE_ERR_ENCODING;
                return -1;
            }

        } else if (kvb_token_eq(p, nlen, "content-length")) {
            length = 0;

            for (i = 0; v + i < ve; i++) {
                if (v[i] < '0' || v[i] > '9'
                    || length > KVB_SCRAPE_BODY_MAX)
                {
                    break;
                }

                length = length * 10 + (v[i] - '0');
            }

            if (i == 0 || v + i < ve) {
                if (length > KVB_SCRAPE_BODY_MAX) {
                    snprintf(s->error, sizeof(s->error),
                             "response body over %u bytes (Content-Length)",
                             KVB_SCRAPE_BODY_MAX);
                    s->head_kind = KVB_SCRAPE_ERR_SIZE;

                } else {
                    snprintf(s->error, sizeof(s->error),
                             "bad Content-Length");
                    s->head_kind = KVB_SCRAPE_ERR_PARSE;
                }

                return -1;
            }

            have_length = 1;
        }
    }

    /* chunked overrides a length (RFC 9112 6.3) */
    if (s->body != KVB_BODY_CHUNKED && have_length) {
        if (length > KVB_SCRAPE_BODY_MAX) {
            snprintf(s->error, sizeof(s->error),
                     "response body over %u bytes (Content-Length)",
                     KVB_SCRAPE_BODY_MAX);
            s->head_kind = KVB_SCRAPE_ERR_SIZE;
            return -1;
        }

        s->body = KVB_BODY_LENGTH;
        s->content_length = length;
    }

    return 0;
}


static void
kvb_scrape_done(kvb_scrape_t *s, uint64_t now)
{
    kvb_load_t  load;

    if (kvb_metrics_parse_ranks(s->buf, s->len, &load, s->ranks,
                                KVB_METRICS_RANKS)
        != 0)
    {
        kvb_scrape_fail(s, now, KVB_SCRAPE_ERR_PARSE,
                        "no vLLM or SGLang load metric in %zu bytes", s->len);
        return;
    }

    s->load = load;
    s->load_ms = now;
    s->have_load = 1;
    s->ok++;
    s->last_failed = 0;

    if (s->failed_since) {
        kvb_log(KVB_LOG_INFO, "engine %s: metrics %s: scraped again, after "
                "%llu failures", s->label, s->url,
                (unsigned long long) s->failed_since);
        s->failed_since = 0;
    }

    kvb_scrape_end(s, now);
}


static void
kvb_scrape_fail(kvb_scrape_t *s, uint64_t now, kvb_scrape_err_e kind,
    const char *fmt, ...)
{
    char     msg[sizeof(s->error)];
    va_list  args;

    /* fmt may be "%s" of s->error itself */
    va_start(args, fmt);
    vsnprintf(msg, sizeof(msg), fmt, args);
    va_end(args);

    memcpy(s->error, msg, sizeof(msg));

    s->failed++;
    s->failures[kind]++;
    s->failed_since++;
    s->last_failed = 1;
    s->last_kind = kind;

    /*
     * Each kind on its own limiter: a refused connection logged does not
     * hide that the next engine restart answers 404.  Until the scrapes
     * work again the engine's load goes out stale, then not at all.
     */
    kvb_log_limited(&s->fail_log[kind], now, KVB_LOG_WARN,
                    "engine %s: metrics %s: scrape failed (%s): %s",
                    s->label, s->url, kvb_scrape_err_names[kind], s->error);

    kvb_scrape_end(s, now);
}


static void
kvb_scrape_end(kvb_scrape_t *s, uint64_t now)
{
    if (s->fd != -1) {
        close(s->fd);
        s->fd = -1;
    }

    s->state = KVB_SCRAPE_IDLE;

    /* a steady rate; a scrape that overran waits a whole interval */
    s->next_ms = s->started_ms + s->interval_ms;

    if (s->next_ms <= now) {
        s->next_ms = now + s->interval_ms;
    }
}


/* a header name or value equal to lower, whatever the case */

static int
kvb_token_eq(const char *p, size_t len, const char *lower)
{
    size_t  i;

    if (len != strlen(lower)) {
        return 0;
    }

    for (i = 0; i < len; i++) {
        if ((p[i] >= 'A' && p[i] <= 'Z' ? p[i] | 0x20 : p[i]) != lower[i]) {
            return 0;
        }
    }

    return 1;
}
