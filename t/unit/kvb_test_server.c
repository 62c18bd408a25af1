/*
 * kvbridge's scrape tests: a server forked on 127.0.0.1 that answers each
 * path its own way (a length, chunked, to close, slowly, with 500, with
 * garbage, not at all), and the bridge's poll loop for one scrape
 * (kvb_test_server.h).
 */

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "kvb_metrics_fixtures.h"
#include "kvb_test_server.h"


uint64_t
now_ms(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);

    return (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}


/* the server: one process, one connection at a time, never blocking */

#define SRV_HELD  64

static pid_t           srv_pid;
unsigned short         srv_port;


static void
srv_write(int fd, const char *p, size_t n)
{
    ssize_t  w;

    while (n) {
        w = write(fd, p, n);
        if (w <= 0) {
            if (w == -1 && errno == EINTR) {
                continue;
            }

            return;
        }

        p += w;
        n -= w;
    }
}


static void
srv_str(int fd, const char *s)
{
    srv_write(fd, s, strlen(s));
}


static void
srv_ok_length(int fd, const char *body)
{
    char  head[256];

    snprintf(head, sizeof(head),
             "HTTP/1.1 200 OK\r\n"
             "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
             "Content-Length: %zu\r\n\r\n", strlen(body));
    srv_str(fd, head);
    srv_str(fd, body);
}


static void
srv_ok_chunked(int fd, const char *body, size_t step)
{
    char    head[32];
    size_t  n, left;

    /* uvicorn's headers, lower case */
    srv_str(fd, "HTTP/1.1 200 OK\r\n"
                "date: Mon, 23 Nov 2026 12:00:00 GMT\r\n"
                "server: uvicorn\r\n"
                "content-type: text/plain; version=0.0.4; charset=utf-8\r\n"
                "transfer-encoding: chunked\r\n\r\n");

    left = strlen(body);

    while (left) {
        n = left < step ? left : step;
        snprintf(head, sizeof(head), "%zx\r\n", n);
        srv_str(fd, head);
        srv_write(fd, body, n);
        srv_str(fd, "\r\n");
        body += n;
        left -= n;

        /* separate segments, so the client sees chunks split across reads */
        usleep(1000);
    }

    srv_str(fd, "0\r\n\r\n");
}


static void
srv_stream(int fd, size_t total, int chunked)
{
    char    line[8192];
    char    head[32];
    size_t  n;

    memset(line, '#', sizeof(line));
    line[sizeof(line) - 1] = '\n';

    while (total) {
        n = total < sizeof(line) ? total : sizeof(line);

        if (chunked) {
            snprintf(head, sizeof(head), "%zx\r\n", n);
            srv_str(fd, head);
        }

        /* the client hangs up past its cap: write fails, we stop */
        if (write(fd, line, n) != (ssize_t) n) {
            return;
        }

        if (chunked) {
            srv_str(fd, "\r\n");
        }

        total -= n;
    }

    if (chunked) {
        srv_str(fd, "0\r\n\r\n");
    }
}


/* returns 1 to keep the connection open unanswered or after the answer */

static int
srv_answer(int fd, const char *req)
{
    char        path[64];
    const char  *sp;
    size_t      n;

    if (strncmp(req, "GET /", 5) != 0) {
        return 0;
    }

    sp = strchr(req + 4, ' ');
    n = sp ? (size_t) (sp - req - 4) : 0;
    if (n >= sizeof(path)) {
        n = sizeof(path) - 1;
    }

    memcpy(path, req + 4, n);
    path[n] = '\0';

    if (strcmp(path, "/metrics") == 0) {
        /* the default path, and the request as a proxy would read it */
        if (strstr(req, " HTTP/1.1\r\n") && strstr(req, "\r\nHost: 127.0.0.1:")
            && strstr(req, "\r\nConnection: close\r\n")
            && strstr(req, "\r\nAccept-Encoding: identity\r\n"))
        {
            srv_ok_length(fd, kvb_fx_vllm_old_text);

        } else {
            srv_str(fd, "HTTP/1.1 400 Bad Request\r\n"
                        "Content-Length: 0\r\n\r\n");
        }

        return 0;
    }

    if (strcmp(path, "/length") == 0) {
        /* answered, then held open: the length alone must end the read */
        srv_ok_length(fd, kvb_fx_vllm_text);
        return 1;
    }

    if (strcmp(path, "/chunked") == 0) {
        srv_ok_chunked(fd, kvb_fx_vllm_text, 333);
        return 1;
    }

    if (strcmp(path, "/sglang") == 0) {
        srv_ok_chunked(fd, kvb_fx_sglang_text, 7);
        return 1;
    }

    if (strcmp(path, "/close") == 0) {
        srv_str(fd, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n");
        srv_str(fd, kvb_fx_sglang_text);
        return 0;
    }

    if (strcmp(path, "/slow") == 0) {
        return 1;
    }

    if (strcmp(path, "/slowbody") == 0) {
        srv_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
                    "vllm:num_requests_running 1\n");
        return 1;
    }

    if (strcmp(path, "/500") == 0) {
        srv_str(fd, "HTTP/1.1 500 Internal Server Error\r\n"
                    "Content-Length: 21\r\n\r\nInternal Server Error");
        return 0;
    }

    if (strcmp(path, "/biglength") == 0) {
        srv_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5000000\r\n\r\n");
        return 1;
    }

    if (strcmp(path, "/bigclose") == 0) {
        srv_str(fd, "HTTP/1.1 200 OK\r\n\r\n");
        srv_stream(fd, 5 * 1024 * 1024, 0);
        return 0;
    }

    if (strcmp(path, "/bigchunked") == 0) {
        srv_str(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        srv_stream(fd, 5 * 1024 * 1024, 1);
        return 0;
    }

    if (strcmp(path, "/trunc") == 0) {
        srv_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
                    "vllm:num_requests_running 1\n");
        return 0;
    }

    if (strcmp(path, "/badchunk") == 0) {
        srv_str(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "zz\r\nvllm:num_requests_running 1\n\r\n0\r\n\r\n");
        return 0;
    }

    if (strcmp(path, "/gzip") == 0) {
        srv_str(fd, "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
                    "Content-Length: 4\r\n\r\n\x1f\x8b\x08\x00");
        return 0;
    }

    if (strcmp(path, "/garbage") == 0) {
        srv_str(fd, "SSH-2.0-OpenSSH_9.2\r\n\r\n");
        return 0;
    }

    if (strcmp(path, "/empty") == 0) {
        return 0;
    }

    if (strcmp(path, "/nometrics") == 0) {
        srv_ok_length(fd, "# HELP up x\n# TYPE up gauge\nup 1\n");
        return 0;
    }

    if (strcmp(path, "/headers") == 0) {
        /* headers that never end */
        srv_str(fd, "HTTP/1.1 200 OK\r\n");
        for (n = 0; n < 2000; n++) {
            srv_str(fd, "X-Padding: aaaaaaaaaaaaaaaa\r\n");
        }
        return 1;
    }

    srv_str(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");

    return 0;
}


static void
srv_loop(int ls)
{
    int      fd, held[SRV_HELD], nheld, i;
    char     req[4096];
    size_t   n;
    ssize_t  r;

    /* the parent kills us; if it dies first, so do we */
    alarm(120);
    signal(SIGPIPE, SIG_IGN);

    nheld = 0;

    for ( ;; ) {
        fd = accept(ls, NULL, NULL);
        if (fd == -1) {
            continue;
        }

        n = 0;

        while (n < sizeof(req) - 1) {
            r = read(fd, req + n, sizeof(req) - 1 - n);
            if (r <= 0) {
                break;
            }

            n += r;
            req[n] = '\0';

            if (strstr(req, "\r\n\r\n")) {
                break;
            }
        }

        req[n] = '\0';

        if (srv_answer(fd, req) && nheld < SRV_HELD) {
            held[nheld++] = fd;
            continue;
        }

        close(fd);

        if (nheld == SRV_HELD) {
            for (i = 0; i < nheld; i++) {
                close(held[i]);
            }

            nheld = 0;
        }
    }
}


int
srv_start(void)
{
    int                 ls, one;
    socklen_t           alen;
    struct sockaddr_in  sin;

    ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls == -1) {
        return -1;
    }

    one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));

    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

    alen = sizeof(sin);

    if (bind(ls, (struct sockaddr *) &sin, sizeof(sin)) == -1
        || listen(ls, 16) == -1
        || getsockname(ls, (struct sockaddr *) &sin, &alen) == -1)
    {
        close(ls);
        return -1;
    }

    srv_port = ntohs(sin.sin_port);

    fflush(stdout);

    srv_pid = fork();
    if (srv_pid == -1) {
        close(ls);
        return -1;
    }

    if (srv_pid == 0) {
        srv_loop(ls);
        _exit(0);
    }

    close(ls);

    return 0;
}


void
srv_stop(void)
{
    if (srv_pid > 0) {
        kill(srv_pid, SIGKILL);
        waitpid(srv_pid, NULL, 0);
        srv_pid = 0;
    }
}


/* the bridge's loop, for one scrape: 0 when it ended, -1 past max_ms */

int
drive(kvb_scrape_t *s, unsigned max_ms)
{
    int                 fd;
    long                wait;
    short               ev;
    uint64_t            start, now, dl, done;
    zmq_pollitem_t      item;
    kvb_scrape_stats_t  st;

    kvb_scrape_stats(s, &st);
    done = st.ok + st.failed;
    start = now_ms();
    ev = 0;

    for ( ;; ) {
        now = now_ms();

        fd = kvb_scrape_want(s, now, &ev);

        kvb_scrape_stats(s, &st);
        if (st.ok + st.failed != done) {
            return 0;
        }

        if (now - start > max_ms) {
            return -1;
        }

        dl = kvb_scrape_deadline(s);
        wait = dl > now ? (long) (dl - now) : 0;
        if (wait > 50) {
            wait = 50;
        }

        memset(&item, 0, sizeof(item));
        item.fd = fd;
        item.events = ev;

        if (zmq_poll(&item, fd == -1 ? 0 : 1, wait) == -1 && errno != EINTR) {
            return -1;
        }

        kvb_scrape_io(s, fd == -1 ? 0 : item.revents, now_ms());

        kvb_scrape_stats(s, &st);
        if (st.ok + st.failed != done) {
            return 0;
        }
    }
}


kvb_scrape_t *
scrape(const char *path, unsigned timeout_ms, kvb_scrape_stats_t *st,
    uint64_t *took)
{
    char           url[128], err[256];
    uint64_t       t0;
    kvb_scrape_t  *s;

    snprintf(url, sizeof(url), "http://127.0.0.1:%u%s", srv_port, path);

    s = kvb_scrape_create(url, 60000, timeout_ms, err, sizeof(err));
    if (s == NULL) {
        printf("# %s: %s\n", url, err);
        memset(st, 0, sizeof(*st));
        return NULL;
    }

    t0 = now_ms();

    if (drive(s, timeout_ms + 2000) != 0) {
        printf("# %s: never ended\n", url);
    }

    *took = now_ms() - t0;
    kvb_scrape_stats(s, st);

    if (st->last_failed) {
        printf("# %s: %s\n", path, st->last_error);
    }

    return s;
}


int
failed_with(const kvb_scrape_stats_t *st, const char *why)
{
    return st->failed == 1 && st->ok == 0 && st->last_failed
           && strstr(st->last_error, why) != NULL;
}
