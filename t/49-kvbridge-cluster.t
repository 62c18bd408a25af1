# kvbridge on a Redis 7 Cluster (issue 22, section 3): kvbridge
# --redis-cluster SPUBLISHes what vLLM-like engines (kvsim --events zmq)
# report on the master of the channel's slot and answers the resync
# requests it SSUBSCRIBEs to there; nginx with cluster=on routes by them.
# A prompt an engine computed for a client of its own draws nginx to it,
# before and after a CLUSTER FAILOVER of the slot's master: the bridge
# and nginx follow the slot, nginx asks a resync, the bridge's mirror
# answers it.  The bridge's first seed is down: it goes on to the second.
# kvbridge refuses a channel without a hash tag; between two nodes that
# each name the other the owner, it backs off.

use strict;
use warnings;

use JSON::PP;
use Test::More;

use Test::KvAware qw(skip_unless_module wait_until free_run);
use Test::KvAware::Cluster;
use KvAware::Launch ();

my $SERVERS = 3;
my $BT      = 16;
my $CH      = '{kvb}:events';

skip_unless_module();
for my $b (KvAware::Launch::kvsim_binary(), KvAware::Launch::kvbridge_binary())
{
    plan skip_all => "$b not built (make tools)" unless -x $b;
}
plan skip_all => 'redis-server is not installed'
    unless grep { -x "$_/redis-server" } split /:/, $ENV{PATH};

my $env = Test::KvAware->new(backends => 0, log_level => 'info');
my $l = $env->launch;
my ($cl, $why) = Test::KvAware::Cluster->start($l, $CH);
ok($cl, 'a cluster of 3 masters and 3 replicas') or BAIL_OUT($why);
my $own = $cl->owner(($cl->nodes)[0]);
my ($seed) = grep { $_ != $own->{port} } $cl->nodes;

my $base = free_run($SERVERS);
my $zmq = free_run(2 * $SERVERS);
my @engines = map {
    ('--engine', "127.0.0.1:" . ($base + $_) . ' model=kvsim'
                 . ' events=tcp://127.0.0.1:' . ($zmq + 2 * $_)
                 . ' replay=tcp://127.0.0.1:' . ($zmq + 2 * $_ + 1))
} 0 .. $SERVERS - 1;

my ($rc, $out) = $l->run_cmd([KvAware::Launch::kvbridge_binary(),
    '--redis', "127.0.0.1:$seed", '--redis-cluster', @engines]);
isnt($rc, 0, 'kvbridge --redis-cluster refuses the default channel');
like($out, qr/--redis-cluster needs a --channel with a hash tag/,
     'and says why');

# the first seed a port nobody listens on: the second one is asked
my ($dead) = KvAware::Launch::free_ports(1);

$l->start_kvsim($base, $SERVERS, qw(--time-scale 50 --quiet --redis off
                --keyspace tokens --events zmq --model kvsim),
                '--zmq-port', $zmq);
ok($l->start_kvbridge('--redis', "127.0.0.1:$dead",
                      '--redis', "127.0.0.1:$seed", '--redis-cluster',
                      '--channel', $CH, '--heartbeat', 200, @engines),
   'kvbridge publishing and answering resyncs, through the second seed');
like(KvAware::Launch::slurp($env->prefix . '/logs/kvbridge.log') // '',
     qr/redis 127\.0\.0\.1:$dead \(\w+\) down/,
     'the seed that is down was tried and logged');
like(KvAware::Launch::slurp($env->prefix . '/logs/kvbridge.log') // '',
     qr/slot \d+ of \Q$CH\E is on 127\.0\.0\.1:$own->{port}, moving there/,
     'kvbridge moved to the slot\'s master');

my $servers = join "\n", map { "        server 127.0.0.1:$_;" }
                         $base .. $base + $SERVERS - 1;
$env->conf(http_config => "
    upstream llm {
        kv_aware keys=tokens block_tokens=$BT;
        kv_aware_events redis=127.0.0.1:$seed cluster=on \"channel=$CH\"
                        heartbeat=2s;
$servers
    }",
           config => '
    location / {
        proxy_pass http://llm;
        add_header X-Upstream $upstream_addr always;
        add_header X-KV-Reason $kv_aware_reason always;
    }
    location = /status { kv_aware_status; }');
$env->start_nginx or BAIL_OUT('nginx did not start');

sub status {
    my $r = $env->request(GET => '/status');
    return $r->{json} ? $r->{json}{upstreams}{llm} : undef;
}

sub all_fresh {
    my $st = status() or return 0;
    return $st->{redis}{state} eq 'up'
           && $SERVERS == grep { $_->{state} eq 'fresh' } @{ $st->{servers} };
}

ok(wait_until(15, \&all_fresh),
   'nginx subscribed, every engine fresh from the bridge\'s heartbeats');

my $json = JSON::PP->new->canonical;

sub body {
    my ($i) = @_;
    return $json->encode({ model => 'kvsim', max_tokens => 1, prompt => [
        map { ($i * 7919 + $_ * 31) % 151936 } 1 .. 8 * $BT ] });
}

# prompt $i computed by engine $home for a client of its own (unless
# $known), then asked of nginx
sub drawn {
    my ($i, $home, $what, $known) = @_;
    unless ($known) {
        my $r = $env->request(POST => '/v1/completions', body($i),
                              { 'Content-Type' => 'application/json' },
                              port => $base + $home);
        is($r->{status}, 200, "$what: engine $home computed prompt $i");
    }
    my $to = '';
    ok(wait_until(5, sub {
            my $n = $env->request(POST => '/v1/completions', body($i),
                                  { 'Content-Type' => 'application/json' });
            $to = $n->{headers}{'x-upstream'} // '';
            $to eq '127.0.0.1:' . ($base + $home) }),
       "$what: nginx sends it to engine $home") or diag("went to $to");
}

drawn(1, 1, 'before the failover');

my $offset = $env->error_log_offset;
my $resyncs = status()->{events}{resyncs};
is($cl->cli($own->{replicas}[0], CLUSTER => 'FAILOVER'), 'OK',
   "CLUSTER FAILOVER on $own->{replicas}[0]");
my $new;
ok(wait_until(15, sub {
        $new = $cl->owner_now;
        $new && $new->{port} != $own->{port} }),
   'the slot moved to ' . ($new ? $new->{port} : '-'));
ok($env->wait_for_log(
       qr/subscribed to "\Q$CH\E" on redis 127\.0\.0\.1:$new->{port} /,
       10, $offset),
   'nginx subscribed on the new master');
ok(wait_until(10, sub {
        $cl->cli($new->{port}, PUBSUB => SHARDNUMSUB => "$CH:resync")
            =~ /\n1$/ }),
   'kvbridge SSUBSCRIBEd to the resync channel on the new master');
ok(wait_until(15, sub { status()->{events}{resyncs} >= $resyncs + $SERVERS }),
   'nginx asked a resync of every engine');
ok(wait_until(15, \&all_fresh),
   'every engine fresh again: the bridge answered');

drawn(1, 1, 'after the failover, from the snapshot', 1);
drawn(2, 2, 'a prompt computed after the failover');

$env->check_logs_clean('kvbridge and nginx on a cluster');

# two nodes that each name the other the owner: before, kvbridge moved
# between them at once, a busy loop with a log line a round
my @pair = Test::KvAware::Cluster->start_bounce($l, 'bounce');
$l->start_kvbridge({ name => 'kvb-bounce', ready => sub { 1 } },
                   '--redis', "127.0.0.1:$pair[0]", '--redis-cluster',
                   '--channel', $CH, @engines[0, 1]);
sleep 3;
my $moves = () = (KvAware::Launch::slurp($env->prefix
                                         . '/logs/kvb-bounce.log') // '')
                 =~ /moving there/g;
ok($moves >= 4 && $moves <= 30,
   "nodes that disagree on the owner: the moves back off ($moves in 3 s)");
$l->stop('kvb-bounce');
$l->stop('bounce');

done_testing();
