# $kv_aware_ranking_NAME: the servers of kv_aware upstream NAME ranked for
# the request at hand, best first, "addr cost,addr cost,..." (lower is
# better), for a balancer of one's own (balancer_by_lua) to choose among:
#
#   * the server that holds a prompt comes first, with the lowest cost;
#   * a prompt nobody holds ranks every server by load alone;
#   * reading it teaches kv_aware nothing (it did not choose);
#   * only servers a first try could take: not one marked down;
#   * an upstream that is not kv_aware, or none of that name: empty.

use strict;
use warnings;

use Test::More;

use Test::KvAware ();
use Test::KvAware::Events qw(prompt chat show addr);

my $env = Test::KvAware->new(backends => 3);
$env->conf(http_config => <<'EOF2', config => <<'EOF3');
    upstream llm {
        kv_aware block_size=64;
        server $TEST_NGINX_BACKEND_1;
        server $TEST_NGINX_BACKEND_2;
        server $TEST_NGINX_BACKEND_3;
        server 127.0.0.1:1 down;
    }
    upstream plain {
        server $TEST_NGINX_BACKEND_1;
    }
EOF2
        location / {
            proxy_pass http://llm;
            add_header X-KV-Reason $kv_aware_reason always;
        }
        location /rank/ {
            proxy_pass http://plain/;
            add_header X-Ranking $kv_aware_ranking_llm always;
            add_header X-Ranking-Plain $kv_aware_ranking_plain always;
            add_header X-Ranking-None $kv_aware_ranking_nosuch always;
        }
        location = /kv_status {
            kv_aware_status;
        }
EOF3
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

my %num = map { addr($env, $_) => "b$_" } 1 .. 3;

sub ranking {
    my ($p) = @_;
    my $r = $env->request(POST => '/rank/v1/chat/completions', $p,
                          { 'Content-Type' => 'application/json' });
    my @e = map { [split / /] } split /,/, $r->{headers}{'x-ranking'} // '';
    return ($r, @e);
}

sub routed {
    my $r = $env->request(GET => '/kv_status');
    my $n = 0;
    $n += $_->{routed} for @{ $r->{json}{upstreams}{llm}{servers} };
    return $n;
}

my $P = prompt('ranked', 12);
my $home = chat($env, $P)->{backend};

my ($r, @e) = ranking($P);
is($r->{status}, 200, 'answered (by the plain upstream)');
is(scalar @e, 3, 'three servers ranked, not the one marked down')
    or diag $r->{headers}{'x-ranking'};
like($_->[0], qr/^127\.0\.0\.1:\d+$/, "an address: $_->[0]") for @e;
like($_->[1], qr/^\d+\.\d{3}$/, "a cost: $_->[1]") for @e;
is($num{ $e[0][0] }, $home, 'the server that holds the prompt first');
cmp_ok($e[0][1], '<', $e[1][1], '  with the lowest cost');
cmp_ok($e[1][1], '<=', $e[2][1], 'the rest in order');

my $before = routed();
my (undef, @f) = ranking(prompt('nobody holds this', 12));
is(scalar @f, 3, 'a prompt nobody holds: three servers');
is($f[0][1], $f[2][1], '  all at the same cost (no load)');
is(routed(), $before, 'ranking routed nothing');
is(chat($env, $P)->{backend}, $home, 'and the prompt still goes home');

ok(!defined $r->{headers}{'x-ranking-plain'}, 'a plain upstream: empty');
ok(!defined $r->{headers}{'x-ranking-none'}, 'no such upstream: empty');
unlike($env->error_log, qr/\[(?:alert|emerg|crit)\]/, 'no alert');

done_testing;
