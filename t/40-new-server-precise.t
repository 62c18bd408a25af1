# kv_aware precise mode: a server that replaces, on reload, one that
# published events does not inherit its "precise" standing.
#
# Routing trusts only events for a server whose events are in sequence:
# what it learns by routing there is a short-lived guess (speculative_ttl)
# that the server's events must confirm.  A newcomer in the slot of such a
# server has published nothing: what nginx learns of it must last
# learned_ttl, so the same prompt a while later still finds it.  (Before
# 0.2.0 the newcomer kept the slot's precise bit: matched=0 reason=load.)

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $LOCATIONS preflight block_hashes prompt chat addr status
    server_status wait_status publisher stored
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 1,
                             log_level => 'info');
my @A = map { addr($env, $_) } 1 .. 3;

sub conf {
    my (@b) = @_;
    my $servers = join '', map {
        "        server \$TEST_NGINX_BACKEND_$_ max_fails=0;\n"
    } @b;
    $env->conf(http_config => <<"EOF2", config => $LOCATIONS);
    upstream llm {
        kv_aware block_size=64;
        kv_aware_events redis=127.0.0.1:\$TEST_NGINX_REDIS_PORT
                        heartbeat=60s speculative_ttl=200ms;
$servers    }
EOF2
}

conf(1, 2);
$env->start_nginx or BAIL_OUT('nginx did not start');
ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }), 'subscribed');

# server 2 publishes: its events are trusted, it is precise
my $pub = publisher($env);
$pub->event($A[1], events => [stored(block_hashes(prompt('warm', 4)))]);
is(server_status(status($env), $A[1])->{state}, 'fresh', 'server 2 fresh');

# server 3 takes server 2's place
conf(1, 3);
$env->reload or BAIL_OUT('reload failed');
my $st = status($env);
is(scalar @{ $st->{servers} }, 2, 'two servers');
is(server_status($st, $A[2])->{state}, 'learned',
   'the newcomer has published nothing');

# prompts routed by load, some to each server; asked again well past
# speculative_ttl, every one finds the server that has its blocks
my @P = map { prompt("newcomer$_", 6) } 1 .. 6;
my %first = map { $_ => chat($env, $P[$_]) } 0 .. $#P;
my @on3 = grep { $first{$_}{backend} eq 'b3' } 0 .. $#P;
ok(@on3, scalar(@on3) . ' of ' . scalar(@P) . ' prompts went to server 3');

sleep 1;    # 5 times speculative_ttl

for my $i (0 .. $#P) {
    my $r = chat($env, $P[$i]);
    is("$r->{backend} $r->{reason} $r->{matched}",
       "$first{$i}{backend} affinity $r->{blocks}",
       "prompt $i again on $first{$i}{backend}, all its blocks matched");
}

$env->stop_nginx;
$env->check_logs_clean('newcomer');

done_testing;
