/*
 * ngx_http_kv_aware_module: disaggregated prefill and decode
 * (kv_aware_prefill), its configuration and its decision.
 */

#ifndef _NGX_HTTP_KV_AWARE_PD_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_PD_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_pd_slice.h"


/* mode=: who runs the two legs */
#define NGX_HTTP_KV_AWARE_PD_HEADER     0     /* the decode server's sidecar */
#define NGX_HTTP_KV_AWARE_PD_VLLM       1     /* nginx, NIXL's contract */
#define NGX_HTTP_KV_AWARE_PD_SGLANG     2     /* nginx, bootstrap fields */

/* SGLang's --disaggregation-bootstrap-port when none is given */
#define NGX_HTTP_KV_AWARE_PD_BOOTSTRAP_PORT  8998
#define NGX_HTTP_KV_AWARE_PD_LOG             5000  /* ms between warnings */


/* a location's kv_aware_prefill; not inherited */
typedef struct {
    ngx_str_t                       name;         /* len 0: none */
    ngx_uint_t                      mode;
    ngx_uint_t                      min_uncached; /* tokens */
    ngx_str_t                       uri;          /* vllm, sglang: leg 1's */
    ngx_uint_t                      bootstrap_port; /* mode=sglang */
    ngx_msec_t                      logged;       /* leg 1's last warning */

    /* found once the configuration is read */
    ngx_http_kv_aware_srv_conf_t   *prefill;
    ngx_http_kv_aware_srv_conf_t   *decode;

    /* what the checks at the end need of where it was written */
    void                           *proxy;        /* the proxy's loc conf */
    u_char                         *file;
    ngx_uint_t                      line;
} ngx_http_kv_aware_pd_conf_t;


/* a request's decision */
typedef struct {
    ngx_http_kv_aware_pd_e          outcome;
    ngx_str_t                       addr;         /* len 0: aggregated */
    uint64_t                        tokens;       /* the prefill's */

    /* the prefill load charged, NULL once given back */
    ngx_http_kv_aware_load_t       *charged;
    uint32_t                        charged_blocks;

    void                           *leg;          /* vllm, sglang: leg 1 */
    uint64_t                        room;         /* sglang: 0: none */
    ngx_str_t                       request_id;   /* both legs' */
    unsigned                        decided:1;
} ngx_http_kv_aware_pd_ctx_t;


extern ngx_module_t  ngx_http_kv_aware_pd_module;


/* $kv_aware_prefill_addr, $kv_aware_pd (preconfiguration) */
ngx_int_t ngx_http_kv_aware_pd_add_variables(ngx_conf_t *cf);

/* the header filter that gives a split's prefill load back early */
ngx_int_t ngx_http_kv_aware_pd_init_filter(ngx_conf_t *cf);

/* the decision, made once a request; NGX_DECLINED: no kv_aware_prefill */
ngx_int_t ngx_http_kv_aware_pd_decide(ngx_http_request_t *r,
    ngx_http_kv_aware_pd_e *outcome, ngx_str_t *addr);

/* the request's decision, made on first use; NULL: no memory */
ngx_http_kv_aware_pd_ctx_t *ngx_http_kv_aware_pd_request_ctx(
    ngx_http_request_t *r);

/*
 * mode=vllm: the decision before the request to the decode server is
 * built (its server estimated, not chosen), the split not counted yet
 * (ngx_http_kv_aware_pd_count() once leg 1 ends).  NULL: an error.
 */
ngx_http_kv_aware_pd_ctx_t *ngx_http_kv_aware_pd_decide_early(
    ngx_http_request_t *r, ngx_http_kv_aware_pd_conf_t *pcf);
void ngx_http_kv_aware_pd_count(ngx_http_kv_aware_pd_conf_t *pcf,
    ngx_http_kv_aware_pd_ctx_t *pctx);

/* the prefill load a split charged, given back (once) */
void ngx_http_kv_aware_pd_release(ngx_http_request_t *r);

/* for the modes that send leg 1: the body as one memory buffer; whether a
 * failed leg may be logged now (once every 5 s a location) */
ngx_chain_t *ngx_http_kv_aware_pd_body_chain(ngx_http_request_t *r,
    u_char *data, size_t len);
ngx_uint_t ngx_http_kv_aware_pd_warn_due(ngx_http_kv_aware_pd_conf_t *pcf);
void ngx_http_kv_aware_pd_give_back(ngx_http_kv_aware_pd_ctx_t *pctx);

/* mode=vllm: the precontent handler that runs leg 1 (pd_vllm.c) */
ngx_int_t ngx_http_kv_aware_pd_vllm_init(ngx_conf_t *cf);

/* mode=sglang: the precontent handler that starts the prefill leg */
ngx_int_t ngx_http_kv_aware_pd_sglang_init(ngx_conf_t *cf);


#endif /* _NGX_HTTP_KV_AWARE_PD_H_INCLUDED_ */
