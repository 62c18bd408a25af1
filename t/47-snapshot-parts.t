# kv_aware precise mode: a snapshot split over several messages counts only
# when all its parts arrived.  A part lost (a gap in seq between "begin"
# and "end", as when Redis drops it or a budget refuses it) leaves the
# server degraded and asked again, instead of trusting a partial picture.

use strict;
use warnings;

use Test::More;

use Test::KvAware ();
use Test::KvAware::Events qw(
    $LOCATIONS preflight addr upstream_conf status server_status
    wait_status publisher stored redis_subscribe $CHANNEL
);

preflight();

my $env = Test::KvAware->new(backends => 2, redis => 1, workers => 1,
                             log_level => 'info');
$env->conf(http_config => upstream_conf(kv_aware => '', n => 2,
                                        events => 'heartbeat=60s'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start');
ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }), 'subscribed');

my @A = map { addr($env, $_) } 1 .. 2;
my $pub = publisher($env);
sub h { map { sprintf '%016x', $_ } @_ }

# a gap: the server is degraded and asked for a snapshot
$pub->event($A[0], seq => 1, events => [stored(h(1 .. 4))]);
$pub->event($A[0], seq => 3, events => [stored(h(5 .. 8))]);
is(server_status(status($env), $A[0])->{state}, 'degraded', 'a gap: degraded');

my $resync = redis_subscribe($env->redis_port, "$CHANNEL:resync");

# its snapshot, the middle part lost
$pub->event($A[0], seq => 4, snapshot => 'begin', events => [stored(h(10))]);
is(server_status(status($env), $A[0])->{state}, 'syncing', 'begin: syncing');
$pub->event($A[0], seq => 6, snapshot => 'end', events => [stored(h(12))]);
my $s = server_status(status($env), $A[0]);
is($s->{state}, 'degraded', 'end after a lost part: still degraded');
ok(scalar($resync->messages(5, sub { grep { $_->[1] =~ /\Q$A[0]\E/ } @_ })),
   'and asked again');

# a whole snapshot makes it fresh
$pub->event($A[0], seq => 7, snapshot => 'begin', events => [stored(h(20))]);
$pub->event($A[0], seq => 8, snapshot => 'more', events => [stored(h(21))]);
$pub->event($A[0], seq => 9, snapshot => 'end', events => [stored(h(22))]);
$s = server_status(status($env), $A[0]);
is($s->{state}, 'fresh', 'a whole snapshot: fresh');
is($s->{entries}{event}, 3, 'holding what the snapshot said');

$env->stop_nginx;
$env->check_logs_clean('snapshot parts');

done_testing;
