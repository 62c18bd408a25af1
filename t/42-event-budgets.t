# kv_aware_events budgets: max_events per message, and per server a
# second server_bytes and server_hashes.
#
# max_rate counts messages whatever they cost; the per-server budgets
# count what they cost.  A message past its server's budget is refused as
# a flood, the server is degraded (events were lost: its event entries
# are not trusted) and asked for a resync, while the other servers'
# events keep applying.  A snapshot in a later second brings it back.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $JSON $CHANNEL $LOCATIONS preflight block_hashes prompt chat addr
    upstream_conf status server_status wait_status seen publisher stored
    redis_subscribe
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 1,
                             log_level => 'info');
my @A = map { addr($env, $_) } 1 .. 3;

sub events_conf {
    $env->conf(http_config => upstream_conf(kv_aware => '',
                                            events => "heartbeat=60s @_"),
               config => $LOCATIONS);
}

subtest 'nginx -t names the parameter' => sub {
    for my $bad ('server_bytes=abc', 'server_bytes=100', 'server_hashes=0',
                 'server_hashes=x', 'max_events=0', 'max_events=many')
    {
        my ($name) = $bad =~ /^(\w+)=/;
        events_conf($bad);
        my ($ok, $out) = $env->test_config;
        ok(!$ok, "$bad refused");
        like($out, qr/invalid $name "/, "... naming $name");
    }
    events_conf('max_message=64k server_bytes=32k');
    my ($ok, $out) = $env->test_config;
    ok(!$ok, 'server_bytes below max_message refused');
    like($out, qr/server_bytes= below max_message=/, '... saying why');
    events_conf('max_hashes=5000 server_hashes=4000');
    ($ok, $out) = $env->test_config;
    ok(!$ok, 'server_hashes below max_hashes refused');
    like($out, qr/server_hashes= below max_hashes=/, '... saying why');
};

events_conf('max_hashes=1000 max_events=4 server_hashes=2000');
$env->start_nginx or BAIL_OUT('nginx did not start');
ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }), 'subscribed');

my $pub = publisher($env);
my $resyncs = redis_subscribe($env->redis_port, "$CHANNEL:resync");

sub msg {
    my ($server, $seq, @events) = @_;
    return [PUBLISH => $CHANNEL, $JSON->encode({ v => 1, server => $server,
                                                 seq => $seq,
                                                 events => \@events })];
}

sub made_up { my ($tag, $n) = @_; map { sprintf '%08x%08x', $tag, $_ } 1 .. $n }

subtest 'max_events' => sub {
    my $before = status($env);
    $pub->event($A[2], events => [map { stored(made_up(99, 1)) } 1 .. 5]);
    my $st = status($env);
    is($st->{events}{rejected}{too_big},
       $before->{events}{rejected}{too_big} + 1,
       '5 events, max_events=4: refused as too big');
    $pub->event($A[2], events => [map { stored(made_up(98 + $_, 1)) } 1 .. 4]);
    is(server_status(status($env), $A[2])->{entries}{event}, 4,
       '4 events taken in');
};

subtest 'server_hashes' => sub {
    sleep 1.1;                      # a fresh second of budgets
    my $before = status($env);
    my $P = prompt('budget-hashes', 6);
    # 5 x 500 hashes of server 1, and server 2 in between: 2,500 > 2,000
    my @msgs = map { msg($A[0], $_, stored(made_up($_, 500))) } 1 .. 3;
    push @msgs, msg($A[1], 1, stored(block_hashes($P)));
    push @msgs, map { msg($A[0], $_, stored(made_up($_, 500))) } 4 .. 5;
    $pub->pipeline(@msgs);
    my $st = wait_status($env, 5, sub { seen($_[0]) >= seen($before) + 6 });
    ok($st, 'all 6 taken in');
    is($st->{events}{rejected}{flood} - $before->{events}{rejected}{flood},
       1, 'the 5th message of server 1 refused as a flood');
    my $s1 = server_status($st, $A[0]);
    is($s1->{state}, 'degraded', 'server 1 degraded');
    is($s1->{entries}{event}, 2000, 'its first 2,000 hashes applied');
    is(server_status($st, $A[1])->{state}, 'fresh', 'server 2 fresh');
    my $r = chat($env, $P);
    is("$r->{backend} $r->{reason}", 'b2 affinity',
       "server 2's events applied meanwhile");

    my @m = $resyncs->messages(5, sub { grep { $_->[1] =~ /\Q$A[0]\E/ } @_ });
    ok((grep { $_->[1] =~ /\Q$A[0]\E/ } @m), 'server 1 asked for a resync');

    sleep 1.1;
    $pub->event($A[0], seq => 6, snapshot => 'full',
                events => [stored(made_up(77, 100))]);
    $st = status($env);
    is(server_status($st, $A[0])->{state}, 'fresh',
       'its snapshot in the next second brings it back');
    is(server_status($st, $A[0])->{entries}{event}, 100,
       'and replaces its entries');
};

subtest 'server_bytes' => sub {
    events_conf('max_message=8k server_bytes=16k');
    $env->reload or return;
    ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }),
       'subscribed again');
    sleep 1.1;
    my $before = status($env);
    # about 6 KB each: the third of server 3 goes past 16k
    my @msgs = map { msg($A[2], 100 + $_, stored(made_up(200 + $_, 300))) }
                   1 .. 3;
    cmp_ok(length($msgs[0][2]), '>', 5600, length($msgs[0][2]) . ' bytes');
    $pub->pipeline(@msgs[0, 1], msg($A[1], 2, stored(made_up(300, 10))),
                   $msgs[2]);
    my $st = wait_status($env, 5, sub { seen($_[0]) >= seen($before) + 4 });
    ok($st, 'all 4 taken in');
    is($st->{events}{rejected}{flood} - $before->{events}{rejected}{flood},
       1, 'the third message of server 3 refused as a flood');
    is(server_status($st, $A[2])->{state}, 'degraded', 'server 3 degraded');
    is(server_status($st, $A[1])->{events}{messages}, 2,
       "server 2's message applied");
};

$env->stop_nginx;
$env->check_logs_clean('budgets');
my $log = $env->error_log;
like($log, qr/ignored an event message: flood: server_hashes/,
     'server_hashes named in the log');
like($log, qr/ignored an event message: flood: server_bytes/,
     'server_bytes named in the log');

done_testing;
