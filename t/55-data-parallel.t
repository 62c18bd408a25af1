# kv_aware with data-parallel servers (kv_aware data_parallel=N): one HTTP
# endpoint, one KV cache per rank.  Each (server, rank) is routed to as its
# own cache, and the rank goes to the server in the header vLLM reads:
#
#     proxy_set_header X-data-parallel-rank $kv_aware_dp_rank;
#
#   * events name the rank ("rank": r): a prefix stored on one rank routes
#     there, with that rank in the header, not to the server's other rank;
#   * learned: a prompt's second request goes to the first's server and
#     rank; distinct prompts spread over the ranks, not just the servers;
#   * a rank the upstream does not have is an unknown server; a gap in a
#     rank's seq asks for that rank's resync ("rank": r in the request);
#   * the status page lists every rank; $kv_aware_dp_rank in a log line
#     after the request is the rank chosen; a retry after a failed server
#     keeps the request whole.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $JSON $CHANNEL preflight block_hashes prompt chat show addr bnum
    upstream_conf status wait_status redis_subscribe publisher stored
);

preflight();

my $LOCATIONS = <<'EOF';
        location / {
            proxy_pass http://llm;
            proxy_set_header X-data-parallel-rank $kv_aware_dp_rank;
            # a server stopped below: a connection to it kept alive (nginx
            # 1.30's default) is reset once the request is sent (t/12)
            proxy_next_upstream error timeout non_idempotent;
            add_header X-KV-Reason $kv_aware_reason always;
            add_header X-KV-Blocks $kv_aware_blocks always;
            add_header X-KV-Matched $kv_aware_matched always;
            add_header X-KV-Rank $kv_aware_dp_rank always;
        }
        location /no-rank/ {
            proxy_pass http://llm/;
        }
        location = /kv_status {
            kv_aware_status;
        }
EOF

my $env = Test::KvAware->new(backends => 2, redis => 1, workers => 1,
                             log_level => 'info');
$env->conf(http_config => upstream_conf(
               n => 2, kv_aware => 'data_parallel=2 learned_ttl=10m',
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

subtest 'the status page lists each rank' => sub {
    my $st = status($env);
    is(scalar @{ $st->{servers} }, 4, '2 servers x 2 ranks');
    for my $a (@A) {
        for my $r (0, 1) {
            ok(rank_status($st, $a, $r), "$a rank $r listed");
        }
    }
};

subtest 'Prometheus: a series per rank' => sub {
    my $r = $env->request(GET => '/kv_status?format=prometheus');
    for my $a (@A) {
        for my $k (0, 1) {
            like($r->{body}, qr/^kv_aware_server_requests_total\{[^}]*
                                 server="\Q$a\E",rank="$k"\}/mx,
                 "$a rank $k has its series");
        }
    }
};

subtest 'learned: the same prompt goes to the same server and rank' => sub {
    my $P = prompt('learned-dp', 8);
    my $r1 = chat($env, $P);
    is($r1->{status}, 200, 'answered');
    like($r1->{rank}, qr/^[01]$/, 'the server got a rank') or diag show($r1);
    my $r2 = chat($env, $P);
    is($r2->{backend}, $r1->{backend}, 'same server');
    is($r2->{rank}, $r1->{rank}, 'same rank');
    is($r2->{reason}, 'affinity', 'by affinity');
};

subtest 'events of one rank route to that rank' => sub {
    my $P = prompt('event-dp', 10);
    my @H = block_hashes($P);
    is($pub->event($A[1], rank => 1, events => [stored(@H)]), 1,
       'published for server 2 rank 1');
    my $st = status($env);
    is(rank_status($st, $A[1], 1)->{state}, 'fresh', 'that rank is fresh');
    is(rank_status($st, $A[1], 1)->{entries}{event}, scalar @H,
       'its entries');
    is(rank_status($st, $A[1], 0)->{state}, 'learned',
       'the other rank of the same server is not');

    for my $i (1 .. 3) {
        my $r = chat($env, $P);
        is($r->{backend}, 'b2', "request $i: server 2") or diag show($r);
        is($r->{rank}, 1, "request $i: rank 1 in the header");
        is($r->{matched}, scalar @H, "request $i: every block matched");
    }

    my $Q = prompt('event-dp-rank0', 10);
    my @G = block_hashes($Q);
    $pub->event($A[0], rank => 0, events => [stored(@G)]);
    my $r = chat($env, $Q);
    is("$r->{backend}/$r->{rank}", 'b1/0', 'and server 1 rank 0 for another')
        or diag show($r);
};

subtest 'a message of no rank is rank 0' => sub {
    my $P = prompt('no-rank-field', 10);
    my @H = block_hashes($P);
    # no "rank" at all: server 2's rank 0 has heard nothing yet, seq 1
    $pub->event($A[1], events => [stored(@H)]);
    my $st = status($env);
    is(rank_status($st, $A[1], 0)->{entries}{event}, scalar @H,
       'rank 0 has the blocks');
    my $r = chat($env, $P);
    is("$r->{backend}/$r->{rank}", 'b2/0', 'routed to server 2 rank 0');
};

subtest 'distinct prompts spread over the ranks' => sub {
    # requests held open, so that load decides where each new one goes
    my $hold = $env->prefix . '/release-spread';
    my @pids;
    for my $i (1 .. 4) {
        my $pid = fork // die "fork: $!";
        if ($pid == 0) {
            chat($env, prompt("spread-$i", 6), quiet => 1,
                 headers => { 'X-Hold' => $hold });
            exit 0;
        }
        push @pids, $pid;
        sleep 0.3;
    }
    my $st = wait_status($env, 5, sub {
        my $n = 0;
        $n += $_->{in_flight} for @{ $_[0]{servers} };
        $n >= 4 });
    my @busy = grep { $_->{in_flight} > 0 } @{ $st->{servers} || [] };
    is(scalar @busy, 4, 'four held requests on four ranks')
        or diag join ' ', map { "$_->{name}/$_->{rank}=$_->{in_flight}" }
                          @{ $st->{servers} || [] };
    open my $fh, '>', $hold or die "$hold: $!";
    close $fh;
    waitpid $_, 0 for @pids;
};

subtest 'a rank the upstream lacks is refused' => sub {
    my $before = status($env)->{events}{rejected}{unknown_server};
    $pub->publish_raw($JSON->encode({ v => 1, server => $A[0], rank => 2,
                                      seq => 1, events => [] }));
    is(status($env)->{events}{rejected}{unknown_server}, $before + 1,
       'rank 2 of 2: unknown server');
};

subtest "a gap asks for that rank's resync" => sub {
    my $sub = redis_subscribe($env->redis_port, "$CHANNEL:resync");
    my $P = prompt('gap-dp', 4);
    $pub->event($A[0], rank => 1, events => [stored(block_hashes($P))]);
    $pub->event($A[0], rank => 1, seq => 99, events => []);
    my ($m) = $sub->messages(5, sub { 1 });
    my $msg = $m ? $m->[1] : undef;
    ok($msg, 'a resync request was published');
    my $req = $msg ? eval { $JSON->decode($msg) } : undef;
    is_deeply($req, { v => 1, type => 'resync', server => $A[0],
                      rank => 1 }, 'naming the server and its rank')
        or diag $msg // '(none)';
    is(rank_status(status($env), $A[0], 1)->{state}, 'degraded',
       'that rank is degraded');
    isnt(rank_status(status($env), $A[0], 0)->{state}, 'degraded',
         'the other rank is not');
};

subtest 'the variable after the request is the rank sent' => sub {
    my $r = $env->request(POST => '/v1/chat/completions',
                          prompt('variable', 4),
                          { 'Content-Type' => 'application/json' });
    like($r->{headers}{'x-kv-rank'} // '', qr/^[01]$/, 'a rank');
    is($r->{headers}{'x-kv-rank'}, $r->{headers}{'x-backend-rank'},
       'the one the server got');
};

subtest 'a failed server: the retry answers, the body whole' => sub {
    my $P = prompt('retry-dp', 10);
    my @H = block_hashes($P);
    $pub->event($A[1], rank => 1, events => [stored(@H)]);
    $env->backend_stop(2);
    my $r = $env->request(POST => '/v1/chat/completions', $P,
                          { 'Content-Type' => 'application/json' });
    is($r->{status}, 200, 'answered');
    is($r->{headers}{'x-backend'}, 'b1', 'by the other server');
    like($env->error_log,
         qr/(?:(?:connect|recv|writev|readv)\(\)\ failed
               |upstream\ prematurely\ closed).*"http:\/\/\Q$A[1]\E/x,
         'after the first try went to the server of the blocks');
    is($r->{json}{len}, length $P, 'the body arrived whole');
    like($r->{headers}{'x-backend-rank'} // '', qr/^[01]$/,
         'with a rank it has');
    $env->backend_start(2);
};

subtest 'without the header, routing still works' => sub {
    my $r = $env->request(POST => '/no-rank/v1/chat/completions',
                          prompt('plain', 4),
                          { 'Content-Type' => 'application/json' });
    is($r->{status}, 200, 'answered');
    ok(!defined $r->{headers}{'x-backend-rank'}, 'no rank sent');
};

done_testing;
