# kv_aware precise mode: an event message that costs far more to parse than
# its size says is refused before it is parsed, and the subscribing
# worker's memory does not grow with it.
#
# `{},` is three bytes of JSON and an object in jansson's tree: a message of
# a few megabytes of them in a field the protocol ignores used to be
# accepted as a heartbeat, took a third of a second to parse and left the
# subscribing worker 300 MB larger for good.  Now a scan of the bytes
# bounds the values, objects and nesting a message may hold by what it may
# carry (max_hashes, max_events) and refuses the rest as too big, before a
# tree is built.  The caps here are the old defaults (4m, 65536 hashes).

use strict;
use warnings;

use Test::More;

use Test::KvAware ();
use Test::KvAware::Events qw(
    $LOCATIONS $CHANNEL preflight prompt chat addr status server_status
    wait_status publisher stored seen
);

preflight();

my $env = Test::KvAware->new(backends => 2, redis => 1, workers => 1,
                             log_level => 'info');
my @A = map { addr($env, $_) } 1 .. 2;

$env->conf(http_config => <<'EOF', config => $LOCATIONS);
    upstream llm {
        kv_aware block_size=64;
        kv_aware_events redis=127.0.0.1:$TEST_NGINX_REDIS_PORT heartbeat=60s
                        max_message=4m max_hashes=65536 max_events=65536
                        server_bytes=64m server_hashes=1000000;
        server $TEST_NGINX_BACKEND_1 max_fails=0;
        server $TEST_NGINX_BACKEND_2 max_fails=0;
    }
EOF
$env->start_nginx or BAIL_OUT('nginx did not start');
ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }), 'subscribed');

my ($worker) = $env->worker_pids;

# the peak: what parsing needed, even if it was given back after
sub peak_kb {
    open my $fh, '<', "/proc/$worker/status" or return 0;
    while (<$fh>) { return $1 if /^VmHWM:\s+(\d+)/ }
    return 0;
}

my $pub = publisher($env);
$pub->event($A[0], events => [stored('00000000000000aa')]);
my $before = peak_kb();

# just under max_message: 1.3 million empty objects in an unknown field
my $junk = '{"v":1,"server":"' . $A[0] . '","seq":2,"junk":['
         . ('{},' x 1_300_000) . '{}]}';
cmp_ok(length $junk, '<', 4 << 20, 'the message is within max_message');

my $st0 = status($env);
for (1 .. 3) {
    $pub->cmd(PUBLISH => $CHANNEL, $junk);
}
my $st = wait_status($env, 20, sub { seen($_[0]) >= seen($st0) + 3 });
ok($st, 'nginx took the three messages in');
is($st->{events}{rejected}{too_big} - $st0->{events}{rejected}{too_big}, 3,
   'each refused as too big');

my $grew = peak_kb() - $before;
cmp_ok($grew, '<', 32 * 1024,
       "the subscribing worker's peak memory grew by $grew kB "
       . "(it was about 300 MB)");

like($env->error_log, qr/ignored an event message: over a size limit: .*over/,
     'the log says what bound it crossed');

# refused unread, the junk took no sequence number: the server's next
# message follows its last one, and the server stays in sync
$pub->event($A[0], seq => 2, events => [stored('00000000000000bb')]);
is(server_status(status($env), $A[0])->{state}, 'fresh',
   'the server is still in sync');

# and a request still routes
my $r = chat($env, prompt('after-junk', 4));
is($r->{status}, 200, 'requests are served');

$env->stop_nginx;
$env->check_logs_clean('event amplification');

done_testing;
