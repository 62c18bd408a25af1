/*
 * ngx_http_kv_aware_module: the upstream's servers as they are now.
 *
 * With "zone" and "server name resolve" (nginx 1.27.3 and later) the
 * peer list changes at run time: servers come and go with DNS.  Each
 * worker keeps its map from the peer list's positions to the zone's slots
 * and makes it again when the list's configuration counter moves; a
 * server new to the upstream gets a free slot and starts fresh, a server
 * gone from it has its slot's entries dropped and its slot freed once
 * nothing it was given is still in flight.
 */

#ifndef _NGX_HTTP_KV_AWARE_MEMBERS_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_MEMBERS_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_members_slice.h"


#if (NGX_HTTP_UPSTREAM_ZONE && nginx_version >= 1027003)
#define NGX_HTTP_KV_AWARE_RESOLVE  1
#else
#define NGX_HTTP_KV_AWARE_RESOLVE  0
#endif


/*
 * Makes the map again if the peer list changed since it was made; called
 * without any of the peer lists' locks held.  The map may still be behind
 * when it returns (the list changed meanwhile): the balancer checks the
 * counter again under the list's lock.
 */
void ngx_http_kv_aware_members_sync(ngx_http_kv_aware_srv_conf_t *kcf);

/* the bytes of members_sync()'s names, in the worker's scratch */
size_t ngx_http_kv_aware_members_scratch_size(
    ngx_http_kv_aware_srv_conf_t *kcf);

/* whether the map is the one of the peer list as it is (lock held) */
ngx_uint_t ngx_http_kv_aware_members_current(
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_upstream_rr_peers_t *peers);


#endif /* _NGX_HTTP_KV_AWARE_MEMBERS_H_INCLUDED_ */
