# kv_aware precise mode: KV events from Redis drive routing.
#
#   * a "stored" event for a prefix on server X routes it to X although
#     nginx learned another server for it; once that other server is fresh
#     too, its learned guess is ignored;
#   * routing to a fresh server leaves speculative entries for
#     speculative_ttl, no longer;
#   * "removed" cuts the match at the removed block, events apply in
#     order, "cleared" empties the server;
#   * a gap in seq makes the server degraded (its events are not trusted),
#     publishes one resync request on <channel>:resync (at most one a
#     second), and snapshots ("full", "begin".."end") make it fresh again;
#   * pattern=on: PSUBSCRIBE, events from any matching channel, resync
#     requests on resync_channel.
#
# Block hashes come from t/lib/kva_hashes.c, built against src/.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $JSON $CHANNEL $LOCATIONS preflight block_hashes prompt chat show
    addr bnum upstream_conf status server_status wait_status
    wait_until seen redis_subscribe publisher stored removed cleared
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 1,
                             log_level => 'info');
# affinity_min=0: the routes below show what the index holds, down to a
# match of 2 blocks of 13, which by default would be placed by capacity
$env->conf(http_config => upstream_conf(
               kv_aware => 'learned_ttl=10m affinity_min=0',
               events => 'heartbeat=60s speculative_ttl=1s'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }),
   'subscribed to redis');
my $pub = publisher($env);
my @A = map { addr($env, $_) } 1 .. 3;      # $A[i-1]: server of bi

sub other { my ($i) = @_; $i % 3 + 1 }      # another backend number

subtest 'stored events beat learned affinity' => sub {
    my $P = prompt('alpha', 12);
    my @H = block_hashes($P);
    cmp_ok(scalar @H, '>=', 12, 'prompt has >= 12 blocks');

    my $r1 = chat($env, $P);
    is($r1->{reason}, 'load', 'first sight: routed by load');
    my $y = bnum($r1->{backend});
    my $r2 = chat($env, $P);
    is($r2->{backend}, "b$y", 'learned: same server again');
    is($r2->{reason}, 'affinity', 'learned: affinity');

    my $x = other($y);
    is($pub->event($A[$x - 1], events => [stored(@H)]), 1,
       'PUBLISH reached exactly one subscriber');
    my $st = status($env);
    my $sx = server_status($st, $A[$x - 1]);
    is($sx->{state}, 'fresh', 'first message (seq 1): fresh');
    is($sx->{entries}{event}, scalar @H, 'event entries = stored hashes');
    is($sx->{events}{messages}, 1, 'server counted 1 message');
    is($sx->{events}{hashes}, scalar @H, 'server counted the hashes');
    is($st->{events}{hashes}, scalar @H, 'upstream counted the hashes');
    is(server_status($st, $A[$y - 1])->{state}, 'learned',
       'the learned server has no events: learned');

    my $r3 = chat($env, $P);
    is($r3->{backend}, "b$x", "now the event server b$x wins")
        or diag show($r3);
    is($r3->{reason}, 'affinity', 'reason affinity');
    is($r3->{matched}, scalar @H, 'matched == blocks');
    is($r3->{blocks}, scalar @H, 'blocks as computed by the hasher');

    # the learned server becomes fresh too: its learned guess is dropped
    $pub->event($A[$y - 1], events => []);
    is(server_status(status($env), $A[$y - 1])->{state}, 'fresh',
       'a heartbeat (seq 1) makes the learned server fresh');
    sleep 1.1;                      # b$x's speculative entries expire
    my $r4 = chat($env, $P);
    is($r4->{backend}, "b$x", 'still the event server') or diag show($r4);
    is($r4->{matched}, scalar @H, 'matched == blocks');
};

subtest 'fresh servers: learned ignored, speculative bridges' => sub {
    # every server fresh (a heartbeat each)
    $pub->event($_, events => []) for @A;
    my $st = status($env);
    is(scalar(grep { $_->{state} eq 'fresh' } @{ $st->{servers} }), 3,
       'three fresh servers');

    my $Q = prompt('bravo', 10);
    my @H = block_hashes($Q);
    my $r1 = chat($env, $Q);
    is($r1->{reason}, 'load', 'new prompt: load');
    my $t = bnum($r1->{backend});
    my $sp = server_status(status($env), $A[$t - 1]);
    is($sp->{entries}{speculative}, scalar @H,
       'routing to a fresh server records speculative entries');
    my $r2 = chat($env, $Q);
    is($r2->{backend}, "b$t", 'within speculative_ttl: same server');
    is($r2->{reason}, 'affinity', 'affinity from speculative entries');
    is($r2->{matched}, scalar @H, 'matched == blocks');

    sleep 1.2;                      # speculative_ttl=1s
    my $r3 = chat($env, $Q);
    is($r3->{reason}, 'load',
       'speculative entries expired, learned ones ignored: load')
        or diag show($r3);
    is($r3->{matched}, 0, 'matched 0');

    my $s = other(bnum($r3->{backend}));
    $pub->event($A[$s - 1], events => [stored(@H)]);
    sleep 1.1;
    my $r4 = chat($env, $Q);
    is($r4->{backend}, "b$s", 'the server that reported it wins');
    is($r4->{matched}, scalar @H, 'matched == blocks');
};

subtest 'removed and cleared' => sub {
    my $R = prompt('charlie', 12);
    my @H = block_hashes($R);
    my $x = 2;
    $pub->event($A[$x - 1], events => [stored(@H)]);
    my $r1 = chat($env, $R);
    is($r1->{backend}, "b$x", 'stored: routed to it');
    is($r1->{matched}, scalar @H, 'matched == blocks');

    my $before = server_status(status($env), $A[$x - 1])->{entries}{event};
    $pub->event($A[$x - 1], events => [removed($H[5])]);
    my $sx = server_status(status($env), $A[$x - 1]);
    is($sx->{entries}{event}, $before - 1, 'removed: one event entry less');
    my $r2 = chat($env, $R);
    is($r2->{backend}, "b$x", 'removed block 5: still there');
    is($r2->{matched}, 5, 'matched stops at the removed block');

    # stored + removed in one message, applied in order
    $pub->event($A[$x - 1], events => [stored(@H), removed(@H[2 .. 11])]);
    my $r3 = chat($env, $R);
    is($r3->{matched}, 2, 'events apply in order: matched 2');

    $pub->event($A[$x - 1], events => [cleared()]);
    $sx = server_status(status($env), $A[$x - 1]);
    is($sx->{entries}{event}, 0, 'cleared: no event entries');
    is($sx->{entries}{speculative}, 0, 'cleared: no speculative entries');
    is($sx->{entries}{learned}, 0, 'cleared: no learned entries');
    is($sx->{state}, 'fresh', 'still fresh');
    my $r4 = chat($env, $R);
    is($r4->{reason}, 'load', 'cleared: nobody holds it') or diag show($r4);
    is($r4->{matched}, 0, 'matched 0');
};

subtest 'gap: degraded, resync asked; snapshots restore' => sub {
    my $x = 3;
    my $name = $A[$x - 1];
    my $sub = redis_subscribe($env->redis_port, "$CHANNEL:resync");
    my $G = prompt('delta', 12);
    my @G = block_hashes($G);
    my $P = prompt('echo', 8);
    my @P = block_hashes($P);
    $pub->event($name, events => [stored(@P)]);

    my $st0 = status($env);
    my $seq = $pub->{seq}{$name};
    $pub->event($name, seq => $seq + 2, events => [stored(@G)]);
    my $st = status($env);
    my $sx = server_status($st, $name);
    is($sx->{state}, 'degraded', 'seq skipped one: degraded');
    is($sx->{seq}, $seq + 2, 'status shows the last seq');
    is($sx->{events}{gaps}, server_status($st0, $name)->{events}{gaps} + 1,
       'gap counted');
    is($st->{events}{resyncs}, $st0->{events}{resyncs} + 1,
       'one resync request counted');
    my @m = $sub->messages(3, sub { @_ >= 1 });
    is(scalar @m, 1, 'a resync request was published');
    is_deeply($m[0] && $JSON->decode($m[0][1]),
              { v => 1, type => 'resync', server => $name },
              'resync request: v, type, server');
    is($m[0] && $m[0][0], "$CHANNEL:resync", 'on <channel>:resync');

    my $r1 = chat($env, $G);
    is($r1->{reason}, 'load', 'degraded: its events are not trusted')
        or diag show($r1);

    # more gaps right away: no second request within a second
    $pub->event($name, seq => $seq + 5, events => []);
    $pub->event($name, seq => $seq + 9, events => []);
    @m = $sub->messages(0.3);
    is(scalar @m, 0, 'resync requests: at most one a second per server');
    is(server_status(status($env), $name)->{events}{gaps},
       $sx->{events}{gaps} + 2, 'the later gaps counted too');

    # the answer: a one-message snapshot with G only
    $pub->event($name, seq => $seq + 20, snapshot => 'full',
                events => [stored(@G)]);
    $sx = server_status(status($env), $name);
    is($sx->{state}, 'fresh', 'snapshot "full": fresh');
    is($sx->{entries}{event}, scalar @G,
       'snapshot replaced the event entries (P dropped, G kept)');
    sleep 1.1;                      # speculative entries of $r1 expire
    my $r2 = chat($env, $G);
    is($r2->{backend}, "b$x", 'fresh again: routed by its events')
        or diag show($r2);
    is($r2->{matched}, scalar @G, 'matched == blocks');
    my $r3 = chat($env, $P);
    is("$r3->{reason} $r3->{matched}", 'load 0',
       'what the snapshot dropped no longer matches');

    $pub->event($name, events => []);
    is(server_status(status($env), $name)->{state}, 'fresh',
       'the next seq after the snapshot: still fresh');

    # a snapshot in parts: syncing until "end"
    my $gaps = server_status(status($env), $name)->{events}{gaps};
    $pub->event($name, snapshot => 'begin', events => [stored(@P[0 .. 3])]);
    $sx = server_status(status($env), $name);
    is($sx->{state}, 'syncing', 'snapshot "begin": syncing');
    is($sx->{entries}{event}, 4, 'begin replaced the event entries');
    $pub->event($name, snapshot => 'more', events => [stored(@P[4 .. 5])]);
    is(server_status(status($env), $name)->{state}, 'syncing',
       '"more": still syncing');
    $pub->event($name, snapshot => 'end', events => [stored(@P[6 .. $#P])]);
    $sx = server_status(status($env), $name);
    is($sx->{state}, 'fresh', '"end": fresh');
    is($sx->{entries}{event}, scalar @P, 'all parts applied');
    is($sx->{events}{gaps}, $gaps, 'no gap counted');
    sleep 1.1;
    my $r4 = chat($env, $P);
    is($r4->{backend}, "b$x", 'routed by the snapshot') or diag show($r4);
    is($r4->{matched}, scalar @P, 'matched == blocks');
};

subtest 'pattern=on: one subscription for many channels' => sub {
    like($env->error_log, qr/\[info\].*events of "\Q$A[2]\E" out of sequence/,
         'the gap above was logged at info');
    $env->stop_nginx;
    $env->conf(http_config => upstream_conf(kv_aware => '',
                   events => 'heartbeat=60s channel=kv:ev:* pattern=on '
                           . 'resync_channel=kv:resync'),
               config => $LOCATIONS);
    $env->start_nginx or return;
    ok(wait_until(5, sub { $env->redis_cli(PUBSUB => 'NUMPAT') == 1 }),
       'PSUBSCRIBE: one pattern');
    my $p = publisher($env);
    my $sub = redis_subscribe($env->redis_port, 'kv:resync');
    my $T = prompt('pattern', 8);
    my @H = block_hashes($T);
    for my $i (1, 3) {
        is($p->publish_raw($JSON->encode({ v => 1, server => $A[$i - 1],
                seq => 1, events => $i == 3 ? [stored(@H)] : [] }),
                channel => "kv:ev:b$i"), 1, "published on kv:ev:b$i");
    }
    my $r = chat($env, $T);
    is("$r->{backend} $r->{reason} $r->{matched}",
       'b3 affinity ' . scalar(@H), 'events from a matching channel route');
    $p->publish_raw($JSON->encode({ v => 1, server => $A[0], seq => 3 }),
                    channel => 'kv:ev:b1');
    my @m = $sub->messages(3, sub { @_ >= 1 });
    is_deeply(@m ? $JSON->decode($m[0][1]) : undef,
              { v => 1, type => 'resync', server => $A[0] },
              'a gap: resync request on resync_channel');
    is(seen(status($env)), 3, 'nothing else came in (pings are not events)');
};

$env->stop_nginx;
$env->check_logs_clean('events');

done_testing;
