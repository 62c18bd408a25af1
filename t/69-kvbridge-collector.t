# kvbridge's collector (--collect) against hostile peers (issue 18):
# peers that announce messages past --max-batch and never finish them
# leave the bridge's memory where it was (defect 1: three such peers of
# 256 MB pinned 775 MB), and the collector still takes an engine's
# batches afterwards; with --collect-allow a peer from another address
# is refused by ZeroMQ's ZAP handshake and one from an allowed address
# accepted; --collect-rate drops what a peer sends past its rate.  Real redis-server and kvbridge; the hostile peers
# speak ZMTP 3.0 by hand on a TCP socket (a ZeroMQ library would not
# send a message it has not got whole), the engine is ZMQ::FFI.

use strict;
use warnings;

use HTTP::Tiny;
use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use KvAware::Launch qw(free_ports wait_until slurp);
use Test::KvAware::Redis;

my $BRIDGE = KvAware::Launch::kvbridge_binary();
my $MODEL  = 'llama';
my $BT     = 16;
my $ENGINE = '127.0.0.1:9';                     # collected, topic "kv"

plan skip_all => "$BRIDGE not built" unless -x $BRIDGE;
# it runs no nginx: the stage that only changes nginx's build skips it
plan skip_all => 'no nginx in this test (KVA_NGINX_FREE=0)'
    if ($ENV{KVA_NGINX_FREE} // '') eq '0';

for my $m (qw(ZMQ::FFI Data::MessagePack)) {
    plan skip_all => "$m missing (make deps)" unless eval "require $m; 1";
}

$SIG{ALRM} = sub { die "test timed out\n" };
$SIG{PIPE} = 'IGNORE';
alarm 120;

my $json = JSON::PP->new->utf8;
my $mp = Data::MessagePack->new->prefer_integer(1);
my $l = KvAware::Launch->new(template => 'kvbridge-collect-XXXXXX',
                             watchdog => 1, diag => \&diag);

my ($redis, $collect, $page, $events) = free_ports(4);
my $BOUND = '127.0.0.1:10';                     # an engine the bridge reaches
$l->start_redis($redis);
my $sub = Test::KvAware::Redis->new($redis)->subscribe('kv_aware:events');

$l->start_kvbridge('--redis', "127.0.0.1:$redis",
                   '--engine', "$ENGINE model=$MODEL topic=kv",
                   '--collect', "tcp://127.0.0.1:$collect",
                   '--max-batch', '1m');

# --- 1. peers announcing 64 MB and sending all but its last byte --------

my $base = rss();
my $MB = 64;
my @peers = map { hostile_peer($MB * 1024 * 1024) } 1 .. 3;
sleep 1;
my $rss = rss();
diag("RSS $base kB at rest, $rss kB with 3 peers of $MB MB "
     . sprintf('(%d sent)', scalar grep { $_->{sent} > 1 << 20 } @peers));
cmp_ok($rss, '<', $base + 32 * 1024,
       "3 peers announcing $MB MB messages past --max-batch 1m: RSS "
       . "$rss kB, from $base kB");
close $_->{sock} for @peers;

# --- 2. the collector still takes a real engine's batches ---------------

my $zctx = ZMQ::FFI->new;
my $pub = $zctx->socket(ZMQ::FFI::Constants::ZMQ_PUB());
$pub->connect("tcp://127.0.0.1:$collect");
my $seq = 0;
ok(wait_until(10, sub {
       $pub->send_multipart(['kv', pack('Q>', $seq++), batch($seq)]);
       stored($ENGINE, 0.2);
   }), 'then an engine\'s batch on the collector reaches Redis')
    or diag(bridge_log());
$pub->close;

ok(kill(0, $l->pid('kvbridge')), 'the bridge is still running');

# --- 3. --collect-allow: only the engines' hosts may publish -------------

$l->stop('kvbridge');
$l->start_kvbridge('--redis', "127.0.0.1:$redis",
                   '--engine', "$ENGINE model=$MODEL topic=kv",
                   '--engine', "$BOUND model=$MODEL "
                               . "events=tcp://127.0.0.1:$events",
                   '--collect', "tcp://127.0.0.1:$collect",
                   '--collect-allow', '127.0.0.2', '--collect-rate', 50,
                   '--metrics', "127.0.0.1:$page");
$sub->messages(0.5);                            # what came before

# ZeroMQ binds the connecting side to a source address: "src;dst"
my $from1 = $zctx->socket(ZMQ::FFI::Constants::ZMQ_PUB());
$from1->connect("tcp://127.0.0.1:0;127.0.0.1:$collect");
my $from2 = $zctx->socket(ZMQ::FFI::Constants::ZMQ_PUB());
$from2->connect("tcp://127.0.0.2:0;127.0.0.1:$collect");

$seq = 0;
my $t = time;
my $got = 0;
while (time < $t + 3 && !$got) {
    $from1->send_multipart(['kv', pack('Q>', $seq++), batch($seq)]);
    $got = stored($ENGINE, 0.1);
}
ok(!$got, 'a publisher from 127.0.0.1, not allowed: none of its '
          . "$seq batches reaches Redis");
like(bridge_log(), qr/a peer from 127\.0\.0\.1 refused/,
     'its connection is refused, and logged');
cmp_ok(metric('kvbridge_collect_denied_total'), '>', 0,
       'and counted: kvbridge_collect_denied_total '
       . metric('kvbridge_collect_denied_total'));
$from1->close;

$seq = 0;
ok(wait_until(10, sub {
       $from2->send_multipart(['kv', pack('Q>', $seq++), batch($seq)]);
       stored($ENGINE, 0.1);
   }), 'a publisher from 127.0.0.2, allowed: its batches reach Redis')
    or diag(bridge_log());

# the engines the bridge connects to are not behind the allow list
my $bound = $zctx->socket(ZMQ::FFI::Constants::ZMQ_PUB());
$bound->bind("tcp://127.0.0.1:$events");
$seq = 0;
ok(wait_until(10, sub {
       $bound->send_multipart(['', pack('Q>', $seq++), batch($seq)]);
       stored($BOUND, 0.1);
   }), 'an engine the bridge connects to (from 127.0.0.1) still gets '
       . 'its batches through') or diag(bridge_log());
$bound->close;

# --- 4. --collect-rate: a peer past 50 messages a second is cut short ----

my $before = metric('kvbridge_engine_batches_total');
$from2->send_multipart(['kv', pack('Q>', $seq++), batch($seq)])
    for 1 .. 1000;
$sub->messages(1);
my $limited = metric('kvbridge_collect_limited_total');
my $batches = metric('kvbridge_engine_batches_total') - $before;
cmp_ok($limited, '>', 500, "1,000 messages at once: $limited dropped "
                           . "past the rate");
cmp_ok($batches, '<=', 200, "$batches of them handed on");
like(bridge_log(), qr/past --collect-rate 50 messages a second/,
     'and logged');
$from2->close;

ok(kill(0, $l->pid('kvbridge')), 'the bridge is still running');

done_testing();


# --- helpers ------------------------------------------------------------

sub bridge_log { slurp($l->prefix . '/logs/kvbridge.log') // '' }

# a vLLM batch of one block, whose hash is $n
sub batch {
    my ($n) = @_;
    my @ids = map { 5000 + $_ } 1 .. $BT;
    return $mp->pack([1.0, [['BlockStored', [$n], undef, \@ids, $BT]]]);
}

# a sample of the bridge's page, summed over its labels
sub metric {
    my ($name) = @_;
    my $r = HTTP::Tiny->new(timeout => 5)
        ->get("http://127.0.0.1:$page/metrics");
    my $sum = 0;
    $sum += $1 while $r->{content} =~ /^\Q$name\E(?:\{[^}]*\})? (\S+)$/mg;
    return $sum;
}

sub rss {
    my ($kb) = (slurp('/proc/' . $l->pid('kvbridge') . '/status') // '')
        =~ /VmRSS:\s+(\d+)/;
    return $kb // 0;
}

# a ZMTP 3.0 PUB that greets, then sends the header of a one-part message
# of $size bytes and $size - 1 of them, as fast as the bridge takes them
sub hostile_peer {
    my ($size) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$collect",
                                  Proto => 'tcp') or die "connect: $!";
    my $greeting = "\xff" . ("\0" x 8) . "\x7f" . "\x03\x00"
                   . "NULL" . ("\0" x 16) . "\0" . ("\0" x 31);
    my $ready = "\x05READY" . "\x0bSocket-Type" . pack('N', 3) . 'PUB';
    syswrite($s, $greeting . "\x04" . chr(length $ready) . $ready);
    syswrite($s, "\x02" . pack('Q>', $size));
    my $p = { sock => $s, sent => 0 };
    my $chunk = 'x' x (1 << 20);
    my $deadline = time + 20;
    $s->blocking(0);
    while ($p->{sent} < $size - 1 && time < $deadline) {
        my $want = $size - 1 - $p->{sent};
        my $n = syswrite($s, $chunk, $want < length $chunk ? $want
                                                           : length $chunk);
        if (!defined $n) {
            last unless $!{EAGAIN};
            # the bridge reads no faster than the loop: wait for room
            my $w = '';
            vec($w, fileno($s), 1) = 1;
            last unless select(undef, $w, undef, 1);
            next;
        }
        $p->{sent} += $n;
    }
    return $p;
}

# a "stored" event for $server came on the channel within $t s
sub stored {
    my ($server, $t) = @_;
    for my $m ($sub->messages($t)) {
        my $msg = eval { $json->decode($m->[1]) } or next;
        next unless ($msg->{server} // '') eq $server;
        return 1 if grep { $_->{type} eq 'stored' } @{ $msg->{events} // [] };
    }
    return 0;
}
