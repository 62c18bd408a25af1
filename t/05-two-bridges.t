# Two kvbridges share one fleet, each following a disjoint half of the
# engines, on the same Redis channel (docs/engines.md, "Several
# bridges"): every engine is fresh in nginx, each engine's blocks reach
# nginx through its own bridge, a prompt an engine holds is routed to
# it, in both halves; no server sees a gap in its sequence after the
# first sync, nginx logs no second publisher, and each bridge answers
# the resyncs of its own engines only.
# Real nginx, redis-server, kvsim (vLLM's wire format) and two kvbridges.

use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use Test::More;

use KvAware::Launch qw(free_ports free_run wait_until module_path slurp);

my $N     = 4;                          # engines 0, 1: bridge a; 2, 3: b
my $BT    = 16;
my $MODEL = 'kvsim';

plan skip_all => 'module not built' unless -f module_path();
for my $b (KvAware::Launch::kvsim_binary(), KvAware::Launch::kvbridge_binary())
{
    plan skip_all => "$b not built (make tools)" unless -x $b;
}
for my $m (qw(ZMQ::FFI Data::MessagePack)) {
    plan skip_all => "$m missing (make deps)" unless eval "require $m; 1";
}

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 90;

my $json = JSON::PP->new->utf8->canonical;
my $http = HTTP::Tiny->new(timeout => 10);
my $l = KvAware::Launch->new(template => 'two-bridges-XXXXXX',
                             watchdog => 1, diag => \&diag);

my ($redis, $port) = free_ports(2);
my $base = free_run($N);
my $zmq = free_run(2 * $N);             # engine i: events Z + 2i, replay + 1

$l->start_redis($redis);
$l->start_kvsim($base, $N, qw(--time-scale 50 --quiet --redis off
                --keyspace tokens --events zmq),
                '--model', $MODEL, '--zmq-port', $zmq);

my %half = (a => [0, 1], b => [2, 3]);
for my $name (sort keys %half) {
    $l->start_kvbridge({ name => "kvbridge-$name" },
        '--redis', "127.0.0.1:$redis", '--heartbeat', 300,
        map { ('--engine', engine($_)) } @{ $half{$name} });
}

my $servers = join '', map { "        server 127.0.0.1:" . ($base + $_)
                             . ";\n" } 0 .. $N - 1;
$l->write_nginx_conf(workers => 1, http => <<EOF);
    upstream llm {
        kv_aware keys=tokens block_tokens=$BT;
        kv_aware_events redis=127.0.0.1:$redis heartbeat=3s;
$servers    }

    server {
        listen 127.0.0.1:$port;
        location / {
            proxy_pass http://llm;
            add_header X-KV-Reason \$kv_aware_reason always;
        }
        location = /status { kv_aware_status; }
    }
EOF
my ($ok, $err) = $l->start_nginx(workers => 1);
ok($ok, 'nginx starts') or BAIL_OUT($err);

ok(wait_until(15, sub { fresh() == $N }),
   "all $N engines fresh, two bridges publishing on one channel");
my %gaps0 = map { ($_ => gaps($_)) } 0 .. $N - 1;

# --- each engine's blocks reach nginx through its own bridge -------------

for my $i (0 .. $N - 1) {
    is(post("http://127.0.0.1:" . ($base + $i) . '/v1/completions',
            body($i))->{status}, 200, "prompt $i computed on engine $i");
}
ok(wait_until(10, sub { !grep { held($_) < 8 } 0 .. $N - 1 }),
   'the blocks of every engine reach nginx, both halves')
    or diag(join ' ', map { held($_) } 0 .. $N - 1);

# --- a prompt an engine holds is routed to it, in both halves ------------

for my $i (0 .. $N - 1) {
    my $r = post("http://127.0.0.1:$port/v1/completions", body($i));
    cmp_ok($r->{cached}, '>=', 7 * $BT,
           "prompt $i through nginx: routed to engine $i, which holds it"
           . " ($r->{reason})");
}

# --- the bridges leave each other alone ----------------------------------

for my $i (0 .. $N - 1) {
    is(gaps($i), $gaps0{$i}, "engine $i: no gap in its sequence since");
}
is(fresh(), $N, 'all still fresh');
unlike(slurp($l->error_log_file) // '', qr/two publishers/,
       'nginx sees one publisher a server');

# a resync of each engine is answered by its own bridge, not the other's
for my $i (0 .. $N - 1) {
    my $msg = '{"v":1,"type":"resync","server":"127.0.0.1:'
              . ($base + $i) . '"}';
    qx(redis-cli -p $redis PUBLISH kv_aware:events:resync '$msg');
    $? == 0 or die "redis-cli failed";
}
for my $name (sort keys %half) {
    my $other = $half{$name eq 'a' ? 'b' : 'a'};
    ok(wait_until(5, sub {
        my $log = bridge_log($name);
        !grep { $log !~ asked($_) } @{ $half{$name} };
    }), "bridge $name answers the resyncs of its engines");
    my $log = bridge_log($name);
    ok(!grep({ $log =~ asked($_) } @$other), "and not the other half's");
}
ok(wait_until(10, sub { fresh() == $N }), 'all fresh after the resyncs');

done_testing();


sub engine {
    my ($i) = @_;
    return "127.0.0.1:" . ($base + $i) . " model=$MODEL"
           . ' events=tcp://127.0.0.1:' . ($zmq + 2 * $i)
           . ' replay=tcp://127.0.0.1:' . ($zmq + 2 * $i + 1);
}

sub asked {
    my $p = $base + $_[0];
    return qr/engine 127\.0\.0\.1:$p: nginx asks for a resync/;
}

sub bridge_log { slurp($l->prefix . "/logs/kvbridge-$_[0].log") // '' }

sub servers {
    my $r = $http->get("http://127.0.0.1:$port/status");
    my $st = $r->{success} && eval { $json->decode($r->{content}) };
    return $st ? $st->{upstreams}{llm}{servers} // [] : [];
}

sub server {
    my ($i) = @_;
    my ($s) = grep { $_->{name} eq '127.0.0.1:' . ($base + $i) }
                   @{ servers() };
    return $s // { state => 'none', entries => {}, events => {} };
}

sub fresh { scalar grep { ($_->{state} // '') eq 'fresh' } @{ servers() } }
sub held  { server($_[0])->{entries}{event} // 0 }
sub gaps  { server($_[0])->{events}{gaps} // -1 }

# 8 blocks of token ids, distinct per $n
sub body {
    my ($n) = @_;
    my @ids = map { ($n * 7919 + $_ * 31) % 151936 } 1 .. 8 * $BT;
    return $json->encode({ model => $MODEL, max_tokens => 1,
                           prompt => \@ids });
}

sub post {
    my ($url, $body) = @_;
    my $r = $http->post($url, { content => $body, headers => {
        'Content-Type' => 'application/json' } });
    my $k = $r->{success} ? eval { $json->decode($r->{content})->{kvsim} }
                          : undef;
    return { status => $r->{status},
             cached => ($k // {})->{cached_tokens} // -1,
             reason => $r->{headers}{'x-kv-reason'} // '-' };
}
