# kvsim speaking vLLM (issue 10): POST /tokenize in vLLM's shape, late or
# failing on demand, and KV events on ZeroMQ in msgpack as vLLM publishes
# them (--events zmq --keyspace tokens): seq from 0, BlockStored with the
# token ids /tokenize gives, LoRA adapters, replay over a DEALER with its
# end marker, drops, the positional encoding, digests, the replay topic.
# Needs build/kvsim, ZMQ::FFI and Data::MessagePack; no Redis.

use strict;
use warnings;

use File::Temp qw(tempdir);
use HTTP::Tiny;
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(WNOHANG);
use Test::More;
use Time::HiRes qw(time sleep);

use Test::KvAware qw(free_run);

my $KVSIM = $ENV{KVSIM_BINARY} || 'build/kvsim';
my $WAIT  = 5;                                  # s, any single wait
my $END   = "\xff" x 8;                         # seq -1: the replay's end

plan skip_all => "$KVSIM not built" unless -x $KVSIM;

for my $m (qw(ZMQ::FFI Data::MessagePack)) {
    plan skip_all => "$m missing (make deps)" unless eval "require $m; 1";
}

require ZMQ::FFI::Constants;
ZMQ::FFI::Constants->import(qw(ZMQ_SUB ZMQ_DEALER));

my $json = JSON::PP->new->utf8->canonical;
my $mp   = Data::MessagePack->new;
my $http = HTTP::Tiny->new(timeout => $WAIT);
my $dir  = tempdir(CLEANUP => 1);
my $zctx = ZMQ::FFI->new;
my (@pids, @socks);

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 60;

END { $_->close for @socks; stop($_) for @pids }

# --- processes ----------------------------------------------------------

sub kvsim {
    my ($log, @args) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>', "$dir/$log" or POSIX::_exit(127);
        open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
        exec $KVSIM, '--servers', 1, '--time-scale', 50, @args
            or POSIX::_exit(127);
    }
    push @pids, $pid;
    return $pid;
}

sub wait_port {
    my ($port) = @_;
    my $end = time + $WAIT;
    while (time < $end) {
        return 1 if IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                          Timeout => 1);
        sleep 0.05;
    }
    return 0;
}

sub stop {
    my ($pid) = @_;
    kill 'TERM', $pid;
    my $end = time + 5;
    while (time < $end) {
        return if waitpid($pid, WNOHANG) == $pid;
        sleep 0.02;
    }
    kill 'KILL', $pid;
    waitpid($pid, 0);
}

# --- HTTP and ZeroMQ ----------------------------------------------------

sub post {
    my ($port, $path, $body) = @_;
    my $t0 = time;
    my $r = $http->post("http://127.0.0.1:$port$path", {
        content => ref $body ? $json->encode($body) : $body,
        headers => { 'Content-Type' => 'application/json' },
    });
    my $j = eval { $json->decode($r->{content}) };
    return ($r->{status}, $j, time - $t0);
}

sub socket_to {
    my ($type, $port) = @_;
    my $s = $zctx->socket($type);
    $s->set_linger(0);
    $s->connect("tcp://127.0.0.1:$port");
    push @socks, $s;
    return $s;
}

# the next multipart message, undef after $t seconds
sub recv_parts {
    my ($s, $t) = @_;
    my $end = time + ($t // $WAIT);
    while (time < $end) {
        return [$s->recv_multipart] if $s->has_pollin;
        sleep 0.005;
    }
    return undef;
}

sub be64 { unpack 'Q>', $_[0] }

# every message of a replay from $start, through the end marker
sub replay {
    my ($port, $start) = @_;
    my $d = socket_to(ZMQ_DEALER(), $port);
    $d->send_multipart(['', pack('Q>', $start)]);
    my @got;
    while (my $m = recv_parts($d)) {
        push @got, $m;
        last if $m->[-2] eq $END;
    }
    return \@got;
}

sub chat {
    my ($model, $text) = @_;
    return { model => $model, max_tokens => 2,
             messages => [{ role => 'user', content => $text }] };
}

# a sentence of about 40 tokens of 4 bytes, told apart by $i
sub text { "request $_[0]: " . join(' ', map { "word$_" } 1 .. 25) }

# --- kvsim with vLLM's defaults: map, uint64 --------------------------------

# each zmq port P takes P + 1 for replay
my $base = free_run(7);
my ($http1, $zmq1, $http2, $zmq2, $http3) =
    ($base, $base + 1, $base + 3, $base + 4, $base + 6);

kvsim('vllm.log', '--base-port', $http1, '--events', 'zmq',
      '--keyspace', 'tokens', '--zmq-port', $zmq1, '--lora', 'ad1,ad2');
ok(wait_port($http1), 'kvsim --events zmq --keyspace tokens is up')
    or BAIL_OUT('kvsim did not start: ' . `cat $dir/vllm.log`);

# /tokenize, both forms

my ($st, $j) = post($http1, '/tokenize',
                    { model => 'kvsim',
                      add_generation_prompt => JSON::PP::true,
                      messages => [{ role => 'user', content => text(0) }] });
my @ids = @{ $j->{tokens} // [] };

is($st, 200, '/tokenize messages: 200');
is_deeply([sort keys %$j], [qw(count max_model_len tokens)],
          '/tokenize: count, max_model_len, tokens, as vLLM answers');
ok($j->{count} == @ids && @ids > 32
   && !grep({ !/^\d+$/ || $_ >= 151936 } @ids),
   '/tokenize: count ids of the vocabulary');
is($j->{max_model_len}, 4802 * 16, '/tokenize: max_model_len, the pool');

($st, my $j2) = post($http1, '/tokenize', { model => 'kvsim',
                     messages => [{ role => 'user', content => text(0) }] });
is_deeply($j2->{tokens}, \@ids, '/tokenize: the same messages, the same ids');

($st, $j) = post($http1, '/tokenize', { model => 'kvsim',
                                        prompt => 'hello world' });
ok($st == 200 && $j->{count} == 3, '/tokenize prompt string: 200');

($st, $j) = post($http1, '/tokenize', { model => 'kvsim',
                                        prompt => [7, 8, 9] });
is_deeply($j->{tokens}, [7, 8, 9], '/tokenize prompt ids: those ids');

($st, $j) = post($http1, '/tokenize', { model => 'kvsim' });
ok($st == 400 && $j->{error}{type} eq 'invalid_request_error'
   && $j->{error}{message} =~ /no prompt/,
   '/tokenize without a prompt: 400, an OpenAI error');

($st, $j) = post($http1, '/tokenize', '{"prompt": ');
ok($st == 400 && $j->{error}{message}, '/tokenize not JSON: 400');

# events: a SUB socket sees one batch per step that stored blocks

my $sub = socket_to(ZMQ_SUB(), $zmq1);
$sub->subscribe('');
sleep 0.5;                                      # the slow joiner

($st) = post($http1, '/v1/chat/completions', chat('kvsim', text(0)));
is($st, 200, 'a chat request');

my $m = recv_parts($sub);
ok($m && @$m == 3 && $m->[0] eq '' && length $m->[1] == 8,
   'PUB: [topic "", seq, payload]');

my $b = eval { $mp->unpack($m->[2]) } // {};
my @ev = @{ $b->{events} // [] };
my $st0 = $ev[0] // {};

is(be64($m->[1]), 0, 'PUB: the first seq is 0');
ok(defined $b->{ts} && $b->{data_parallel_rank} == 0 && @ev == 1,
   'batch: {ts, events, data_parallel_rank}, one event');
ok($st0->{type} eq 'BlockStored' && $st0->{block_size} == 16
   && @{ $st0->{token_ids} } == 16 * @{ $st0->{block_hashes} }
   && @{ $st0->{block_hashes} } == int(@ids / 16),
   'BlockStored: block_size 16, token_ids of 16 per block, full blocks');
is_deeply($st0->{token_ids}, [@ids[0 .. @{ $st0->{token_ids} } - 1]],
          'BlockStored: the ids /tokenize gives for the messages');
ok(!defined $st0->{parent_block_hash} && !defined $st0->{lora_name}
   && $st0->{medium} eq 'GPU' && $st0->{group_idx} == 0
   && $st0->{kv_cache_spec_kind} eq 'full_attention'
   && !exists $st0->{extra_keys},
   'BlockStored: no parent, GPU, full attention, no extra keys');

post($http1, '/v1/chat/completions', chat('kvsim', text(0)));
post($http1, '/v1/chat/completions', chat('kvsim', text(1)));
post($http1, '/v1/chat/completions', chat('ad1', text(0)));

my @seqs = (0);
my $lora;
while (my $n = recv_parts($sub, 1)) {
    push @seqs, be64($n->[1]);
    my $e = (eval { $mp->unpack($n->[2]) } // {})->{events}[0] // {};
    $lora = $e if defined $e->{lora_name};
}
is_deeply(\@seqs, [0, 1, 2],
          'seq 0, 1, 2: a cache hit stores nothing, publishes nothing');
ok($lora && $lora->{lora_name} eq 'ad1'
   && @{ $lora->{extra_keys} } == @{ $lora->{block_hashes} }
   && !grep({ ref ne 'ARRAY' || "@$_" ne 'ad1' } @{ $lora->{extra_keys} }),
   'an adapter (--lora): lora_name, extra_keys [["ad1"], ...]');
ok($lora && $lora->{block_hashes}[0] != $st0->{block_hashes}[0],
   'an adapter\'s blocks hash apart from the base model\'s');

# replay over a DEALER

my $r = replay($zmq1 + 1, 0);
is_deeply([map { $_->[0] } @$r], ['', '', '', ''],
          'replay: [""] first, as a DEALER receives');
is_deeply([map { $_->[1] eq $END ? -1 : be64($_->[1]) } @$r], [0, 1, 2, -1],
          'replay from 0: every batch, then seq -1');
is($r->[0][2], $m->[2], 'replay: the payload PUB sent');
is($r->[-1][2], '', 'replay: the end marker has an empty payload');

$r = replay($zmq1 + 1, 2);
is_deeply([map { $_->[1] eq $END ? -1 : be64($_->[1]) } @$r], [2, -1],
          'replay from 2: seq 2, then the end');

$r = replay($zmq1 + 1, 9);
is_deeply([map { $_->[1] eq $END ? -1 : be64($_->[1]) } @$r], [-1],
          'replay past the end: only the end marker');

# --- the positional encoding, digests, drops, the topic in replies -------

kvsim('array.log', '--base-port', $http2, '--events', 'zmq',
      '--keyspace', 'tokens', '--zmq-port', $zmq2, '--zmq-encoding', 'array',
      '--zmq-hash', 'bytes', '--zmq-drop', 1, '--zmq-topic', 'kv@sim',
      '--zmq-replay-topic', '--block-tokens', 8, '--tokenize-fail');
kvsim('late.log', '--base-port', $http3, '--redis', 'off',
      '--tokenize-delay-ms', 300);
ok(wait_port($http2) && wait_port($http3), 'two more kvsims');

$sub = socket_to(ZMQ_SUB(), $zmq2);
$sub->subscribe('');
sleep 0.5;

($st) = post($http2, '/v1/chat/completions', chat('kvsim', text(2)));
is($st, 200, 'a chat request');
ok(!recv_parts($sub, 0.5), '--zmq-drop 1: nothing on PUB');

$r = replay($zmq2 + 1, 0);
ok(@$r == 2 && @{ $r->[0] } == 4 && $r->[0][1] eq 'kv@sim'
   && be64($r->[0][2]) == 0 && $r->[1][1] eq 'kv@sim' && $r->[1][2] eq $END,
   'replay keeps the dropped batch: ["", topic, seq, payload], the end');

$b = eval { $mp->unpack($r->[0][3]) } // [];
$st0 = (ref $b eq 'ARRAY' && ref $b->[1] eq 'ARRAY') ? $b->[1][0] : [];
ok(ref $b eq 'ARRAY' && @$b == 3 && $b->[2] == 0,
   'positional: [ts, events, rank]');
ok(ref $st0 eq 'ARRAY' && @$st0 == 11 && $st0->[0] eq 'BlockStored'
   && $st0->[4] == 8 && @{ $st0->[3] } == 8 * @{ $st0->[1] }
   && $st0->[6] eq 'GPU' && $st0->[10] eq 'full_attention',
   'positional BlockStored: tag first, block_size 8, its ids, GPU');
ok(ref $st0 eq 'ARRAY' && !grep({ length != 32 } @{ $st0->[1] }),
   '--zmq-hash bytes: 32-byte digests');

($st, $j) = post($http2, '/tokenize', { prompt => 'hi' });
ok($st == 500 && $j->{error}{type} eq 'server_error',
   '--tokenize-fail: 500, an OpenAI error');

($st, $j, my $took) = post($http3, '/tokenize', { prompt => 'hi' });
ok($st == 200 && $j->{count} == 1 && $took >= 0.29,
   sprintf('--tokenize-delay-ms 300: answered after %.0f ms', 1000 * $took));

# a client that gives up on a late answer costs kvsim nothing
my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$http3") or die;
print $s "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 14\r\n\r\n"
       . '{"prompt":"a"}';
close $s;
sleep 0.4;
($st) = post($http3, '/tokenize', { prompt => 'hi' });
is($st, 200, 'a closed connection with a late answer waiting: still serving');

done_testing();
