# kv_aware_status under load: the page counts every index entry, a chunk
# per hold of the zone lock, so that however often it is asked for,
# routing never waits for more than a chunk.  On a full index, a client
# polling status back to back delays only the requests of the worker
# making a page.

use strict;
use warnings;

use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $LOCATIONS preflight block_hashes prompt chat addr upstream_conf status
    wait_status publisher stored fill_index seen
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 2,
                             log_level => 'notice');
my @A = map { addr($env, $_) } 1 .. 3;

$env->conf(http_config => upstream_conf(kv_aware => 'index_size=32m',
                                        events => 'heartbeat=60s'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start');
ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }), 'subscribed');

my $pub = publisher($env);
my $st = fill_index($env, $pub, \@A);
my $cap = $st->{index}{capacity};
cmp_ok($st->{index}{used}, '>=', $cap * 0.95,
       "index full: $st->{index}{used} of $cap");

my $P = prompt('status-load', 8);
$pub->event($A[1], events => [stored(block_hashes($P))]);
# nginx takes the event on its own time: on a loaded CI machine the first
# request could otherwise be routed before it (CI failed here once)
ok(wait_status($env, 10, sub { seen($_[0]) > seen($st) }),
   'the prompt\'s blocks reached nginx');

sub timed {
    my @t;
    for my $i (1 .. 40) {
        my $t0 = time;
        my $r = chat($env, $P);
        push @t, time - $t0;
        next if "$r->{status} $r->{backend}" eq '200 b2';
        diag("request $i: $r->{status} $r->{backend} $r->{reason}");
        return ();
    }
    return sort { $a <=> $b } @t;
}

my @base = timed();
is(scalar @base, 40, '40 requests routed to b2 without status');

# a client polling status back to back: at most 400 hits, 10 s
my $kid = fork // die "fork: $!";
if ($kid == 0) {
    $SIG{TERM} = 'DEFAULT';
    my $t0 = time;
    for (1 .. 400) {
        $env->request(GET => '/kv_status');
        last if time - $t0 > 10;
    }
    POSIX::_exit(0);
}
my $t0 = time;
my $one = $env->request(GET => '/kv_status');
my $status_ms = (time - $t0) * 1000;
my @load = timed();
kill 'TERM', $kid;
waitpid($kid, 0);

is(scalar @load, 40, '40 requests routed to b2 while status is polled');
my ($b50, $l33, $l50, $lmax) = map { $_ * 1000 }
    $base[20], $load[13], $load[20], $load[-1];
note(sprintf 'one status page %.1f ms; requests: median %.1f ms alone, '
     . '%.1f ms (first third %.1f, max %.1f) under status', $status_ms,
     $b50, $l50, $l33, $lmax);
# A page is made whole by the worker that serves it, the zone's lock
# given up between chunks: a request that worker takes meanwhile waits
# for the page, one on the other worker waits a chunk at most.  The
# client polls back to back, so one worker or the other is always busy
# and about half the requests wait (under ASan a page is 60 to 120 ms,
# and the median, at that boundary, went from 18 to 44 ms run to run).
# With the lock held for a whole page every request would wait: so the
# first third must not.  25 ms over the median alone, or half of it on
# a machine so loaded that the median alone is tens of ms (under a load
# of 6 to 9 on 2 cores it was 88 ms: noise, not a lock).
my $bound = $b50 * 1.5 > $b50 + 25 ? $b50 * 1.5 : $b50 + 25;
cmp_ok($l33, '<', $bound, 'a third of the requests are not delayed');
cmp_ok($lmax, '<', 250, 'nor is the slowest');

$env->stop_nginx;
$env->check_logs_clean('status under load');

done_testing;
