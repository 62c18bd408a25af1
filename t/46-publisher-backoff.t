# kv_aware precise mode: the Redis publisher connection (resync requests,
# liveness pings) starts over from the shortest reconnect backoff once it
# is connected again, as the subscriber does.  After a long outage has
# pushed the backoff to its 3 s ceiling, a second, short one costs about
# as long as the outage itself, not 3 s of resync requests unsent.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $CHANNEL $LOCATIONS preflight addr upstream_conf status server_status
    wait_status publisher stored redis_subscribe
);

preflight();

my $env = Test::KvAware->new(backends => 2, redis => 1, workers => 1,
                             log_level => 'info');
$env->conf(http_config => upstream_conf(
               kv_aware => '', n => 2,
               events => 'connect_timeout=1s heartbeat=60s'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start');
ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }), 'redis up');

my $A1 = addr($env, 1);
publisher($env)->event($A1, events => [stored('00000000000000aa')]);
is(server_status(status($env), $A1)->{state}, 'fresh', 'b1 fresh');

# a long outage: both links back off to 3 s (12 attempts, 6.1 s)
my $f0 = status($env)->{redis}{failures};
$env->redis_stop;
ok(wait_status($env, 15, sub { $_[0]{redis}{failures} >= $f0 + 14 }),
   'a long outage: the reconnect backoff at its ceiling');
$env->redis_start;
ok(wait_status($env, 10, sub { $_[0]{redis}{state} eq 'up' }),
   'subscribed again');
my $resync = redis_subscribe($env->redis_port, "$CHANNEL:resync");
ok(scalar($resync->messages(10, sub { grep { $_->[1] =~ /\Q$A1\E/ } @_ })),
   'resync asked after the long outage');
undef $resync;

# a short one: the resync request follows the subscriber in well under 3 s
$env->redis_stop;
ok(wait_status($env, 5, sub { $_[0]{redis}{state} ne 'up' }), 'redis down');
$env->redis_start;
my $t0 = time;
$resync = redis_subscribe($env->redis_port, "$CHANNEL:resync");
my @m = $resync->messages(10, sub { grep { $_->[1] =~ /\Q$A1\E/ } @_ });
my $took = time - $t0;
ok(scalar(grep { $_->[1] =~ /\Q$A1\E/ } @m), 'resync asked again');
cmp_ok($took, '<', 2, sprintf 'resync request %.1f s after Redis is back',
       $took);

$env->stop_nginx;
$env->check_logs_clean('publisher backoff');

done_testing;
