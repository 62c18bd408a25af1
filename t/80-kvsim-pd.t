# kvsim's disaggregated roles (tools/kvsim/kvsim_pd.c, kvsim_pull.c): a
# prefill server answering vLLM's leg 1 and holding the blocks, a decode
# server pulling only what it lacks and publishing it, llm-d's sidecar
# header, SGLang's bootstrap room in both orders, held blocks timing out,
# hostile params.  Real kvsim processes and redis-server; waits bounded.

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
my $WAIT  = 10;

plan skip_all => "$KVSIM not built" unless -x $KVSIM;
plan skip_all => "$REDIS not found"
    unless grep { -x "$_/$REDIS" } split /:/, $ENV{PATH};

my $json = JSON::PP->new->utf8->canonical;
my $http = HTTP::Tiny->new(timeout => $WAIT);
my $dir  = tempdir(CLEANUP => 1);
my @pids;

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 120;

END { kill 'TERM', @pids; waitpid($_, 0) for @pids }

sub spawn {
    my ($log, @cmd) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>', "$dir/$log" or POSIX::_exit(127);
        open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
        exec @cmd or POSIX::_exit(127);
    }
    push @pids, $pid;
}

sub wait_port {
    my $end = time + $WAIT;
    while (time < $end) {
        return 1 if IO::Socket::INET->new(PeerAddr => "127.0.0.1:$_[0]");
        sleep 0.05;
    }
    return 0;
}

sub post {
    my ($port, $path, $body, %h) = @_;
    my $r = $http->post("http://127.0.0.1:$port$path", {
        content => ref $body ? $json->encode($body) : $body,
        headers => { 'Content-Type' => 'application/json', %h } });
    $r->{json} = eval { $json->decode($r->{content}) };
    return $r;
}

sub metric {
    my ($port, $name) = @_;
    my $r = $http->get("http://127.0.0.1:$port/metrics");
    return $r->{content} =~ /^\Q$name\E(?:\{[^}]*\})? (\S+)$/m ? $1 : undef;
}

# a request left waiting on its socket, read later (the other order)
sub send_async {
    my ($port, $body) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port")
        or die "connect: $!";
    my $b = $json->encode($body);
    print $s "POST /v1/completions HTTP/1.0\r\nHost: x\r\n"
        . "Content-Type: application/json\r\nContent-Length: "
        . length($b) . "\r\n\r\n$b";
    return $s;
}

sub read_async {
    my ($s) = @_;
    local $/;
    my $all = <$s> // '';
    my ($body) = $all =~ /\r\n\r\n(.*)\z/s;
    return eval { $json->decode($body // '') };
}

# vLLM's toy proxy's leg 1
sub leg1 {
    my ($body) = @_;
    return { %$body, stream => JSON::PP::false, max_tokens => 1,
             kv_transfer_params => {
                 do_remote_decode => JSON::PP::true,
                 do_remote_prefill => JSON::PP::false,
                 map { $_ => undef } qw(remote_engine_id remote_block_ids
                                        remote_host remote_port) } };
}

# --- start ------------------------------------------------------------------

my $rport = free_run(1);
spawn('redis.log', $REDIS, '--bind', '127.0.0.1', '--port', $rport,
      '--save', '', '--appendonly', 'no');
wait_port($rport) or BAIL_OUT('redis-server does not start');
my $sub = Test::KvAware::Redis->new($rport)->subscribe($CHAN);

my $base = free_run(4);
my ($P, $Q, $D, $BP) = ($base, $base + 1, $base + 2, $base + 3);
my @common = ('--servers', 1, '--heartbeat-ms', 5000);
spawn('p.log', $KVSIM, @common, '--base-port', $P, '--role', 'prefill',
      '--redis', "127.0.0.1:$rport", '--bootstrap-port', $BP);
spawn('q.log', $KVSIM, @common, '--base-port', $Q, '--role', 'prefill',
      '--redis', 'off', '--kv-hold-s', 0.2);
spawn('d.log', $KVSIM, @common, '--base-port', $D, '--role', 'decode',
      '--sidecar', '--pd-wait-s', 2, '--redis', "127.0.0.1:$rport");
wait_port($_) or BAIL_OUT("kvsim on $_ does not start") for $P, $Q, $D, $BP;

# 600 tokens of 4 bytes: 9 full blocks of 64
my $prompt = 'abcd' x 600;

# --- leg 1 on the prefill server --------------------------------------------

my $r = post($P, '/v1/completions',
             leg1({ prompt => $prompt, stream => JSON::PP::true,
                    stream_options => { include_usage => JSON::PP::true } }),
             'X-Request-Id' => 'rid-1');
is($r->{status}, 200, 'leg 1: 200');
is($r->{json}{usage}{completion_tokens}, 1, 'one token, not streamed');
my $kv = $r->{json}{kv_transfer_params};
is_deeply([ sort keys %{ $kv || {} } ],
          [ qw(do_remote_decode do_remote_prefill remote_block_ids
               remote_engine_id remote_host remote_port remote_request_id
               tp_size) ], 'kv_transfer_params: every field of vLLM\'s');
ok($kv->{do_remote_prefill} && !$kv->{do_remote_decode},
   'do_remote_prefill true, do_remote_decode false');
is(scalar @{ $kv->{remote_block_ids} }, 9, 'the 9 full blocks of the prompt');
is_deeply([ @$kv{qw(remote_request_id remote_host remote_port tp_size)} ],
          [ 'rid-1', '127.0.0.1', $P, 1 ],
          'remote_request_id is the X-Request-Id; the server\'s address');
like($kv->{remote_engine_id}, qr/^kvsim-127\.0\.0\.1:$P-0$/, 'engine id');
is(metric($P, 'kvsim_pd_blocks_held'), 9, 'the blocks are held');
is(metric($P, 'kvsim_pd_prefill_legs_total'), 1, 'a prefill leg counted');

# --- leg 2 on the decode server: pulls, publishes, decodes ------------------

$r = post($D, '/v1/completions',
          { prompt => $prompt, max_tokens => 4, kv_transfer_params => $kv });
is($r->{status}, 200, 'leg 2: 200');
is($r->{json}{usage}{completion_tokens}, 4, 'decoded max_tokens');
is($r->{json}{usage}{prompt_tokens_details}{cached_tokens}, 576,
   'cached_tokens: the 9 pulled blocks');
is_deeply([ @{ $r->{json}{kvsim}{pd} }{qw(mode local_blocks pulled_blocks)} ],
          [ 'vllm', 0, 9 ], 'kvsim.pd: nothing local, 9 pulled');
is(metric($D, 'kvsim_pd_blocks_pulled_total'), 9, 'decode: 9 blocks pulled');
is(metric($D, 'kvsim_pd_bytes_pulled_total'), 9 * 64 * 262144,
   'decode: their bytes (--kv-token-bytes x 64 tokens a block)');
is(metric($P, 'kvsim_pd_blocks_held'), 0, 'prefill: released once pulled');
is(metric($P, 'kvsim_pd_pulls_served_total'), 1, 'prefill: a pull served');

my (%stored, $end);
$end = time + $WAIT;
while (time < $end && (keys %stored < 2
                       || @{ $stored{"127.0.0.1:$D"} || [] } < 9)) {
    my ($v) = $sub->messages($end - time, sub { 1 }) or last;
    my $m = eval { $json->decode($v->[1]) } or next;
    push @{ $stored{ $m->{server} } }, @{ $_->{hashes} }
        for grep { $_->{type} eq 'stored' } @{ $m->{events} || [] };
}
is_deeply($stored{"127.0.0.1:$D"}, $stored{"127.0.0.1:$P"},
          'the decode publishes the pulled blocks, the keys the prefill '
          . 'published');

# the same prefix again: only the blocks the decode lacks move
my $prompt2 = ('abcd' x 384) . ('efgh' x 216);
$r = post($P, '/v1/completions', leg1({ prompt => $prompt2 }));
$kv = $r->{json}{kv_transfer_params};
$r = post($D, '/v1/completions',
          { prompt => $prompt2, max_tokens => 2, kv_transfer_params => $kv });
is_deeply([ @{ $r->{json}{kvsim}{pd} }{qw(local_blocks pulled_blocks)} ],
          [ 6, 3 ], 'a shared prefix: 6 blocks held locally, 3 pulled');
is($r->{json}{usage}{prompt_tokens_details}{cached_tokens}, 576,
   'cached_tokens counts both');
is(metric($D, 'kvsim_pd_blocks_pulled_total'), 12, 'decode: 3 more moved');
is(metric($P, 'kvsim_pd_blocks_held'), 0, 'prefill: all released');

# --- llm-d's sidecar ----------------------------------------------------------

my $legs = metric($P, 'kvsim_pd_prefill_legs_total');
my $prompt3 = 'side' x 600;
$r = post($D, '/v1/completions',
          { prompt => $prompt3, max_tokens => 3, stream => JSON::PP::true },
          'x-prefiller-host-port' => "127.0.0.1:$P",
          'X-Request-Id' => 'side-1');
is($r->{status}, 200, 'sidecar: 200');
my @chunks = map { /^data: (\{.*)$/ ? $json->decode($1) : () }
             split /\n\n/, $r->{content};
is(scalar @chunks, 3, 'streamed, 3 tokens');
is($chunks[0]{kvsim}{pd}{mode}, 'sidecar', 'the decode ran leg 1');
is($chunks[0]{kvsim}{pd}{remote_request_id}, 'side-1',
   'the prefill got the same X-Request-Id on leg 1');
is($r->{headers}{'x-request-id'}, 'side-1', 'echoed on leg 2');
is($chunks[0]{kvsim}{pd}{pulled_blocks}, 9, 'then pulled its 9 blocks');
is(metric($P, 'kvsim_pd_prefill_legs_total'), $legs + 1,
   'one more leg 1 on the prefill server');

$r = post($D, '/v1/completions', { prompt => 'none' x 600, max_tokens => 2 });
ok(!$r->{json}{kvsim}{pd}, 'no header: aggregated');
is($r->{json}{usage}{prompt_tokens_details}{cached_tokens}, 0,
   'computed on the decode server');

# --- held blocks time out: the pull fails, the decode serves anyway ---------

$r = post($Q, '/v1/completions', leg1({ prompt => 'late' x 600 }));
$kv = $r->{json}{kv_transfer_params};
$end = time + $WAIT;
sleep 0.1 while time < $end && metric($Q, 'kvsim_pd_blocks_held') > 0;
is(metric($Q, 'kvsim_pd_holds_expired_total'), 1,
   '--kv-hold-s 0.2: the hold expired');
my $fails = metric($D, 'kvsim_pd_pull_failures_total');
$r = post($D, '/v1/completions',
          { prompt => 'late' x 600, max_tokens => 2,
            kv_transfer_params => $kv });
is($r->{status}, 200, 'a pull after the timeout: still 200');
is($r->{json}{kvsim}{pd}{fallback}, 'pull refused', 'fell back: refused');
is($r->{json}{usage}{prompt_tokens_details}{cached_tokens}, 0,
   'the decode computed the prompt');
is(metric($D, 'kvsim_pd_pull_failures_total'), $fails + 1, 'counted');
is(post($Q, '/kv/pull', { id => $kv->{remote_request_id},
                          block_ids => [0] })->{status}, 404,
   'the prefill: 404 for an expired hold');

# --- hostile and missing params ---------------------------------------------

my $ok = { do_remote_prefill => JSON::PP::true, remote_host => '127.0.0.1',
           remote_port => $P, remote_request_id => 'x',
           remote_block_ids => [0] };
my @bad = (
    'a string', [ 1 ], { do_remote_prefill => JSON::PP::true },
    { %$ok, remote_host => 'localhost' }, { %$ok, remote_port => 99999 },
    { %$ok, remote_port => '80' }, { %$ok, remote_block_ids => 'x' },
    { %$ok, remote_block_ids => [ -1 ] }, { %$ok, remote_block_ids => [ [] ] },
    { %$ok, remote_request_id => 'a"b' }, { %$ok, remote_request_id => 7 },
    { %$ok, remote_host => '127.0.0.1', remote_port => $Q + 1000 },
    { %$ok, remote_request_id => 'nobody' },
);
my $i = 0;
for my $kvb (@bad) {
    $r = post($D, '/v1/completions', { prompt => "bad $i " x 30,
                                       max_tokens => 2,
                                       kv_transfer_params => $kvb });
    is($r->{json}{usage}{completion_tokens}, 2,
       "hostile params $i: served aggregated");
    $i++;
}
$r = post($D, '/v1/completions', { prompt => 'deep', max_tokens => 1,
                                   kv_transfer_params =>
                                       ('[' x 5000) . (']' x 5000) });
ok($r->{status} == 200 || $r->{status} == 400, 'deep params: answered');

for my $body ('{', '[]', '{"id":"x"}', '{"id":"rid-1","block_ids":"z"}',
              '{"id":3,"block_ids":[]}', '{"id":"a","first_block":-1}') {
    $r = post($P, '/kv/pull', $body);
    ok($r->{status} >= 400 && $r->{status} < 500, "pull $body: refused");
}
$r = post($P, '/v1/completions', leg1({ prompt => 'hold' x 600 }),
          'X-Request-Id' => 'hold-1');
is(post($P, '/kv/pull', { id => 'hold-1', block_ids => [ 99999 ] })->{status},
   400, 'a block the hold does not have: 400');
is($http->get("http://127.0.0.1:$_/health")->{status}, 200, "$_ alive")
    for $P, $D;

# a prefill server that accepts and never answers: the pull times out
my $silent = IO::Socket::INET->new(Listen => 16, LocalAddr => '127.0.0.1',
                                   LocalPort => 0) or die "listen: $!";
my $mute = { %$ok, remote_port => $silent->sockport };
my $timeouts = metric($D, 'kvsim_pd_pull_timeouts_total');
my $t1 = time;
$r = post($D, '/v1/completions', { prompt => 'mute' x 600, max_tokens => 2,
                                   kv_transfer_params => $mute });
is($r->{json}{kvsim}{pd}{fallback}, 'pull timed out',
   sprintf('a silent prefill: served aggregated after %.1f s', time - $t1));
is(metric($D, 'kvsim_pd_pull_timeouts_total'), $timeouts + 1,
   'a pull timeout counted');

# a client that leaves while its request waits on the pull
my $fallbacks = metric($D, 'kvsim_pd_fallbacks_total');
my $gone = send_async($D, { prompt => 'gone' x 600, max_tokens => 2,
                            kv_transfer_params => $mute });
sleep 0.3;
close $gone;
sleep 2.2;                              # nothing fires later
is($http->get("http://127.0.0.1:$D/health")->{status}, 200,
   'a client gone during the pull: the decode lives on');
is(metric($D, 'kvsim_pd_fallbacks_total'), $fallbacks,
   'and serves nobody for it');

# --- SGLang's bootstrap room --------------------------------------------------

sub boot {
    my ($p, $room, $port) = @_;
    return { prompt => $p, max_tokens => 3, bootstrap_host => '127.0.0.1',
             bootstrap_port => $port // $P, bootstrap_room => $room };
}

$r = post($P, '/v1/completions', boot('room' x 600, 11));
is($r->{status}, 200, 'sglang, prefill first: the prefill answers');
$r = post($D, '/v1/completions', boot('room' x 600, 11));
is_deeply([ @{ $r->{json}{kvsim}{pd} }{qw(mode pulled_blocks)} ],
          [ 'sglang', 9 ], 'then the decode pulls the room\'s 9 blocks');

my $s = send_async($D, boot('wait' x 600, 12, $BP));
sleep 0.3;
$r = post($P, '/v1/completions', boot('wait' x 600, 12, $BP));
my $j = read_async($s);
is_deeply([ @{ $j->{kvsim}{pd} || {} }{qw(mode pulled_blocks fallback)} ],
          [ 'sglang', 9, undef ],
          'sglang, decode first: it waits, pulls (from --bootstrap-port)');
is(post($BP, '/v1/completions', boot('x', 1))->{status}, 404,
   'the bootstrap port serves pulls only');
ok(metric($D, 'kvsim_pd_bootstrap_retries_total') > 0, 'retries counted');

my $t0 = time;
$r = post($D, '/v1/completions', boot('gone' x 600, 13));
my $took = time - $t0;
is($r->{json}{kvsim}{pd}{fallback}, 'bootstrap room never ready',
   'a prefill that never comes: served aggregated');
ok($took > 1.5 && $took < 8, sprintf('after --pd-wait-s 2 (%.1f s)', $took));
is($r->{json}{usage}{completion_tokens}, 3, 'with every token');

# a clean exit (LeakSanitizer's and UBSan's reports under make test-asan)
kill 'TERM', @pids;
waitpid($_, 0) for @pids;
@pids = ();
for my $log (qw(p.log q.log d.log)) {
    open my $fh, '<', "$dir/$log" or next;
    my @bad = grep { /Sanitizer|runtime error/ } <$fh>;
    ok(!@bad, "$log: no sanitizer report") or diag @bad;
}

done_testing();
