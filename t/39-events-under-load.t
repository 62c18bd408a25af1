# kv_aware precise mode: large event messages back to back, taken in by
# the worker that holds the subscription, a chunk of hashes per hold of
# the zone's lock.  Requests on the other worker must wait for a chunk at
# most, not for a message: nginx's lock is not fair, and taken again at
# once after each chunk it went to the applying worker again and again
# while the other slept on it.  As in t/45, each answer names its worker
# (X-Worker), and the requests of the worker that takes no events are
# judged.  Here, 24 messages in about 2 s: their p99 went from 6.9-7.5
# ms to 2.3-2.5 and the slowest from 19-20 to 5-6 when the lock was
# handed over (the median, 0.5-0.9 ms, did not move).  The bound is
# looser (a loaded CI machine): it fails a lock held for whole messages
# for a tenth of the requests, not the unfair hand-over those figures
# show, which only the p99 and the slowest printed here tell.

use strict;
use warnings;

use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $JSON $CHANNEL preflight block_hashes prompt addr upstream_conf status
    wait_status publisher stored seen timed_chats
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 2,
                             log_level => 'notice');
my @A = map { addr($env, $_) } 1 .. 3;

# caps raised so that messages of 65,536 hashes come in back to back
$env->conf(http_config => upstream_conf(kv_aware => 'index_size=64m',
               events => 'heartbeat=60s max_message=4m max_hashes=65536 '
                       . 'max_rate=100000 server_bytes=512m '
                       . 'server_hashes=100000000'),
           config => <<'EOF');
        location / {
            proxy_pass http://llm;
            add_header X-KV-Reason $kv_aware_reason always;
            add_header X-Worker $pid always;
        }
        location = /kv_status {
            kv_aware_status;
        }
EOF
$env->start_nginx or BAIL_OUT('nginx did not start');
ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }), 'subscribed');

# the worker holding the subscription: the one that logged it (just
# after the status said "up": polled)
my $subscriber;
KvAware::Launch::wait_until(5, sub {
    ($subscriber) = $env->error_log =~ /^\S+\ \S+\ \[notice\]\ (\d+)\#\d+:
                                        \ kv_aware:\ upstream\ "llm"
                                        \ subscribed/mx;
});
ok($subscriber, 'the subscribing worker: ' . ($subscriber // 'none'));

my $pub = publisher($env);
my $P = prompt('events-load', 8);
$pub->event($A[1], events => [stored(block_hashes($P))]);

# requests in turn until $until->(): [start, end, worker] each, () if
# one went wrong
sub timed { timed_chats($env, $P, 'b2', @_) }

# the times of those on the worker without the subscription, ms, in order
sub other_ms {
    sort { $a <=> $b } map { ($_->[1] - $_->[0]) * 1000 }
                       grep { $_->[2] ne ($subscriber // '') } @_;
}

my @base = timed(sub { $_[0] >= 100 });
is(scalar @base, 100, '100 requests routed to b2 without events');

# The flood, made before it starts (JSON::PP takes longer to write a
# message than nginx to take it in): $N messages of 65,536 new hashes
# each, the three servers in turn, each server's seq going on.
my $N = 24;
my %seq = %{ $pub->{seq} };
my @msgs = map {
    my $m = $_;
    my $server = $A[$m % 3];
    $JSON->encode({ v => 1, server => $server, seq => ++$seq{$server},
                    events => [stored(map { sprintf '%08x%08x', $m, $_ }
                                          1 .. 65536)] });
} 1 .. $N;

# published back to back by a child (PUBLISH waits for Redis only)
my $st0 = status($env);
my $kid = fork // die "fork: $!";
if ($kid == 0) {
    my $p = publisher($env);
    $p->cmd(PUBLISH => $CHANNEL, $_) for @msgs;
    POSIX::_exit(0);
}

# requests until nginx has taken the last message in (20 s at most)
my $t0 = time;
my $done = 0;
my $published = 0;
my @load = timed(sub {
    return 1 if time - $t0 > 20;
    # a status page counts the index, on one of the two workers: asked
    # for only once everything is published, and then seldom
    $published ||= waitpid($kid, POSIX::WNOHANG()) == $kid;
    return 0 if !$published || $_[0] % 50;
    $done ||= seen(status($env)) - seen($st0) >= $N;
    return $done;
});
my $load_s = time - $t0;
waitpid($kid, 0) unless $published;
my $st1 = status($env);
my $taken = seen($st1) - seen($st0);
my $applied = $st1->{events}{messages} - $st0->{events}{messages};

cmp_ok(scalar @load, '>=', 40, scalar(@load) . ' requests routed to b2 '
       . 'during the flood');
is($taken, $N, "all $N messages taken in meanwhile");
is($applied, $N, 'all applied, none refused (no flood without the lock)');

my @b = other_ms(@base);
my @f = other_ms(@load);
my ($b50, $f50, $f90, $f99) = ($b[@b / 2] // 0, $f[@f / 2] // 0,
                         $f[int(@f * 0.9)] // 0, $f[int(@f * 0.99)] // 0);
note(sprintf '%d messages of 65,536 hashes in %.2f s; requests on the '
     . 'worker without the subscription: median %.1f ms alone (%d), '
     . 'under the flood median %.1f, p90 %.1f, p99 %.1f, slowest %.1f ms (%d)',
     $taken, $load_s, $b50, scalar @b, $f50, $f90, $f99, $f[-1] // 0,
     scalar @f);
# as t/45: 25 ms over the median alone, or half of it on a loaded machine
my $bound = $b50 * 1.5 > $b50 + 25 ? $b50 * 1.5 : $b50 + 25;
cmp_ok(scalar @f, '>=', 20, 'requests on the worker without it');
cmp_ok($f90, '<', $bound, 'those requests are not delayed');

$env->stop_nginx;
$env->check_logs_clean('events under load');

done_testing;
