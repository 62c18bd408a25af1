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
#   * a reload hands the sharded subscription over;
#   * two nodes that each name the other the owner: the links back off;
#   * cluster=on on a Redis that is no cluster: a clear error, requests
#     routed all the same; a node that answers nothing is given up;
#   * share=on: a second nginx hears what the first routed, sharded;
#   * an ACL user without SPUBLISH: the refusal logged now and then, the
#     publisher kept where it is (not sent to ask the cluster again);
#   * seeds: redis= given twice, the first down: the second one is asked;
#   * nginx -t refuses cluster=on without a hash tag, with pattern=on, a
#     resync_channel= in another slot, and several redis= without it.
#
# A publisher in this test follows the slot as any cluster client does:
# MOVED or a dead node, it asks the cluster who owns the slot now.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(sleep time);

use KvAware::Launch ();
use Test::KvAware qw(wait_until);
use Test::KvAware::Cluster;
use Test::KvAware::Events qw(
    $JSON $LOCATIONS preflight block_hashes prompt chat show addr bnum
    status server_status wait_status stored
);

preflight();

my $CH = '{kvc}:events';

my $env = Test::KvAware->new(backends => 3, workers => 1,
                             log_level => 'info');
my ($cl, $why) = Test::KvAware::Cluster->start($env->launch, $CH);
ok($cl, 'a cluster of 3 masters and 3 replicas') or BAIL_OUT($why);

my $own = $cl->owner(($cl->nodes)[0]);
my ($seed) = grep { $_ != $own->{port} && $_ != $own->{replicas}[0] }
             $cl->nodes;
my %seq;

sub event {
    my ($server, %m) = @_;
    my $seq = delete $m{seq} // ($seq{$server} // 0) + 1;
    $seq{$server} = $seq;
    return $cl->spublish($CH, $JSON->encode({ v => 1, server => $server,
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

sub resync_for {
    my ($sub, $server, $timeout) = @_;
    my $of = sub {
        grep { ($JSON->decode($_)->{server} // '') eq $server } @_ };
    return scalar $of->($cl->smessages($sub, $timeout, $of));
}

# --- nginx -t ----------------------------------------------------------------

# a parameter with a brace is quoted: nginx would read a block
sub upstream {
    my ($events, $redis) = @_;
    $events = join ' ', map { /[{}]/ ? "\"$_\"" : $_ } split ' ', $events;
    my $servers = join '', map {
        "        server \$TEST_NGINX_BACKEND_$_ max_fails=0;\n" } 1 .. 3;
    return <<"EOF";
    upstream llm {
        kv_aware block_size=64 learned_ttl=10m affinity_min=0;
        kv_aware_events redis=127.0.0.1:${\($redis // $seed)} $events;
$servers    }
EOF
}

for ([ 'cluster=on', qr/needs a channel= with a hash tag/ ],
     [ 'cluster=on channel={a}:x:* pattern=on resync_channel={a}:r',
       qr/needs pattern=off with cluster=on/ ],
     [ "cluster=on channel=$CH resync_channel=other:resync",
       qr/resync_channel= in another cluster slot/ ],
     [ "cluster=maybe channel=$CH", qr/cluster/ ],
     [ "redis=127.0.0.1:1 channel=$CH",
       qr/redis= more than once: several seeds are for cluster=on/ ]) {
    my ($events, $re) = @$_;
    $env->conf(http_config => upstream($events), config => $LOCATIONS);
    my ($ok, $err) = $env->test_config;
    ok(!$ok, "nginx -t refuses \"$events\"");
    like($err, $re, 'and says why');
}

# eight seeds at most: an address given twice is one of them
{
    my $more = join ' ', map { "redis=127.0.0.1:$_" } 1 .. 7;
    $env->conf(http_config => upstream("$more redis=127.0.0.1:7 "
                                       . "cluster=on channel=$CH"),
               config => $LOCATIONS);
    my ($ok, $err) = $env->test_config;
    ok($ok, 'nginx -t takes 8 seeds, one of them twice') or diag $err;
    $env->conf(http_config => upstream("$more redis=127.0.0.1:8 "
                                       . "cluster=on channel=$CH"),
               config => $LOCATIONS);
    ($ok, $err) = $env->test_config;
    ok(!$ok, 'nginx -t refuses 9 seeds');
    like($err, qr/more than 8 addresses in redis=/, 'and says why');
}

# --- a Redis that is no cluster ----------------------------------------------

my ($plain) = KvAware::Launch::free_ports(1);
$env->launch->start_redis($plain, { name => 'plain' });
$env->conf(http_config => upstream("cluster=on channel=$CH "
                                   . 'connect_timeout=1s', $plain),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);
ok($env->wait_for_log("redis 127.0.0.1:$plain: CLUSTER SLOTS answered ERR "
                      . 'This instance has cluster support disabled', 5),
   'cluster=on on a Redis that is no cluster: a clear error');
isnt(status($env)->{redis}{state}, 'up', 'the link is not up');
is(chat($env, prompt('plain', 4))->{status}, 200,
   'requests are routed all the same');

# a node that accepts and answers nothing (stopped): not waited for forever
my $offset0 = $env->error_log_offset;
kill 'STOP', $env->launch->pid('plain');
ok($env->wait_for_log("redis cluster node 127.0.0.1:$plain: no answer in",
                      10, $offset0),
   'a stopped node: given up after connect_timeout, tried again');
kill 'CONT', $env->launch->pid('plain');
$env->stop_nginx;
$env->launch->stop('plain');

# --- two nodes that name each other the owner: no busy bounce ----------------

my @pair = Test::KvAware::Cluster->start_bounce($env->launch, 'bounce');
$env->conf(http_config => upstream("cluster=on channel=$CH", $pair[0]),
           config => $LOCATIONS);
my $offset_b = $env->error_log_offset;
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);
sleep 3;
my $moves = () = $env->error_log($offset_b) =~ /moves there/g;
# at 100 ms a move, some 60 in 3 s for the two links; backing off, ~12
ok($moves >= 4 && $moves <= 25,
   "nodes that disagree on the owner: the moves back off ($moves in 3 s)");
$env->stop_nginx;
$env->launch->stop('bounce');

# --- seeds: the first one down, the next one answers -------------------------

my ($dead) = KvAware::Launch::free_ports(1);
$env->conf(http_config => upstream("cluster=on channel=$CH",
                                   "$dead redis=127.0.0.1:$seed"),
           config => $LOCATIONS);
my $offset_s = $env->error_log_offset;
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);
ok(wait_status($env, 10, sub { $_[0]{redis}{state} eq 'up' }),
   'two seeds, the first down: subscribed through the second');
like($env->error_log($offset_s),
     qr/redis cluster node 127\.0\.0\.1:$dead: .*tries the next node/,
     'the seed that is down was tried and logged')
    or diag($env->error_log($offset_s));
$env->stop_nginx;

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
is((split /\n/, $cl->cli($own->{port}, PUBSUB => SHARDNUMSUB => $CH))[1], 1,
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

my $rs = $cl->ssubscribe($own->{port}, "$CH:resync");
$cl->smessages($rs, 0.2);
event_seen($A[$x - 1], seq => $seq{$A[$x - 1]} + 2, events => []);
is(server_status(status($env), $A[$x - 1])->{state}, 'degraded',
   'a gap: degraded');
ok(resync_for($rs, $A[$x - 1], 5),
   'the resync request came SPUBLISHed on the slot');
event_seen($A[$x - 1], seq => $seq{$A[$x - 1]} + 5, snapshot => 'full',
           events => [stored(@H)]);
is(server_status(status($env), $A[$x - 1])->{state}, 'fresh',
   'the snapshot made it fresh');

# a reload hands the sharded subscription over as any other
my $offset = $env->error_log_offset;
$env->reload;
ok($env->wait_for_log(qr/takes the subscription over/, 10, $offset),
   'reload: the new subscriber takes over');
ok(wait_until(10, sub {
        ($cl->cli($own->{port}, PUBSUB => SHARDNUMSUB => $CH))
            =~ /\n1$/ }),
   'reload: one sharded subscriber again, the old one let go');
my $R = prompt('reloaded', 8);
my @R = block_hashes($R);
event_seen($A[$x - 1], events => [stored(@R)]);
sleep 1.1;
my $r2 = chat($env, $R);
is("$r2->{backend} $r2->{matched}", "b$x " . scalar @R,
   'reload: events still route') or diag show($r2);

# --- failovers while events flow ---------------------------------------------

# heartbeats of the servers other than b$x, one every 20 ms, and stored
# events of b$x for a prompt that only it holds, until the routing shows
# it; then what is asked of the resync is answered
sub failover_round {
    my ($what, $trigger) = @_;
    my $old = $cl->owner_now->{port};
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
        my $o = $n > 10 && $cl->owner_now;
        last if $o && $o->{port} != $old
                && status($env)->{redis}{state} eq 'up';
        sleep 0.02;
    }
    my $new = $cl->owner_now // { port => 0 };
    ok($new->{port} && $new->{port} != $old,
       "$what: the slot moved from $old to $new->{port}");
    ok(wait_status($env, 10, sub { $_[0]{redis}{state} eq 'up' }),
       "$what: nginx subscribed again");
    my $on = qr/subscribed to "\Q$CH\E" on redis 127\.0\.0\.1:$new->{port} /;
    ok($env->wait_for_log($on, 10, $offset),
       "$what: on the new master");

    # what nginx heard is no longer trusted: each server asks a resync,
    # on the new master, and the answer is what routes
    my $rs = $cl->ssubscribe($new->{port}, "$CH:resync");
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
    is($cl->cli($own->{replicas}[0], CLUSTER => 'FAILOVER'), 'OK',
       "CLUSTER FAILOVER on $own->{replicas}[0]");
});

failover_round('the master killed', sub {
    ok($cl->kill_node($new->{port}), "master $new->{port} killed");
});

$env->check_logs_clean('after two failovers');

# --- share=on: two nginx learn together over the slot ----------------------

# the servers publish nothing now: what routes is what each nginx learned
# and what the other SPUBLISHed on CHANNEL:learned
$env->stop_nginx;
my $share = "cluster=on channel=$CH share=on heartbeat=60s";
$env->conf(http_config => upstream($share), config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

my ($port_b) = KvAware::Launch::free_ports(1);
my $lb = KvAware::Launch->new(template => 'cluster-b-XXXXXX', watchdog => 1,
                              diag => \&diag);
(my $http_b = upstream($share)) =~ s/\$TEST_NGINX_BACKEND_(\d+)/
                                     '127.0.0.1:' . $env->backend_port($1)/ge;
$lb->write_nginx_conf(http => $http_b . <<EOF);
    server {
        listen 127.0.0.1:$port_b;
$LOCATIONS    }
EOF
my ($ok_b, $err_b) = $lb->start_nginx;
ok($ok_b, 'a second nginx, share=on too') or diag($err_b);

sub status_b {
    my $r = $env->request(GET => '/kv_status', undef, {}, port => $port_b);
    return $r->{json} ? $r->{json}{upstreams}{llm} : undef;
}

ok(wait_until(10, sub {
        my $b = status_b();
        $b && $b->{redis}{state} eq 'up'
        && status($env)->{redis}{state} eq 'up' }),
   'both subscribed to the cluster');

my $S = prompt('shared', 10);
my $ra = chat($env, $S);
ok(wait_until(5, sub { (status_b() // {})->{share}{received} > 0 }),
   'the second nginx heard what the first routed (SPUBLISHed, learned)');
my $rb = $env->request(POST => '/v1/chat/completions', $S,
                       { 'Content-Type' => 'application/json' },
                       port => $port_b);
is(($rb->{headers}{'x-backend'} // '-') . ' '
   . ($rb->{headers}{'x-kv-reason'} // '-'), "$ra->{backend} affinity",
   'and sends the prompt to the same server, by affinity');

$lb->stop_nginx;
$env->check_logs_clean('share=on');

# --- an ACL user without SPUBLISH: said, not taken for a MOVED --------------

# before, every refused SPUBLISH sent the publisher to ask CLUSTER SLOTS
# again, a NOTICE each time, at the shortest backoff
$env->stop_nginx;
$cl->cli($_, ACL => SETUSER => 'nopub', 'on', '>secret', '~*', '&*',
         '+@all', '-spublish') for $cl->nodes;
$env->conf(http_config => upstream("cluster=on channel=$CH heartbeat=60s "
                                   . 'user=nopub password=secret '
                                   . 'read_timeout=1s'),
           config => $LOCATIONS);
my $offset_acl = $env->error_log_offset;
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);
ok($env->wait_for_log('refused SPUBLISH: NOPERM', 10, $offset_acl),
   'a refused SPUBLISH is said');
sleep 3;                                    # three pings refused
my $acl_log = $env->error_log($offset_acl);
is(scalar(() = $acl_log =~ /refused SPUBLISH/g), 1,
   'once in 10 s, not at every publish');
unlike($acl_log, qr/the publisher asks the cluster where/,
       'and not taken for a MOVED');
is(status($env)->{redis}{state}, 'up', 'the subscriber stays up');

done_testing();
