# kvbridge's engines against failing ones (issue 18), no nginx (t/66 has
# it): engines are Perl PUB sockets speaking vLLM's wire format, without
# a replay endpoint (vLLM's default):
#
#   G  (defect 6) an engine holding 1,000 blocks, 100 stored and 100
#      evicted a batch, 9 of its 61 batches lost on the wire: what the
#      bridge publishes and snapshots never holds more than the engine,
#      no block evicted in a lost batch, and every later batch's blocks;
#   S  (defect 7) 100,000 blocks, --snapshot-rate 512k: the snapshot is
#      paced at that rate (no second of it past 1 MB, nginx's
#      server_bytes=1m), and a resync asked every second while one runs
#      (3.8 s) does not restart it: snapshots end;
#   L  (defect 7) a snapshot of 80,000 blocks while the engine's live
#      messages take about 340 kB a second: the snapshot gets what they
#      leave, no second of the two over 1 MB (the rate, a tenth of it
#      saved up and one part: 715 kB at most; a snapshot paced at the
#      rate beside them would reach 1.06 MB);
#   M  (defects 16, 10) one batch over --max-batch: the bridge logs the
#      disconnect, reconnects, and the next batches arrive, the lost one
#      taken for a gap ("cleared"); an engine whose PUB socket is closed
#      gets no heartbeats until it binds again.
# Real redis-server and kvbridge.

use strict;
use warnings;

use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use KvAware::Launch qw(free_ports free_run wait_until slurp);
use Test::KvAware::Redis;

my $BRIDGE = KvAware::Launch::kvbridge_binary();
my $KEYS   = 'build/kva_token_keys';
my $MODEL  = 'm';
my $BT     = 16;

plan skip_all => "$BRIDGE not built" unless -x $BRIDGE;
# it runs no nginx: the stage that only changes nginx's build skips it
plan skip_all => 'no nginx in this test (KVA_NGINX_FREE=0)'
    if ($ENV{KVA_NGINX_FREE} // '') eq '0';
plan skip_all => "$KEYS not built (make tools)" unless -x $KEYS;

for my $m (qw(ZMQ::FFI Data::MessagePack)) {
    plan skip_all => "$m missing (make deps)" unless eval "require $m; 1";
}

require ZMQ::FFI::Constants;
ZMQ::FFI::Constants->import(qw(ZMQ_PUB ZMQ_LINGER));

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 240;

my $json = JSON::PP->new->utf8->canonical;
my $mp = Data::MessagePack->new->prefer_integer(1);
my $l = KvAware::Launch->new(template => 'kvbridge-engine-XXXXXX',
                             watchdog => 1, diag => \&diag);

my ($redis) = free_ports(1);
my $zmq = free_run(4);
my %E = (G => { addr => '127.0.0.1:6', port => $zmq },
         S => { addr => '127.0.0.1:7', port => $zmq + 1 },
         M => { addr => '127.0.0.1:16', port => $zmq + 2 },
         L => { addr => '127.0.0.1:17', port => $zmq + 3 });

$l->start_redis($redis);
my $zctx = ZMQ::FFI->new;
bind_engine($_) for sort keys %E;

my $sub = Test::KvAware::Redis->new($redis)->subscribe('kv_aware:events');
$l->start_kvbridge('--redis', "127.0.0.1:$redis", '--heartbeat', 200,
    '--snapshot-rate', '512k', '--max-batch', '256k',
    map { ('--engine', "$E{$_}{addr} model=$MODEL "
                       . "events=tcp://127.0.0.1:$E{$_}{port}") } sort keys %E);
sleep 1;                                    # the bridge's SUBs connect

my %held;       # server => { key => 1 }, as nginx would hold it
my %snap;       # server => { key => 1 }, the last snapshot
my %log;        # server => [[time, bytes, snapshot, seq, events], ...]
my %cleared;    # server => count

# --- G: lost batches without replay: no ghosts, new blocks published ----

my $G = $E{G}{addr};
my @lost_removed;       # engine hashes evicted in lost batches
my @last_stored;        # the last batch's
{
    my @held = (0 .. 999);
    send_batch('G', [map { stored($_) } @held]);
    my $next = 1000;
    for my $i (1 .. 60) {
        my @new = ($next .. $next + 99);
        $next += 100;
        my @gone = splice @held, 0, 100;
        push @held, @new;
        # lost batches evict what batches on the wire stored
        my $lost = $i % 7 == 3;
        push @lost_removed, @gone if $lost;
        @last_stored = @new;
        send_batch('G', [(map { stored($_) } @new),
                         ['BlockRemoved', \@gone]], $lost);
        drain(0.02);
    }
}
my @want = map { key_of($_) } @last_stored[0 .. 9];
ok(wait_until(10, sub { drain(0.1); !grep { !$held{$G}{$_} } @want }),
   'G: after 9 lost batches of 60, its last batch is still published');
cmp_ok(scalar(keys %{ $held{$G} }), '<=', 1000,
       'what nginx holds of G is at most the 1,000 blocks G holds: '
       . scalar(keys %{ $held{$G} }));
ok(resync($G), 'a resync of G is answered');
my $n = scalar(grep { $_ ne '__done' } keys %{ $snap{$G} });
cmp_ok($n, '<=', 1000, "its snapshot: $n blocks, not more than G holds");
my @ghosts = grep { $snap{$G}{$_} }
             map { key_of($lost_removed[$_]) }
             grep { $_ % 50 == 0 } 0 .. $#lost_removed;
is(scalar(@ghosts), 0, 'no block evicted in a lost batch in it');
ok(!grep({ !$snap{$G}{$_} } @want), 'and the last batch\'s blocks');
cmp_ok($cleared{$G} // 0, '>=', 1, 'nginx heard "cleared" for the gaps');
like(bridge_log(), qr/engine \Q$G\E: events lost \(no replay endpoint\): its \d+ blocks forgotten/,
     'the bridge says what it forgot');

# --- S: pacing and coalescing -------------------------------------------

my $S = $E{S}{addr};
for my $b (0 .. 99) {
    send_batch('S', [map { stored(1_000_000 + $b * 1000 + $_) } 0 .. 999]);
    drain(0.01);
}
ok(wait_until(20, sub { drain(0.1); keys %{ $held{$S} } >= 100_000 }),
   'S: 100,000 blocks published')
    or diag(scalar(keys %{ $held{$S} }) . ' held');
drain(0.5);

$log{$S} = [];
ok(resync($S, 15), 'one resync of S: answered');
my @parts = grep { $_->[2] } @{ $log{$S} };
my $bytes = 0;
$bytes += $_->[1] for @parts;
my $dt = @parts > 1 ? $parts[-1][0] - $parts[0][0] : 0;
my $rate = $dt > 0 ? ($bytes - $parts[-1][1]) / $dt : 0;
cmp_ok($rate, '<=', 1.2 * 512 * 1024,
       sprintf('--snapshot-rate 512k: %d bytes in %.2f s, %.0f kB/s',
               $bytes, $dt, $rate / 1024));
cmp_ok($rate, '>=', 0.6 * 512 * 1024, 'and not far below it');
my $peak = peak_second(\@parts);
cmp_ok($peak, '<=', 1024 * 1024,
       "no second of it over nginx's server_bytes=1m: $peak bytes at most");

# a resync every second while snapshots of 3.8 s run
$log{$S} = [];
my $t0 = time;
my $asked = 0;
while (time - $t0 < 9) {
    ask($S);
    $asked++;
    my $until = time + 1;
    drain(0.1) while time < $until;
}
drain(0.3);
my @snaps = map { $_->[2] } grep { $_->[2] } @{ $log{$S} };
my $begins = grep { $_ eq 'begin' || $_ eq 'full' } @snaps;
my $ends = grep { $_ eq 'end' || $_ eq 'full' } @snaps;
cmp_ok($ends, '>=', 1, "$asked resyncs, one a second: $begins snapshots "
       . "begun, $ends ended");
cmp_ok($begins, '<=', $ends + 1, 'none begun again before its end');
ok(wait_until(10, sub { drain(0.1); $snap{$S}{__done} }),
   'the one asked during the last ends too');
is(scalar(grep { $_ ne '__done' } keys %{ $snap{$S} }), 100_000,
   'with the 100,000 blocks');

# --- L: a snapshot paced by what live messages leave ---------------------

my $L = $E{L}{addr};
for my $b (0 .. 79) {
    send_batch('L', [map { stored(2_000_000 + $b * 1000 + $_) } 0 .. 999]);
    drain(0.01);
}
sleep 1;
drain(0.5);
$log{$L} = [];
{
    # 600 blocks stored and the 600 before removed every 0.1 s
    my ($h, $t0, $asked, @prev) = (3_000_000, time, 0);
    while (time - $t0 < 30) {
        my @new = ($h .. $h + 599);
        $h += 600;
        send_batch('L', [(map { stored($_) } @new),
                         @prev ? ['BlockRemoved', \@prev] : ()]);
        @prev = @new;
        if (!$asked && time - $t0 > 1) {
            ask($L);
            $asked = time;
        }
        my $until = time + 0.1;
        drain($until - time) while time < $until;
        last if $asked && grep { $_->[2] =~ /^(end|full)$/ } @{ $log{$L} };
    }
}
my @l = @{ $log{$L} };
my ($lb) = grep { $l[$_][2] =~ /^(begin|full)$/ } 0 .. $#l;
my ($le) = grep { $l[$_][2] =~ /^(end|full)$/ } 0 .. $#l;
ok(defined $le, 'a resync while live messages flow: the snapshot ends')
    or diag(scalar(@l) . ' messages');
my @during = defined $le ? @l[$lb .. $le] : @l;
my ($live, $snapb) = (0, 0);
$_->[2] ? ($snapb += $_->[1]) : ($live += $_->[1]) for @during;
my $span = @during > 1 ? $during[-1][0] - $during[0][0] : 0;
$peak = peak_second(\@during);
cmp_ok($peak, '<=', 1024 * 1024, sprintf('no second of live and snapshot '
       . 'messages over server_bytes=1m: %d at most; in %.1f s %d kB '
       . 'live, %d kB of snapshot', $peak, $span, $live / 1024,
       $snapb / 1024));

# --- M: a batch over --max-batch; a closed PUB ---------------------------

my $M = $E{M}{addr};
send_batch('M', [stored(5_000_000)]);
ok(wait_until(5, sub { drain(0.1); $held{$M}{ key_of(5_000_000) } }),
   'M: its first block arrives');
my $mark = length(bridge_log());
my @big = map { 100_000 + $_ } 1 .. 120_000;     # ~360 kB of msgpack
send_batch('M', [['BlockStored', [6_000_000], undef, \@big, scalar(@big)]]);
my $k = 7_000_000;
ok(wait_until(15, sub {
    send_batch('M', [stored($k++)]);
    drain(0.2);
    $held{$M}{ key_of($k - 1) };
}), 'after a batch over --max-batch (256k), later batches arrive')
    or diag(substr(bridge_log(), $mark));
like(substr(bridge_log(), $mark),
     qr/engine \Q$M\E: its events socket \S+ disconnected/,
     'the bridge logged the disconnect');
cmp_ok($cleared{$M} // 0, '>=', 1, 'the lost batch counted as a gap: '
       . '"cleared"');

# heartbeats say that the engine's socket is connected
drain(0.5);
$E{M}{pub}->close;
delete $E{M}{pub};
sleep 0.5;
drain(0.1);
$log{$_} = [] for $M, $G;
drain(1.5);
is(scalar(@{ $log{$M} }), 0, 'M\'s PUB closed: no heartbeats for it in '
   . '1.5 s (--heartbeat 200)');
cmp_ok(scalar(@{ $log{$G} // [] }), '>', 0, 'G\'s go on');
bind_engine('M');
ok(wait_until(5, sub { drain(0.1); @{ $log{$M} } > 0 }),
   'M bound again: heartbeats again');

ok(kill(0, $l->pid('kvbridge')), 'the bridge is still running');

done_testing();


# --- helpers ------------------------------------------------------------

sub bind_engine {
    my ($e) = @_;
    my $pub = $zctx->socket(ZMQ_PUB());
    $pub->set(ZMQ_LINGER(), 'int', 0);
    # again after a close: another process may hold the port a while
    for my $try (1 .. 10) {
        last if eval { $pub->bind("tcp://127.0.0.1:$E{$e}{port}"); 1 };
        die $@ if $try == 10;
        sleep 0.5;
    }
    $E{$e}{pub} = $pub;
    $E{$e}{seq} //= 0;
}

# one batch, its seq spent; $lost: not sent (as lost on the wire)
sub send_batch {
    my ($e, $events, $lost) = @_;
    my $seq = $E{$e}{seq}++;
    return if $lost;
    $E{$e}{pub}->send_multipart(['', pack('Q>', $seq),
                                 $mp->pack([time, $events])]);
}

# engine block $h: a block of its own (no parent), ids of its own
sub ids_of { my ($h) = @_; return [map { 16 * $h + $_ } 1 .. $BT] }
sub stored {
    my ($h) = @_;
    return ['BlockStored', [$h], undef, ids_of($h), $BT];
}

sub key_of {
    my ($h) = @_;
    my $in = join ' ', @{ ids_of($h) };
    my ($key) = split /\n/, `echo '$in' | $KEYS $BT '$MODEL'`;
    return $key;
}

sub bridge_log { slurp($l->prefix . '/logs/kvbridge.log') // '' }

sub ask {
    my ($s) = @_;
    Test::KvAware::Redis->new($redis)->cmd(PUBLISH => 'kv_aware:events:resync',
        $json->encode({ v => 1, type => 'resync', server => $s }));
}

sub resync {
    my ($s, $t) = @_;
    delete $snap{$s};
    ask($s);
    return wait_until($t // 10, sub {
        drain(0.1);
        $snap{$s} && $snap{$s}{__done};
    });
}

# the most bytes of @$parts in any second
sub peak_second {
    my ($parts) = @_;
    my ($peak, $sum, $j) = (0, 0, 0);
    for my $i (0 .. $#$parts) {
        $sum += $parts->[$i][1];
        while ($parts->[$i][0] - $parts->[$j][0] > 1.0) {
            $sum -= $parts->[$j++][1];
        }
        $peak = $sum if $sum > $peak;
    }
    return $peak;
}

# applies what came on the channel for up to $t s
sub drain {
    my ($t) = @_;
    for my $m ($sub->messages($t)) {
        if ($m->[1] =~ /"server":"\Q$E{L}{addr}\E"/) {
            # L's are many: timed, not decoded
            my ($snap) = $m->[1] =~ /"snapshot":"(\w+)"/;
            push @{ $log{ $E{L}{addr} } }, [time, length($m->[1]),
                                            $snap // '', 0,
                                            $m->[1] =~ /"stored"/ ? 1 : 0];
            next;
        }
        my $msg = eval { $json->decode($m->[1]) } or next;
        my $s = $msg->{server};
        my $snap = $msg->{snapshot} // '';
        push @{ $log{$s} }, [time, length($m->[1]), $snap, $msg->{seq},
                             scalar(@{ $msg->{events} // [] })];
        if ($snap eq 'full' || $snap eq 'begin') {
            $held{$s} = {};
            $snap{$s} = {};
        }
        for my $ev (@{ $msg->{events} // [] }) {
            if ($ev->{type} eq 'cleared') {
                $held{$s} = {};
                $cleared{$s}++;
            } elsif ($ev->{type} eq 'stored') {
                $held{$s}{$_} = 1 for @{ $ev->{hashes} };
                $snap{$s}{$_} = 1 for $snap ? @{ $ev->{hashes} } : ();
            } elsif ($ev->{type} eq 'removed') {
                delete $held{$s}{$_} for @{ $ev->{hashes} };
            }
        }
        $snap{$s}{__done} = 1 if $snap eq 'full' || $snap eq 'end';
    }
}
