# kv_aware: block_size changed by reload while requests flow.
#
# Hashes of another block size never match, so a reload that changes
# block_size resets the index.  Workers of the old cycle still route in it
# meanwhile: the reset happens under the zone lock, so that none of them
# links an entry into a half-reset index.  Ten reloads alternate the block
# size under traffic from four clients and a stream of large event
# messages (the subscriber writes the index a long while): every request
# succeeds, no worker dies, routing still works afterwards, and the index
# passes kv_aware_status?check (an unlocked reset once left a cycle in a
# chain, and a lookup then looped forever under the lock).

use strict;
use warnings;

use POSIX ();
use Test::More;

use Test::KvAware ();
use Test::KvAware::Events qw(
    $JSON $CHANNEL $LOCATIONS preflight prompt chat addr status traffic
    redis_connect
);

preflight();

my $env = Test::KvAware->new(backends => 3, workers => 2, redis => 1,
                             log_level => 'notice');

sub conf {
    my ($bs) = @_;
    $env->conf(http_config => <<"EOF2", config => $LOCATIONS);
    upstream llm {
        kv_aware block_size=$bs index_size=128m;
        kv_aware_events redis=127.0.0.1:\$TEST_NGINX_REDIS_PORT
                        heartbeat=60s;
        server \$TEST_NGINX_BACKEND_1 max_fails=0;
        server \$TEST_NGINX_BACKEND_2 max_fails=0;
        server \$TEST_NGINX_BACKEND_3 max_fails=0;
    }
EOF2
}

conf(64);
$env->start_nginx or BAIL_OUT('nginx did not start');

# two clients, many prompts sharing prefixes: the index keeps changing
my @bodies = map { prompt('bs' . ($_ % 7), 4 + $_ % 9) } 1 .. 40;
my @t = map { traffic($env, @bodies[$_ .. $#bodies], @bodies[0 .. $_ - 1]) }
            0, 10, 20, 30;

# 8,000 hashes a message (under max_hashes), 20 messages a second,
# at most 400
my $A1 = addr($env, 1);
my $events = fork // die "fork: $!";
if ($events == 0) {
    $SIG{TERM} = 'DEFAULT';
    my $c = redis_connect($env->redis_port);
    for my $m (1 .. 400) {
        my @h = map { sprintf '%016x', ($m << 32) + $_ } 1 .. 8000;
        $c->cmd(PUBLISH => $CHANNEL, $JSON->encode({
            v => 1, server => $A1, seq => $m,
            events => [{ type => 'stored', hashes => \@h }] }));
        select(undef, undef, undef, 0.05);
    }
    POSIX::_exit(0);
}

my $ok = 0;
for my $i (1 .. 10) {
    conf($i % 2 ? 32 : 64);
    $ok++ if $env->reload(quiet => 1);
}
is($ok, 10, '10 reloads, block_size 32 <-> 64');
kill 'TERM', $events;
waitpid($events, 0);

my @res = map { $_->stop } @t;
cmp_ok(scalar @res, '>=', 20, scalar(@res) . ' requests meanwhile');
is(scalar(grep { $_->[0] ne '200' } @res), 0, 'every one answered 200');

# the last reload left block_size=64: the index works
my $P = prompt('after-reloads', 8);
my $r1 = chat($env, $P);
my $r2 = chat($env, $P);
is("$r2->{backend} $r2->{reason} $r2->{matched}",
   "$r1->{backend} affinity $r1->{blocks}", 'a repeated prompt has affinity');
cmp_ok(status($env)->{index}{used}, '>', 0, 'the index is in use');

# chains, free list and counters, verified over the whole index
my $check = $env->request(GET => '/kv_status?check');
is($check->{json} && $check->{json}{upstreams}{llm}{index}{check}, 'ok',
   'the index is sound after the resets');

$env->stop_nginx;
$env->check_logs_clean('block_size reloads');
like($env->error_log, qr/block_size of upstream "llm" changed, index reset/,
     'the resets are logged');

done_testing;
