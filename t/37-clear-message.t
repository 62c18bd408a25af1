# kv_aware precise mode: one message carrying many "cleared" events.
#
# A clear wipes everything its server said before it in the message, so a
# message with 1,000 of them costs one scan of the index, not 1,000: a
# request routed meanwhile on a full index does not wait for them, nothing
# is refused as a flood, and routing goes on as before.  (Before 0.2.0 each
# clear scanned the whole index: 3.5 s of routing stalled by a 21 KB
# message on a full 32m index.)

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $JSON $CHANNEL $LOCATIONS preflight block_hashes prompt chat addr
    upstream_conf status server_status wait_status seen publisher stored
    cleared fill_index
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 1,
                             log_level => 'info');
my @A = map { addr($env, $_) } 1 .. 3;

# default limits: what the old module accepted too, so this runs on both
$env->conf(http_config => upstream_conf(kv_aware => 'index_size=32m',
                                        events => 'max_rate=100000'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start');
ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }), 'subscribed');

my $pub = publisher($env);

# made-up hashes of servers 1 and 2 fill the index
my $st = fill_index($env, $pub, [@A[0, 1]], 1.05);
my $cap = $st->{index}{capacity};
cmp_ok($st->{index}{used}, '>=', $cap * 0.95,
       "index full: $st->{index}{used} of $cap");

# a prefix that server 2's events place there, to route during the clears
my $P = prompt('during-clears', 8);
my @P = block_hashes($P);
$pub->event($A[1], events => [stored(@P)]);
is(chat($env, $P)->{backend}, 'b2', 'the prefix routes to server 2');

# one message, 1,000 clears of server 3, 21 KB; then a request at once
sleep 1.1;                                  # a fresh second of budgets
my $before = status($env);
my $msg = $JSON->encode({ v => 1, server => $A[2], seq => 1,
                          events => [map { cleared() } 1 .. 1000] });
cmp_ok(length $msg, '<', 32 * 1024, length($msg) . ' bytes');
$pub->send(PUBLISH => $CHANNEL, $msg);
my $t0 = time;
my $r = chat($env, $P);
my $took = time - $t0;
is($pub->reply(10), 1, 'the message reached nginx');
is("$r->{status} $r->{backend} $r->{reason}", '200 b2 affinity',
   'routing goes on');
cmp_ok($took, '<', 0.3, sprintf 'a request meanwhile took %.0f ms',
       $took * 1000);

$st = wait_status($env, 5, sub { seen($_[0]) > seen($before) });
ok($st, 'nginx took the message in');
is($st->{events}{rejected}{flood}, $before->{events}{rejected}{flood},
   'not a flood: one scan');
is(server_status($st, $A[2])->{state}, 'fresh', 'server 3 is fresh');
cmp_ok($st->{index}{used}, '>=', $cap * 0.9,
       'what the other servers said is still there');

# and the server stays usable: its next events route
my $Q = prompt('after-clears', 8);
$pub->event($A[2], seq => 2, events => [stored(block_hashes($Q))]);
$r = chat($env, $Q);
is("$r->{backend} $r->{reason}", 'b3 affinity', 'server 3 routes again');

$env->stop_nginx;
$env->check_logs_clean('many clears in one message');

done_testing;
