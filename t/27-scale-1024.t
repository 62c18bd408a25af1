# kv_aware at its limit of 1,024 caches in one upstream (docs/scale.md):
# two servers of data_parallel=512, every rank a cache of its own.
#
#   * the status page lists all 1,024 ranks, Prometheus (ranks=all) has
#     the last one;
#   * events of the rank in slot 1000 route there, every block matched;
#   * a prefix held by eight ranks (past the six an index entry keeps
#     inline) routes to one of them, every block matched;
#   * learned: a prompt's second request goes to the first's rank;
#   * a gap on the last rank asks for that rank's resync.

use strict;
use warnings;

use Test::More;

use Test::KvAware ();
use Test::KvAware::Events qw(
    $JSON $CHANNEL preflight block_hashes prompt chat show addr
    upstream_conf status wait_status redis_subscribe publisher stored
);

preflight();

my $LOCATIONS = <<'EOF';
        location / {
            proxy_pass http://llm;
            proxy_set_header X-data-parallel-rank $kv_aware_dp_rank;
            add_header X-KV-Reason $kv_aware_reason always;
            add_header X-KV-Blocks $kv_aware_blocks always;
            add_header X-KV-Matched $kv_aware_matched always;
            add_header X-KV-Rank $kv_aware_dp_rank always;
        }
        location = /kv_status {
            kv_aware_status;
        }
EOF

my $env = Test::KvAware->new(backends => 2, redis => 1, workers => 1,
                             log_level => 'info');
$env->conf(http_config => upstream_conf(
               n => 2, kv_aware => 'data_parallel=512 learned_ttl=10m',
               events => 'heartbeat=60s speculative_ttl=1s'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }),
   'subscribed to redis');
my $pub = publisher($env);
my @A = map { addr($env, $_) } 1 .. 2;

sub rank_status {
    my ($st, $name, $rank) = @_;
    my ($s) = grep { $_->{name} eq $name && ($_->{rank} // -1) == $rank }
              @{ $st->{servers} || [] };
    return $s;
}

subtest 'the status page lists 1,024 ranks' => sub {
    my $st = status($env);
    is(scalar @{ $st->{servers} }, 1024, '2 servers x 512 ranks');
    ok(rank_status($st, $A[1], 511), 'the last rank listed');
    # past 64 ranks a series per server; ?ranks=all: per rank (t/28)
    my $r = $env->request(GET => '/kv_status?format=prometheus&ranks=all');
    like($r->{body}, qr/^kv_aware_server_requests_total\{[^}]*
                        server="\Q$A[1]\E",rank="511"\}/mx,
         'Prometheus has its series');
};

subtest 'events of the rank in slot 1000 route there' => sub {
    my $P = prompt('rank-488', 10);
    my @H = block_hashes($P);
    # slot 1000: server 2, rank 488
    is($pub->event($A[1], rank => 488, events => [stored(@H)]), 1,
       'published for server 2 rank 488');
    my $st = status($env);
    is(rank_status($st, $A[1], 488)->{state}, 'fresh', 'that rank is fresh');
    is(rank_status($st, $A[1], 488)->{entries}{event}, scalar @H,
       'its entries');

    for my $i (1 .. 3) {
        my $r = chat($env, $P);
        is("$r->{backend}/$r->{rank}", 'b2/488', "request $i: that rank")
            or diag show($r);
        is($r->{matched}, scalar @H, "request $i: every block matched");
    }
};

subtest 'a prefix held by eight ranks' => sub {
    my $P = prompt('eight-ranks', 12);
    my @H = block_hashes($P);
    for my $k (0 .. 7) {
        $pub->event($A[0], rank => 300 + 17 * $k, events => [stored(@H)]);
    }
    my $st = status($env);
    my $n = grep { ($_->{entries}{event} // 0) == @H
                   && $_->{name} eq $A[0] } @{ $st->{servers} };
    is($n, 8, 'eight ranks hold every block');
    my $r = chat($env, $P);
    my %held = map { (300 + 17 * $_) => 1 } 0 .. 7;
    ok($r->{backend} eq 'b1' && $held{$r->{rank}},
       "routed to one of them (b1/$r->{rank})") or diag show($r);
    is($r->{matched}, scalar @H, 'every block matched');
};

subtest 'learned: the same prompt goes to the same rank' => sub {
    my $P = prompt('learned-1024', 8);
    my $r1 = chat($env, $P);
    is($r1->{status}, 200, 'answered');
    my $r2 = chat($env, $P);
    is("$r2->{backend}/$r2->{rank}", "$r1->{backend}/$r1->{rank}",
       "same server and rank ($r1->{backend}/$r1->{rank})");
    is($r2->{reason}, 'affinity', 'by affinity');
};

subtest "a gap asks for the last rank's resync" => sub {
    my $sub = redis_subscribe($env->redis_port, "$CHANNEL:resync");
    my $P = prompt('gap-511', 4);
    $pub->event($A[1], rank => 511, events => [stored(block_hashes($P))]);
    $pub->event($A[1], rank => 511, seq => 99, events => []);
    my ($m) = $sub->messages(5, sub { 1 });
    my $msg = $m ? $m->[1] : undef;
    my $req = $msg ? eval { $JSON->decode($msg) } : undef;
    is_deeply($req, { v => 1, type => 'resync', server => $A[1],
                      rank => 511 }, 'naming the server and its rank')
        or diag $msg // '(none)';
    is(rank_status(status($env), $A[1], 511)->{state}, 'degraded',
       'that rank is degraded');
};

done_testing;
