# kv_aware precise mode: a hash flood from the events channel.  A
# publisher picks the hash values it sends; when the bucket was the key's
# low bits, 65,536 hashes equal in their low 20 bits made one chain of
# 65,536 entries, and taking in that one message (each insert walking the
# chain) kept the worker busy for seconds while requests waited.  Buckets
# are now keyed by a per-zone secret and chains are capped, so the message
# costs what any other does.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $JSON $CHANNEL $LOCATIONS preflight block_hashes prompt chat addr
    upstream_conf status server_status wait_status publisher stored
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 1,
                             log_level => 'info');
my @A = map { addr($env, $_) } 1 .. 3;

$env->conf(http_config => upstream_conf(kv_aware => 'index_size=32m'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start');
ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }), 'subscribed');

my $pub = publisher($env);

# a prefix server 2 holds, to route while the flood is taken in
my $P = prompt('during-hash-flood', 8);
$pub->event($A[1], events => [stored(block_hashes($P))]);
my $r = chat($env, $P);
is("$r->{backend} $r->{reason}", 'b2 affinity', 'routed by the event');

# 65,536 distinct hashes, all ending in the same 20 bits
my @h = map { sprintf '%011x%05x', $_ * 7919 + 1, 0xabcde } 1 .. 65536;
my $msg = $JSON->encode({ v => 1, server => $A[0], seq => 1,
                          events => [stored(@h)] });
cmp_ok(length $msg, '<', 4 << 20, 'within max_message');

my $before = status($env);
my $t0 = time;
$pub->cmd(PUBLISH => $CHANNEL, $msg);

# requests while nginx takes the message in: none may wait for it
my ($slowest, $bad) = (0, 0);
for (1 .. 20) {
    my $t = time;
    my $c = chat($env, $P);
    $t = time - $t;
    $slowest = $t if $t > $slowest;
    $bad++ unless $c->{status} == 200 && $c->{backend} eq 'b2';
    sleep 0.02;
}
is($bad, 0, 'every request meanwhile routed by affinity');
cmp_ok($slowest * 1000, '<', 500,
       sprintf 'the slowest request meanwhile took %.0f ms',
       $slowest * 1000);

my $st = wait_status($env, 10, sub {
    $_[0]{events}{hashes} >= $before->{events}{hashes} + 65536 });
my $took = time - $t0;
ok($st, 'the message was applied');
cmp_ok($took, '<', 3, sprintf 'within %.2f s of its publication', $took);
cmp_ok($st->{index}{used}, '>=', $before->{index}{used} + 65536,
       "the index holds them all ($st->{index}{used} entries)");
is($st->{events}{rejected}{too_big}, 0, 'nothing refused as too big');

# what the flood was for: lookups of such hashes stay cheap
$t0 = time;
$pub->event($A[0], events => [stored(@h[0 .. 999])]);
$r = chat($env, $P);
cmp_ok(time - $t0, '<', 1, 'another message of them and a request: fast');
is($r->{backend}, 'b2', 'routing unchanged');

$env->stop_nginx;
$env->check_logs_clean('hash flood');

done_testing;
