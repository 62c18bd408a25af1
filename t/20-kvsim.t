# kvsim, the simulated model servers (tools/kvsim/): HTTP API, the prefix
# cache model as clients see it, KV events on Redis, resync, fault injection.
# Needs build/kvsim (make) and redis-server; every wait is bounded.

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
use Test::KvAware::Redis ();

my $KVSIM = $ENV{KVSIM_BINARY} || 'build/kvsim';
my $REDIS = $ENV{TEST_REDIS_SERVER} || 'redis-server';
my $CHAN  = 'kv_aware:events';
my $WAIT  = 10;                                 # s, any single wait

plan skip_all => "$KVSIM not built" unless -x $KVSIM;
plan skip_all => "$REDIS not found"
    unless grep { -x "$_/$REDIS" } split /:/, $ENV{PATH};

my $json = JSON::PP->new->utf8->canonical;
my $http = HTTP::Tiny->new(timeout => $WAIT);
my $dir  = tempdir(CLEANUP => 1);
my @pids;

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 120;

END { stop_all() }

# --- processes and ports ----------------------------------------------------

sub spawn {
    my ($log, @cmd) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>', "$dir/$log" or POSIX::_exit(127);
        open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
        exec @cmd or POSIX::_exit(127);
    }
    push @pids, $pid;
    return $pid;
}

sub wait_port {
    my ($port) = @_;
    my $end = time + $WAIT;
    while (time < $end) {
        my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                      Timeout => 1);
        return 1 if $s;
        sleep 0.05;
    }
    return 0;
}

# SIGTERM, then SIGKILL after 5 s; the exit status, -1 when killed
sub stop {
    my ($pid) = @_;
    @pids = grep { $_ != $pid } @pids;
    kill 'TERM', $pid;
    my $end = time + 5;
    while (time < $end) {
        return $? if waitpid($pid, WNOHANG) == $pid;
        sleep 0.02;
    }
    kill 'KILL', $pid;
    waitpid($pid, 0);
    return -1;
}

sub stop_all {
    stop($_) for @pids;
}

sub slurp {
    open my $fh, '<', "$dir/$_[0]" or return '';
    local $/;
    return <$fh>;
}

# --- Redis: subscriber and publisher (Test::KvAware::Redis) ----------------

sub redis_do {
    my ($port, @cmd) = @_;
    return Test::KvAware::Redis->new($port)->cmd(@cmd);
}

# event messages until $pred says yes; all of them land in $c->{seen}
sub wait_event {
    my ($c, $pred) = @_;
    my $deadline = time + $WAIT;
    while ((my $left = $deadline - time) > 0) {
        my ($v) = $c->messages($left, sub { 1 }) or last;
        my $m = eval { $json->decode($v->[1]) };
        if (!$m) {
            diag "undecodable event: $v->[1]";
            next;
        }
        push @{ $c->{seen} }, $m;
        return $m if $pred->($m);
    }
    return undef;
}

# --- HTTP helpers -----------------------------------------------------------

sub get {
    my ($port, $path) = @_;
    return $http->get("http://127.0.0.1:$port$path");
}

sub post {
    my ($port, $path, $body) = @_;
    my $r = $http->post("http://127.0.0.1:$port$path", {
        content => ref $body ? $json->encode($body) : $body,
        headers => { 'Content-Type' => 'application/json' } });
    $r->{json} = eval { $json->decode($r->{content}) }
        if ($r->{headers}{'content-type'} // '') =~ /json/;
    return $r;
}

sub metric {
    my ($port, $name) = @_;
    my $r = get($port, '/metrics');
    return $r->{content} =~ /^\Q$name\E(?:\{[^}]*\})? (\S+)$/m ? $1 : undef;
}

sub sse {
    my ($content) = @_;
    return map { /^data: (.*)$/ ? $1 : () } split /\n\n/, $content;
}

# --- start ------------------------------------------------------------------

my $rport = free_run(1);
spawn('redis.log', $REDIS, '--bind', '127.0.0.1', '--port', $rport,
      '--save', '', '--appendonly', 'no', '--daemonize', 'no');
wait_port($rport) or BAIL_OUT('redis-server does not start');

my $sub = eval { Test::KvAware::Redis->new($rport)->subscribe($CHAN) };
ok($sub, 'subscribed to the events') or diag $@;

my $base = free_run(2);
my ($A, $B) = ($base, $base + 1);
my ($idA, $idB) = ("127.0.0.1:$A", "127.0.0.1:$B");

my $kvsim = spawn('kvsim.log', $KVSIM, '--servers', 2, '--base-port', $base,
      '--redis', "127.0.0.1:$rport", '--time-scale', 50,
      '--heartbeat-ms', 200, '--quiet');
wait_port($A) && wait_port($B) or BAIL_OUT('kvsim does not start');

# --- HTTP API ---------------------------------------------------------------

for my $p ($A, $B) {
    my $r = get($p, '/health');
    is($r->{status}, 200, "/health on $p");
}

my $r = get($A, '/v1/models');
is($r->{status}, 200, '/v1/models');
like($r->{content}, qr/"object":"list".*"id":"kvsim"/, 'lists the model');

$r = post($A, '/v1/chat/completions', {
    model => 'm', max_tokens => 5,
    messages => [ { role => 'user', content => 'hello there' } ] });
is($r->{status}, 200, 'chat completion');
my $u = $r->{json}{usage};
my $plen = length("hello there\x1fuser\x1e");
is_deeply([ @$u{qw(prompt_tokens completion_tokens total_tokens)} ],
          [ int(($plen + 3) / 4), 5, int(($plen + 3) / 4) + 5 ],
          'usage: prompt tokens are 4-byte pieces, exactly max_tokens out');
is($u->{prompt_tokens_details}{cached_tokens}, 0, 'nothing cached yet');
is($r->{headers}{'x-kvsim-server'}, $idA, 'X-Kvsim-Server');
is($r->{json}{kvsim}{server}, $idA, 'kvsim.server in the body');
is($r->{json}{object}, 'chat.completion', 'an OpenAI chat completion');
is(length $r->{json}{choices}[0]{message}{content}, 20, '5 tokens of text');

$r = post($A, '/v1/completions', { prompt => 'x', max_tokens => 1 });
is($r->{json}{choices}[0]{finish_reason}, 'length',
   '/v1/completions, default model');

$r = post($A, '/v1/chat/completions', '{"messages": [');
is($r->{status}, 400, 'a broken body: 400');
ok($r->{json} && $r->{json}{error}{message}, 'with an OpenAI error object');

$r = post($A, '/v1/completions', { model => 'm' });
is($r->{status}, 400, 'no prompt: 400');

# --- the prefix cache as clients see it -------------------------------------

my $long = 'abcd' x 300;                # 1200 bytes: 4 full blocks of 256
my %before = map { $_ => metric($A, "vllm:$_") }
    qw(prefix_cache_hits_total prefix_cache_queries_total
       request_success_total generation_tokens_total);

my @cached;
for (1 .. 2) {
    $r = post($A, '/v1/completions',
              { model => 'm', prompt => $long, max_tokens => 4 });
    push @cached, $r->{json}{usage}{prompt_tokens_details}{cached_tokens};
}
is_deeply(\@cached, [ 0, 256 ],
          'a repeated prompt hits its 4 full blocks: 4 * 64 tokens');
is($r->{json}{kvsim}{cached_tokens}, 256, 'kvsim.cached_tokens too');

$r = post($B, '/v1/completions',
          { model => 'm', prompt => $long, max_tokens => 4 });
is($r->{json}{usage}{prompt_tokens_details}{cached_tokens}, 0,
   'the other server has its own cache');

$r = post($A, '/v1/completions',
          { model => 'other', prompt => $long, max_tokens => 1 });
is($r->{json}{usage}{prompt_tokens_details}{cached_tokens}, 0,
   'another model never shares blocks');

$r = post($A, '/v1/chat/completions', {
    model => 'm', max_tokens => 6, stream => JSON::PP::true,
    messages => [ { role => 'user', content => $long } ] });
is($r->{status}, 200, 'streaming chat completion');
like($r->{headers}{'content-type'}, qr{^text/event-stream}, 'as SSE');
my @data = sse($r->{content});
is($data[-1], '[DONE]', 'ends with [DONE]');
my @chunks = map { $json->decode($_) } @data[0 .. $#data - 1];
is(scalar(grep { defined $_->{choices}[0]{delta}{content} } @chunks), 6,
   'one chunk per token');
is($chunks[0]{kvsim}{server}, $idA, 'the first chunk says who served');
is($chunks[0]{kvsim}{cached_tokens}, 256,
   'the chat form of the prompt shares the text blocks');
is($chunks[0]{choices}[0]{delta}{role}, 'assistant', 'role first');
is($chunks[-1]{choices}[0]{finish_reason}, 'length', 'finish_reason');
is($chunks[-1]{usage}{completion_tokens}, 6, 'usage in the last chunk');

my %after = map { $_ => metric($A, "vllm:$_") } keys %before;
is($after{prefix_cache_hits_total} - $before{prefix_cache_hits_total}, 512,
   '/metrics: prefix cache hits in tokens');
ok($after{prefix_cache_queries_total} - $before{prefix_cache_queries_total}
   >= 3 * 301, '/metrics: prefix cache queries in tokens');
is($after{request_success_total} - $before{request_success_total}, 4,
   '/metrics: requests');
is($after{generation_tokens_total} - $before{generation_tokens_total}, 15,
   '/metrics: generated tokens');
for my $m (qw(vllm:num_requests_waiting vllm:num_requests_running
              vllm:gpu_cache_usage_perc vllm:num_preemptions_total)) {
    ok(defined metric($A, $m), "/metrics: $m");
}

# --- KV events --------------------------------------------------------------

my $stored = wait_event($sub, sub {
    my ($m) = @_;
    $m->{server} eq $idA && grep { $_->{type} eq 'stored' }
                                 @{ $m->{events} || [] };
});
ok($stored, 'stored events on the channel');
my ($ev) = grep { $_->{type} eq 'stored' } @{ $stored->{events} || [] };
is(scalar @{ $ev->{hashes} || [] }, 4, 'the 4 blocks of the prompt');
ok(!grep({ !/^[0-9a-f]{16}$/ } @{ $ev->{hashes} }), 'as 16 hex digits');
ok(!defined $ev->{parent}, 'the first block has no parent');
is($stored->{v}, 1, 'protocol version 1');
ok(ref $stored->{load} && defined $stored->{load}{kv_usage}, 'with load');
is($stored->{load}{kv_tokens}, 4802 * 64,
   'and its pool in tokens: --num-blocks x --block-tokens (defaults)');

# the first message of each server clears what receivers knew
my ($first) = grep { $_->{server} eq $idA } @{ $sub->{seen} };
is($first->{seq}, 1, 'seq starts at 1');
is($first->{events}[0]{type}, 'cleared', 'starting: cleared');

# heartbeats keep coming and seq has no gap
my $n = 0;
wait_event($sub, sub { $_[0]{server} eq $idB && ++$n >= 3 });
for my $id ($idA, $idB) {
    my @seq = map { $_->{seq} } grep { $_->{server} eq $id } @{ $sub->{seen} };
    my @gaps = grep { $seq[$_] != $seq[$_ - 1] + 1 } 1 .. $#seq;
    ok(@seq >= 3 && !@gaps, "$id: seq +1 per message (@seq[0 .. 2] ...)");
}
ok(grep({ $_->{server} eq $idB && !$_->{events} && $_->{load} }
        @{ $sub->{seen} }), 'heartbeats with load');

# resync: a snapshot of all cached blocks
my %held;
for my $m (grep { $_->{server} eq $idA } @{ $sub->{seen} }) {
    for my $e (@{ $m->{events} || [] }) {
        %held = () if $e->{type} eq 'cleared';
        $held{$_} = 1 for $e->{type} eq 'stored' ? @{ $e->{hashes} } : ();
        delete @held{ @{ $e->{hashes} } } if $e->{type} eq 'removed';
    }
}

redis_do($rport, 'PUBLISH', "$CHAN:resync",
         $json->encode({ v => 1, type => 'resync', server => $idA }));
my $snap = wait_event($sub, sub { $_[0]{server} eq $idA
                                  && $_[0]{snapshot} });
ok($snap, 'a resync request gets a snapshot');
is($snap && $snap->{snapshot}, 'full', 'in one message');
my @snap = map { @{ $_->{hashes} || [] } } @{ $snap->{events} || [] };
is_deeply([ sort @snap ], [ sort keys %held ],
          'holding exactly what the events said (' . scalar(@snap)
          . ' blocks)');

redis_do($rport, 'PUBLISH', "$CHAN:resync",
         $json->encode({ v => 1, type => 'resync', server => '10.0.0.1:1' }));
redis_do($rport, 'PUBLISH', "$CHAN:resync", 'not json');
$n = 0;
my $other = wait_event($sub, sub { $_[0]{snapshot} || ++$n >= 4 });
ok($other && !$other->{snapshot}, 'foreign or broken requests: ignored');

# --- fault injection: dropped events leave seq gaps --------------------------

my $dport = free_run(1);
my $kvsim_drop = spawn('kvsim-drop.log', $KVSIM, '--servers', 1,
      '--base-port', $dport, '--redis', "127.0.0.1:$rport",
      '--heartbeat-ms', 20, '--drop-events', 0.5, '--seed', 7, '--quiet');
wait_port($dport) or BAIL_OUT('kvsim --drop-events does not start');
$n = 0;
wait_event($sub, sub { $_[0]{server} eq "127.0.0.1:$dport" && ++$n >= 20 });
my @dseq = map { $_->{seq} }
    grep { $_->{server} eq "127.0.0.1:$dport" } @{ $sub->{seen} };
my @gaps = grep { $dseq[$_] > $dseq[$_ - 1] + 1 } 1 .. $#dseq;
ok(@dseq >= 20 && @gaps, '--drop-events 0.5: gaps in seq ('
   . scalar(@gaps) . ' in ' . scalar(@dseq) . ' messages)');
ok(!grep({ $dseq[$_] <= $dseq[$_ - 1] } 1 .. $#dseq),
   'seq still increases');
ok(metric($dport, 'kvsim_events_dropped_total') > 0, 'counted in /metrics');

# --- Redis away: HTTP goes on -------------------------------------------------

stop($pids[0]);                         # redis-server
$r = post($A, '/v1/completions',
          { model => 'm', prompt => $long, max_tokens => 2 });
is($r->{status}, 200, 'Redis down: still serving');
is($r->{json}{usage}{prompt_tokens_details}{cached_tokens}, 256,
   'with its cache');

# in flight while stopping: answered, and a clean exit
my $pid = fork // die "fork: $!";
if ($pid == 0) {
    post($A, '/v1/completions', { prompt => 'x', max_tokens => 1000000 });
    POSIX::_exit(0);
}
sleep 0.3;
is(stop($kvsim), 0, 'SIGTERM: kvsim exits 0 with a request in flight');
is(stop($kvsim_drop), 0, 'the other one too');
waitpid($pid, 0);
for my $log ('kvsim.log', 'kvsim-drop.log') {
    unlike(slurp($log), qr/AddressSanitizer|LeakSanitizer|runtime error/,
           "$log: no sanitizer report");
}
stop_all();

done_testing();
