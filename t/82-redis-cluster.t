# kv_aware_events cluster=on: KV events over a Redis 7 Cluster with
# sharded pub/sub (issue 22, section 3).
#
#   * three masters and three replicas on loopback, made by redis-cli
#     --cluster create; nginx's seed is a node that does not own the
#     channel's slot: it asks CLUSTER SLOTS and SSUBSCRIBEs on the owner;
#   * events SPUBLISHed on the owner route requests, resync requests come
#     back SPUBLISHed on the same slot;
#   * a failover of the owner while events flow (CLUSTER FAILOVER on its
#     replica: Redis sends an "sunsubscribe"; then the new owner killed:
#     the connection drops and the replica takes over): nginx follows the
#     slot each time, asks a resync, and routes by the answer;
#   * nginx -t refuses cluster=on without a hash tag, with pattern=on, and
#     a resync_channel= in another slot.
#
# A publisher in this test follows the slot as any cluster client does:
# MOVED or a dead node, it asks the cluster who owns the slot now.

use strict;
use warnings;

use Test::More;
use IO::Select;
use IO::Socket::INET;
use Time::HiRes qw(sleep time);

use KvAware::Launch ();
use Test::KvAware ();
use Test::KvAware::Events qw(
    $JSON $LOCATIONS preflight block_hashes prompt chat show addr bnum
    status server_status wait_status wait_until stored
);

preflight();

my $CH = '{kvc}:events';

my $env = Test::KvAware->new(backends => 3, workers => 1,
                             log_level => 'info');
my $launch = $env->launch;

# six nodes, each with its bus port given (the default, port + 10000,
# may be taken or past 65535)
my @P = KvAware::Launch::free_ports(12);
my @nodes = @P[0 .. 5];
for my $i (0 .. 5) {
    $launch->start_redis($nodes[$i], { name => "redis$i" },
        '--cluster-enabled', 'yes', '--cluster-port', $P[6 + $i],
        '--cluster-config-file', "nodes-$nodes[$i].conf",
        '--cluster-node-timeout', '1000')
        or BAIL_OUT("redis node $i did not start");
}
my (undef, $out) = $launch->run_cmd(['redis-cli', '--cluster', 'create',
    (map { "127.0.0.1:$_" } @nodes), '--cluster-replicas', '1',
    '--cluster-yes']);
like($out, qr/All 16384 slots covered/, 'redis-cli --cluster create');

sub cli {
    my ($port, @cmd) = @_;
    my (undef, $o) = $launch->run_cmd(['redis-cli', '-h', '127.0.0.1',
                                       '-p', $port, @cmd]);
    chomp $o;
    return $o;
}

my $slot = cli($nodes[0], CLUSTER => KEYSLOT => $CH);

# the master of the slot and its replicas, as node $from sees it; the
# ports of the nodes alive as the cluster says
sub owner {
    my ($from) = @_;
    my ($master, @replicas, %id);
    for (split /\n/, cli($from, CLUSTER => 'NODES')) {
        my ($id, $a, $flags, $of, @rest) = split ' ';
        next unless $a && $a =~ /:(\d+)@/;
        my $port = $1;
        next if $flags =~ /fail/;
        $id{$id} = $port;
        if ($flags =~ /master/) {
            for (@rest[4 .. $#rest]) {
                my ($lo, $hi) = split /-/;
                $master = [$id, $port]
                    if defined $lo && $lo =~ /^\d+$/
                       && $lo <= $slot && $slot <= ($hi // $lo);
            }
        }
    }
    return undef unless $master;
    for (split /\n/, cli($from, CLUSTER => 'NODES')) {
        my ($id, $a, $flags, $of) = split ' ';
        push @replicas, $1 if $flags =~ /slave/ && $flags !~ /fail/
                              && $of eq $master->[0] && $a =~ /:(\d+)@/;
    }
    return { port => $master->[1], replicas => \@replicas };
}

# ready: every node says ok, and the slot's master has a replica in sync
ok(wait_until(20, sub {
        return 0 if grep { cli($_, CLUSTER => 'INFO') !~ /cluster_state:ok/ }
                         @nodes;
        my $o = owner($nodes[0]) or return 0;
        return @{ $o->{replicas} }
               && cli($o->{replicas}[0], INFO => 'replication')
                  =~ /master_link_status:up/;
    }), 'the cluster is up, the slot\'s master has a replica')
    or BAIL_OUT('no cluster');

my $own = owner($nodes[0]);
my ($seed) = grep { $_ != $own->{port} && $_ != $own->{replicas}[0] } @nodes;

# as a node still alive sees it
sub owner_now {
    for my $p (@nodes) {
        next unless KvAware::Launch::redis_ping($p);
        my $o = owner($p);
        return $o if $o;
    }
    return undef;
}

# --- a publisher that follows the slot ------------------------------------

my %pub = (port => $own->{port});
my %seq;

sub spublish {
    my ($channel, $msg) = @_;
    for my $try (1 .. 40) {
        my $c = $pub{c} //= eval {
            Test::KvAware::Redis->new($pub{port}) };
        my $n = $c ? $c->cmd(SPUBLISH => $channel, $msg) : undef;
        return $n if defined $n && !ref $n;
        # MOVED, a dead node or a refused connection: ask who owns it now
        delete $pub{c};
        my $o = owner_now();
        $pub{port} = $o->{port} if $o;
        sleep 0.1;
    }
    return undef;
}

sub event {
    my ($server, %m) = @_;
    my $seq = delete $m{seq} // ($seq{$server} // 0) + 1;
    $seq{$server} = $seq;
    return spublish($CH, $JSON->encode({ v => 1, server => $server,
                                         seq => $seq, %m }));
}

# an event nginx has taken in (it counts its messages)
sub event_seen {
    my ($server, %m) = @_;
    my $before = status($env)->{events}{messages};
    my $n = event($server, %m);
    wait_status($env, 5, sub { $_[0]{events}{messages} > $before })
        or diag('nginx did not take the event in');
    return $n;
}

# --- a sharded subscriber, for the resync requests ---------------------------

sub ssubscribe {
    my ($port, $channel) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $port, Timeout => 2)
        or return undef;
    print {$s} sprintf("*2\r\n\$10\r\nSSUBSCRIBE\r\n\$%d\r\n%s\r\n",
                       length $channel, $channel);
    return { s => $s, buf => '' };
}

# the payloads of "smessage"s within $timeout s, until $until->(@so_far)
sub smessages {
    my ($sub, $timeout, $until) = @_;
    my $deadline = time + $timeout;
    my @m;
    my $sel = IO::Select->new($sub->{s});
    while (time < $deadline) {
        while ($sub->{buf} =~ s/\A\*3\r\n\$\d+\r\n(\w+)\r\n\$\d+\r\n([^\r]*)\r\n
                                  (?:\$(\d+)\r\n|:(\d+)\r\n)//x) {
            my ($kind, $len) = ($1, $3);
            if (defined $len) {
                my $payload = substr($sub->{buf}, 0, $len + 2, '');
                push @m, substr($payload, 0, $len) if $kind eq 'smessage';
            }
            return @m if $until && @m && $until->(@m);
        }
        next unless $sel->can_read(0.05);
        sysread($sub->{s}, $sub->{buf}, 65536, length $sub->{buf}) or last;
    }
    return @m;
}

sub resync_for {
    my ($sub, $server, $timeout) = @_;
    my @m = smessages($sub, $timeout, sub {
        grep { ($JSON->decode($_)->{server} // '') eq $server } @_ });
    return scalar grep { ($JSON->decode($_)->{server} // '') eq $server } @m;
}

# --- nginx -t ----------------------------------------------------------------

# a parameter with a brace is quoted: nginx would read a block
sub upstream {
    my ($events) = @_;
    $events = join ' ', map { /[{}]/ ? "\"$_\"" : $_ } split ' ', $events;
    my $servers = join '', map {
        "        server \$TEST_NGINX_BACKEND_$_ max_fails=0;\n" } 1 .. 3;
    return <<"EOF";
    upstream llm {
        kv_aware block_size=64 learned_ttl=10m affinity_min=0;
        kv_aware_events redis=127.0.0.1:$seed $events;
$servers    }
EOF
}

for ([ 'cluster=on', qr/needs a channel= with a hash tag/ ],
     [ 'cluster=on channel={a}:x:* pattern=on resync_channel={a}:r',
       qr/needs pattern=off with cluster=on/ ],
     [ "cluster=on channel=$CH resync_channel=other:resync",
       qr/resync_channel= in another cluster slot/ ],
     [ "cluster=maybe channel=$CH", qr/cluster/ ]) {
    my ($events, $re) = @$_;
    $env->conf(http_config => upstream($events), config => $LOCATIONS);
    my ($ok, $err) = $env->test_config;
    ok(!$ok, "nginx -t refuses \"$events\"");
    like($err, $re, 'and says why');
}

# --- subscribed on the slot's master, through the seed -----------------------

$env->conf(http_config => upstream("cluster=on channel=$CH heartbeat=60s "
                                   . 'speculative_ttl=1s read_timeout=1s'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

ok(wait_status($env, 10, sub { $_[0]{redis}{state} eq 'up' }),
   'subscribed to the cluster');
like($env->error_log,
     qr/subscribed to "\Q$CH\E" on redis 127\.0\.0\.1:$own->{port} \(the slot/,
     "on the slot's master ($own->{port}), the seed was $seed");
is((split /\n/, cli($own->{port}, PUBSUB => SHARDNUMSUB => $CH))[1], 1,
   'PUBSUB SHARDNUMSUB: one sharded subscriber on the owner');
is(status($env)->{redis}{failures}, 0, 'moving to the owner is no failure');

my @A = map { addr($env, $_) } 1 .. 3;
my $P = prompt('cluster', 12);
my @H = block_hashes($P);

is(event_seen($_, events => []), 1, "SPUBLISH heartbeat of $_: 1 receiver")
    for @A;
my $r0 = chat($env, $P);
my $x = bnum($r0->{backend}) % 3 + 1;       # not where load put it
event_seen($A[$x - 1], events => [stored(@H)]);
sleep 1.1;                                  # the speculative entries expire
my $r1 = chat($env, $P);
is($r1->{backend}, "b$x", 'a stored event SPUBLISHed routes to its server')
    or diag show($r1);
is($r1->{matched}, scalar @H, 'matched == blocks');

my $rs = ssubscribe($own->{port}, "$CH:resync");
smessages($rs, 0.2);
event_seen($A[$x - 1], seq => $seq{$A[$x - 1]} + 2, events => []);
is(server_status(status($env), $A[$x - 1])->{state}, 'degraded',
   'a gap: degraded');
ok(resync_for($rs, $A[$x - 1], 5),
   'the resync request came SPUBLISHed on the slot');
event_seen($A[$x - 1], seq => $seq{$A[$x - 1]} + 5, snapshot => 'full',
           events => [stored(@H)]);
is(server_status(status($env), $A[$x - 1])->{state}, 'fresh',
   'the snapshot made it fresh');

# --- failovers while events flow ---------------------------------------------

# heartbeats of the servers other than b$x, one every 20 ms, and stored
# events of b$x for a prompt that only it holds, until the routing shows
# it; then what is asked of the resync is answered
sub failover_round {
    my ($what, $trigger) = @_;
    my $old = owner_now()->{port};
    my $offset = $env->error_log_offset;
    my $Q = prompt("failover-$what", 10);
    my @Q = block_hashes($Q);
    my $y = $x % 3 + 1;

    $trigger->();
    my $t0 = time;
    my $n = 0;
    while (time - $t0 < 15) {
        event($A[$y - 1], events => []);
        $n++;
        my $o = $n > 10 && owner_now();
        last if $o && $o->{port} != $old
                && status($env)->{redis}{state} eq 'up';
        sleep 0.02;
    }
    my $new = owner_now() // { port => 0 };
    ok($new->{port} && $new->{port} != $old,
       "$what: the slot moved from $old to $new->{port}");
    ok(wait_status($env, 10, sub { $_[0]{redis}{state} eq 'up' }),
       "$what: nginx subscribed again");
    my $on = qr/subscribed to "\Q$CH\E" on redis 127\.0\.0\.1:$new->{port} /;
    ok($env->wait_for_log($on, 10, $offset),
       "$what: on the new master");

    # what nginx heard is no longer trusted: each server asks a resync,
    # on the new master, and the answer is what routes
    my $rs = ssubscribe($new->{port}, "$CH:resync");
    ok(resync_for($rs, $A[$y - 1], 5), "$what: a resync asked of b$y");
    event_seen($A[$y - 1], seq => $seq{$A[$y - 1]} + 100, snapshot => 'full',
               events => [stored(@Q)]);
    ok(wait_status($env, 5, sub {
            server_status($_[0], $A[$y - 1])->{state} eq 'fresh' }),
       "$what: b$y fresh after its snapshot");
    sleep 1.1;
    my $r = chat($env, $Q);
    is("$r->{backend} $r->{matched}", "b$y " . scalar @Q,
       "$what: routed by the events of the new master") or diag show($r);
    return $new;
}

my $new = failover_round('CLUSTER FAILOVER', sub {
    is(cli($own->{replicas}[0], CLUSTER => 'FAILOVER'), 'OK',
       "CLUSTER FAILOVER on $own->{replicas}[0]");
});

failover_round('the master killed', sub {
    my ($i) = grep { $nodes[$_] == $new->{port} } 0 .. 5;
    kill 'KILL', $launch->pid("redis$i");
    $launch->stop("redis$i");
    ok(!KvAware::Launch::port_open($new->{port}), "master $new->{port} killed");
});

$env->check_logs_clean('after two failovers');

done_testing();
