# A hung Redis (issue 18, defect 2): redis-server SIGSTOPped for 15 s while
# an engine publishes about 5 MB/s of events through kvbridge.  Before,
# the bridge queued every PUBLISH in hiredis (a cap of 65,536 messages,
# not bytes), never noticed the link was hung, and kept what it grew:
# RSS rose about as fast as the engine published.  Now:
#   - the link is dropped once Redis has answered nothing for
#     --redis-timeout (5 s), and made again with a backoff;
#   - what waits for an answer is bounded in bytes (--redis-max-pending,
#     16m): the bridge's RSS stays within a stated bound during the stop
#     and comes back down after;
#   - what could not be sent spent its seq: the messages after the resume
#     show the gap, nginx asks for a resync, and is answered with a
#     snapshot of what the engine holds: nginx holds it, fresh.
# Real redis-server, kvbridge and nginx (when the module is built); the
# engine is this test, publishing vLLM's wire format (msgpack batches on
# ZeroMQ) at a steady rate; a Redis subscriber of this test's hears what
# nginx hears.

use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use KvAware::Launch qw(free_ports free_run wait_until slurp module_path);
use Test::KvAware::Redis;

my $BRIDGE = KvAware::Launch::kvbridge_binary();

plan skip_all => "$BRIDGE not built" unless -x $BRIDGE;

for my $m (qw(ZMQ::FFI Data::MessagePack)) {
    plan skip_all => "$m missing (make deps)" unless eval "require $m; 1";
}

require ZMQ::FFI::Constants;
ZMQ::FFI::Constants->import(qw(ZMQ_PUB ZMQ_SNDHWM));

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 150;

my $STOP_S   = 15;          # Redis stopped this long
my $RATE     = 1000;        # batches a second while it is stopped
my $BLOCKS   = 256;         # blocks a batch: about 5 KB of JSON out
my $BT       = 16;
# the stated bound: 16m pending, and as much again for hiredis
# formatting and growing its buffer, over the RSS before the stop
my $GROWTH_KB = 32 * 1024;
my $AFTER_KB  = 16 * 1024;  # over the baseline, once Redis is back

# under AddressSanitizer freed memory waits in its quarantine (256 MB)
# and RSS tells nothing of the bridge's own: those bounds are not checked
my $ASAN = (slurp($BRIDGE) // '') =~ /AddressSanitizer/;

my $json = JSON::PP->new->utf8;
my $mp = Data::MessagePack->new->prefer_integer(1);
my $l = KvAware::Launch->new(template => 'kvbridge-hung-XXXXXX',
                             watchdog => 1, diag => \&diag);

my ($redis, $port) = free_ports(2);
my $NGINX = -f module_path();
my $http = HTTP::Tiny->new(timeout => 10);
my $zmq = free_run(1);
my $SERVER = '127.0.0.1:9';

# the engine: a PUB the bridge connects to
my $zctx = ZMQ::FFI->new;
my $pub = $zctx->socket(ZMQ_PUB());
$pub->set(ZMQ_SNDHWM(), 'int', 100_000);
$pub->bind("tcp://127.0.0.1:$zmq");

$l->start_redis($redis, '--client-output-buffer-limit', 'pubsub 0 0 0');
my $sub = Test::KvAware::Redis->new($redis)->subscribe('kv_aware:events');
$l->start_kvbridge('--redis', "127.0.0.1:$redis",
                   '--engine', "$SERVER model=m events=tcp://127.0.0.1:$zmq");
my $bpid = $l->pid('kvbridge');

# nginx, subscribed to the same Redis, for the engine's server
if ($NGINX) {
    $l->write_nginx_conf(workers => 1, http => <<EOF);
    upstream llm {
        kv_aware keys=tokens block_tokens=$BT;
        kv_aware_events redis=127.0.0.1:$redis heartbeat=3s;
        server $SERVER;
    }

    server {
        listen 127.0.0.1:$port;
        location = /status { kv_aware_status; }
    }
EOF
    my ($ok, $err) = $l->start_nginx(workers => 1);
    ok($ok, 'nginx starts') or BAIL_OUT($err);
}

# nginx's view of the engine: (its events part, its server)
sub nginx_view {
    my $r = $http->get("http://127.0.0.1:$port/status");
    my $st = $r->{success} && eval { $json->decode($r->{content}) };
    my $up = $st ? $st->{upstreams}{llm} : undef;
    return $up ? ($up->{events}, $up->{servers}[0]) : ();
}

# batches: set k stored, then removed; the last set F stays
my $seq = 0;
my (@stored, @removed);
for my $k (0 .. 3) {
    my @h = map { $k * 100_000 + $_ } 1 .. $BLOCKS;
    my @ids = map { ($k * 7 + $_) % 30_000 } 1 .. $BLOCKS * $BT;
    push @stored, $mp->pack([time, [['BlockStored', \@h, undef, \@ids,
                                     $BT]]]);
    push @removed, $mp->pack([time, [['BlockRemoved', \@h]]]);
}
my @fh = map { 900_000 + $_ } 1 .. $BLOCKS;
my $final = $mp->pack([time, [['BlockStored', \@fh, undef,
                                [map { 20_000 + $_ } 1 .. $BLOCKS * $BT],
                                $BT]]]);

sub send_batch { $pub->send_multipart(['', pack('Q>', $seq++), $_[0]]) }

# publishes $rate batches a second for $secs s; samples the bridge's RSS
sub publish_for {
    my ($secs, $rate, $sample) = @_;
    my $t0 = time;
    my $n = 0;
    while ((my $t = time - $t0) < $secs) {
        my $want = int($t * $rate);
        while ($n < $want) {
            my $k = int($n / 2) % 4;
            send_batch($n % 2 ? $removed[$k] : $stored[$k]);
            $n++;
        }
        $sample->() if $sample;
        sleep 0.01;
    }
    # the last set stored is removed too: the engine holds nothing of them
    if ($n % 2) {
        send_batch($removed[int($n / 2) % 4]);
        $n++;
    }
    return $n;
}

sub rss_kb {
    my ($kb) = (slurp("/proc/$bpid/status") // '') =~ /VmRSS:\s+(\d+)/;
    return $kb // 0;
}

my %seen;       # what the subscriber heard of our server
sub drain {
    my ($t) = @_;
    for my $m ($sub->messages($t)) {
        my $msg = eval { $json->decode($m->[1]) } or next;
        next unless ($msg->{server} // '') eq $SERVER;
        push @{ $seen{seqs} }, $msg->{seq};
        my $snap = $msg->{snapshot} // '';
        if ($snap eq 'full' || $snap eq 'begin') {
            $seen{snap} = {};
        }
        if ($snap) {
            for my $ev (@{ $msg->{events} // [] }) {
                $seen{snap}{$_} = 1 for @{ $ev->{hashes} // [] };
            }
            $seen{snap_done} = 1 if $snap eq 'full' || $snap eq 'end';
        }
    }
}

# --- before: the link carries the engine's batches --------------------

sleep 0.5;                                      # the SUB joins
publish_for(2, 100);
ok(wait_until(10, sub { drain(0.1); @{ $seen{seqs} // [] } >= 150 }),
   'Redis hears the engine\'s batches through the bridge');
drain(1.5);                                     # all of it

# idle past the timeout: the links are kept alive, not taken for hung
drain(6);
unlike(slurp($l->prefix . '/logs/kvbridge.log') // '', qr/down:/,
       'a Redis that answers is not taken for hung, the subscriber idle');
drain(0.5);
my $base = rss_kb();
my $last_seq = $seen{seqs}[-1];
my %nginx_before;
if ($NGINX) {
    my ($ev, $srv);
    ok(wait_until(10, sub {
        ($ev, $srv) = nginx_view();
        $srv && $srv->{state} eq 'fresh' && $srv->{seq} >= $last_seq;
    }), 'nginx follows the engine, fresh');
    %nginx_before = (resyncs => $ev->{resyncs} // 0,
                     gaps => $srv->{events}{gaps} // 0);
}
diag("bridge RSS before the stop: $base kB");

# --- Redis stopped: the bridge must not grow with what it cannot send --

my $from = length(slurp($l->prefix . '/logs/kvbridge.log') // '');
kill 'STOP', $l->pid('redis');
my $t_stop = time;
my $peak = $base;
my $sent = publish_for($STOP_S, $RATE, sub {
    my $r = rss_kb();
    $peak = $r if $r > $peak;
});
my $stopped_log = substr(slurp($l->prefix . '/logs/kvbridge.log') // '',
                         $from);
diag(sprintf('%d batches in %.1f s while Redis was stopped; bridge RSS '
             . 'peak %d kB (+%d kB)', $sent, time - $t_stop, $peak,
             $peak - $base));

SKIP: {
    skip 'RSS under AddressSanitizer', 1 if $ASAN;
    cmp_ok($peak - $base, '<', $GROWTH_KB,
           'while Redis is stopped the bridge grows less than '
           . ($GROWTH_KB / 1024) . ' MB (--redis-max-pending 16m)');
}
like($stopped_log, qr/redis 127\.0\.0\.1:\d+ \(publish\) down: no reply in 5000 ms, hung/,
     'the hung publishing link is dropped within the timeout')
    or diag($stopped_log);
like($stopped_log, qr/message dropped \(\d+ bytes waiting for an answer, at most 16777216\)|\(publish\) down/,
     'past the cap, or with the link down, messages are dropped, counted');

# --- Redis back: reconnected, memory given back, nginx resyncs --------

kill 'CONT', $l->pid('redis');
my $t_cont = time;
ok(wait_until(15, sub {
    publish_for(0.2, 50);
    my $t = substr(slurp($l->prefix . '/logs/kvbridge.log') // '', $from);
    $t =~ /\(publish\) down.*publishing on/s;
}), 'the bridge reconnects after Redis resumes');
diag(sprintf('publishing again %.1f s after SIGCONT', time - $t_cont));

# what the engine holds at the end: set F
send_batch($final);
drain(1);
publish_for(1, 20);
drain(2);

# What the kernel had taken for the old link before it was reset may
# still reach Redis when it resumes (Redis reads what its socket holds
# before it sees the reset): a run of old seqs, then the new link's.
# Either way a seq is skipped, and nginx asks for a resync.
my @after = grep { $_ > $last_seq } @{ $seen{seqs} // [] };
my ($gap) = grep { $after[$_] != $after[$_ - 1] + 1 } 1 .. $#after;
ok(defined $gap,
   'after the resume the seqs heard skip those that were lost: a gap, '
   . 'so nginx asks for a resync ('
   . (defined $gap ? "$after[$gap - 1] then $after[$gap]" : 'none')
   . ", after $last_seq before the stop)");

Test::KvAware::Redis->new($redis)->cmd(PUBLISH => 'kv_aware:events:resync',
    $json->encode({ v => 1, type => 'resync', server => $SERVER }));
ok(wait_until(10, sub { drain(0.1); $seen{snap_done} }),
   'a resync is answered with a snapshot');
is(scalar(keys %{ $seen{snap} // {} }), $BLOCKS,
   "the snapshot holds what the engine holds ($BLOCKS blocks)");

SKIP: {
    skip 'the module is not built: no nginx', 1 unless $NGINX;
    my ($ev, $srv);
    # each round stores a set and removes it again: nginx holds just the
    # engine's blocks once the removal has come through too, which on a
    # loaded machine can be a while after the store
    ok(wait_until(20, sub {
        publish_for(0.2, 10);
        wait_until(2, sub {
            ($ev, $srv) = nginx_view();
            $srv && $srv->{state} eq 'fresh'
                && $srv->{entries}{event} == $BLOCKS
                && ($ev->{resyncs} // 0) > $nginx_before{resyncs};
        });
    }), 'nginx saw the gap, asked for a resync and holds the engine\'s '
        . "$BLOCKS blocks, fresh") or diag(explain([$ev, $srv]));
    diag(sprintf('nginx: %d resyncs asked (%d before), gaps %d (%d '
                 . 'before), %d event entries, %s',
                 $ev->{resyncs} // 0, $nginx_before{resyncs},
                 $srv->{events}{gaps} // 0, $nginx_before{gaps},
                 $srv->{entries}{event} // 0, $srv->{state} // '?'))
        if $srv;
}

my $after_kb = rss_kb();
diag("bridge RSS after the resume: $after_kb kB");
SKIP: {
    skip 'RSS under AddressSanitizer', 1 if $ASAN;
    cmp_ok($after_kb - $base, '<', $AFTER_KB,
           'the memory held for the hung link is given back');
}

ok(kill(0, $bpid), 'the bridge is still running');

$pub->close;
done_testing();
