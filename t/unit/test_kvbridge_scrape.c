/*
 * kvbridge's HTTP client for the engines' /metrics (tools/kvbridge/
 * kvb_scrape.c) against a server forked on 127.0.0.1
 * (kvb_test_server.h) that answers with a length, chunked, to close,
 * slowly, with 500, with garbage and not at all; its schedule on the
 * loop's clock; the URLs it takes and refuses.
 */

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include "tap.h"
#include "kvb_scrape.h"
#include "kvb_test_server.h"


static void test_client_ranks(void);


static void
test_client_ok(void)
{
    uint64_t            took, at;
    kvb_load_t          l;
    kvb_scrape_t       *s;
    kvb_scrape_stats_t  st;

    s = scrape("/length", 2000, &st, &took);
    ok(s && st.ok == 1 && st.failed == 0
       && kvb_scrape_load(s, &l, &at) == 0
       && l.running == 12 && l.waiting == 3 && l.kv_usage == 0.8125,
       "Content-Length, connection held open: load read at the length");
    kvb_scrape_destroy(s);

    s = scrape("/chunked", 2000, &st, &took);
    ok(s && st.ok == 1 && kvb_scrape_load(s, &l, &at) == 0
       && l.running == 12 && l.waiting == 3 && l.kv_usage == 0.8125,
       "chunked (uvicorn), connection held open: read at the last chunk");
    kvb_scrape_destroy(s);

    s = scrape("/sglang", 2000, &st, &took);
    ok(s && st.ok == 1 && kvb_scrape_load(s, &l, &at) == 0
       && l.running == 60 && l.waiting == 4 && l.kv_usage == 0.61,
       "SGLang in 7-byte chunks");
    kvb_scrape_destroy(s);

    s = scrape("/close", 2000, &st, &took);
    ok(s && st.ok == 1 && kvb_scrape_load(s, &l, &at) == 0
       && l.running == 60, "HTTP/1.0, no length: read to close");
    kvb_scrape_destroy(s);

    s = scrape("", 2000, &st, &took);
    ok(s && st.ok == 1 && kvb_scrape_load(s, &l, &at) == 0
       && l.running == 3 && l.kv_usage == 0.25,
       "no path: GET /metrics, HTTP/1.1 with Host, identity, close");
    kvb_scrape_destroy(s);
}


static void
test_client_fail(void)
{
    int                 fd;
    char                url[64], err[256];
    uint64_t            took, at;
    socklen_t           alen;
    kvb_load_t          l;
    kvb_scrape_t       *s;
    kvb_scrape_stats_t  st;
    struct sockaddr_in  sin;

    s = scrape("/500", 2000, &st, &took);
    ok(s && failed_with(&st, "HTTP status 500")
       && kvb_scrape_load(s, &l, &at) == -1, "500: failed, no load");
    kvb_scrape_destroy(s);

    s = scrape("/slow", 300, &st, &took);
    ok(s && failed_with(&st, "timed out") && took >= 300 && took < 1500,
       "no answer: timed out in %llu ms", (unsigned long long) took);
    kvb_scrape_destroy(s);

    s = scrape("/slowbody", 300, &st, &took);
    ok(s && failed_with(&st, "reading the body") && took < 1500,
       "half a body: timed out");
    kvb_scrape_destroy(s);

    s = scrape("/trunc", 2000, &st, &took);
    ok(s && failed_with(&st, "closed inside the body"),
       "closed before its length: failed");
    kvb_scrape_destroy(s);

    s = scrape("/biglength", 2000, &st, &took);
    ok(s && failed_with(&st, "over 4194304") && took < 1000,
       "Content-Length over 4 MB: failed at the headers");
    kvb_scrape_destroy(s);

    s = scrape("/bigclose", 5000, &st, &took);
    ok(s && failed_with(&st, "over 4194304"), "5 MB to close: failed");
    kvb_scrape_destroy(s);

    s = scrape("/bigchunked", 5000, &st, &took);
    ok(s && failed_with(&st, "over 4194304"), "5 MB chunked: failed");
    kvb_scrape_destroy(s);

    s = scrape("/headers", 2000, &st, &took);
    ok(s && failed_with(&st, "headers over"), "endless headers: failed");
    kvb_scrape_destroy(s);

    s = scrape("/badchunk", 2000, &st, &took);
    ok(s && failed_with(&st, "chunked"), "bad chunk size: failed");
    kvb_scrape_destroy(s);

    s = scrape("/gzip", 2000, &st, &took);
    ok(s && failed_with(&st, "Content-Encoding"), "gzip body: failed");
    kvb_scrape_destroy(s);

    s = scrape("/garbage", 2000, &st, &took);
    ok(s && failed_with(&st, "not an HTTP"), "not HTTP: failed");
    kvb_scrape_destroy(s);

    s = scrape("/empty", 2000, &st, &took);
    ok(s && failed_with(&st, "before the response headers"),
       "closed without a word: failed");
    kvb_scrape_destroy(s);

    s = scrape("/nometrics", 2000, &st, &took);
    ok(s && failed_with(&st, "no vLLM or SGLang"),
       "200 without our gauges: failed");
    kvb_scrape_destroy(s);

    /* a port that was just free: refused */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    alen = sizeof(sin);
    bind(fd, (struct sockaddr *) &sin, sizeof(sin));
    getsockname(fd, (struct sockaddr *) &sin, &alen);
    close(fd);

    snprintf(url, sizeof(url), "http://localhost:%u/metrics",
             ntohs(sin.sin_port));
    s = kvb_scrape_create(url, 60000, 2000, err, sizeof(err));
    ok(s && drive(s, 3000) == 0, "refused: the scrape ends");
    if (s) {
        kvb_scrape_stats(s, &st);
        ok(failed_with(&st, "refused"), "refused: \"%s\"", st.last_error);
        kvb_scrape_destroy(s);
    }
}


static void
test_client_schedule(void)
{
    int                 fd;
    char                url[64], err[256];
    short               ev;
    unsigned            i;
    kvb_scrape_t       *s;
    kvb_scrape_stats_t  st;
    zmq_pollitem_t      item;

    /* the clock is ours here: the loop's now, not the wall's */
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/slow", srv_port);
    s = kvb_scrape_create(url, 1000, 400, err, sizeof(err));

    ok(s && kvb_scrape_deadline(s) == 0, "a new scrape is due at once");
    if (s == NULL) {
        return;
    }

    fd = kvb_scrape_want(s, 10000, &ev);
    ok(fd >= 0 && ev == ZMQ_POLLOUT, "want at 10000: connecting");
    ok(kvb_scrape_deadline(s) == 10400, "busy: the deadline is the timeout");

    /* connect and send, the time standing still */
    for (i = 0; i < 100 && fd >= 0 && ev != ZMQ_POLLIN; i++) {
        memset(&item, 0, sizeof(item));
        item.fd = fd;
        item.events = ev;
        zmq_poll(&item, 1, 100);
        kvb_scrape_io(s, item.revents, 10000);
        fd = kvb_scrape_want(s, 10000, &ev);
    }

    ok(fd >= 0 && ev == ZMQ_POLLIN, "request sent: waiting to read");

    kvb_scrape_io(s, 0, 10399);
    kvb_scrape_stats(s, &st);
    ok(st.failed == 0, "not failed 1 ms before its timeout");

    kvb_scrape_io(s, 0, 10400);
    kvb_scrape_stats(s, &st);
    ok(st.failed == 1 && strstr(st.last_error, "timed out"),
       "failed at its timeout, without I/O");

    ok(kvb_scrape_want(s, 10400, &ev) == -1
       && kvb_scrape_deadline(s) == 11000,
       "idle: the next scrape an interval after this one started");
    ok(kvb_scrape_want(s, 10999, &ev) == -1, "not before");
    ok(kvb_scrape_want(s, 11000, &ev) >= 0, "started at 11000");

    /* a timeout longer than the interval: the next waits a whole one */
    kvb_scrape_destroy(s);
    s = kvb_scrape_create(url, 100, 500, err, sizeof(err));
    kvb_scrape_want(s, 20000, &ev);
    kvb_scrape_io(s, 0, 20500);
    ok(kvb_scrape_deadline(s) == 20600, "overran: next at end + interval");
    kvb_scrape_destroy(s);
}


static void
test_urls(void)
{
    char           err[256];
    kvb_scrape_t  *s;
    unsigned       i, good;

    static const char  *bad[] = {
        "https://127.0.0.1/metrics", "127.0.0.1:8000", "http://",
        "http://vllm-0.svc:8000/metrics", "http://10.0.0.1:0/",
        "http://10.0.0.1:65536/", "http://10.0.0.1:80x/",
        "http://[::1/metrics", "http://[10.0.0.1]:80/",
        "http://10.0.0.1/me trics", "http://10.0.0.1/a\r\nX: y",
        "http://10.0.0.1:/"
    };

    static const char  *fine[] = {
        "http://127.0.0.1:8000/metrics", "http://localhost:30000/metrics",
        "http://[::1]:8000/metrics", "http://[fe80::1]/", "http://10.1.2.3",
        "http://10.1.2.3:8000/metrics?name[]=vllm:num_requests_running"
    };

    good = 0;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        s = kvb_scrape_create(bad[i], 1000, 1000, err, sizeof(err));
        if (s == NULL && err[0] != '\0') {
            good++;

        } else {
            printf("# accepted \"%s\"\n", bad[i]);
        }

        kvb_scrape_destroy(s);
    }

    ok(good == i, "%u bad URLs refused, with a reason", good);

    err[0] = '\0';
    s = kvb_scrape_create("http://vllm-0:8000/", 1000, 1000, err,
                          sizeof(err));
    ok(s == NULL && strstr(err, "no name lookups"),
       "a host name: refused, and the reason says why");

    good = 0;

    for (i = 0; i < sizeof(fine) / sizeof(fine[0]); i++) {
        s = kvb_scrape_create(fine[i], 1000, 1000, err, sizeof(err));
        if (s != NULL) {
            good++;

        } else {
            printf("# refused \"%s\": %s\n", fine[i], err);
        }

        kvb_scrape_destroy(s);
    }

    ok(good == i, "%u good URLs accepted", good);

    ok(kvb_scrape_create("http://127.0.0.1/", 0, 1000, err, sizeof(err))
       == NULL, "interval 0 refused");
}


/* one scrape, every rank's load: the ranks of a server share it */

static void
test_client_ranks(void)
{
    uint64_t            took, at;
    kvb_load_t          l;
    kvb_scrape_t       *s;
    kvb_scrape_stats_t  st;

    s = scrape("/length", 2000, &st, &took);
    ok(s && st.ok == 1 && kvb_scrape_rank_load(s, 0, &l, &at) == 0
       && l.running == 7 && l.waiting == 2 && l.kv_usage == 0.4375,
       "rank 0's load from vLLM's engine=\"0\" series");
    ok(s && kvb_scrape_rank_load(s, 1, &l, &at) == 0
       && l.running == 5 && l.waiting == 1 && l.kv_usage == 0.8125,
       "rank 1's from engine=\"1\"");
    ok(s && kvb_scrape_rank_load(s, 2, &l, &at) == -1
       && kvb_scrape_rank_load(s, 64, &l, &at) == -1,
       "a rank without series, and one past 63: none");
    kvb_scrape_destroy(s);

    s = scrape("/500", 2000, &st, &took);
    ok(s && kvb_scrape_rank_load(s, 0, &l, &at) == -1,
       "a failed scrape: no rank's load");
    kvb_scrape_destroy(s);
}


int
main(void)
{
    signal(SIGPIPE, SIG_IGN);

    test_urls();

    if (srv_start() != 0) {
        skip("no loopback listening socket here");

    } else {
        test_client_ok();
        test_client_fail();
        test_client_schedule();
        test_client_ranks();
        srv_stop();
    }

    return done_testing();
}
