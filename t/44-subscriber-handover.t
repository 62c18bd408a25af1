# kv_aware precise mode: reloads hand the subscription over.
#
# On a reload the old cycle's subscriber stays subscribed until the new
# cycle's has subscribed, then lets go; for a moment both receive what is
# published, and what one applied the other skips.  So a steady stream of
# events across reloads loses nothing and repeats nothing: no gap is
# counted, the server stays fresh (no resync needed), and every message
# is applied exactly once.  (Before 0.2.0 the old subscriber left at once:
# what was published until the new one subscribed was lost, every reload
# counted a gap and degraded every server.)

use strict;
use warnings;

use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $JSON $CHANNEL $LOCATIONS preflight addr upstream_conf status
    server_status wait_status redis_connect
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 2,
                             log_level => 'info');
my @A = map { addr($env, $_) } 1 .. 3;

$env->conf(http_config => upstream_conf(kv_aware => '',
                                        events => 'heartbeat=60s'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start');
ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }), 'subscribed');

# server 1 publishes a message every 5 ms, at most 4,000 (20 s)
my $count = $env->prefix . '/published';
my $kid = fork // die "fork: $!";
if ($kid == 0) {
    my $stop = 0;
    $SIG{TERM} = sub { $stop = 1 };
    my $c = redis_connect($env->redis_port);
    my $seq = 0;
    while (!$stop && $seq < 4000) {
        $seq++;
        $c->cmd(PUBLISH => $CHANNEL, $JSON->encode({
            v => 1, server => $A[0], seq => $seq,
            events => [{ type => 'stored',
                         hashes => [sprintf '%016x', $seq] }] }));
        sleep 0.005;
    }
    open(my $fh, '>', $count) or POSIX::_exit(1);
    print {$fh} "$seq\n";
    close $fh;
    POSIX::_exit(0);
}

sub s1 { server_status(status($env), $A[0]) }

ok(wait_until_s1(sub { $_[0]{state} eq 'fresh' && $_[0]{seq} >= 20 }),
   'server 1 fresh, its events flowing');

sub wait_until_s1 {
    my ($cond) = @_;
    return wait_status($env, 5, sub {
        my $s = server_status($_[0], $A[0]);
        return $s && $cond->($s);
    });
}

my $reloads = 0;
for (1 .. 5) {
    $reloads++ if $env->reload(quiet => 1);
    my $seq = s1()->{seq};
    wait_until_s1(sub { $_[0]{seq} >= $seq + 20 });
}
is($reloads, 5, '5 reloads with events flowing');

kill 'TERM', $kid;
waitpid($kid, 0);
open(my $fh, '<', $count) or die "no count: $!";
my $published = <$fh>;
chomp $published;
ok(wait_until_s1(sub { $_[0]{seq} == $published }),
   "nginx saw all $published");

my $s = s1();
is($s->{events}{gaps}, 0, 'no gap counted');
is($s->{state}, 'fresh', 'server 1 still fresh');
is($s->{events}{messages}, $published, 'every message applied once');
is($s->{entries}{event}, $published, 'every hash in the index');
is(status($env)->{events}{resyncs}, 0, 'no resync asked');

$env->stop_nginx;
$env->check_logs_clean('handover');
like($env->error_log, qr/takes the subscription over/,
     'the handovers are logged');

done_testing;
