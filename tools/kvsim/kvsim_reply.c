/*
 * kvsim: the bodies of the replies, in the shapes OpenAI's clients and
 * vLLM's scrapers parse: chat and text completions, whole or streamed,
 * errors, metrics.  The extra "kvsim" member says which server answered,
 * what it found cached and how long the request queued.
 */

#include <stdio.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "kva_rand.h"
#include "kvsim_reply.h"


static void kvs_reply_headers(kvs_req_t *r, const char *type);
static void kvs_head(struct evbuffer *b, kvs_req_t *r);
static void kvs_tail(struct evbuffer *b, kvs_req_t *r, int first, int done);
static void kvs_token(kvs_sim_t *sim, struct evbuffer *b);


void
kvs_reply_start(kvs_req_t *r)
{
    if (r->started) {
        return;
    }

    r->started = 1;
    kvs_reply_headers(r, "text/event-stream");
    evhttp_add_header(evhttp_request_get_output_headers(r->req),
                      "Cache-Control", "no-cache");
    evhttp_send_reply_start(r->req, 200, "OK");
}


void
kvs_reply_chunk(kvs_req_t *r, struct evbuffer *b, int done)
{
    int  first;

    first = (r->seq->out == 1);

    kvs_reply_start(r);

    evbuffer_add(b, "data: ", 6);
    kvs_head(b, r);

    if (r->chat) {
        evbuffer_add_printf(b, "\"delta\":{%s\"content\":\"",
                            first ? "\"role\":\"assistant\"," : "");
        kvs_token(r->srv->sim, b);
        evbuffer_add(b, "\"}", 2);

    } else {
        evbuffer_add(b, "\"text\":\"", 8);
        kvs_token(r->srv->sim, b);
        evbuffer_add_printf(b, "\",\"logprobs\":null");
    }

    kvs_tail(b, r, first, done);
    evbuffer_add_printf(b, "\n\n%s", done ? "data: [DONE]\n\n" : "");
    evhttp_send_reply_chunk(r->req, b);

    if (done) {
        evhttp_send_reply_end(r->req);
    }
}


void
kvs_reply_body(kvs_req_t *r, struct evbuffer *b)
{
    uint32_t  i;

    kvs_head(b, r);
    evbuffer_add_printf(b, r->chat ? "\"message\":{\"role\":\"assistant\","
                        "\"content\":\"" : "\"text\":\"");

    for (i = 0; i < r->seq->out; i++) {
        kvs_token(r->srv->sim, b);
    }

    evbuffer_add_printf(b, r->chat ? "\"}" : "\",\"logprobs\":null");
    kvs_tail(b, r, 1, 1);
    kvs_reply_headers(r, "application/json");
    evhttp_send_reply(r->req, 200, NULL, b);
}


/* a completion's: the server, its rank, the request's id echoed (vLLM) */
static void
kvs_reply_headers(kvs_req_t *r, const char *type)
{
    char               cached[16];
    struct evkeyvalq  *h;

    h = evhttp_request_get_output_headers(r->req);
    evhttp_add_header(h, "Content-Type", type);
    evhttp_add_header(h, "X-Kvsim-Server", r->srv->id);
    kvs_reply_rank_header(r->srv, r->req);

    /*
     * what the pool held of the prompt, in a header too: an access log
     * can set it beside what the router thought the server held
     */
    if (r->seq) {
        snprintf(cached, sizeof(cached), "%u", r->seq->cached);
        evhttp_add_header(h, "X-Kvsim-Cached-Tokens", cached);
    }

    if (r->pd && r->pd->request_id[0]) {
        evhttp_add_header(h, "X-Request-Id", r->pd->request_id);
    }
}


static void
kvs_head(struct evbuffer *b, kvs_req_t *r)
{
    evbuffer_add_printf(b, "{\"id\":\"%s-kvsim-%llu\",\"object\":\"%s\","
                        "\"created\":%lld,\"model\":\"%s\",\"choices\":"
                        "[{\"index\":0,",
                        r->chat ? "chatcmpl" : "cmpl",
                        (unsigned long long) r->id,
                        r->chat ? (r->stream ? "chat.completion.chunk"
                                             : "chat.completion")
                                : "text_completion",
                        (long long) r->created, r->model);
}


static void
kvs_tail(struct evbuffer *b, kvs_req_t *r, int first, int done)
{
    kvs_seq_t  *seq = r->seq;

    evbuffer_add_printf(b, ",\"finish_reason\":%s}]",
                        done ? "\"length\"" : "null");

    if (done) {
        evbuffer_add_printf(b, ",\"usage\":{\"prompt_tokens\":%u,"
                            "\"completion_tokens\":%u,\"total_tokens\":%u,"
                            "\"prompt_tokens_details\":"
                            "{\"cached_tokens\":%u}}",
                            seq->prompt, seq->out, seq->prompt + seq->out,
                            seq->cached);

        if (r->hold && r->pd->remote_decode) {
            kvs_pd_reply_params(r->srv, seq, r->pd->hold_id, b);
        }
    }

    if (first) {
        evbuffer_add_printf(b, ",\"kvsim\":{\"server\":\"%s\","
                            "\"rank\":%u,"
                            "\"cached_tokens\":%u,\"queue_ms\":%.3f,"
                            "\"preempted\":%u",
                            r->srv->id, r->srv->rank, seq->cached,
                            seq->t_admitted - seq->t_arrival,
                            seq->preempted);

        if (r->pd && r->pd->mode) {
            /* the decode's side of a disaggregated request */
            evbuffer_add_printf(b, ",\"pd\":{\"mode\":\"%s\","
                                "\"prefill\":\"%s:%u\","
                                "\"remote_request_id\":\"%s\","
                                "\"local_blocks\":%u,\"pulled_blocks\":%u,"
                                "\"fallback\":%s%s%s}",
                                r->pd->mode, r->pd->host, r->pd->port,
                                r->pd->remote_id, r->pd->local,
                                r->pd->pulled, r->pd->fallback ? "\"" : "",
                                r->pd->fallback ? r->pd->fallback : "null",
                                r->pd->fallback ? "\"" : "");
        }

        evbuffer_add(b, "}", 1);
    }

    evbuffer_add(b, "}", 1);
}


static void
kvs_token(kvs_sim_t *sim, struct evbuffer *b)
{
    char  t[4];

    /* 4 bytes, no JSON escaping: the load generator's alphabet */
    t[0] = 'a' + (char) kva_rand_below(&sim->rng, 26);
    t[1] = 'a' + (char) kva_rand_below(&sim->rng, 26);
    t[2] = 'a' + (char) kva_rand_below(&sim->rng, 26);
    t[3] = ' ';

    evbuffer_add(b, t, 4);
}


/*
 * vLLM's series, and ours.  A data-parallel server labels each rank's
 * series engine="r", as vLLM's PrometheusStatLogger does for each of its
 * engines; rank 0's HTTP side answers for all of them.
 */

void
kvs_reply_metrics(kvs_server_t *srv, struct evhttp_request *req)
{
    char              eng[32];
    unsigned          r, n;
    const char       *m;
    kvs_server_t     *first, *x;
    struct evbuffer  *b;

    b = evbuffer_new();
    if (b == NULL) {
        kvs_reply_error(srv, req, 500, "out of memory");
        return;
    }

    m = srv->sim->conf.model;
    n = srv->sim->conf.data_parallel;
    first = srv - srv->rank;

#define kvs_metric(name, type, fmt, v)                                      \
    evbuffer_add_printf(b, "# TYPE " name " " type "\n");                   \
    for (r = 0; r < n; r++) {                                               \
        x = &first[r];                                                      \
        if (n > 1) {                                                        \
            snprintf(eng, sizeof(eng), ",engine=\"%u\"", r);                \
        } else {                                                            \
            eng[0] = '\0';                                                  \
        }                                                                   \
        evbuffer_add_printf(b, name "{model_name=\"%s\"%s} " fmt "\n",     \
                            m, eng, v);                                     \
    }

    kvs_metric("vllm:num_requests_running", "gauge", "%u",
               x->sched.nrunning);
    kvs_metric("vllm:num_requests_waiting", "gauge", "%u",
               x->sched.nwaiting);
    kvs_metric("vllm:gpu_cache_usage_perc", "gauge", "%.6f",
               kvs_cache_usage(&x->cache));
    kvs_metric("vllm:kv_cache_usage_perc", "gauge", "%.6f",
               kvs_cache_usage(&x->cache));
    kvs_metric("vllm:prefix_cache_queries_total", "counter", "%llu",
               (unsigned long long) x->sched.query_tokens);
    kvs_metric("vllm:prefix_cache_hits_total", "counter", "%llu",
               (unsigned long long) x->sched.hit_tokens);
    kvs_metric("vllm:num_preemptions_total", "counter", "%llu",
               (unsigned long long) x->sched.preemptions);
    kvs_metric("vllm:prompt_tokens_total", "counter", "%llu",
               (unsigned long long) x->sched.prompt_tokens);
    kvs_metric("vllm:generation_tokens_total", "counter", "%llu",
               (unsigned long long) x->sched.gen_tokens);
    kvs_metric("vllm:request_success_total", "counter", "%llu",
               (unsigned long long) x->sched.finished);
    kvs_metric("kvsim_steps_total", "counter", "%llu",
               (unsigned long long) x->sched.steps);
    kvs_metric("kvsim_step_lag_ms", "gauge", "%.3f", x->lag_ms);
    kvs_metric("kvsim_step_lag_max_ms", "gauge", "%.3f", x->lag_max_ms);
    kvs_metric("kvsim_step_lag_ms_sum", "counter", "%.3f", x->lag_sum_ms);
    kvs_metric("kvsim_step_lag_steps_total", "counter", "%llu",
               (unsigned long long) x->lag_steps);
    kvs_metric("kvsim_cache_blocks_cached", "gauge", "%u",
               x->cache.nhashed);
    kvs_metric("kvsim_cache_blocks_free", "gauge", "%u", x->cache.nfree);
    kvs_metric("kvsim_cache_evictions_total", "counter", "%llu",
               (unsigned long long) x->cache.evictions);
    kvs_metric("kvsim_events_published_total", "counter", "%llu",
               (unsigned long long) x->published);
    kvs_metric("kvsim_events_dropped_total", "counter", "%llu",
               (unsigned long long) x->dropped);
    kvs_metric("kvsim_event_seq", "gauge", "%llu",
               (unsigned long long) x->seq);
    kvs_metric("kvsim_requests_total", "counter", "%llu",
               (unsigned long long) x->requests);
    kvs_metric("kvsim_requests_rejected_total", "counter", "%llu",
               (unsigned long long) x->rejected);

#undef kvs_metric

    kvs_pd_metrics(srv, b);

    /* vLLM's info metric of its cache configuration: the pool's size */
    evbuffer_add_printf(b, "# TYPE vllm:cache_config_info gauge\n");

    for (r = 0; r < n; r++) {
        if (n > 1) {
            snprintf(eng, sizeof(eng), ",engine=\"%u\"", r);
        } else {
            eng[0] = '\0';
        }

        evbuffer_add_printf(b, "vllm:cache_config_info{model_name=\"%s\"%s,"
                            "block_size=\"%u\",num_gpu_blocks=\"%u\","
                            "enable_prefix_caching=\"True\"} 1.0\n", m, eng,
                            srv->sim->conf.block_tokens,
                            srv->sim->conf.num_blocks);
    }

    if (n > 1) {
        /* X-data-parallel-rank headers that named no rank */
        evbuffer_add_printf(b, "# TYPE kvsim_dp_rank_invalid_total counter\n"
                            "kvsim_dp_rank_invalid_total{model_name=\"%s\"}"
                            " %llu\n", m,
                            (unsigned long long) first->bad_rank);
    }

    kvs_reply(srv, req, 200, "text/plain; version=0.0.4", b);
    evbuffer_free(b);
}


void
kvs_reply(kvs_server_t *srv, struct evhttp_request *req, int code,
    const char *type, struct evbuffer *body)
{
    struct evkeyvalq  *h;

    if (code >= 400) {
        srv->rejected++;
    }

    h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", type);
    evhttp_add_header(h, "X-Kvsim-Server", srv->id);
    kvs_reply_rank_header(srv, req);
    evhttp_send_reply(req, code, NULL, body);
}


void
kvs_reply_rank_header(kvs_server_t *srv, struct evhttp_request *req)
{
    char  rank[16];

    if (srv->sim->conf.data_parallel > 1) {
        snprintf(rank, sizeof(rank), "%u", srv->rank);
        evhttp_add_header(evhttp_request_get_output_headers(req),
                          "X-Kvsim-Rank", rank);
    }
}


void
kvs_reply_error(kvs_server_t *srv, struct evhttp_request *req, int code,
    const char *msg)
{
    struct evbuffer  *b;

    b = evbuffer_new();
    if (b == NULL) {
        srv->rejected++;
        evhttp_send_error(req, code, NULL);
        return;
    }

    evbuffer_add_printf(b, "{\"error\":{\"message\":\"%s\",\"type\":\"%s\","
                        "\"param\":null,\"code\":%d}}", msg,
                        code < 500 ? "invalid_request_error" : "server_error",
                        code);
    kvs_reply(srv, req, code, "application/json", b);
    evbuffer_free(b);
}
