# kvbridge and nginx, storage tiers (issue 21): an engine published from
# here as vLLM publishes (a PUB socket, [topic, seq, msgpack], events by
# name), a real kvbridge, redis-server and nginx.
#
#   * the engine stores 4 blocks on GPU, then offloads them (BlockStored
#     medium CPU, by hash alone as vLLM's offloading connector sends
#     them): nginx holds 4 blocks, none past GPU;
#   * the GPU copies are evicted (BlockRemoved medium GPU): nginx still
#     holds the 4 blocks, now at the CPU tier (servers[].tiers.cpu);
#   * a resync: the bridge's snapshot says the tier, nginx fresh again
#     with the 4 blocks in host memory;
#   * stored on GPU again: lifted; the GPU copies evicted once more: CPU;
#   * the CPU copies evicted: nginx removes the blocks.

use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use KvAware::Launch qw(free_ports free_run wait_until module_path);
use Test::KvAware::Redis;

my $BT    = 16;
my $MODEL = 'llama';

plan skip_all => 'module not built' unless -f module_path();
plan skip_all => 'kvbridge not built (make tools)'
    unless -x KvAware::Launch::kvbridge_binary();
for my $m (qw(ZMQ::FFI Data::MessagePack)) {
    plan skip_all => "$m missing (make deps)" unless eval "require $m; 1";
}

require ZMQ::FFI::Constants;
ZMQ::FFI::Constants->import(qw(ZMQ_PUB ZMQ_LINGER));

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 90;

my $json = JSON::PP->new->utf8->canonical;
my $mp = Data::MessagePack->new->prefer_integer(1);
my $http = HTTP::Tiny->new(timeout => 10);
my $l = KvAware::Launch->new(template => 'kvbridge-tiers-XXXXXX',
                             watchdog => 1, diag => \&diag);

# the engine's name: an address nobody listens on, its events publish
my ($redis, $port, $eng) = free_ports(3);
my $zmq = free_run(1);
my $X = "127.0.0.1:$eng";

$l->start_redis($redis);

my $zctx = ZMQ::FFI->new;
my $pub = $zctx->socket(ZMQ_PUB());
$pub->set(ZMQ_LINGER(), 'int', 0);
$pub->bind("tcp://127.0.0.1:$zmq");
my $seq = 0;

$l->start_kvbridge('--redis', "127.0.0.1:$redis",
                   '--engine', "$X model=$MODEL events=tcp://127.0.0.1:$zmq");

$l->write_nginx_conf(workers => 1, http => <<EOF);
    upstream llm {
        kv_aware keys=tokens block_tokens=$BT;
        kv_aware_events redis=127.0.0.1:$redis heartbeat=60s;
        server $X max_fails=0;
    }

    server {
        listen 127.0.0.1:$port;
        location = /status { kv_aware_status; }
    }
EOF
my ($ok, $err) = $l->start_nginx(workers => 1);
ok($ok, 'nginx starts') or BAIL_OUT($err);

# the SUB socket joins late: a block a try until nginx holds one
my $try = 0;
ok(wait_until(15, sub {
       send_events(stored([9_000 + $try], [map { $try * 100 + $_ } 1 .. $BT]));
       $try++;
       sleep 0.2;
       (server()->{entries}{event} // 0) > 0 }),
   'the bridge hears the engine, nginx the bridge');
my $base = server()->{entries}{event};

my @tok = map { 50_000 + $_ } 1 .. 4 * $BT;
my @E = (101 .. 104);

send_events(stored([@E], \@tok));
ok(wait_until(10, sub { server()->{entries}{event} == $base + 4 }),
   'stored on GPU: 4 blocks held');

send_events(map { untokened([$_], 'CPU') } @E);
send_events(stored([9_999], [map { 60_000 + $_ } 1 .. $BT]));   # a mark
ok(wait_until(10, sub { server()->{entries}{event} == $base + 5 }),
   'offloaded to CPU: the mark is held');
is(server()->{tiers}{cpu}, 0, 'no news for a CPU copy beside the GPU one');

send_events(removed([@E], 'GPU'));
ok(wait_until(10, sub { server()->{tiers}{cpu} == 4 }),
   'the GPU copies evicted: the 4 blocks move to the CPU tier')
    or diag(explain(server()));
is(server()->{entries}{event}, $base + 5, 'and are still held');

# a resync: the snapshot carries the tiers
my $sub = Test::KvAware::Redis->new($redis)->subscribe('kv_aware:events');
my $r = Test::KvAware::Redis->new($redis);
$r->cmd(PUBLISH => 'kv_aware:events:resync',
        $json->encode({ v => 1, type => 'resync', server => $X }));
my $snap;
wait_until(10, sub {
    for my $m ($sub->messages(0.2)) {
        my $msg = eval { $json->decode($m->[1]) } or next;
        $snap = $msg if ($msg->{snapshot} // '') eq 'full';
    }
    $snap });
my @cpu = grep { ($_->{medium} // '') eq 'cpu' } @{ $snap->{events} // [] };
is(scalar(@cpu) && scalar @{ $cpu[0]{hashes} }, 4,
   'the bridge\'s snapshot: a stored event of 4 blocks at the CPU tier');
ok(wait_until(10, sub { (server()->{seq} // 0) >= ($snap->{seq} // 1e9)
                        && server()->{state} eq 'fresh' }),
   'nginx applied the snapshot: fresh');
is(server()->{tiers}{cpu}, 4, 'the blocks are in host memory there');
is(server()->{entries}{event}, $base + 5, 'every block in it');

send_events(stored([@E], \@tok));
ok(wait_until(10, sub { server()->{tiers}{cpu} == 0 }),
   'stored on GPU again: lifted');

send_events(removed([@E], 'GPU'));
ok(wait_until(10, sub { server()->{tiers}{cpu} == 4 }),
   'evicted from GPU again: CPU');

send_events(removed([@E], 'CPU'));
ok(wait_until(10, sub { server()->{entries}{event} == $base + 1 }),
   'the CPU copies evicted: removed');
is(server()->{tiers}{cpu}, 0, 'nothing left in host memory');

my $log = $l->error_log_file;
open my $fh, '<', $log or die "$log: $!";
my @bad = grep { /\[(alert|crit|emerg)\]/ } <$fh>;
is(scalar @bad, 0, 'nginx error log clean') or diag(@bad);

done_testing();

# a BlockStored as vLLM's msgspec encodes it, blocks chained from the first
sub stored {
    my ($hashes, $tokens) = @_;
    return { type => 'BlockStored', block_hashes => $hashes,
             parent_block_hash => undef, token_ids => $tokens,
             block_size => $BT, lora_id => undef, medium => 'GPU',
             lora_name => undef, group_idx => 0,
             kv_cache_spec_kind => 'full_attention' };
}

# an offload tier's BlockStored by hash alone
sub untokened {
    my ($hashes, $medium) = @_;
    return { type => 'BlockStored', block_hashes => $hashes,
             parent_block_hash => undef, token_ids => [], block_size => 0,
             lora_id => undef, medium => $medium, lora_name => undef,
             group_idx => 0 };
}

sub removed {
    my ($hashes, $medium) = @_;
    return { type => 'BlockRemoved', block_hashes => $hashes,
             medium => $medium, group_idx => 0 };
}

sub send_events {
    my (@events) = @_;
    $pub->send_multipart(['', pack('Q>', $seq++),
                          $mp->pack({ ts => time(), events => \@events })]);
}

sub server {
    my $res = $http->get("http://127.0.0.1:$port/status");
    my $st = $res->{success} && eval { $json->decode($res->{content}) };
    my ($s) = grep { $_->{name} eq $X }
                   @{ ($st ? $st->{upstreams}{llm}{servers} : undef) // [] };
    return $s // { state => 'none', entries => {}, tiers => {},
                   events => {} };
}
