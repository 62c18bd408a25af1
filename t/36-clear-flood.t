# kv_aware precise mode: a flood of index clears.  A "cleared" event or a
# snapshot's start scans the used part of the index under the zone lock;
# past about 4 million entries scanned a second such messages are refused
# as a flood and their server is degraded (its event entries no longer
# trusted), so routing never waits long on the lock; the first scan of a
# second always passes, so the server's snapshot brings it back.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $JSON $LOCATIONS preflight block_hashes prompt chat addr upstream_conf
    status server_status wait_status seen publisher stored cleared
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 1,
                             log_level => 'info');
my @A = map { addr($env, $_) } 1 .. 3;

# bench-size messages of one server: the per-server budgets out of the way
$env->conf(http_config => upstream_conf(
               kv_aware => 'index_size=64m',
               events => 'max_rate=100000 max_message=4m max_hashes=65536 '
                         . 'server_bytes=512m server_hashes=100000000'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start');
ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }), 'subscribed');

my $pub = publisher($env);

# 1.2 million entries of server 1: 20 messages of 60,000 made-up hashes
my $n = 0;
for my $m (1 .. 20) {
    my @h = map { sprintf '%016x', ($m << 32) + $_ } 1 .. 60000;
    $pub->event($A[0], events => [stored(@h)]);
}
# under ASan, or beside a sanitized build (stage two in CI), a message of
# 60,000 hashes may take nginx longer than the publisher waits for it:
# the last ones may still be queued at Redis's socket when the status
# page is read (30 s were not enough once, at 1,040,023)
my $st = wait_status($env, 60, sub { $_[0]{index}{used} >= 1_200_000 })
         // status($env);
cmp_ok($st->{index}{used}, '>=', 1_200_000, "index holds $st->{index}{used}");

# a prefix that server 2's events place there, to route during the flood
my $P = prompt('during-flood', 8);
my @P = block_hashes($P);
$pub->event($A[1], events => [stored(@P)]);

# 40 clears of server 3 in one go: at 1.2M entries a scan, 4 fit a second
sleep 1.1;
my $before = status($env);
my @rep = $pub->pipeline(map {
    [PUBLISH => $Test::KvAware::Events::CHANNEL,
     $JSON->encode({ v => 1, server => $A[2], seq => $_,
                     events => [cleared()] })]
} 1 .. 40);
my $t0 = time;
my $r = chat($env, $P);
my $took = time - $t0;
is("$r->{backend} $r->{reason}", 'b2 affinity', 'routing goes on');
cmp_ok($took, '<', 1, sprintf 'a request meanwhile took %.0f ms',
       $took * 1000);

$st = wait_status($env, 5, sub { seen($_[0]) >= seen($before) + 40 });
ok($st, 'all 40 taken in');
my $flood = $st->{events}{rejected}{flood}
            - $before->{events}{rejected}{flood};
cmp_ok($flood, '>=', 30, "$flood clears refused as a flood");
cmp_ok($flood, '<=', 38, 'the first few were applied');
is(server_status($st, $A[2])->{state}, 'degraded',
   'the flooding server is degraded');
is(server_status($st, $A[1])->{state}, 'fresh', 'the others stay fresh');

# a new second: its snapshot (a whole-index scan) is taken in at once
sleep 1.1;
$pub->event($A[2], seq => 41, snapshot => 'full', events => []);
is(server_status(status($env), $A[2])->{state}, 'fresh',
   'a snapshot in the next second brings the server back');

$env->stop_nginx;
$env->check_logs_clean('clear flood');
like($env->error_log, qr/too many index clears a second/,
     'the flood is logged');

done_testing;
