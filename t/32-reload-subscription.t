# kv_aware precise mode: one subscription per nginx instance.
#
#   * worker_processes 2: one worker subscribes (PUBSUB NUMSUB 1, one
#     <channel>:ping:<pid>:<upstream> channel, <pid> a worker);
#   * nginx -s reload under traffic: every request 200, exactly one
#     subscription once the old workers are gone, held by a new worker;
#   * an old worker kept alive by a slow request gives its subscription up
#     at once: the new worker holds the only one meanwhile;
#   * a reload that renames the channel moves the subscription;
#   * SIGKILL to the subscribing worker: the master respawns it and there is
#     exactly one subscription again, by the new process, and events still
#     route.

use strict;
use warnings;

use POSIX ();
use Test::More;
use Time::HiRes qw(sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $CHANNEL $LOCATIONS preflight block_hashes prompt chat addr
    upstream_conf status wait_until numsub publisher stored traffic
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 2,
                             log_level => 'info');
my %conf = (http_config => upstream_conf(kv_aware => '',
                                         events => 'heartbeat=60s'),
            config => $LOCATIONS);
$env->conf(%conf);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

my @A = map { addr($env, $_) } 1 .. 3;
my @bodies = map { prompt("reload$_", 6) } 1 .. 4;

# pids in the <channel>:ping:<pid>:llm channels: who is subscribed
sub ping_pids {
    my ($channel) = @_;
    $channel //= $CHANNEL;
    return map { /:ping:(\d+):llm$/ ? $1 : () }
           split /\n/, $env->redis_cli(PUBSUB => 'CHANNELS',
                                       "$channel:ping:*");
}

sub one_subscriber {
    my ($channel) = @_;
    my @p = ping_pids($channel);
    return numsub($env, $channel) == 1 && @p == 1 ? $p[0] : 0;
}

subtest 'one subscription with 2 workers' => sub {
    my $pid = wait_until(5, sub { one_subscriber() });
    ok($pid, "one subscription, by pid $pid");
    my %w = map { $_ => 1 } $env->worker_pids;
    is(scalar(keys %w), 2, 'two workers');
    ok($w{$pid}, 'the subscriber is a worker');
    sleep 0.3;
    is(numsub($env), 1, 'and only one');
};

subtest 'reload under traffic' => sub {
    my %old = map { $_ => 1 } $env->worker_pids;
    my $tr = traffic($env, @bodies);
    wait_until(5, sub { $tr->count >= 5 });
    $env->reload or return;
    my $pid = wait_until(5, sub { one_subscriber() });
    ok($pid, "one subscription after the reload (pid $pid)");
    ok($pid && !$old{$pid}, 'held by a new worker');
    my %w = map { $_ => 1 } $env->worker_pids;
    ok($w{$pid}, 'which is alive');
    my $n = $tr->count;
    wait_until(5, sub { $tr->count >= $n + 5 });
    my @r = $tr->stop;
    my @bad = grep { $_->[0] != 200 } @r;
    is(scalar @bad, 0, scalar(@r) . ' requests, all 200')
        or diag explain [@bad[0 .. ($#bad < 9 ? $#bad : 9)]];
    sleep 0.3;
    is(numsub($env), 1, 'still one subscription');

    my $pub = publisher($env);
    my $fresh = prompt('after-reload', 6);  # never routed before
    my @H = block_hashes($fresh);
    is($pub->event($A[1], events => [stored(@H)]), 1,
       'an event reaches one subscriber');
    my $r = chat($env, $fresh);
    is("$r->{backend} $r->{reason} $r->{matched}",
       'b2 affinity ' . scalar(@H), 'and routes');
};

subtest 'an old worker busy with a slow request lets go at once' => sub {
    my %old = map { $_ => 1 } $env->worker_pids;
    my $oldsub = wait_until(5, sub { one_subscriber() });
    # slow requests, so that the old workers (one holds the channel) stay
    my $kid = fork // die "fork: $!";
    if ($kid == 0) {
        my @r = $env->concurrent([map {
            [POST => '/v1/chat/completions', $bodies[$_],
             { 'X-Delay-Ms' => 2500 }]
        } map { $_ % 4 } 0 .. 7]);
        POSIX::_exit(scalar(grep { $_->{status} == 200 } @r) == 8 ? 0 : 1);
    }
    sleep 0.5;
    my ($rc, $out) = $env->run_nginx('-s', 'reload');
    is($rc, 0, 'nginx -s reload') or diag $out;
    my $pid = wait_until(2, sub {
        my $p = one_subscriber();
        return $p && !$old{$p} ? $p : 0;
    });
    ok($pid, 'the new worker holds the only subscription');
    SKIP: {
        skip 'no slow request landed on the old subscriber', 1
            unless _zombie_free($oldsub);
        ok($pid, "while the old subscriber $oldsub still serves requests");
    }
    waitpid($kid, 0);
    is($?, 0, 'the slow requests all answered 200');
    ok(wait_until(5, sub { !grep { kill(0, $_) && _zombie_free($_) }
                                 keys %old }), 'old workers gone');
    is(numsub($env), 1, 'one subscription');
};

sub _zombie_free {
    my ($pid) = @_;
    open(my $fh, '<', "/proc/$pid/stat") or return 0;
    my $s = <$fh> // return 0;
    return $s !~ /\)\s+Z/;
}

subtest 'reload renames the channel' => sub {
    $env->conf(%conf, http_config => upstream_conf(
        kv_aware => '', events => 'heartbeat=60s channel=kv:other'));
    $env->reload or return;
    ok(wait_until(5, sub { one_subscriber('kv:other') }),
       'one subscription on the new channel');
    ok(wait_until(5, sub { numsub($env) == 0 }),
       'none left on the old one');
    $env->conf(%conf);
    $env->reload or return;
    ok(wait_until(5, sub { one_subscriber() }), 'and back');
    is(numsub($env, 'kv:other'), 0, 'none left on kv:other');
};

subtest 'the subscribing worker is killed' => sub {
    my $pid = wait_until(5, sub { one_subscriber() });
    ok($pid, "subscriber pid $pid") or return;   # never kill 0
    my $st0 = status($env);
    kill 'KILL', $pid;
    my $new = wait_until(8, sub {
        my $p = one_subscriber();
        return $p && $p != $pid ? $p : 0;
    });
    ok($new, "one subscription again, by the respawned worker $new");
    my %w = map { $_ => 1 } $env->worker_pids;
    ok($new && $w{$new}, 'a live worker of this master');
    is(scalar(keys %w), 2, 'two workers again');
    sleep 0.5;
    is(numsub($env), 1, 'exactly one subscription');
    my $st = status($env);
    cmp_ok($st->{redis}{connects}, '>', $st0->{redis}{connects},
           'status: connects counted the new subscription');
    is($st->{redis}{state}, 'up', 'status: up');

    my $pub = publisher($env);
    my $fresh = prompt('after-kill', 6);    # never routed before
    my @H = block_hashes($fresh);
    $pub->{seq}{$A[2]} = 50;
    is($pub->event($A[2], snapshot => 'full', events => [stored(@H)]), 1,
       'events reach the new subscriber');
    my $r = chat($env, $fresh);
    is("$r->{status} $r->{backend} $r->{matched}",
       "200 b3 " . scalar(@H), 'and route');
};

$env->stop_nginx;
my @bad = grep { /\[(?:alert|emerg|crit)\]|exited on signal/
                 && !/exited on signal 9/ } split /\n/, $env->error_log;
is(scalar @bad, 0, 'no alert/crit in the error log but the SIGKILL')
    or diag join "\n", @bad[0 .. ($#bad < 9 ? $#bad : 9)];

done_testing;
