# Lua beside kv_aware: Debian's libnginx-mod-http-lua (OpenResty's
# lua-nginx-module) loaded into Debian's nginx with this module.  An
# access_by_lua handler that reads the body (ngx.req.read_body(), in
# memory and in a temp file) and rewrites headers, as an API gateway does
# (the key turned into a tenant, the key removed), and a log_by_lua
# handler that counts requests by $kv_aware_reason in a shared dict and
# logs $kv_aware_* per request.  Routing by prefix is unchanged by it and
# the servers receive the body byte for byte.  The servers are Lua
# handlers too, in the same nginx on their own ports: they answer what
# they received (length, MD5, headers).

use strict;
use warnings;

use Digest::MD5 qw(md5_hex);
use Test::More;

use Test::KvAware qw(skip_unless_module);
use KvAware::Launch qw(free_ports slurp);

my $MODS = '/usr/lib/nginx/modules';
my $NGINX = KvAware::Launch::nginx_binary();

skip_unless_module();
plan skip_all => "no Debian Lua module ($MODS/ngx_http_lua_module.so: "
               . 'apt-get install libnginx-mod-http-lua, which make deps does)'
    unless -f "$MODS/ngx_http_lua_module.so" && -f "$MODS/ndk_http_module.so";
# Debian's .so loads only into Debian's nginx
my ($version) = `$NGINX -v 2>&1` =~ m{nginx/(\S+)};
my ($debian) = `/usr/sbin/nginx -v 2>&1` =~ m{nginx/(\S+)};
plan skip_all => "Debian's Lua module is built for Debian's nginx "
               . ($debian // '?') . ", not $NGINX " . ($version // '?')
    unless defined $version && defined $debian && $version eq $debian;

my @ports = free_ports(3);
my $env = Test::KvAware->new(backends => 0);
my $servers = join "\n", map { "        server 127.0.0.1:$_;" } @ports;
my $listens = join "\n", map { "        listen 127.0.0.1:$_;" } @ports;

$env->conf(main_config => "
load_module $MODS/ndk_http_module.so;
load_module $MODS/ngx_http_lua_module.so;",
           http_config => <<"EOF",
    lua_shared_dict kv_reasons 1m;

    upstream llm {
        kv_aware;
$servers
    }

    # the model servers: what arrived, as they saw it
    server {
$listens
        client_body_buffer_size 1m;
        client_max_body_size 8m;
        access_log off;

        location / {
            content_by_lua_block {
                ngx.req.read_body()
                local data = ngx.req.get_body_data()
                if not data then
                    local file = ngx.req.get_body_file()
                    if file then
                        local f = assert(io.open(file, "rb"))
                        data = f:read("*a")
                        f:close()
                    end
                end
                data = data or ""
                local h = ngx.req.get_headers()
                ngx.header["X-Backend"] = ngx.var.server_port
                ngx.say("len_at=", #data, " md5_at=", ngx.md5(data),
                        " tenant=", h["x-tenant"] or "-",
                        " auth=", h["authorization"] or "-",
                        " seen=", h["x-body-seen"] or "-")
            }
        }
    }
EOF
           config => <<'EOF');
        client_body_buffer_size 16k;     # larger bodies go to a file
        client_max_body_size 8m;

        location /v1/ {
            # an API gateway's work before the upstream: the key becomes a
            # tenant and is not passed on; the body is read to look at it
            access_by_lua_block {
                local key = ngx.var.http_authorization
                local tenant = key and key:match("^Bearer%s+(%w+)")
                if not tenant then
                    return ngx.exit(401)
                end
                ngx.req.read_body()
                local data = ngx.req.get_body_data()
                local seen
                if data then
                    seen = "memory:" .. #data
                else
                    local file = ngx.req.get_body_file()
                    local f = file and io.open(file, "rb")
                    seen = "file:" .. (f and f:seek("end") or -1)
                    if f then f:close() end
                end
                ngx.req.set_header("X-Tenant", tenant)
                ngx.req.set_header("X-Body-Seen", seen)
                ngx.req.clear_header("Authorization")
            }

            proxy_pass http://llm;
            add_header X-KV-Reason $kv_aware_reason always;
            add_header X-KV-Matched $kv_aware_matched always;

            # what kv_aware decided, in Lua once the request is done
            log_by_lua_block {
                -- nil when kv_aware did not route the request
                local v = ngx.var
                local reason = v.kv_aware_reason or "-"
                ngx.shared.kv_reasons:incr(reason, 1, 0)
                ngx.log(ngx.NOTICE, "kvlua: reason=", reason,
                        " blocks=", v.kv_aware_blocks or "-",
                        " matched=", v.kv_aware_matched or "-",
                        " upstream=", v.upstream_addr or "-")
            }
        }

        location = /reasons {
            content_by_lua_block {
                local d = ngx.shared.kv_reasons
                for _, k in ipairs(d:get_keys(0)) do
                    ngx.say(k, " ", d:get(k))
                end
            }
        }
EOF

my ($ok, $out) = $env->test_config;
ok($ok, "nginx -t: Debian's Lua module and kv_aware, both loaded")
    or diag($out);
$env->start_nginx or BAIL_OUT('nginx did not start');

sub system_prompt {
    my ($tag, $words) = @_;
    return join ' ', map { sprintf '%s%04d', $tag, $_ } 1 .. $words;
}

sub ask {
    my ($sys, $question, %o) = @_;
    my $body = '{"model":"m","messages":[{"role":"system","content":"'
             . $sys . '"},{"role":"user","content":"' . $question . '"}]}';
    my $r = $env->request(POST => '/v1/chat/completions', $body,
                          { 'Content-Type' => 'application/json',
                            ($o{key} ? (Authorization => "Bearer $o{key}")
                                     : ()) });
    my %seen = ($r->{body} // '') =~ /(\w+)=(\S+)/g;
    return { status => $r->{status}, backend => $r->{headers}{'x-backend'},
             reason => $r->{headers}{'x-kv-reason'} // '',
             matched => $r->{headers}{'x-kv-matched'} // 0,
             len => length $body, md5 => md5_hex($body), %seen };
}

my $err0 = $env->error_log_offset;

# a shared prefix four times, in memory (2 kB) and in a temp file (64 kB)
for my $case ([memory => 300], [file => 9000]) {
    my ($where, $words) = @$case;
    my $sys = system_prompt($where, $words);
    my @r = map { ask($sys, "question $_", key => 'acme') } 1 .. 4;

    is(scalar(grep { $_->{status} == 200 } @r), 4, "$where: four answered");
    ok(!grep({ $_->{len} != ($_->{len_at} // -1) } @r)
       && !grep({ $_->{md5} ne ($_->{md5_at} // '') } @r),
       "$where: each body reached its server byte for byte");
    my %at = map { $_->{backend} // '?' => 1 } @r;
    is(scalar keys %at, 1, "$where: all four on one server");
    is(scalar(grep { $_->{reason} eq 'affinity' && $_->{matched} > 0 }
                   @r[1 .. 3]),
       3, "$where: the last three by affinity");
    is(scalar(grep { $_->{seen} =~ /^$where:\d+$/ } @r), 4,
       "$where: Lua read the body (in $where)")
        or diag(join ' ', map { $_->{seen} // '-' } @r);
    is(scalar(grep { $_->{tenant} eq 'acme' && $_->{auth} eq '-' } @r), 4,
       "$where: the server got X-Tenant, not the key");
}

# new prefixes: spread by load as without Lua
my %spread;
$spread{ ask(system_prompt("p$_", 300), 'hi', key => 'acme')->{backend}
         // '?' }++ for 1 .. 6;
ok(keys %spread >= 2, 'new prefixes spread ('
   . join(' ', map { "$_=$spread{$_}" } sort keys %spread) . ')');

# refused by Lua: never routed, never at a server
my $r = ask(system_prompt('nokey', 300), 'hi');
is($r->{status}, 401, 'no key: 401 from access_by_lua');
ok(!defined $r->{backend}, '... and no server saw it');

# log_by_lua: every request counted by its reason, logged with the rest
my %count = ($env->request(GET => '/reasons')->{body} // '')
            =~ /^(\S+) (\d+)$/mg;
is($count{affinity}, 6, 'log_by_lua counted six by affinity')
    or diag(join ' ', %count);
is(($count{load} // 0) + ($count{affinity} // 0), 14,
   'and fourteen routed in all');
is($count{'-'}, 1, 'the refused one without a reason');

my @lines = $env->error_log($err0)
            =~ /kvlua: (reason=\S+ blocks=\S+ matched=\S+ upstream=\S+)/g;
is(scalar @lines, 15, 'log_by_lua logged each request');
is(scalar(grep { /^reason=- blocks=- matched=- upstream=-$/ } @lines), 1,
   'the refused one: no $kv_aware_* (nil in Lua)');
is(scalar(grep { /reason=affinity blocks=(\d+) matched=(\d+)/ && $2 > 0
                 && $2 <= $1 } @lines), 6,
   '$kv_aware_blocks and $kv_aware_matched read in Lua');

$env->stop_nginx;
$env->check_logs_clean('Lua and kv_aware');

done_testing;
