# kvbridge's stream against hostile and flooding peers (issue 18):
#
#  1. defect 8: on the collector, anyone is whichever engine its topic
#     names.  A stray frame with seq 0, and one with seq 2^63 followed by
#     the real engine's next batch, must leave nginx's view of the engine
#     (what the bridge publishes on Redis) as it was: no "cleared", every
#     block kept, the stray's own block never announced.  A real restart
#     (a new process from seq 0, two batches) still clears.
#  2. defect 3: an engine's replay ROUTER answers with a flood of valid
#     73 KB batches, as fast as it can; another engine publishing every
#     20 ms must keep reaching Redis promptly (today's code froze the loop
#     for seconds), and the bridge's memory stays bounded.
#  3. a third engine (no replay socket, so nothing is held for a replay)
#     floods its event socket with those batches as fast as it can: the
#     bridge's memory stays bounded (with no high-water mark on its SUB
#     socket, ZeroMQ read them all ahead of the loop: hundreds of MB in
#     seconds), and the other engine keeps being heard.
#
# Real redis-server and kvbridge; the engines are Perl ZeroMQ peers
# sending what vLLM sends ([topic, seq, msgpack batch]; replies
# ["", seq, batch], the end seq -1).

use strict;
use warnings;

use IO::Handle;
use IO::Select;
use JSON::PP;
use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);

use KvAware::Launch qw(free_ports free_run wait_until slurp);
use IO::Socket::INET;

my $BRIDGE = KvAware::Launch::kvbridge_binary();
my $KEYS   = 'build/kva_token_keys';
my $MODEL  = 'llama';
my $BT     = 16;
my $FLOOD  = $ENV{KVB_FLOOD} // 5000;          # replies in the flood
my $PERIOD = 0.02;                              # the other engine's pace

plan skip_all => "$BRIDGE not built" unless -x $BRIDGE;
# it runs no nginx: the stage that only changes nginx's build skips it
plan skip_all => 'no nginx in this test (KVA_NGINX_FREE=0)'
    if ($ENV{KVA_NGINX_FREE} // '') eq '0';
plan skip_all => "$KEYS not built (make tools)" unless -x $KEYS;

for my $m (qw(ZMQ::FFI Data::MessagePack)) {
    plan skip_all => "$m missing (make deps)" unless eval "require $m; 1";
}

require ZMQ::FFI::Constants;
ZMQ::FFI::Constants->import(qw(ZMQ_PUB ZMQ_ROUTER ZMQ_SNDHWM));

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 150;

my $json = JSON::PP->new->utf8->canonical;
my $mp = Data::MessagePack->new->prefer_integer(1);
my $l = KvAware::Launch->new(template => 'kvbridge-stream-XXXXXX',
                             watchdog => 1, diag => \&diag);

my ($redis, $pn, $pf, $pg, $ph, $collect) = free_ports(6);
my $zmq = free_run(4);
my ($zf, $zg, $zh) = ($zmq, $zmq + 2, $zmq + 3); # F's replay on $zf + 1
my $N = "127.0.0.1:$pn";                        # collected, topic kv@n
my $F = "127.0.0.1:$pf";                        # floods its replay
my $G = "127.0.0.1:$pg";                        # publishes meanwhile
my $H = "127.0.0.1:$ph";                        # floods its events

# the other engine's batches and their keys, before anything runs
# (one chain: block i's parent is block i - 1, so one call keys them all)
my $GN = 300;
my @gkey = keys_of_ids([map { @{ g_ids($_) } } 0 .. $GN - 1]);
my %gseq = map { $gkey[$_] => $_ } 0 .. $GN - 1;
die "G's keys: " . scalar(@gkey) unless @gkey == $GN;

# the flooding engine and the other one: children with their own contexts
my $dir = $l->prefix;
my ($f_ctl, $f_pid) = child(\&engine_f);
my ($g_ctl, $g_pid) = child(\&engine_g);
my ($h_ctl, $h_pid) = child(\&engine_h);

$l->start_redis($redis, '--client-output-buffer-limit', 'pubsub 0 0 0');
my $sub = subscribe($redis, 'kv_aware:events');
$l->start_kvbridge('--redis', "127.0.0.1:$redis",
    '--engine', "$N model=$MODEL topic=kv\@n",
    '--engine', "$F model=$MODEL events=tcp://127.0.0.1:$zf"
                . ' replay=tcp://127.0.0.1:' . ($zf + 1),
    '--engine', "$G model=$MODEL events=tcp://127.0.0.1:$zg",
    '--engine', "$H model=$MODEL events=tcp://127.0.0.1:$zh",
    '--collect', "tcp://127.0.0.1:$collect", '--replay-timeout', 2000);

my (%held, %cleared, %arrived, %last_at);

# --- 1. strays on the collector -------------------------------------------

my $zctx = ZMQ::FFI->new;
my $real = $zctx->socket(ZMQ_PUB());
$real->connect("tcp://127.0.0.1:$collect");
my $evil = $zctx->socket(ZMQ_PUB());
$evil->connect("tcp://127.0.0.1:$collect");
sleep 0.5;                                      # subscriptions reach them

my @nkeys;
for my $seq (0 .. 9) {
    $real->send_multipart(['kv@n', pack('Q>', $seq), n_batch($seq)]);
    push @nkeys, n_keys($seq);
}
ok(wait_held($N, \@nkeys), 'the collected engine: '
   . scalar(@nkeys) . ' blocks held') or diag(bridge_log());

my @stray = n_keys(999);

$evil->send_multipart(['kv@n', pack('Q>', 0), n_batch(999)]);
sleep 0.3;
$real->send_multipart(['kv@n', pack('Q>', 10), n_batch(10)]);
push @nkeys, n_keys(10);
ok(wait_held($N, \@nkeys), 'a stray seq 0, then the engine\'s seq 10: '
   . 'applied');

$evil->send_multipart(['kv@n', pack('Q>', 2**63), n_batch(999)]);
sleep 0.3;
$real->send_multipart(['kv@n', pack('Q>', 11), n_batch(11)]);
push @nkeys, n_keys(11);
ok(wait_held($N, \@nkeys), 'a stray seq 2^63, then the engine\'s seq 11: '
   . 'applied');
drain(1);

is($cleared{$N} // 0, 0, 'no "cleared" for the engine: nginx\'s view is '
   . 'intact') or diag(bridge_log());
is(scalar(grep { $held{$N}{$_} } @nkeys), 120,
   'all of its 120 blocks still held');
ok(!grep({ $held{$N}{$_} } @stray),
   'the strays\' blocks were never announced');
unlike(bridge_log(), qr/engine \Q$N\E restarted/, 'no restart logged');

# a real restart: a new process, from seq 0, two batches
$real->close;
my $again = $zctx->socket(ZMQ_PUB());
$again->connect("tcp://127.0.0.1:$collect");
sleep 0.5;
my @new;
for my $seq (0, 1) {
    $again->send_multipart(['kv@n', pack('Q>', $seq), n_batch(500 + $seq)]);
    push @new, n_keys(500 + $seq);
    sleep 0.1;
}
ok(wait_until(10, sub { drain(0.1); ($cleared{$N} // 0) >= 1 }),
   'a real restart (seq 0, then 1) still clears') or diag(bridge_log());
ok(wait_held($N, \@new) && !grep({ $held{$N}{$_} } @nkeys),
   'and then only the new process\'s blocks are held');
$again->close;
$evil->close;

# --- 2. a replay flood while another engine publishes --------------------

ok(wait_until(10, sub { drain(0.1); keys %{ $held{$F} // {} } > 0
                        && keys %{ $held{$G} // {} } > 0 }),
   'F and G reach Redis');

my $rss0 = rss();
my $f_before = f_replays();
my $t_flood = time;
print $g_ctl "go\n";
print $f_ctl "flood\n";

# what G sent meanwhile reaches Redis: its latencies
drain(6);
my ($flood_sent) = (slurp("$dir/f-flood") // '') =~ /^sent (\S+) (\S+)/m;
ok($flood_sent, "F's replay sent $FLOOD batches of 73 KB") or
    diag(slurp("$dir/f-flood") // 'F wrote nothing');

my %sent = map { /^(\d+) (\S+)$/ ? ($1 => $2) : () }
           split /\n/, slurp("$dir/g-sent") // '';
my @lat;
for my $s (sort { $a <=> $b } keys %sent) {
    next if $sent{$s} < $t_flood || $sent{$s} > $t_flood + 3;
    push @lat, defined $arrived{$s} ? $arrived{$s} - $sent{$s} : 99;
}
@lat = sort { $a <=> $b } @lat;
my $max = @lat ? $lat[-1] : 99;
my $p99 = @lat ? $lat[int(0.99 * $#lat)] : 99;
ok(@lat > 50 && $max < 1.0,
   sprintf('G\'s %d batches sent during the flood reached Redis within '
           . '%.0f ms (p99 %.0f ms, bound 1 s)', scalar(@lat), 1000 * $max,
           1000 * $p99));

my $rss = rss();
SKIP: {
    # under AddressSanitizer freed memory waits in its quarantine: RSS
    # says nothing of the bridge's own
    skip 'RSS under AddressSanitizer', 1
        if (slurp($BRIDGE) // '') =~ /AddressSanitizer/;
    # the replay socket queues at most 1,000 messages: 73 MB of these
    cmp_ok($rss, '<', 110_000,
           "the bridge's peak RSS stays bounded: $rss kB (from $rss0 kB)");
}

ok(wait_until(10, sub { f_replays() > $f_before }),
   'F\'s flooded replay ended (lost or whole), the bridge goes on')
    or diag(bridge_log());
my @longest = bridge_log() =~ /engine \Q$F\E: .*longest replay read (\d+) us/g;
diag("F: the longest kvb_stream_io() call: $longest[-1] us")
    if @longest;

ok(kill(0, $l->pid('kvbridge')), 'the bridge is still running');

# --- 3. an event-socket flood while another engine publishes --------------

drain(0.5);
my $now0 = vmrss();
my ($rss_max, $g_silent) = ($now0, 0);
print $h_ctl "events\n";
my $t_events = time;
while (time < $t_events + 6) {
    drain(0.1);
    my $r = vmrss();
    $rss_max = $r if $r > $rss_max;
    my $quiet = time - ($last_at{$G} // $t_events);
    $g_silent = $quiet if $quiet > $g_silent;
}
my ($ev_sent) = (slurp("$dir/h-events") // '') =~ /^sent (\d+)/m;
ok($ev_sent && $ev_sent > 1000,
   'H flooded its event socket: ' . ($ev_sent // 0) . ' batches of 73 KB');
SKIP: {
    skip 'RSS under AddressSanitizer', 1
        if (slurp($BRIDGE) // '') =~ /AddressSanitizer/;
    # the SUB socket queues 16 batches of at most --max-batch (4 MB)
    cmp_ok($rss_max - $now0, '<', 40_000,
           "the bridge's RSS during the event flood: $rss_max kB"
           . " (from $now0 kB)");
}
cmp_ok($g_silent, '<', 1.0,
       sprintf('G was heard throughout the event flood (longest silence'
               . ' %.0f ms)', 1000 * $g_silent));
ok(kill(0, $l->pid('kvbridge')), 'the bridge is still running');

print $f_ctl "stop\n";
close $f_ctl;
print $g_ctl "stop\n";
close $g_ctl;
print $h_ctl "stop\n";
close $h_ctl;
waitpid($_, 0) for $f_pid, $g_pid, $h_pid;

done_testing();


# --- helpers ----------------------------------------------------------

sub bridge_log { slurp($l->prefix . '/logs/kvbridge.log') // '' }

# F's replays, ended: lines the bridge logs as each one ends
sub f_replays {
    my @n = bridge_log() =~ /engine \Q$F\E: gaps \d+, replayed/g;
    return scalar @n;
}

sub vmrss {
    my ($r) = (slurp('/proc/' . $l->pid('kvbridge') . '/status') // '')
        =~ /VmRSS:\s+(\d+)/;
    return $r // 0;
}

sub rss {
    my ($hwm) = (slurp('/proc/' . $l->pid('kvbridge') . '/status') // '')
        =~ /VmHWM:\s+(\d+)/;
    return $hwm // 0;
}

sub keys_of_ids {
    my ($ids) = @_;
    my $in = join ' ', @$ids;
    my $out = `echo '$in' | $KEYS $BT '$MODEL'`;
    return split /\n/, $out;
}

# the collected engine: batch $i stores a chain of 10 blocks (999: the
# stray's)
sub n_ids {
    my ($i) = @_;
    return [map { 50_000 + $i * 1000 + $_ } 1 .. 10 * $BT];
}

sub n_keys { keys_of_ids(n_ids($_[0])) }

sub n_batch {
    my ($i) = @_;
    return $mp->pack([time, [['BlockStored', [map { $i * 100 + $_ } 0 .. 9],
                               undef, n_ids($i), $BT]]]);
}

# G's batch $i: one block, its own tokens
sub g_ids {
    my ($i) = @_;
    return [map { 200_000 + $i * $BT + $_ } 0 .. $BT - 1];
}

# a subscriber of our own: Test::KvAware::Redis waits for a pause in the
# messages, which a busy channel never makes
sub subscribe {
    my ($port, $channel) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port")
        or die "redis: $!";
    print $s "SUBSCRIBE $channel\r\n";
    return { sock => $s, buf => '' };
}

# [time read, payload] of each message published, for $t s
sub messages {
    my ($c, $t) = @_;
    my $sel = IO::Select->new($c->{sock});
    my $end = time + $t;
    my @m;
    while ((my $left = $end - time) > 0) {
        last unless $sel->can_read($left);
        sysread($c->{sock}, $c->{buf}, 1 << 20, length $c->{buf}) or last;
        my $at = time;
        # *3 $7 message $N channel $N payload (":1" for subscribe)
        while (1) {
            my ($pos, @part) = (0);
            last unless $c->{buf} =~ /\A\*3\r\n/;
            $pos = 4;
            for (1 .. 3) {
                my $rest = substr($c->{buf}, $pos);
                if ($rest =~ /\A:(\d+)\r\n/) {
                    push @part, $1;
                    $pos += length($&);
                    next;
                }
                $rest =~ /\A\$(\d+)\r\n/ or last;
                my ($h, $n) = (length($&), $1);
                last if length($rest) < $h + $n + 2;
                push @part, substr($rest, $h, $n);
                $pos += $h + $n + 2;
            }
            last unless @part == 3;
            substr($c->{buf}, 0, $pos) = '';
            push @m, [$at, $part[2]] if $part[0] eq 'message';
        }
    }
    return @m;
}

# applies what came on the channel for up to $t s
sub drain {
    my ($t) = @_;
    for my $m (messages($sub, $t)) {
        my ($at, $payload) = @$m;
        my $msg = eval { $json->decode($payload) } or next;
        my $s = $msg->{server} // next;
        $last_at{$s} = $at;
        my $snap = $msg->{snapshot} // '';
        $held{$s} = {} if $snap eq 'full' || $snap eq 'begin';
        for my $ev (@{ $msg->{events} // [] }) {
            if ($ev->{type} eq 'cleared') {
                $held{$s} = {};
                $cleared{$s}++;
            } elsif ($ev->{type} eq 'stored') {
                for my $k (@{ $ev->{hashes} }) {
                    $held{$s}{$k} = 1;
                    $arrived{$gseq{$k}} //= $at
                        if $s eq $G && defined $gseq{$k};
                }
            } elsif ($ev->{type} eq 'removed') {
                delete $held{$s}{$_} for @{ $ev->{hashes} };
            }
        }
    }
}

sub wait_held {
    my ($s, $keys) = @_;
    my $ok = wait_until(10, sub {
        drain(0.1);
        !grep { !$held{$s}{$_} } @$keys;
    });
    diag(scalar(grep { !$held{$s}{$_} } @$keys) . ' of ' . scalar(@$keys)
         . " keys missing for $s") unless $ok;
    return $ok;
}

# forks $code with a pipe from the parent; the child never returns
sub child {
    my ($code) = @_;
    pipe(my $r, my $w) or die "pipe: $!";
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        close $w;
        alarm 150;
        eval { $code->($r); 1 }
            or print STDERR "# child $$: $@";
        POSIX::_exit(0);
    }
    close $r;
    $w->autoflush(1);
    return ($w, $pid);
}

# F: small batches every 50 ms, replays answered from what it sent; told
# "flood", it skips 5 seqs and answers the replay that follows with
# $FLOOD batches of 73 KB, as fast as ZeroMQ takes them
sub engine_f {
    my ($ctl) = @_;
    my $ctx = ZMQ::FFI->new;
    my $pub = $ctx->socket(ZMQ_PUB());
    $pub->bind("tcp://127.0.0.1:$zf");
    my $router = $ctx->socket(ZMQ_ROUTER());
    $router->set(ZMQ_SNDHWM(), 'int', 0);
    $router->bind('tcp://127.0.0.1:' . ($zf + 1));
    my $sel = IO::Select->new($ctl);
    my ($seq, %sent, $flood) = (0);
    my $big = big_batch();
    my $end = time + 140;

    while (time < $end) {
        if ($sel->can_read(0.05)) {
            my $cmd = <$ctl> // 'stop';
            last if $cmd =~ /stop/;
            if ($cmd =~ /flood/) {
                $flood = 1;
                $seq += 5;
            }

        }

        while ($router->has_pollin) {
            my ($id, undef, $start) = $router->recv_multipart;
            $start = unpack('Q>', $start);
            if ($flood && $flood == 1) {
                $flood = 2;
                my $t0 = time;
                $router->send_multipart([$id, '', pack('Q>', $start),
                                         $sent{$start} // '']);
                $router->send_multipart([$id, '', pack('Q>', $start + $_),
                                         $big]) for 1 .. $FLOOD;
                $router->send_multipart([$id, '', pack('Q>', ~0), '']);
                open(my $fh, '>', "$dir/f-flood") or die;
                printf $fh "sent %.3f %.3f\n", $t0, time;
                close $fh;
                next;
            }
            for my $s (sort { $a <=> $b } keys %sent) {
                $router->send_multipart([$id, '', pack('Q>', $s), $sent{$s}])
                    if $s >= $start;
            }
            $router->send_multipart([$id, '', pack('Q>', ~0), '']);
        }

        next if $flood && $flood == 2;
        $sent{$seq} = $mp->pack([1.0, [['BlockStored', [$seq], undef,
                                 [map { 300_000 + $seq * $BT + $_ }
                                  1 .. $BT], $BT]]]);
        $pub->send_multipart(['', pack('Q>', $seq), $sent{$seq}]);
        $seq++;
    }
}

# 73 KB, valid: 820 blocks of 16 token ids past 65535 (5 bytes each)
sub big_batch {
    my @ids = map { 70_000 + $_ } 1 .. 820 * $BT;
    return $mp->pack([1.0, [['BlockStored', [map { 9_000_000 + $_ } 1 .. 820],
                              undef, \@ids, $BT]]]);
}

# H: silent until told "events", then 4 s of F's big batch on its event
# socket, in order, as fast as ZeroMQ takes them (its PUB drops past its
# high-water mark: the bridge sees gaps, and has no replay to ask)
sub engine_h {
    my ($ctl) = @_;
    my $ctx = ZMQ::FFI->new;
    my $pub = $ctx->socket(ZMQ_PUB());
    $pub->bind("tcp://127.0.0.1:$zh");
    my $big = big_batch();
    my $cmd = <$ctl> // 'stop';
    return if $cmd =~ /stop/;
    my ($t0, $n) = (time, 0);
    while (time < $t0 + 4) {
        for (1 .. 64) {
            $pub->send_multipart(['', pack('Q>', $n), $big]);
            $n++;
        }
    }
    open(my $fh, '>', "$dir/h-events") or die;
    print $fh "sent $n\n";
    close $fh;
    $cmd = <$ctl>;                      # stop
}

# G: one small batch every $PERIOD s; told "go", the next $GN are the
# ones the test looks for, the time each was sent written down
sub engine_g {
    my ($ctl) = @_;
    my $ctx = ZMQ::FFI->new;
    my $pub = $ctx->socket(ZMQ_PUB());
    $pub->bind("tcp://127.0.0.1:$zg");
    open(my $fh, '>', "$dir/g-sent") or die;
    $fh->autoflush(1);
    my $sel = IO::Select->new($ctl);
    my ($seq, $i) = (0, undef);
    my $next = time;
    my $end = time + 140;

    while (time < $end) {
        if ($sel->can_read(0)) {
            my $cmd = <$ctl> // 'stop';
            last if $cmd =~ /stop/;
            $i = 0 if $cmd =~ /go/;
        }

        my $mine = defined $i && $i < $GN;
        my $ev = $mine
            ? ['BlockStored', [1_000_000 + $i],
               $i ? 1_000_000 + $i - 1 : undef, g_ids($i), $BT]
            : ['BlockStored', [$seq], undef, g_ids(1000 + $seq), $BT];
        $pub->send_multipart(['', pack('Q>', $seq),
                              $mp->pack([1.0, [$ev]])]);
        if (defined $i && $i < $GN) {
            printf $fh "%d %.4f\n", $i, time;
            $i++;
        }
        $seq++;
        $next += $PERIOD;
        sleep($next - time) if $next > time;
    }
}
