# kv_aware cost=ttft: placement by predicted time to first token.
#
#   * a heterogeneous pool (kvsim --slow-servers: one server of four
#     prefills at a quarter of the speed) under load: the rate kv_aware
#     learns for the slow server is well below the others', and the slow
#     server computes proportionally fewer prompt tokens (its own
#     /metrics say so).  kvsim sends a streamed answer's headers before
#     its prefill, as vLLM and SGLang do (--early-headers): what teaches
#     is the first chunk's time, not the header's;
#   * the status page and the Prometheus page show each server's rate,
#     its samples and the time to first token predicted and observed;
#   * hostile answers teach nothing: a server that answers 502 at once,
#     one that answers whole (not streamed); the kvsim server beside them
#     is learned;
#   * nginx -t refuses a bad cost= or ttft_rate=.

use strict;
use warnings;

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use Test::KvAware qw(skip_unless_module free_run);

my $KVSIM  = $ENV{KVSIM_BINARY} || 'build/kvsim';
my $KVLOAD = $ENV{KVLOAD_BINARY} || 'build/kvload';

skip_unless_module();
plan skip_all => "$KVSIM or $KVLOAD not built (make tools)"
    unless -x $KVSIM && -x $KVLOAD;

my $SERVERS = 4;
my $SCALE   = 5;
my $json    = JSON::PP->new->canonical;

my $base = free_run($SERVERS);
my $env  = Test::KvAware->new(backends => 2,
                              backend_modes => [qw(fail ok)],
                              log_level => 'info');

ok(eval { $env->launch->start_kvsim($base, $SERVERS, { binary => $KVSIM },
              '--time-scale', $SCALE, '--redis', 'off', '--quiet',
              '--slow-servers', 0, '--slow-factor', 4, '--early-headers') },
   'kvsim listens, server 0 prefilling at a quarter of the speed')
    or diag $@;

my @kvsim = map { "127.0.0.1:$_" } $base .. $base + $SERVERS - 1;
my $pool = join ' ', map { "server $_;" } @kvsim;

# kv: the heterogeneous pool; hostile: a 502 at once, a whole answer, and
# a kvsim server that streams
$env->conf(http_config => "
    client_body_buffer_size 1m;
    upstream kv { kv_aware cost=ttft; $pool }
    upstream hostile {
        kv_aware cost=ttft block_size=64;
        server \$TEST_NGINX_BACKEND_1 max_fails=0;
        server \$TEST_NGINX_BACKEND_2 max_fails=0;
        server $kvsim[1] max_fails=0;
    }",
           config => '
        location / { proxy_pass http://kv; proxy_buffering off; }
        location /hostile/ { proxy_pass http://hostile/; }
        location = /kv_status { kv_aware_status; }
        location = /metrics { kv_aware_status prometheus; }');
$env->start_nginx or BAIL_OUT('nginx did not start');

sub servers {
    my ($upstream) = @_;
    my $r = $env->request(GET => '/kv_status');
    my $st = eval { $json->decode($r->{body}) } || {};
    return { map { $_->{name} => $_ }
             @{ $st->{upstreams}{$upstream}{servers} || [] } };
}

sub median {
    my @v = sort { $a <=> $b } @_;
    return @v % 2 ? $v[$#v / 2] : ($v[@v / 2 - 1] + $v[@v / 2]) / 2;
}

# ---- a heterogeneous pool under load

my $out = $env->prefix . '/kvload.txt';
my $rc = system("timeout 60 $KVLOAD --target 127.0.0.1:" . $env->port
                . " --workload no-sharing --qps-ladder 40:6"
                . " --time-scale $SCALE --system-tokens 1000"
                . " --question-tokens 1000 --output-tokens 16"
                . " --drain-seconds 20 > $out 2>&1");
is($rc, 0, 'kvload ran') or diag(`tail -5 $out`);

my $s = servers('kv');
my $slow = $s->{ $kvsim[0] } || {};
my @fast = map { $s->{$_} || {} } @kvsim[1 .. $#kvsim];

ok((grep { ($_->{ttft}{samples} // 0) >= 4 } $slow, @fast) == $SERVERS,
   'every server learned from 4 answers or more')
    or diag($json->encode($s));

my $fast_rate = median(map { $_->{ttft}{rate} // 0 } @fast);
my $slow_rate = $slow->{ttft}{rate} // 0;
ok($slow_rate > 0 && $slow_rate < 0.5 * $fast_rate,
   "the slow server's learned rate is well below the others' "
   . "($slow_rate against $fast_rate blocks a second)");

ok((grep { ($_->{ttft}{predicted_ms} // 0) > 0
           && ($_->{ttft}{observed_ms} // 0) > 0 } $slow, @fast)
   == $SERVERS, 'each server shows a prediction and an observation');

# what each server computed, from its own /metrics
sub misses {
    my ($addr) = @_;
    my ($port) = $addr =~ /:(\d+)$/;
    my $r = $env->request(GET => '/metrics', undef, {}, port => $port);
    my ($q) = $r->{body} =~ /^vllm:prefix_cache_queries_total\S* (\d+)/m;
    my ($h) = $r->{body} =~ /^vllm:prefix_cache_hits_total\S* (\d+)/m;
    return ($q // 0) - ($h // 0);
}

my @miss = map { misses($_) } @kvsim;
my $fast_mean = ($miss[1] + $miss[2] + $miss[3]) / 3;
ok($fast_mean > 0 && $miss[0] < 0.6 * $fast_mean,
   'the slow server computes proportionally fewer prompt tokens '
   . "($miss[0] against $fast_mean on average)");

# ---- Prometheus: the same rates

my $p = $env->request(GET => '/metrics')->{body} // '';
my %prom;
while ($p =~ /^kv_aware_server_prefill_rate_blocks\{upstream="kv",
              server="([^"]+)"\}\s+(\d+)/mgx)
{
    $prom{$1} = $2;
}
is(scalar keys %prom, $SERVERS, 'Prometheus: a rate for each server');
ok(($prom{ $kvsim[0] } // 0) > 0
   && $prom{ $kvsim[0] } < 0.5 * median(@prom{ @kvsim[1 .. $#kvsim] }),
   'Prometheus: the slow server is the slow one');
like($p, qr/^kv_aware_server_ttft_predicted_ms\{upstream="kv",/m,
     'Prometheus: the predictions');

# ---- hostile answers

my %status;
for my $i (1 .. 12) {
    my $prompt = join ' ', map { "hostile $i asks question $_." } 1 .. 40;
    my $r = $env->request(POST => '/hostile/v1/chat/completions',
                          $json->encode({ model => 'kvsim', stream => \1,
                                          max_tokens => 2,
                                          messages => [ { role => 'user',
                                                   content => $prompt } ] }),
                          { 'Content-Type' => 'application/json' });
    $status{ $r->{status} }++;
}

ok($status{502} && $status{200}, 'the hostile pool answered 502 and 200')
    or diag(join ' ', %status);

my $h = servers('hostile');
my $fail = $h->{ '127.0.0.1:' . $env->backend_port(1) } || {};
my $whole = $h->{ '127.0.0.1:' . $env->backend_port(2) } || {};
my $good = $h->{ $kvsim[1] } || {};

ok(($fail->{ttft}{ignored} // 0) > 0 && ($fail->{ttft}{samples} // -1) == 0
   && ($fail->{ttft}{rate} // -1) == 0,
   'a server answering 502 at once teaches no rate')
    or diag($json->encode($fail));
ok(($whole->{ttft}{ignored} // 0) > 0
   && ($whole->{ttft}{samples} // -1) == 0,
   'a whole (not streamed) answer teaches no rate')
    or diag($json->encode($whole));
ok(($good->{ttft}{samples} // 0) > 0 && ($good->{ttft}{rate} // 0) > 0,
   'the streaming server beside them is learned')
    or diag($json->encode($good));
is($fail->{ttft}{queued_blocks} + $whole->{ttft}{queued_blocks}
   + $good->{ttft}{queued_blocks}, 0, 'no blocks left queued');

$env->stop_nginx;
$env->check_logs_clean('ttft');

# ---- nginx -t

for my $bad ('cost=fast', 'cost=', 'ttft_rate=0', 'ttft_rate=x') {
    $env->conf(http_config => "upstream u { kv_aware $bad; $pool }",
               config => 'location / { proxy_pass http://u; }');
    my ($ok, $msg) = $env->test_config;
    my ($name) = $bad =~ /^(\w+)=/;
    ok(!$ok && $msg =~ /invalid $name/, "nginx -t refuses $bad")
        or diag($msg);
}

done_testing;
