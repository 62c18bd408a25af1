# kvbridge and a data-parallel engine (kvsim --data-parallel 2, vLLM's
# wire format on a port a rank): requests sent with X-data-parallel-rank
# run on that rank, each rank's cache reaches Redis in messages that say
# "rank", with a seq of their own; a resync that names a rank is answered
# with that rank's snapshot alone (without "rank": rank 0's); each rank's
# load is its own (/metrics, engine="r"); a header out of range is
# balanced, counted, and no request is lost.  Engines that connect to
# the bridge's collector on its port + rank are told apart by topic and
# rank; a batch whose data_parallel_rank disagrees with its port is kept
# under the port's rank, and logged.
# kvsim's own Redis messages say the rank too, and answer a resync by
# rank.  Real redis-server, kvsim and kvbridge: t/55 tests the module's
# side alone, t/61 the whole chain through nginx.

use strict;
use warnings;

use HTTP::Tiny;
use IO::Socket::INET;
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

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 120;

my $json = JSON::PP->new->utf8->canonical;
my $http = HTTP::Tiny->new(timeout => 10);
my $l = KvAware::Launch->new(template => 'kvbridge-dp-XXXXXX',
                             watchdog => 1, diag => \&diag);

# one server, two ranks: events on Z and Z + 1, replays on Z + 2, Z + 3
my ($redis, $port, $own) = free_ports(3);
my $zmq = free_run(4);
my $collect = free_run(2);
my $addr = "127.0.0.1:$port";
my ($COLLECTED, $BYHAND) = ('127.0.0.1:2', '127.0.0.1:3');

$l->start_redis($redis);
$l->start_kvsim($port, 1, { name => 'kvsim' },
    qw(--time-scale 5 --keyspace tokens --events zmq --redis off
       --data-parallel 2), '--model', $MODEL, '--zmq-port', $zmq);

my $sub = Test::KvAware::Redis->new($redis)->subscribe('kv_aware:events');
$l->start_kvbridge('--redis', "127.0.0.1:$redis", '--heartbeat', 200,
    '--metrics-interval', 100, '--engine',
    "$addr model=$MODEL events=tcp://127.0.0.1:$zmq"
    . ' replay=tcp://127.0.0.1:' . ($zmq + 2)
    . " data_parallel=2 metrics=http://$addr/metrics",
    '--collect', "tcp://127.0.0.1:$collect",
    '--engine', "$COLLECTED model=$MODEL topic=kv\@dp data_parallel=2",
    '--engine', "$BYHAND model=$MODEL events=tcp://127.0.0.1:$own rank=1");

my %held;           # rank => { key => 1 }
my %snap;           # rank => { key => 1 }, the last snapshot
my %seq;            # rank => the last seq
my %load;           # rank => the last load
my %other;          # "server rank" => { key => 1 }: the other engines
my ($messages, $unranked, $foreign, $seq_bad) = (0, 0, 0, 0);

# --- 1. the header picks the rank; each rank's blocks under its rank ------

my ($p0, $p1) = (prompt(1, 600), prompt(2, 600));
my @k0 = keys_of($p0);
my @k1 = keys_of($p1);
ok(@k0 >= 30 && @k1 >= 30, scalar(@k0) . ' and ' . scalar(@k1)
   . ' blocks in the two prompts');

is(chat($p0, 0)->{rank}, 0, 'X-data-parallel-rank: 0 runs on rank 0');
is(chat($p1, 1)->{rank}, 1, 'X-data-parallel-rank: 1 runs on rank 1');

ok(wait_held(0, \@k0), 'rank 0\'s blocks arrive as rank 0\'s');
ok(wait_held(1, \@k1), 'rank 1\'s blocks arrive as rank 1\'s');
ok(!grep({ $held{1}{$_} } @k0) && !grep({ $held{0}{$_} } @k1),
   'neither rank holds the other\'s prompt');

my $again = chat($p1, 1);
cmp_ok($again->{cached_tokens}, '>=', @k1 * $BT - $BT,
       'the same prompt again on rank 1 hits rank 1\'s cache');
is(chat($p1, 0)->{cached_tokens}, 0, 'on rank 0 it misses: caches apart');

drain(0.5);
ok($messages > 4 && $unranked == 0, "all $messages messages say \"rank\"");
is($foreign, 0, 'no message of another server or a rank past 1');
is($seq_bad, 0, 'each rank\'s seq goes up by one, on its own');
cmp_ok(scalar(keys %seq), '==', 2, 'both ranks published');

# --- 2. a resync names a rank: that rank's snapshot alone ----------------

ok(resync(1), 'a resync of rank 1 is answered');
ok(!grep({ !$snap{1}{$_} } @k1) && !grep({ $snap{1}{$_} } @k0),
   'with rank 1\'s blocks, not rank 0\'s');
ok(!$snap{0}, 'and no snapshot of rank 0');

ok(resync(undef), 'a resync without "rank" is answered');
ok($snap{0} && !grep({ !$snap{0}{$_} } @k0) && !$snap{1},
   'as rank 0\'s, rank 0 alone');

ok(!resync(5, 2), 'a resync of a rank the server lacks: no answer');

# --- 3. each rank's load is its own --------------------------------------

my $busy = IO::Socket::INET->new(PeerAddr => $addr, Timeout => 5)
    or die "connect: $!";
my $body = body(prompt(3, 100), 4000, 1);
print $busy "POST /v1/chat/completions HTTP/1.1\r\nHost: $addr\r\n"
    . "Content-Type: application/json\r\nX-data-parallel-rank: 1\r\n"
    . 'Content-Length: ' . length($body) . "\r\n\r\n$body";

ok(wait_until(10, sub {
    drain(0.1);
    $load{1} && $load{1}{running} >= 1 && $load{0}
        && $load{0}{running} == 0;
}), 'a long request on rank 1: rank 1\'s messages say running 1, '
    . 'rank 0\'s running 0')
    or diag($json->encode(\%load));
close $busy;

# each rank's pool, from vLLM's cache_config_info on the engine's /metrics
my $metrics = $http->get("http://$addr/metrics")->{content} // '';
for my $rk (0, 1) {
    my ($line) = $metrics
        =~ /^(vllm:cache_config_info\{[^}]*engine="$rk"[^}]*\})/m;
    my ($bs) = ($line // '') =~ /block_size="(\d+)"/;
    my ($nb) = ($line // '') =~ /num_gpu_blocks="(\d+)"/;
    ok($bs && $nb && ($load{$rk}{kv_tokens} // 0) == $bs * $nb,
       "rank ${rk}'s load says its pool: " . ($load{$rk}{kv_tokens} // 'none')
       . ' tokens, ' . ($nb // '?') . ' blocks of ' . ($bs // '?'));
}

# --- 4. a header out of range: balanced, counted, answered ---------------

my $r = chat(prompt(4, 100), 9);
ok($r->{rank} == 0 || $r->{rank} == 1,
   'X-data-parallel-rank: 9 is answered by a rank');
like($http->get("http://$addr/metrics")->{content},
     qr/^kvsim_dp_rank_invalid_total\{[^}]*\} 1$/m,
     'and counted in kvsim\'s metrics');
like(slurp($l->prefix . '/logs/kvsim.log') // '',
     qr/X-data-parallel-rank "9" is not a rank/, 'and logged');

my $log = slurp($l->prefix . '/logs/kvbridge.log') // '';
unlike($log, qr/says data_parallel_rank/,
       'the bridge saw each batch\'s data_parallel_rank match its port');
like($log, qr/engine \Q$addr\E rank 1: model/,
     'the bridge names each rank in its log');

# --- 5. configuration mistakes stop the bridge ---------------------------

for my $bad (["data_parallel=2 rank=1", qr/not both/],
             ["data_parallel=1025", qr/expected 1 to 1024/],
             ["rank=1024", qr/expected 0 to 1023/],
             ["data_parallel=2 events=tcp://127.0.0.1:65535",
              qr/at most 65535/]) {
    my $out = `$BRIDGE --engine "$addr model=m events=tcp://127.0.0.1:1 $bad->[0]" 2>&1`;
    ok($? >> 8 == 2 && $out =~ $bad->[1], "refused: $bad->[0]")
        or diag($out);
}

my $out = `$BRIDGE --engine "$addr model=m events=tcp://127.0.0.1:1 rank=1" --engine "$addr model=m events=tcp://127.0.0.1:2 rank=1" 2>&1`;
like($out, qr/rank 1 given twice/, 'a rank given twice: refused');

# --- 6. the collector: topic and rank; a rank that disagrees -------------

SKIP: {
    skip 'ZMQ::FFI or Data::MessagePack missing (make deps)', 4
        unless eval { require ZMQ::FFI; require ZMQ::FFI::Constants;
                      require Data::MessagePack; 1 };

    my $mp = Data::MessagePack->new->prefer_integer(1);
    my $ctx = ZMQ::FFI->new;
    my @ids = map { 2000 + $_ } 1 .. $BT;
    my ($key) = keys_of_ids(\@ids);
    my $batch = sub {
        my ($rank) = @_;
        return $mp->pack([1.0, [['BlockStored', [7], undef, \@ids, $BT]],
                          $rank]);
    };

    # vLLM's rank 1 connects to the collector's port + 1, as it binds
    my $r1 = $ctx->socket(ZMQ::FFI::Constants::ZMQ_PUB());
    $r1->connect('tcp://127.0.0.1:' . ($collect + 1));
    my $r3 = $ctx->socket(ZMQ::FFI::Constants::ZMQ_PUB());
    $r3->connect("tcp://127.0.0.1:$collect");
    my $mine = $ctx->socket(ZMQ::FFI::Constants::ZMQ_PUB());
    $mine->bind("tcp://127.0.0.1:$own");
    sleep 0.5;                                  # subscribers join late

    $r1->send_multipart(['kv@dp', pack('Q>', 0), $batch->(1)]);
    $r3->send_multipart(['kv@dp', pack('Q>', 0), $batch->(3)]);
    $mine->send_multipart(['', pack('Q>', 0), $batch->(0)]);

    ok(wait_until(10, sub { drain(0.1); $other{"$COLLECTED 1"}{$key} }),
       'collected: a batch of data_parallel_rank 1 on the port + 1 is '
       . 'rank 1\'s') or diag($json->encode(\%other));
    ok(!$other{"$COLLECTED 0"}, 'and not rank 0\'s');
    ok(wait_until(5, sub {
           slurp($l->prefix . '/logs/kvbridge.log')
               =~ /a batch of rank 3 on topic "kv\@dp", a rank no engine/;
       }), 'a rank the server was not given: dropped and logged');
    ok(wait_until(10, sub { drain(0.1); $other{"$BYHAND 1"}{$key} })
       && slurp($l->prefix . '/logs/kvbridge.log')
          =~ /engine \Q$BYHAND\E rank 1: batch 0 says data_parallel_rank 0/,
       'rank=1 by hand, a batch saying rank 0: kept as rank 1\'s, logged');
    $_->close for $r1, $r3, $mine;
}

# --- 7. kvsim --data-parallel on Redis: "rank" in its own messages -------

{
    my ($p2) = free_ports(1);
    my $a2 = "127.0.0.1:$p2";
    $l->start_kvsim($p2, 1, { name => 'kvsim-redis' },
        qw(--time-scale 50 --data-parallel 2 --heartbeat-ms 200),
        '--redis', "127.0.0.1:$redis", '--model', $MODEL);
    my (%ranks, %stored, %snapped);
    my $collect = sub {
        for my $m ($sub->messages($_[0])) {
            my $msg = eval { $json->decode($m->[1]) } or next;
            next unless $msg->{server} eq $a2;
            my $rk = $msg->{rank} // 'none';
            $ranks{$rk}++;
            my $n = 0;
            $n += @{ $_->{hashes} // [] } for @{ $msg->{events} // [] };
            $stored{$rk} += $n;
            $snapped{$rk} += $n if $msg->{snapshot};
        }
    };
    my $r = $http->post("http://$a2/v1/chat/completions",
        { content => body(prompt(5, 300)),
          headers => { 'Content-Type' => 'application/json',
                       'X-data-parallel-rank' => 1 } });
    ok(wait_until(10, sub { $collect->(0.1); ($stored{1} // 0) > 0 }),
       'kvsim on Redis: rank 1\'s blocks in messages with "rank": 1');
    wait_until(5, sub { $collect->(0.1); $ranks{0} });
    ok(!$ranks{none} && $ranks{0} && !$stored{0},
       'rank 0 says its rank too (heartbeats), and stored nothing');
    Test::KvAware::Redis->new($redis)->cmd(PUBLISH => 'kv_aware:events:resync',
        $json->encode({ v => 1, type => 'resync', server => $a2,
                        rank => 1 }));
    ok(wait_until(10, sub { $collect->(0.1); ($snapped{1} // 0) > 0 })
       && !$snapped{0}, 'a resync of rank 1: rank 1\'s snapshot alone');
    $l->stop('kvsim-redis');
}

ok(kill(0, $l->pid('kvbridge')), 'the bridge is still running');

done_testing();


# --- helpers ------------------------------------------------------------

sub prompt {
    my ($n, $words) = @_;
    return join ' ', map { sprintf 'w%x%02d', $n, $_ % 97 } 1 .. $words;
}

sub body {
    my ($text, $max, $stream) = @_;
    return $json->encode({ model => $MODEL, max_tokens => $max // 1,
                           $stream ? (stream => JSON::PP::true) : (),
                           messages => [{ role => 'user',
                                          content => $text }] });
}

# the reply's "kvsim" member, its rank checked against X-Kvsim-Rank
sub chat {
    my ($text, $rank) = @_;
    my $r = $http->post("http://$addr/v1/chat/completions",
                        { content => body($text),
                          headers => { 'Content-Type' => 'application/json',
                                       'X-data-parallel-rank' => $rank } });
    die "chat: $r->{status} $r->{content}" unless $r->{success};
    my $k = $json->decode($r->{content})->{kvsim};
    die "X-Kvsim-Rank $r->{headers}{'x-kvsim-rank'}, body $k->{rank}"
        unless ($r->{headers}{'x-kvsim-rank'} // -1) == $k->{rank};
    return $k;
}

sub keys_of {
    my ($text) = @_;
    my $r = $http->post("http://$addr/tokenize", { content => body($text) });
    die "tokenize: $r->{status}" unless $r->{success};
    return keys_of_ids($json->decode($r->{content})->{tokens});
}

sub keys_of_ids {
    my $in = join ' ', @{ $_[0] };
    return split /\n/, `echo '$in' | $KEYS $BT '$MODEL'`;
}

# applies what came on the channel for up to $t s, per rank
sub drain {
    my ($t) = @_;
    for my $m ($sub->messages($t)) {
        my $msg = eval { $json->decode($m->[1]) } or next;
        $messages++;
        if (!exists $msg->{rank}) {
            $unranked++;
            next;
        }
        my $rk = $msg->{rank};
        if ($msg->{server} ne $addr) {
            $other{"$msg->{server} $rk"}{$_} = 1
                for map { @{ $_->{hashes} // [] } } @{ $msg->{events} // [] };
            next;
        }
        if ($rk !~ /^[01]$/) {
            $foreign++;
            next;
        }
        $seq_bad++ if defined $seq{$rk} && $msg->{seq} != $seq{$rk} + 1;
        $seq{$rk} = $msg->{seq};
        $load{$rk} = $msg->{load} if $msg->{load};
        my $snap = $msg->{snapshot} // '';
        if ($snap eq 'full' || $snap eq 'begin') {
            $held{$rk} = {};
            $snap{$rk} = {};
        }
        for my $ev (@{ $msg->{events} // [] }) {
            if ($ev->{type} eq 'cleared') {
                $held{$rk} = {};
            } elsif ($ev->{type} eq 'stored') {
                $held{$rk}{$_} = 1 for @{ $ev->{hashes} };
                $snap{$rk}{$_} = 1 for $snap ? @{ $ev->{hashes} } : ();
            } elsif ($ev->{type} eq 'removed') {
                delete $held{$rk}{$_} for @{ $ev->{hashes} };
            }
        }
        $snap{$rk}{__done} = 1 if $snap eq 'full' || $snap eq 'end';
    }
}

sub wait_held {
    my ($rank, $keys) = @_;
    my $ok = wait_until(10, sub {
        drain(0.1);
        !grep { !$held{$rank}{$_} } @$keys;
    });
    diag(scalar(grep { !$held{$rank}{$_} } @$keys) . ' of '
         . scalar(@$keys) . " keys missing for rank $rank") unless $ok;
    return $ok;
}

# asks for a snapshot (of $rank, or without "rank"); true once one ends
sub resync {
    my ($rank, $wait) = @_;
    drain(0.3);
    %snap = ();
    Test::KvAware::Redis->new($redis)->cmd(PUBLISH => 'kv_aware:events:resync',
        $json->encode({ v => 1, type => 'resync', server => $addr,
                        defined $rank ? (rank => $rank) : () }));
    wait_until($wait // 10, sub {
        drain(0.1);
        grep { $_->{__done} } values %snap;
    }) or return 0;
    delete $_->{__done} for values %snap;
    return 1;
}
