/*
 * ngx_http_kv_aware_module: kv_aware_tokenize, token ids for a request
 * from a tokenizer, asked before a server is chosen.
 */

#ifndef _NGX_HTTP_KV_AWARE_TOKENIZE_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_TOKENIZE_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"


char *ngx_http_kv_aware_tokenize_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
void *ngx_http_kv_aware_tokenize_create_conf(ngx_conf_t *cf);
char *ngx_http_kv_aware_tokenize_merge_conf(ngx_conf_t *cf, void *parent,
    void *child);
ngx_int_t ngx_http_kv_aware_tokenize_init(ngx_conf_t *cf);


#endif /* _NGX_HTTP_KV_AWARE_TOKENIZE_H_INCLUDED_ */
