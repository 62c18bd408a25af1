# kv_aware precise mode: heartbeats and load.
#
#   * heartbeat=1s: a server silent past it is reported stale (not before),
#     warned about, asked for a resync; its event entries are then ignored
#     (a prefix only its events knew is routed by load) while what nginx
#     learned by routing still holds; its next message in sequence makes
#     it fresh again and its events count again; a first message in
#     mid-sequence (seq 42) is a gap;
#   * a server silent while degraded or syncing becomes stale as well, and
#     the load it reported stops counting;
#   * "load" of a message shows in kv_aware_status (waiting, running,
#     kv_usage) and weighs in routing: a server reporting a long queue
#     loses a prefix it holds; once it reports an empty one it wins again.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $JSON $CHANNEL $LOCATIONS preflight block_hashes prompt chat show
    addr upstream_conf status server_status wait_status
    redis_subscribe publisher stored
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 1,
                             log_level => 'info');
my @A = map { addr($env, $_) } 1 .. 3;

sub start_with {
    my ($events) = @_;
    $env->stop_nginx;
    $env->conf(http_config => upstream_conf(kv_aware => '',
                                            events => $events),
               config => $LOCATIONS);
    $env->start_nginx or return 0;
    return wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' });
}

subtest 'silent past the heartbeat: stale' => sub {
    start_with('heartbeat=1s speculative_ttl=1s') or return fail('start');
    my $pub = publisher($env);
    my $sub = redis_subscribe($env->redis_port, "$CHANNEL:resync");
    my $x = 2;
    my $X = $A[$x - 1];
    my $P = prompt('routed', 8);        # routed to X: learned there
    my $Q = prompt('events', 8);        # known from X's events only
    my @P = block_hashes($P);
    my @Q = block_hashes($Q);
    my $mark = $env->error_log_offset;

    $pub->event($X, events => [stored(@P), stored(@Q)]);
    my $t0 = time;
    is(server_status(status($env), $X)->{state}, 'fresh', 'fresh');
    my $r = chat($env, $P);
    is("$r->{backend} $r->{matched}", "b$x " . scalar(@P), 'P routed to X');

    ok(!wait_status($env, 0.6, sub {
           server_status($_[0], $X)->{state} ne 'fresh' }),
       'still fresh 0.6 s after its message');
    my $st = wait_status($env, 3, sub {
        server_status($_[0], $X)->{state} eq 'stale' });
    my $dt = time - $t0;
    ok($st, sprintf('stale %.1f s after its last message', $dt));
    cmp_ok($dt, '>=', 0.95, 'not before the heartbeat');
    cmp_ok($dt, '<=', 2.5, 'soon after it');
    ok($env->wait_for_log(
           qr/\[warn\].*server "\Q$X\E" silent for \d+ ms, routing it by learned state/,
           1, $mark), 'warn: silent');
    my @m = $sub->messages(2, sub { @_ >= 1 });
    is_deeply($m[0] && $JSON->decode($m[0][1]),
              { v => 1, type => 'resync', server => $X },
              'a resync request for it');

    my $rq = chat($env, $Q);
    is("$rq->{reason} $rq->{matched}", 'load 0',
       'stale: its event entries are ignored') or diag show($rq);
    my $rp = chat($env, $P);
    is("$rp->{backend} $rp->{reason} $rp->{matched}",
       "b$x affinity " . scalar(@P), 'stale: learned state still routes');

    # one more message in sequence: fresh again, its events count again
    my $R = prompt('again', 8);
    my @R = block_hashes($R);
    $pub->event($X, events => [stored(@R)]);
    is(server_status(status($env), $X)->{state}, 'fresh',
       'the next seq: fresh again');
    my $rr = chat($env, $R);
    is("$rr->{backend} $rr->{reason} $rr->{matched}",
       "b$x affinity " . scalar(@R), 'its events route again');

    ok(wait_status($env, 3, sub {
           server_status($_[0], $X)->{state} eq 'stale' }),
       'silent again: stale again');
    is(scalar(grep { $_->{state} eq 'stale' } @{ status($env)->{servers} }),
       1, 'servers never heard from stay "learned", not stale');

    # a server first heard from in mid-sequence: it missed something
    my $W = $A[0];
    is(server_status(status($env), $W)->{state}, 'learned', 'b1: learned');
    my @n = $sub->messages(0.01);   # drop older resync requests
    $pub->event($W, seq => 42, events => []);
    my $sw = server_status(status($env), $W);
    is("$sw->{state} $sw->{seq} $sw->{events}{gaps}", 'degraded 42 1',
       'first message at seq 42: degraded, a gap');
    @m = $sub->messages(2, sub { grep { $_->[1] =~ /\Q"$W"\E/ } @_ });
    ok((grep { $_->[1] =~ /"server":"\Q$W\E"/ } @m),
       'and asked for a resync');
};

# A server that goes silent while degraded (a gap) or syncing (a snapshot
# that never ends) is silent all the same: past the heartbeat it must be
# stale, and the load it last reported must stop counting.
subtest 'silent while degraded or syncing: stale too' => sub {
    start_with('heartbeat=1s') or return fail('start');
    my $pub = publisher($env);
    my %heavy = (waiting => 400, running => 100);
    my ($D, $S) = @A[0, 1];
    $pub->event($D, events => [], load => \%heavy);
    $pub->event($S, events => [], load => \%heavy);
    $pub->event($D, seq => 5, events => []);            # a gap
    $pub->event($S, snapshot => 'begin', events => []);  # never ends
    my $st = status($env);
    is(server_status($st, $D)->{state}, 'degraded', 'b1 degraded');
    is(server_status($st, $S)->{state}, 'syncing', 'b2 syncing');
    my $r = chat($env, prompt('heavy', 4));
    is($r->{backend}, 'b3', 'their reported queues keep requests away');

    $st = wait_status($env, 3, sub {
        !grep { $_->{state} ne 'stale' }
            map { server_status($_[0], $_) } $D, $S });
    ok($st, 'both stale within 3 s of silence (heartbeat=1s)')
        or diag explain [map { "$_->{name}: $_->{state}" }
                         @{ status($env)->{servers} }];
    my %to;
    $to{ chat($env, prompt("light$_", 4))->{backend} }++ for 1 .. 6;
    ok($to{b1} && $to{b2}, 'their last load no longer counts: b1 and b2 '
                           . 'get new prompts again')
        or diag explain \%to;
};

subtest 'load figures' => sub {
    start_with('heartbeat=60s speculative_ttl=200ms') or return fail('start');
    my $pub = publisher($env);
    # the others fresh: only events and speculative entries count for them
    $pub->event($_, events => []) for @A[1, 2];
    my $x = 1;
    my $X = $A[$x - 1];
    my $P = prompt('loaded', 10);
    my @P = block_hashes($P);

    my $sx = server_status(status($env), $X);
    ok(!exists $sx->{load}, 'no load before the server reports one');

    $pub->event($X, events => [stored(@P)],
                load => { waiting => 3, running => 12, kv_usage => 0.43 });
    $sx = server_status(status($env), $X);
    is_deeply($sx->{load}, { waiting => 3, running => 12,
                             kv_usage => 0.43 }, 'status shows the load');
    my $r = chat($env, $P);
    is("$r->{backend} $r->{reason}", "b$x affinity",
       'a light load: the prefix stays with its server');

    $pub->event($X, load => { waiting => 400, running => 100,
                              kv_usage => 1 });
    $sx = server_status(status($env), $X);
    is_deeply($sx->{load}, { waiting => 400, running => 100,
                             kv_usage => 1 }, 'status: a heavy load');
    $r = chat($env, $P);
    isnt($r->{backend}, "b$x", "a queue of 500: the prefix goes elsewhere "
                               . "($r->{backend}, $r->{reason})");
    is($r->{status}, 200, 'answered');

    $pub->event($X, events => [stored(@P)],
                load => { waiting => 0, running => 0, kv_usage => 0 });
    is_deeply(server_status(status($env), $X)->{load},
              { waiting => 0, running => 0, kv_usage => 0 },
              'status: idle');
    sleep 0.3;                      # the speculative entry of $r expires
    $r = chat($env, $P);
    is("$r->{backend} $r->{reason}", "b$x affinity",
       'idle again: back to its server');

    $pub->event($X, load => { waiting => 2 });
    is(server_status(status($env), $X)->{load}{waiting}, 2,
       'a partial load object updates what it names');
};

$env->stop_nginx;
$env->check_logs_clean('heartbeat');

done_testing;
