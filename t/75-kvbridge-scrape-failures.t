# The bridge says when it cannot read an engine's load (issue 18, defect
# 17).  Before, a /metrics that always failed was silent: the failures
# were counted in a struct nobody read, and the load simply stopped.  Now
# each failure kind is logged, with the engine and the URL, at most once
# every 5 s a kind ("and N more like it"), and a working /metrics logs
# nothing.  Engines: a wrong port (refused), a kvsim path that answers 404,
# a server that answers gzip, one that accepts and never answers
# (timeout), and kvsim's own /metrics (fine).  Real redis-server, kvsim
# and kvbridge; the gzip and silent servers are this test's children.

use strict;
use warnings;

use IO::Socket::INET;
use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);

use KvAware::Launch qw(free_ports free_run wait_until slurp);

my $BRIDGE = KvAware::Launch::kvbridge_binary();

plan skip_all => "$BRIDGE not built" unless -x $BRIDGE;
# it runs no nginx: the stage that only changes nginx's build skips it
plan skip_all => 'no nginx in this test (KVA_NGINX_FREE=0)'
    if ($ENV{KVA_NGINX_FREE} // '') eq '0';

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 90;

my $l = KvAware::Launch->new(template => 'kvbridge-scrape-XXXXXX',
                             watchdog => 1, diag => \&diag);

my ($redis, $kv, $refused, $gzip, $silent) = free_ports(5);
my $zmq = free_run(2);

$l->start_redis($redis);
$l->start_kvsim($kv, 1, qw(--time-scale 50 --keyspace tokens --events zmq
                           --redis off --model m), '--zmq-port', $zmq);

# the gzip server answers every request so; the silent one only listens
my $gz = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $gzip,
                               Listen => 16, ReuseAddr => 1)
    or die "listen $gzip: $!";
my $quiet = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                  LocalPort => $silent, Listen => 64,
                                  ReuseAddr => 1)
    or die "listen $silent: $!";

my $child = fork // die "fork: $!";
if ($child == 0) {
    # not the launcher's handlers, nor its cleanup at exit: ours are the
    # parent's processes
    $SIG{$_} = 'DEFAULT' for qw(TERM INT HUP ALRM);
    alarm 80;
    while (my $c = $gz->accept) {
        my $req = '';
        while ($req !~ /\r\n\r\n/) {
            sysread($c, $req, 4096, length $req) or last;
        }
        my $body = "\x1f\x8b\x08\x00" . ("\0" x 16);
        print {$c} "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                   . "Content-Encoding: gzip\r\nContent-Length: "
                   . length($body) . "\r\n\r\n$body";
        close $c;
    }
    POSIX::_exit(0);
}
close $gz;

my %ENGINE = (
    refused => "http://127.0.0.1:$refused/metrics",
    notfound => "http://127.0.0.1:$kv/no-metrics-here",
    gzip => "http://127.0.0.1:$gzip/metrics",
    silent => "http://127.0.0.1:$silent/metrics",
    fine => "http://127.0.0.1:$kv/metrics",
);
my %ADDR;
my $n = 0;
my @args;
for my $e (sort keys %ENGINE) {
    $ADDR{$e} = '127.0.0.1:' . (20001 + $n++);
    # events of a port nobody binds, but the fine one's: kvsim's
    my $ev = $e eq 'fine' ? $zmq : 1;
    $ADDR{$e} = "127.0.0.1:$kv" if $e eq 'fine';
    push @args, '--engine', "$ADDR{$e} model=m events=tcp://127.0.0.1:$ev "
                            . "metrics=$ENGINE{$e}";
}

my $t0 = time;
$l->start_kvbridge('--redis', "127.0.0.1:$redis", '--metrics-interval', 200,
                   @args);

sub bridge_log { slurp($l->prefix . '/logs/kvbridge.log') // '' }

sub failed_re {
    my ($e, $kind, $why) = @_;
    return qr/engine \Q$ADDR{$e}\E: metrics \Q$ENGINE{$e}\E: scrape failed \(\Q$kind\E\): $why/;
}

my %want = (
    refused => ['connect', qr/connect\(\): Connection refused/],
    notfound => ['status', qr/HTTP status 404/],
    gzip => ['encoding', qr/unsupported Content-Encoding "gzip"/],
    silent => ['timeout', qr/timed out after 2000 ms waiting for the response/],
);

ok(wait_until(15, sub {
    my $log = bridge_log();
    !grep { $log !~ failed_re($_, @{ $want{$_} }) } keys %want;
}), 'each failing /metrics is logged with the engine, the URL, the kind '
    . 'and why') or diag(bridge_log());

for my $e (sort keys %want) {
    like(bridge_log(), failed_re($e, @{ $want{$e} }), "$e: $want{$e}[0]");
}

# 200 ms a scrape: about 30 failures of each in 6 s, two lines at most
sleep(7 - (time - $t0)) if time - $t0 < 7;
my $log = bridge_log();
for my $e (qw(refused notfound gzip)) {
    my $lines = () = $log =~ /${\ failed_re($e, @{ $want{$e} })}/g;
    ok($lines >= 1 && $lines <= 2, "$e: rate-limited, $lines lines in "
       . sprintf('%.0f', time - $t0) . ' s of failures every 200 ms');
}
like($log, qr/${\ failed_re('refused', @{ $want{refused} })} \(and \d+ more like it\)/,
     'the next line counts those it did not print');
unlike($log, qr/engine \Q$ADDR{fine}\E: metrics .*scrape failed/,
       'the working /metrics logs no failure');

kill 'KILL', $child;
waitpid($child, 0);
done_testing();
