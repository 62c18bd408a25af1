# kv_aware precise mode: a Redis that accepts and never answers.
#
#   * kv_aware_events points at a listener that accepts TCP connections
#     and answers nothing (a hung Redis, a proxy or firewall that swallows
#     what follows the handshake): requests are answered 200, routed from
#     what nginx learned, and the link is not "up";
#   * the error log names the hang ("no answer in 500 ms after
#     connecting") within a bounded time, and nginx tries again (the
#     listener sees more connections than the first two);
#   * the listener is replaced by a real redis-server on the same port:
#     the link comes up by itself and an event routes a prompt.

use strict;
use warnings;

use Test::More;
use IO::Socket::INET;
use POSIX ();
use Time::HiRes qw(sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $LOCATIONS preflight block_hashes prompt chat addr bnum upstream_conf
    status wait_status wait_until publisher stored
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 0, workers => 1,
                             log_level => 'info');
my $port = $env->redis_port;
my $count = $env->prefix . '/hung-accepts';

# the hung "Redis": accepts, keeps every connection open, answers nothing
my $listener = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                     LocalPort => $port, Listen => 16,
                                     ReuseAddr => 1, Proto => 'tcp')
    or BAIL_OUT("cannot listen on $port: $!");
my $hung = fork // BAIL_OUT("fork: $!");
if ($hung == 0) {
    my @keep;
    while (my $c = $listener->accept) {
        push @keep, $c;
        if (open my $fh, '>>', $count) { print $fh "1\n"; close $fh }
    }
    POSIX::_exit(0);
}
close $listener;
END { kill 'KILL', $hung if $hung }

sub accepts {
    open my $fh, '<', $count or return 0;
    my @l = <$fh>;
    return scalar @l;
}

$env->conf(http_config => upstream_conf(
               kv_aware => 'learned_ttl=10m affinity_min=0',
               events => 'connect_timeout=500ms read_timeout=1s '
                         . 'heartbeat=60s'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

subtest 'a Redis that answers nothing' => sub {
    my $hang = "redis 127.0.0.1:$port: no answer in 500 ms after "
               . 'connecting, the subscriber retries';
    ok($env->wait_for_log($hang, 10, 0), 'the error log names the hang');
    like($env->error_log, qr/\[error\].*\Q$hang\E/, 'at level error');
    ok(wait_until(10, sub { accepts() >= 3 }),
       'nginx tried again: ' . accepts() . ' connections accepted');

    my $st = status($env);
    isnt($st->{redis}{state}, 'up', "the link is not up: $st->{redis}{state}");
    is($st->{redis}{connects}, 0, 'no subscription counted');

    my $P = prompt('hung', 8);
    my $r1 = chat($env, $P);
    is($r1->{status}, 200, 'a request is answered');
    is($r1->{reason}, 'load', 'first sight: routed by load');
    my $r2 = chat($env, $P);
    is($r2->{status}, 200, 'again');
    is($r2->{backend}, $r1->{backend}, 'learned: the same server again');
    is($r2->{reason}, 'affinity', 'learned affinity, as with Redis down');

    my @lines = grep { /no answer in 500 ms after connecting, the subscriber/ }
                split /\n/, $env->error_log;
    cmp_ok(scalar @lines, '<=', accepts(),
           scalar(@lines) . ' subscriber lines: at most one an attempt');
};

subtest 'a real Redis on the same port' => sub {
    kill 'KILL', $hung;
    waitpid $hung, 0;
    $env->redis_start or return fail('redis-server did not start');

    my $st = wait_status($env, 10, sub { $_[0]{redis}{state} eq 'up' });
    ok($st, 'the link comes up by itself');

    my $P = prompt('after', 12);
    my @H = block_hashes($P);
    my $x = 2;
    is(publisher($env)->event(addr($env, $x), events => [stored(@H)]), 1,
       'PUBLISH reached exactly one subscriber');
    my $r = chat($env, $P);
    is($r->{status}, 200, 'answered');
    is($r->{backend}, "b$x", "an event routes the prompt to b$x");
    is($r->{reason}, 'affinity', 'by affinity');
};

$env->stop_nginx;
$env->check_logs_clean('redis hung');

done_testing;
