# balancer_by_lua choosing among the servers kv_aware ranks (issue 12):
# Debian's Lua module in Debian's nginx with this module; upstream "llm"
# is kv_aware with events, "llm_lua" a Lua balancer that reads
# $kv_aware_ranking_llm (in access_by_lua, once the body is read) and takes
# the best server the tenant may use, as docs/clients.md's example does:
#
#   * without a restriction it takes kv_aware's first choice, the server
#     whose events say it holds the prompt;
#   * a tenant barred from that server gets the next in the ranking;
#   * the bodies reach the servers whole.

use strict;
use warnings;

use Test::More;

use Test::KvAware qw(skip_unless_module);
use Test::KvAware::Events qw(preflight prompt block_hashes publisher stored
                             addr wait_status);

my $MODS = '/usr/lib/nginx/modules';
my $NGINX = KvAware::Launch::nginx_binary();

skip_unless_module();
plan skip_all => "no Debian Lua module in $MODS (make deps installs it)"
    unless -f "$MODS/ngx_http_lua_module.so" && -f "$MODS/ndk_http_module.so";
my ($version) = `$NGINX -v 2>&1` =~ m{nginx/(\S+)};
my ($debian) = `/usr/sbin/nginx -v 2>&1` =~ m{nginx/(\S+)};
plan skip_all => "Debian's Lua module is built for Debian's nginx "
               . ($debian // '?') . ", not $NGINX " . ($version // '?')
    unless defined $version && defined $debian && $version eq $debian;
preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1);
$env->conf(main_config => "
load_module $MODS/ndk_http_module.so;
load_module $MODS/ngx_http_lua_module.so;",
           http_config => <<'EOF', config => <<'EOF2');
    upstream llm {
        kv_aware block_size=64;
        kv_aware_events redis=127.0.0.1:$TEST_NGINX_REDIS_PORT
                        heartbeat=60s;
        server $TEST_NGINX_BACKEND_1;
        server $TEST_NGINX_BACKEND_2;
        server $TEST_NGINX_BACKEND_3;
    }

    upstream llm_lua {
        server 0.0.0.1;
        balancer_by_lua_block {
            local balancer = require "ngx.balancer"
            local barred = ngx.var.http_x_barred
            for addr in (ngx.ctx.ranking or ""):gmatch("([^ ,]+) [^,]+") do
                if addr ~= barred then
                    local host, port = addr:match("^(.+):(%d+)$")
                    assert(balancer.set_current_peer(host, tonumber(port)))
                    return
                end
            end
            return ngx.exit(503)
        }
    }
EOF
        location /v1/ {
            access_by_lua_block {
                ngx.req.read_body()
                ngx.ctx.ranking = ngx.var.kv_aware_ranking_llm
                ngx.header["X-Ranking"] = ngx.ctx.ranking
            }
            proxy_pass http://llm_lua;
        }
        location = /kv_status {
            kv_aware_status;
        }
EOF2
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }),
   'subscribed to redis');

my $pub = publisher($env);
my $P = prompt('lua-balanced', 10);
$pub->event(addr($env, 2), events => [stored(block_hashes($P))]);

sub ask {
    my (%h) = @_;
    return $env->request(POST => '/v1/chat/completions', $P,
                         { 'Content-Type' => 'application/json', %h });
}

my $r = ask();
is($r->{status}, 200, 'answered through the Lua balancer');
like($r->{headers}{'x-ranking'} // '', qr/^\Q${\ addr($env, 2)}\E \d+\.\d+,/,
     'the ranking puts the server of the events first')
    or diag $r->{headers}{'x-ranking'};
is($r->{headers}{'x-backend'}, 'b2', 'and Lua takes it');
is($r->{json}{len}, length $P, 'the body arrives whole');

my $b = ask('X-Barred' => addr($env, 2));
is($b->{status}, 200, 'a tenant barred from it is answered');
isnt($b->{headers}{'x-backend'}, 'b2', '  by the next in the ranking');
is($b->{json}{len}, length $P, '  the body whole');

unlike($env->error_log, qr/\[(?:alert|emerg|crit)\]/, 'no alert');

done_testing;
