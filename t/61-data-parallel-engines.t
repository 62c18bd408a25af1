# The whole chain with data-parallel engines (issue 10): two kvsim servers
# of two ranks each, speaking vLLM's wire format a port a rank, kvbridge
# (data_parallel=2) to Redis, and nginx with keys=tokens data_parallel=2
# sending the rank it chose in X-data-parallel-rank:
#
#   * a prompt one rank computed for a client of its own draws nginx to
#     that server and that rank (the engine's cache hit says so), not to
#     the same server's other rank;
#   * a prompt routed twice through nginx lands on one rank both times and
#     hits its cache the second time.
#
# Token-id prompts: no tokenizer is involved.

use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use KvAware::Launch qw(free_ports free_run wait_until module_path);

my $SERVERS = 2;
my $BT      = 16;
my $MODEL   = 'kvsim';

plan skip_all => 'module not built' unless -f module_path();
for my $b (KvAware::Launch::kvsim_binary(), KvAware::Launch::kvbridge_binary())
{
    plan skip_all => "$b not built (make tools)" unless -x $b;
}

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 120;

my $json = JSON::PP->new->utf8->canonical;
my $http = HTTP::Tiny->new(timeout => 10);
my $l = KvAware::Launch->new(template => 'dp-engines-XXXXXX', watchdog => 1,
                             diag => \&diag);

my ($redis, $port) = free_ports(2);
my $base = free_run($SERVERS);
# per server 2 ranks: events on Z, Z + 1, replays on Z + 2, Z + 3
my $zmq = free_run(4 * $SERVERS);

$l->start_redis($redis);
$l->start_kvsim($base, $SERVERS, qw(--time-scale 50 --quiet --redis off
                --keyspace tokens --events zmq --data-parallel 2),
                '--model', $MODEL, '--zmq-port', $zmq);

# kvsim's layout: server i's rank r publishes on Z + 4i + r (see its README)
$l->start_kvbridge('--redis', "127.0.0.1:$redis", '--heartbeat', 200,
    map {
        ('--engine', "127.0.0.1:" . ($base + $_) . " model=$MODEL"
                     . ' events=tcp://127.0.0.1:' . ($zmq + 4 * $_)
                     . ' replay=tcp://127.0.0.1:' . ($zmq + 4 * $_ + 2)
                     . ' data_parallel=2')
    } 0 .. $SERVERS - 1);

my $servers = join '', map { "        server 127.0.0.1:" . ($base + $_)
                             . ";\n" } 0 .. $SERVERS - 1;
$l->write_nginx_conf(workers => 1, http => <<EOF);
    upstream llm {
        kv_aware keys=tokens block_tokens=$BT data_parallel=2;
        kv_aware_events redis=127.0.0.1:$redis heartbeat=5s;
$servers    }

    server {
        listen 127.0.0.1:$port;
        location / {
            proxy_pass http://llm;
            proxy_set_header X-data-parallel-rank \$kv_aware_dp_rank;
            add_header X-KV-Reason \$kv_aware_reason always;
            add_header X-KV-Matched \$kv_aware_matched always;
            add_header X-KV-Rank \$kv_aware_dp_rank always;
        }
        location = /status { kv_aware_status; }
    }
EOF
my ($ok, $err) = $l->start_nginx(workers => 1);
ok($ok, 'nginx starts') or BAIL_OUT($err);

sub status {
    my $r = $http->get("http://127.0.0.1:$port/status");
    my $st = $r->{success} && eval { $json->decode($r->{content}) };
    return $st ? $st->{upstreams}{llm} : undef;
}

ok(wait_until(15, sub {
    my $st = status() or return 0;
    my @fresh = grep { ($_->{state} // '') eq 'fresh' } @{ $st->{servers} };
    return @fresh == 2 * $SERVERS;
}), 'every rank of every server fresh from the bridge');

sub body {
    my ($n) = @_;
    my @ids = map { ($n * 7919 + $_ * 31) % 151936 } 1 .. 8 * $BT;
    return $json->encode({ model => $MODEL, max_tokens => 1,
                           prompt => \@ids });
}

# POSTs to $url; the reply's kvsim member and nginx's headers
sub post {
    my ($url, $body, $rank) = @_;
    my $r = $http->post($url, { content => $body, headers => {
        'Content-Type' => 'application/json',
        defined $rank ? ('X-data-parallel-rank' => $rank) : () } });
    my $k = $r->{success} ? eval { $json->decode($r->{content})->{kvsim} }
                          : undef;
    return { status => $r->{status}, kvsim => $k // {},
             rank => $r->{headers}{'x-kvsim-rank'} // -1,
             sent => $r->{headers}{'x-kv-rank'} // -1,
             reason => $r->{headers}{'x-kv-reason'} // '-',
             matched => $r->{headers}{'x-kv-matched'} // -1 };
}

sub held {
    my ($addr, $rank) = @_;
    my $st = status() or return 0;
    my ($s) = grep { $_->{name} eq $addr && $_->{rank} == $rank }
              @{ $st->{servers} };
    return $s ? $s->{entries}{event} : 0;
}

subtest 'a prompt one rank computed draws nginx to that rank' => sub {
    for my $i (1 .. 4) {
        my $home = $i % $SERVERS;
        my $rank = ($i >> 1) % 2;
        my $addr = '127.0.0.1:' . ($base + $home);
        my $before = held($addr, $rank);
        my $direct = post("http://$addr/v1/completions", body($i), $rank);
        is($direct->{rank}, $rank, "prompt $i computed on $addr rank $rank");
        ok(wait_until(5, sub { held($addr, $rank) >= $before + 8 }),
           '  its blocks reach nginx under that rank');

        my $r = post("http://127.0.0.1:$port/v1/completions", body($i));
        is($r->{status}, 200, '  through nginx: answered');
        is($r->{sent}, $rank, "  nginx chose rank $rank");
        is($r->{rank}, $rank, '  the engine ran it there');
        is($r->{reason}, 'affinity', '  by affinity');
        cmp_ok($r->{kvsim}{cached_tokens} // 0, '>=', 7 * $BT,
               '  and hit that rank\'s cache');
    }
};

subtest 'a prompt routed twice lands on one rank' => sub {
    my $first = post("http://127.0.0.1:$port/v1/completions", body(50));
    my $again = post("http://127.0.0.1:$port/v1/completions", body(50));
    is($again->{rank}, $first->{rank}, 'the same rank');
    cmp_ok($again->{kvsim}{cached_tokens} // 0, '>', 0, 'a cache hit');
};

unlike(KvAware::Launch::slurp($l->error_log_file) // '',
       qr/\[(?:alert|emerg|crit)\]/, 'no alert');

$l->stop_all;

done_testing;
