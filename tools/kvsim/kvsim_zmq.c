/*
 * kvsim: KV events as vLLM publishes them (kvsim_zmq.h).
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <event2/event.h>
#include <msgpack.h>
#include <zmq.h>

#include "kva_rand.h"
#include "kvsim_vllm.h"
#include "kvsim_zmq.h"


#define KVS_ZMQ_PARTS       4           /* a replay request has 3 */


typedef struct {
    uint64_t            seq;
    char               *data;
    size_t              len;
} kvs_zbatch_t;


typedef struct {
    kvs_zmq_t          *z;
    kvs_server_t       *srv;
    void               *pub;
    void               *router;
    struct event       *ev;             /* the ROUTER's ZMQ_FD */

    kvs_zbatch_t       *ring;           /* the last --zmq-buffer batches */
    size_t              head;           /* the oldest */
    size_t              count;
    uint64_t            next;           /* seq of the next batch */
} kvs_zsrv_t;


struct kvs_zmq_s {
    kvs_sim_t          *sim;
    void               *ctx;
    kvs_zsrv_t         *srvs;

    kvs_vev_t          *evs;
    uint64_t           *hashes;
    size_t              cap;            /* of both */
    msgpack_sbuffer     sb;
};


static int kvs_zmq_open(kvs_zmq_t *z, kvs_zsrv_t *zs, unsigned i);
static int kvs_zmq_grow(kvs_zmq_t *z, size_t n);
static void kvs_zmq_keep(kvs_zsrv_t *zs, char *data, size_t len);
static void kvs_zmq_send(kvs_zsrv_t *zs, uint64_t seq, const char *data,
    size_t len);
static void kvs_zmq_handler(evutil_socket_t fd, short what, void *arg);
static void kvs_zmq_replay(kvs_zsrv_t *zs, zmq_msg_t *id, uint64_t start);
static int kvs_zmq_reply(kvs_zsrv_t *zs, zmq_msg_t *id, const uint8_t *seq,
    const char *data, size_t len);
static void kvs_be64(uint8_t *p, uint64_t v);
static uint64_t kvs_be64_get(const uint8_t *p);


kvs_zmq_t *
kvs_zmq_create(kvs_sim_t *sim)
{
    unsigned    i;
    kvs_zmq_t  *z;

    z = calloc(1, sizeof(kvs_zmq_t));
    if (z == NULL) {
        return NULL;
    }

    z->sim = sim;
    msgpack_sbuffer_init(&z->sb);

    z->ctx = zmq_ctx_new();
    z->srvs = calloc(sim->nranks, sizeof(kvs_zsrv_t));

    if (z->ctx == NULL || z->srvs == NULL) {
        fprintf(stderr, "kvsim: zmq: out of memory\n");
        kvs_zmq_destroy(z);
        return NULL;
    }

    for (i = 0; i < sim->nranks; i++) {
        if (kvs_zmq_open(z, &z->srvs[i], i) != 0) {
            kvs_zmq_destroy(z);
            return NULL;
        }
    }

    return z;
}


void
kvs_zmq_destroy(kvs_zmq_t *z)
{
    size_t       k;
    unsigned     i;
    kvs_zsrv_t  *zs;

    for (i = 0; z->srvs && i < z->sim->nranks; i++) {
        zs = &z->srvs[i];

        if (zs->ev) {
            event_free(zs->ev);
        }

        if (zs->pub) {
            zmq_close(zs->pub);
        }

        if (zs->router) {
            zmq_close(zs->router);
        }

        for (k = 0; zs->ring && k < zs->count; k++) {
            free(zs->ring[(zs->head + k) % z->sim->conf.zmq_buffer].data);
        }

        free(zs->ring);
    }

    /* linger 0 on every socket: this returns at once */
    if (z->ctx) {
        zmq_ctx_term(z->ctx);
    }

    free(z->srvs);
    free(z->evs);
    free(z->hashes);
    msgpack_sbuffer_destroy(&z->sb);
    free(z);
}


static int
kvs_zmq_open(kvs_zmq_t *z, kvs_zsrv_t *zs, unsigned i)
{
    int          linger, fd;
    char         ep[64];
    size_t       fdlen;
    unsigned     port, dp;
    kvs_sim_t   *sim = z->sim;

    zs->z = z;
    zs->srv = &sim->servers[i];
    zs->ring = calloc(sim->conf.zmq_buffer, sizeof(kvs_zbatch_t));
    zs->pub = zmq_socket(z->ctx, ZMQ_PUB);
    zs->router = zmq_socket(z->ctx, ZMQ_ROUTER);

    if (zs->ring == NULL || zs->pub == NULL || zs->router == NULL) {
        fprintf(stderr, "kvsim: zmq: %s\n", zmq_strerror(errno));
        return -1;
    }

    linger = 0;
    zmq_setsockopt(zs->pub, ZMQ_LINGER, &linger, sizeof(int));
    zmq_setsockopt(zs->router, ZMQ_LINGER, &linger, sizeof(int));

    /*
     * Server s's ranks as vLLM lays one server's out: events on a base
     * port + r, replay on another base + r; the bases of server s are
     * P + 2 N s and P + 2 N s + N (N ranks).  Without data parallelism:
     * P + 2 s and P + 2 s + 1.
     */
    dp = sim->conf.data_parallel;
    port = sim->conf.zmq_port + 2 * dp * (i / dp) + i % dp;
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", port);

    if (zmq_bind(zs->pub, ep) != 0) {
        fprintf(stderr, "kvsim: zmq: cannot bind %s: %s\n", ep,
                zmq_strerror(errno));
        return -1;
    }

    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", port + dp);

    if (zmq_bind(zs->router, ep) != 0) {
        fprintf(stderr, "kvsim: zmq: cannot bind %s: %s\n", ep,
                zmq_strerror(errno));
        return -1;
    }

    fdlen = sizeof(int);

    if (zmq_getsockopt(zs->router, ZMQ_FD, &fd, &fdlen) != 0) {
        fprintf(stderr, "kvsim: zmq: ZMQ_FD: %s\n", zmq_strerror(errno));
        return -1;
    }

    zs->ev = event_new(sim->base, fd, EV_READ | EV_PERSIST, kvs_zmq_handler,
                       zs);

    if (zs->ev == NULL || event_add(zs->ev, NULL) != 0) {
        fprintf(stderr, "kvsim: zmq: out of memory\n");
        return -1;
    }

    return 0;
}


void
kvs_zmq_step(kvs_zmq_t *z, kvs_server_t *srv)
{
    char            *data;
    size_t           i, nev, nh;
    uint64_t         seq;
    kvs_op_t        *op, *prev;
    kvs_vev_t       *e;
    kvs_conf_t      *conf = &z->sim->conf;
    kvs_cache_t     *c = &srv->cache;
    kvs_zsrv_t      *zs = &z->srvs[srv->index];
    struct timeval   tv;

    if (c->ops_lost) {
        /* a seq neither sent nor kept: the receiver's replay fails */
        zs->next++;
        srv->dropped++;
        c->ops_lost = 0;
    }

    if (c->nops == 0) {
        return;
    }

    if (kvs_zmq_grow(z, c->nops) != 0) {
        zs->next++;
        srv->dropped++;
        kvs_cache_ops_clear(c);
        return;
    }

    nev = 0;
    nh = 0;
    prev = NULL;
    e = NULL;

    for (i = 0; i < c->nops; i++) {
        op = &c->ops[i];

        if (op->type == KVS_OP_STORED ? op->ids == KVS_NIL : op->ehash == 0) {
            /* stored without an engine's view: nothing to say about it */
            prev = NULL;
            continue;
        }

        if (op->type == KVS_OP_STORED) {
            /* one event per chain of one sequence, as vLLM's */
            if (e != NULL && e->type == KVS_VEV_STORED && prev != NULL
                && prev->type == KVS_OP_STORED && op->eparent == prev->ehash
                && op->lora == prev->lora
                && op->ids == prev->ids + conf->block_tokens)
            {
                z->hashes[nh++] = op->ehash;
                e->nhashes++;
                prev = op;
                continue;
            }

            e = &z->evs[nev++];
            memset(e, 0, sizeof(kvs_vev_t));
            e->type = KVS_VEV_STORED;
            e->hashes = &z->hashes[nh];
            e->has_parent = (op->eparent != 0);
            e->parent = op->eparent;
            e->tokens = &c->ids[op->ids];
            e->block_size = conf->block_tokens;
            e->lora_name = op->lora ? conf->lora[op->lora - 1] : NULL;

        } else if (e == NULL || e->type != KVS_VEV_REMOVED) {
            e = &z->evs[nev++];
            memset(e, 0, sizeof(kvs_vev_t));
            e->type = KVS_VEV_REMOVED;
            e->hashes = &z->hashes[nh];
        }

        z->hashes[nh++] = op->ehash;
        e->nhashes++;
        prev = op;
    }

    if (nev == 0) {
        kvs_cache_ops_clear(c);
        return;
    }

    gettimeofday(&tv, NULL);
    msgpack_sbuffer_clear(&z->sb);

    if (kvs_vllm_encode(&z->sb, conf->zmq_encoding, conf->zmq_hash,
                        tv.tv_sec + tv.tv_usec / 1e6, srv->rank, z->evs,
                        nev)
        != 0)
    {
        zs->next++;
        srv->dropped++;
        kvs_cache_ops_clear(c);
        return;
    }

    kvs_cache_ops_clear(c);

    data = malloc(z->sb.size ? z->sb.size : 1);
    seq = zs->next++;

    if (data == NULL) {
        srv->dropped++;
        return;
    }

    memcpy(data, z->sb.data, z->sb.size);
    kvs_zmq_keep(zs, data, z->sb.size);

    /* a drop loses the batch on PUB only: replay still has it */
    if (conf->zmq_drop > 0.0 && kva_rand_unit(&z->sim->rng) < conf->zmq_drop)
    {
        srv->dropped++;
        return;
    }

    kvs_zmq_send(zs, seq, data, z->sb.size);
}


static int
kvs_zmq_grow(kvs_zmq_t *z, size_t n)
{
    size_t      cap;
    uint64_t   *hashes;
    kvs_vev_t  *evs;

    if (n <= z->cap) {
        return 0;
    }

    for (cap = z->cap ? z->cap : 256; cap < n; cap *= 2) { /* void */ }

    evs = realloc(z->evs, cap * sizeof(kvs_vev_t));
    if (evs == NULL) {
        return -1;
    }

    z->evs = evs;

    hashes = realloc(z->hashes, cap * sizeof(uint64_t));
    if (hashes == NULL) {
        return -1;
    }

    z->hashes = hashes;
    z->cap = cap;

    return 0;
}


static void
kvs_zmq_keep(kvs_zsrv_t *zs, char *data, size_t len)
{
    size_t         cap;
    kvs_zbatch_t  *b;

    cap = zs->z->sim->conf.zmq_buffer;

    if (zs->count == cap) {
        free(zs->ring[zs->head].data);
        zs->head = (zs->head + 1) % cap;
        zs->count--;
    }

    b = &zs->ring[(zs->head + zs->count) % cap];
    b->seq = zs->next - 1;
    b->data = data;
    b->len = len;
    zs->count++;
}


static void
kvs_zmq_send(kvs_zsrv_t *zs, uint64_t seq, const char *data, size_t len)
{
    uint8_t      s[8];
    const char  *topic;

    topic = zs->z->sim->conf.zmq_topic;
    kvs_be64(s, seq);

    /* PUB never blocks: past its high-water mark it drops, as vLLM's */
    if (zmq_send(zs->pub, topic, strlen(topic), ZMQ_SNDMORE | ZMQ_DONTWAIT)
            < 0
        || zmq_send(zs->pub, s, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0
        || zmq_send(zs->pub, data, len, ZMQ_DONTWAIT) < 0)
    {
        zs->srv->dropped++;
        return;
    }

    zs->srv->published++;
}


/*
 * ZMQ_FD is edge-triggered: read until ZMQ_EVENTS shows no POLLIN, and
 * look again after sending, which can consume the edge.
 */
static void
kvs_zmq_handler(evutil_socket_t fd, short what, void *arg)
{
    int          events, more, n, bad;
    size_t       len, nparts, i;
    zmq_msg_t    parts[KVS_ZMQ_PARTS], skip;
    kvs_zsrv_t  *zs = arg;

    for ( ;; ) {
        len = sizeof(int);

        if (zmq_getsockopt(zs->router, ZMQ_EVENTS, &events, &len) != 0
            || !(events & ZMQ_POLLIN))
        {
            return;
        }

        nparts = 0;
        more = 1;
        bad = 0;

        while (more && nparts < KVS_ZMQ_PARTS) {
            zmq_msg_init(&parts[nparts]);
            n = zmq_msg_recv(&parts[nparts], zs->router, ZMQ_DONTWAIT);

            if (n < 0) {
                zmq_msg_close(&parts[nparts]);
                more = 0;
                break;
            }

            more = zmq_msg_more(&parts[nparts]);
            nparts++;
        }

        while (more) {
            /* more parts than a replay request has: drop the rest */
            zmq_msg_init(&skip);
            n = zmq_msg_recv(&skip, zs->router, ZMQ_DONTWAIT);
            more = (n >= 0) && zmq_msg_more(&skip);
            zmq_msg_close(&skip);
            bad = 1;
        }

        /* [identity, "", start_seq], as vLLM's replay expects */
        if (!bad && nparts == 3 && zmq_msg_size(&parts[1]) == 0
            && zmq_msg_size(&parts[2]) == 8)
        {
            kvs_zmq_replay(zs, &parts[0],
                           kvs_be64_get(zmq_msg_data(&parts[2])));
        }

        for (i = 0; i < nparts; i++) {
            zmq_msg_close(&parts[i]);
        }
    }
}


static void
kvs_zmq_replay(kvs_zsrv_t *zs, zmq_msg_t *id, uint64_t start)
{
    size_t         k, cap;
    uint8_t        s[8];
    kvs_zbatch_t  *b;

    cap = zs->z->sim->conf.zmq_buffer;

    for (k = 0; k < zs->count; k++) {
        b = &zs->ring[(zs->head + k) % cap];

        if (b->seq < start) {
            continue;
        }

        kvs_be64(s, b->seq);

        if (kvs_zmq_reply(zs, id, s, b->data, b->len) != 0) {
            return;
        }
    }

    memset(s, 0xff, 8);                 /* -1: the end */
    (void) kvs_zmq_reply(zs, id, s, "", 0);
}


/*
 * [identity, "", (topic,) seq, payload]; past the ROUTER's high-water
 * mark the message is dropped silently, as vLLM's are.
 */
static int
kvs_zmq_reply(kvs_zsrv_t *zs, zmq_msg_t *id, const uint8_t *seq,
    const char *data, size_t len)
{
    const char  *topic;

    topic = zs->z->sim->conf.zmq_topic;

    if (zmq_send(zs->router, zmq_msg_data(id), zmq_msg_size(id),
                 ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0
        || zmq_send(zs->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0
        || (zs->z->sim->conf.zmq_replay_topic
            && zmq_send(zs->router, topic, strlen(topic),
                        ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        || zmq_send(zs->router, seq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0
        || zmq_send(zs->router, data, len, ZMQ_DONTWAIT) < 0)
    {
        return -1;
    }

    return 0;
}


static void
kvs_be64(uint8_t *p, uint64_t v)
{
    int  i;

    for (i = 7; i >= 0; i--) {
        p[i] = (uint8_t) v;
        v >>= 8;
    }
}


static uint64_t
kvs_be64_get(const uint8_t *p)
{
    int       i;
    uint64_t  v;

    v = 0;

    for (i = 0; i < 8; i++) {
        v = (v << 8) | p[i];
    }

    return v;
}
