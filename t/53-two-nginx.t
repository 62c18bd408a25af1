# Two nginx instances subscribed to one kvbridge route alike (issue 10):
# each learns of the engines' caches from the same events, not from its
# own routing, so a prompt an engine holds draws both nginx to it, even a
# prompt neither nginx ever routed.  Real redis-server, kvsim speaking
# vLLM (--events zmq --keyspace tokens), kvbridge, two nginx with
# keys=tokens; token-id prompts, so no tokenizer is involved.

use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use KvAware::Launch qw(free_ports free_run wait_until slurp module_path);

my $SERVERS = 4;
my $BT      = 16;

plan skip_all => 'module not built' unless -f module_path();
for my $b (KvAware::Launch::kvsim_binary(), KvAware::Launch::kvbridge_binary())
{
    plan skip_all => "$b not built (make tools)" unless -x $b;
}
plan skip_all => 'redis-server is not installed'
    unless grep { -x "$_/redis-server" } split /:/, $ENV{PATH};

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 120;

my $json = JSON::PP->new->utf8->canonical;
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 1);
my $l = KvAware::Launch->new(template => 'two-nginx-XXXXXX', watchdog => 1,
                             diag => \&diag);

my ($redis, $na, $nb) = free_ports(3);
my $base = free_run($SERVERS);
my $zmq = free_run(2 * $SERVERS);

$l->start_redis($redis);
$l->start_kvsim($base, $SERVERS, qw(--time-scale 50 --quiet --redis off
                --keyspace tokens --events zmq --model kvsim),
                '--zmq-port', $zmq);
$l->start_kvbridge('--redis', "127.0.0.1:$redis", map {
    ('--engine', "127.0.0.1:" . ($base + $_) . ' model=kvsim'
                 . ' events=tcp://127.0.0.1:' . ($zmq + 2 * $_)
                 . ' replay=tcp://127.0.0.1:' . ($zmq + 2 * $_ + 1))
} 0 .. $SERVERS - 1);

# two nginx, each in its own prefix
my %nginx;
for my $n (['a', $na], ['b', $nb]) {
    my ($name, $port) = @$n;
    my $x = KvAware::Launch->new(template => "nginx-$name-XXXXXX",
                                 watchdog => 1, diag => \&diag);
    my $servers = join '', map { "        server 127.0.0.1:"
                                 . ($base + $_) . ";\n" } 0 .. $SERVERS - 1;
    $x->write_nginx_conf(workers => 2, http => <<EOF);
    upstream llm {
        kv_aware keys=tokens block_tokens=$BT;
        kv_aware_events redis=127.0.0.1:$redis;
$servers
    }

    server {
        listen 127.0.0.1:$port;
        location / {
            proxy_pass http://llm;
            add_header X-Upstream \$upstream_addr always;
            add_header X-KV-Matched \$kv_aware_matched always;
            add_header X-KV-Reason \$kv_aware_reason always;
        }
        location = /status { kv_aware_status; }
    }
EOF
    my ($ok, $err) = $x->start_nginx(workers => 2);
    ok($ok, "nginx $name starts") or diag($err);
    $nginx{$name} = { port => $port, launch => $x };
}

# both subscribed and every server fresh (the bridge's heartbeats)
for my $name (qw(a b)) {
    ok(wait_until(10, sub {
        my $r = $http->get("http://127.0.0.1:$nginx{$name}{port}/status");
        return 0 unless $r->{success};
        my $st = eval { $json->decode($r->{content}) } or return 0;
        my ($u) = values %{ $st->{upstreams} };
        my @fresh = grep { ($_->{state} // '') eq 'fresh' }
                    @{ $u->{servers} // [] };
        return @fresh == $SERVERS;
    }), "nginx $name: every server fresh from the bridge's heartbeats");
}

# the blocks nginx $name holds for server $addr from events
sub blocks {
    my ($name, $addr) = @_;
    my $r = $http->get("http://127.0.0.1:$nginx{$name}{port}/status");
    my $st = $r->{success} && eval { $json->decode($r->{content}) }
        or return 0;
    my ($u) = values %{ $st->{upstreams} };
    my ($srv) = grep { ($_->{name} // '') eq $addr }
                @{ $u->{servers} // [] };
    return $srv ? $srv->{entries}{event} // 0 : 0;
}

# K prompts, each computed first by one engine for a client of its own
# (straight to the engine, no nginx): then both nginx send it there
my $K = 12;             # 8 blocks each, 3 a server
my (%same, %right);
for my $i (1 .. $K) {
    my $home = $i % $SERVERS;
    my @ids = map { ($i * 7919 + $_ * 31) % 151936 } 1 .. 8 * $BT;
    my $body = $json->encode({ model => 'kvsim', max_tokens => 1,
                               prompt => \@ids });
    my $addr = '127.0.0.1:' . ($base + $home);
    my %before = map { $_ => blocks($_, $addr) } qw(a b);
    my $r = $http->post('http://127.0.0.1:' . ($base + $home)
                        . '/v1/completions', { content => $body });
    ok($r->{success}, "prompt $i computed by server $home")
        or diag($r->{status});

    # the events reach both before either routes the prompt: a request
    # routed elsewhere first would put the prefix on a second server
    for my $name (qw(a b)) {
        wait_until(5, sub { blocks($name, $addr) >= $before{$name} + 8 })
            or diag("nginx $name: no events for $addr");
    }

    my %to;
    for my $name (qw(a b)) {
        my $r = $http->post("http://127.0.0.1:$nginx{$name}{port}"
                            . '/v1/completions', { content => $body });
        $to{$name} = $r->{headers}{'x-upstream'} // '';
    }
    $same{$i} = $to{a} eq $to{b};
    $right{$i} = $to{a} eq '127.0.0.1:' . ($base + $home);
}

is(scalar(grep { $same{$_} } keys %same), $K,
   "both nginx send each of $K prompts to the same server");
is(scalar(grep { $right{$_} } keys %right), $K,
   'the server that holds it, which neither nginx had routed it to');

done_testing();
