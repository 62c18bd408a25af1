# kvbridge between engines that speak vLLM (kvsim --events zmq) and Redis
# (issue 10): the keys it publishes are the token keys of the ids the
# engine's /tokenize gives, whatever the encoding and hash form; LoRA
# adapters and the base model never share a key; evictions reach nginx as
# "removed"; a stream with a third of its batches lost on the wire is
# replayed whole; an engine restart is a "cleared", also one that went
# past the seq the bridge saw while the bridge was away; a restarted bridge
# rebuilds its mirror from the engines' replay buffers; a resync is
# answered with a snapshot of the mirror; hostile frames are skipped.
# Real redis-server, kvsim and kvbridge; no nginx (t/52 routes with it).

use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use KvAware::Launch qw(free_ports free_run wait_until slurp);
use Test::KvAware::Redis;

my $BRIDGE = KvAware::Launch::kvbridge_binary();
my $KEYS   = 'build/kva_token_keys';
my $MODEL  = 'llama';
my $BT     = 16;                                # tokens a block

plan skip_all => "$BRIDGE not built" unless -x $BRIDGE;
# it runs no nginx: the stage that only changes nginx's build skips it
plan skip_all => 'no nginx in this test (KVA_NGINX_FREE=0)'
    if ($ENV{KVA_NGINX_FREE} // '') eq '0';
plan skip_all => "$KEYS not built (make tools)" unless -x $KEYS;

for my $m (qw(ZMQ::FFI Data::MessagePack)) {
    plan skip_all => "$m missing (make deps)" unless eval "require $m; 1";
}

require ZMQ::FFI::Constants;
ZMQ::FFI::Constants->import(qw(ZMQ_PUB));

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 120;

my $json = JSON::PP->new->utf8->canonical;
my $http = HTTP::Tiny->new(timeout => 10);
my $l = KvAware::Launch->new(template => 'kvbridge-XXXXXX', watchdog => 1,
                             diag => \&diag);

# engines A, B (a third of its batches dropped on the wire, positional
# encoding, int64 hashes), C (digests, topic frames in replies); the
# collector for a hostile publisher
# kvsim binds its PUB on the port given and its replay ROUTER on the next:
# one run of 6 for the three engines, apart from the other ports
my ($redis, $pa, $pb, $pc, $collect) = free_ports(5);
my $zmq = free_run(6);
my ($za, $zb, $zc) = ($zmq, $zmq + 2, $zmq + 4);
my %ENGINE = (
    A => { port => $pa, zmq => $za, opts => [qw(--num-blocks 300)] },
    B => { port => $pb, zmq => $zb,
           opts => [qw(--zmq-drop 0.33 --zmq-encoding array --zmq-hash
                       int64)] },
    C => { port => $pc, zmq => $zc,
           opts => [qw(--zmq-hash bytes --zmq-replay-topic)] },
);
my $HOSTILE = '127.0.0.1:1';

$l->start_redis($redis);
start_engine($_) for sort keys %ENGINE;

my $sub = Test::KvAware::Redis->new($redis)->subscribe('kv_aware:events');
start_bridge();

my %held;           # server => { key => 1 }, as nginx would hold it
my %snap;           # server => { key => 1 }, the last snapshot's parts
my %cleared;        # server => how many "cleared" events came
my %removed;        # server => how many keys were removed

# --- 1. exact keys, both encodings, three hash forms ----------------------

my @p1 = keys_of(prompt(1, 1200), $MODEL);
ok(@p1 >= 60, scalar(@p1) . ' blocks in the first prompt');

for my $e (qw(A B C)) {
    chat($e, prompt(1, 1200));
}

# B's lost batches show as gaps only when a later one comes: keep it busy
for my $i (1 .. 6) {
    chat('B', prompt(100 + $i, 200));
    chat('C', prompt(100 + $i, 200));
}

for my $e (qw(A B C)) {
    ok(wait_held($e, \@p1), "engine $e: the module's token keys of "
       . "the ids /tokenize gives ($ENGINE{$e}{opts}[-1])");
}

# --- 2. replay: B saw a third of its batches lost, and lost nothing -----

ok(wait_until(10, sub {
    drain(0.1);
    same_set($held{addr('B')}, $held{addr('C')});
}), 'B, whose batches were dropped, ends up holding what C holds')
    or diag(scalar(keys %{ $held{addr('B')} }) . ' vs '
            . scalar(keys %{ $held{addr('C')} }));
like(bridge_log(), qr/engine \Q${\ addr('B')}\E: gaps [1-9]\d*, replayed [1-9]\d*, lost 0/,
     'the bridge replayed B\'s gaps and lost none');

# --- 3. LoRA adapters and the base model never share a key --------------

my $p2 = prompt(2, 400);
my @base = keys_of($p2, $MODEL);
my @la = keys_of($p2, 'adapter-a');
my @lb = keys_of($p2, 'adapter-b');
chat('C', $p2, 'adapter-a');
chat('C', $p2, 'adapter-b');
chat('C', $p2);
ok(wait_held('C', [@la, @lb, @base]),
   'an adapter\'s blocks are keyed by its name');
ok(!grep({ my $k = $_; grep { $_ eq $k } @lb, @base } @la),
   'same prompt, adapters a and b and the base model: no key shared');

# --- 4. evictions reach nginx as "removed" ------------------------------

my @first = keys_of(prompt(300, 1500), $MODEL);
chat('A', prompt(300, 1500));
chat('A', prompt(300 + $_, 1500)) for 1 .. 12;
my @last = keys_of(prompt(312, 1500), $MODEL);
ok(wait_held('A', \@last), 'A holds its last prompt');
ok(wait_until(5, sub {
    drain(0.1);
    !grep { $held{addr('A')}{$_} } @first;
}), 'what A evicted (its first prompt) was removed');
cmp_ok(scalar(keys %{ $held{addr('A')} }), '<=', 300,
       'A holds at most its 300 blocks');

# --- 5. a resync is answered with the mirror ----------------------------

for my $e (qw(A B C)) {
    ok(resync_matches($e), "resync of $e: a snapshot equal to the stream");
}

# --- 6. an engine restart is a "cleared" --------------------------------

$l->stop('kvsim-C');
start_engine('C');
sleep 0.5;                                      # the bridge reconnects
chat('C', prompt(7, 300));
ok(wait_until(10, sub { drain(0.1); ($cleared{addr('C')} // 0) >= 1 }),
   'C restarted (seq back to 0): nginx hears "cleared"');
ok(wait_held('C', [keys_of(prompt(7, 300), $MODEL)])
   && !grep({ $held{addr('C')}{$_} } @p1),
   'and then only what the new C holds');

# --- 6b. a restart the seq does not show ---------------------------------
# The bridge is cut off (stopped) while C restarts and publishes more
# batches than the bridge saw of the old C: its seq never goes back.
# Back, the bridge asks C's replay for the last batch it saw, gets
# another (or none), and takes C for the new process it is.

my $before = $cleared{addr('C')} // 0;
my @old = keys %{ $held{addr('C')} };
kill 'STOP', $l->pid('kvbridge');
$l->stop('kvsim-C');
start_engine('C');
chat('C', prompt(400 + $_, 300)) for 1 .. 12;
my @new = map { keys_of(prompt(400 + $_, 300), $MODEL) } 1 .. 12;
kill 'CONT', $l->pid('kvbridge');
ok(wait_until(10, sub { drain(0.1); ($cleared{addr('C')} // 0) > $before }),
   'C restarted while the bridge was away, past the seq it saw: nginx '
   . 'hears "cleared"') or diag(bridge_log());
ok(wait_held('C', \@new) && !grep({ $held{addr('C')}{$_} } @old),
   'then the new C\'s blocks, replayed from its start, and none of the '
   . 'old C\'s (' . scalar(@old) . ')');
like(bridge_log(), qr/engine \Q${\ addr('C')}\E restarted \(seq \d+ (replayed is not the one seen|no longer replayed)\)/,
     'the bridge says how it told');
like(bridge_log(), qr/engine \Q${\ addr('C')}\E: reconnected, checking it is the same process/,
     'on reconnecting, before any new batch');
ok(resync_matches('C'), 'a resync of C matches the new C');

# --- 7. a restarted bridge rebuilds its mirror from the replay buffers --

$l->stop('kvbridge');
start_bridge();
chat('A', prompt(8, 300));
sleep 1;
ok(resync_matches('A', [@last, keys_of(prompt(8, 300), $MODEL)]),
   'a new bridge answers a resync of A with A\'s blocks from before '
   . 'it started (replayed from seq 0)');

# --- 8. hostile frames on the collector ---------------------------------

my $mp = Data::MessagePack->new->prefer_integer(1);
my $zctx = ZMQ::FFI->new;
my $pub = $zctx->socket(ZMQ_PUB());
$pub->connect("tcp://127.0.0.1:$collect");
sleep 0.5;                                      # a subscriber joins late
my @ids = map { 1000 + $_ } 1 .. $BT;
my $good = $mp->pack([1.0, [['BlockStored', [42], undef, \@ids, $BT]]]);
$pub->send_multipart($_) for
    ['evil', pack('Q>', 0), "\xc1 not msgpack"],
    ['evil', pack('Q>', 1), "\x92\x01\xdd\xff\xff\xff\xff"],
    ['evil', pack('Q>', 2), $mp->pack({ ts => 1 })],
    ['evil', pack('Q>', 3)],
    ['nobody', pack('Q>', 0), $good],
    ['evil', pack('Q>', 3), $good];
my ($want) = keys_of_ids(\@ids, $MODEL);
ok(wait_held($HOSTILE, [$want]),
   'after garbage, a 4 GB claim, a non-batch and a short message, the '
   . 'next good batch is applied') or diag(bridge_log());
like(bridge_log(), qr/batch 0 refused \(bad_msgpack\)/,
     'not msgpack: refused and logged');
my ($rss) = (slurp('/proc/' . $l->pid('kvbridge') . '/status') // '')
    =~ /VmHWM:\s+(\d+)/;
cmp_ok($rss // 0, '<', 200_000,
       "the 4 GB claim was refused before msgpack-c allocated: peak RSS "
       . ($rss // '?') . ' kB');
$pub->close;

ok(kill(0, $l->pid('kvbridge')), 'the bridge is still running');

done_testing();


# --- helpers ------------------------------------------------------------

sub addr { "127.0.0.1:$ENGINE{$_[0]}{port}" }

sub start_engine {
    my ($e) = @_;
    $l->start_kvsim($ENGINE{$e}{port}, 1,
        { name => "kvsim-$e" },
        qw(--time-scale 50 --keyspace tokens --events zmq --redis off),
        '--model', $MODEL, '--lora', 'adapter-a,adapter-b',
        '--zmq-port', $ENGINE{$e}{zmq}, @{ $ENGINE{$e}{opts} });
}

sub start_bridge {
    my @engines = map {;
        '--engine', addr($_) . " model=$MODEL"
            . " events=tcp://127.0.0.1:$ENGINE{$_}{zmq}"
            . ' replay=tcp://127.0.0.1:' . ($ENGINE{$_}{zmq} + 1)
            . " metrics=http://" . addr($_) . '/metrics'
    } sort keys %ENGINE;
    $l->start_kvbridge('--redis', "127.0.0.1:$redis", @engines,
                       '--engine', "$HOSTILE model=$MODEL topic=evil",
                       '--collect', "tcp://127.0.0.1:$collect",
                       '--replay-timeout', 2000);
}

sub bridge_log { slurp($l->prefix . '/logs/kvbridge.log') // '' }

# a long user message, distinct per $n: ~4 bytes a pseudo-token
sub prompt {
    my ($n, $words) = @_;
    return join ' ', map { sprintf 'w%x%02d', $n, $_ % 97 } 1 .. $words;
}

sub body {
    my ($text, $model) = @_;
    return $json->encode({ model => $model // $MODEL, max_tokens => 1,
                           messages => [{ role => 'user',
                                          content => $text }] });
}

sub chat {
    my ($e, $text, $model) = @_;
    my $r = $http->post("http://" . addr($e) . '/v1/chat/completions',
                        { content => body($text, $model),
                          headers => { 'Content-Type' =>
                                       'application/json' } });
    diag("chat to $e: $r->{status} $r->{content}") unless $r->{success};
}

# the ids the engine's /tokenize gives (A's: they all tokenize alike)
sub keys_of {
    my ($text, $model) = @_;
    my $r = $http->post("http://" . addr('A') . '/tokenize',
                        { content => body($text, $model) });
    die "tokenize: $r->{status}" unless $r->{success};
    return keys_of_ids($json->decode($r->{content})->{tokens}, $model);
}

sub keys_of_ids {
    my ($ids, $model) = @_;
    my $in = join ' ', @$ids;
    my $out = `echo '$in' | $KEYS $BT '$model'`;
    return split /\n/, $out;
}

# applies what came on the channel for up to $t s
sub drain {
    my ($t) = @_;
    for my $m ($sub->messages($t)) {
        my $msg = eval { $json->decode($m->[1]) } or next;
        my $s = $msg->{server};
        if (($msg->{keyspace} // '') ne 'tokens') {
            diag("not in the token key space: $m->[1]");
            next;
        }
        my $snap = $msg->{snapshot} // '';
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
                if ($snap) {
                    $snap{$s}{$_} = 1 for @{ $ev->{hashes} };
                }
            } elsif ($ev->{type} eq 'removed') {
                delete $held{$s}{$_} for @{ $ev->{hashes} };
                $removed{$s} += @{ $ev->{hashes} };
            }
        }
        $snap{$s}{__done} = 1 if $snap eq 'full' || $snap eq 'end';
    }
}

sub wait_held {
    my ($e, $keys) = @_;
    my $s = $e =~ /:/ ? $e : addr($e);
    my $ok = wait_until(10, sub {
        drain(0.1);
        !grep { !$held{$s}{$_} } @$keys;
    });
    diag(scalar(grep { !$held{$s}{$_} } @$keys) . ' of ' . scalar(@$keys)
         . " keys missing for $s") unless $ok;
    return $ok;
}

sub same_set {
    my ($a, $b) = @_;
    return 0 unless $a && $b && keys %$a == keys %$b;
    return !grep { !$b->{$_} } keys %$a;
}

# asks for a snapshot of $e; it must equal what the stream built (or,
# given @$want, hold those keys)
sub resync_matches {
    my ($e, $want) = @_;
    my $s = addr($e);
    delete $snap{$s};
    Test::KvAware::Redis->new($redis)->cmd(PUBLISH => 'kv_aware:events:resync',
        $json->encode({ v => 1, type => 'resync', server => $s }));
    wait_until(10, sub { drain(0.1); $snap{$s} && $snap{$s}{__done} })
        or return 0;
    my %got = %{ $snap{$s} };
    delete $got{__done};
    return !grep { !$got{$_} } @$want if $want;
    my $ok = same_set(\%got, $held{$s});
    diag(scalar(keys %got) . " in the snapshot, "
         . scalar(keys %{ $held{$s} }) . ' in the stream') unless $ok;
    return $ok;
}
