# kv_aware precise mode: bad event messages are counted and ignored.
#
# kv_aware_events max_message=1k max_hashes=8 max_rate=50.  Each class is
# sent and must raise its own counter in kv_aware_status (and no other),
# leave the index and the server's sequence untouched (no gap afterwards),
# never apply part of a rejected message; then a flood of 500 messages
# raises "flood"; afterwards a valid event still routes, the worker did
# not crash and the warn lines are rate-limited (a handful, not 500).

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $JSON $CHANNEL $LOCATIONS preflight block_hashes prompt chat addr
    upstream_conf status server_status wait_status seen publisher
    stored removed
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 1,
                             log_level => 'info');
$env->conf(http_config => upstream_conf(kv_aware => '',
               events => 'heartbeat=60s max_message=1k max_hashes=8 '
                       . 'max_rate=50'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);
ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }), 'redis up');

my @A = map { addr($env, $_) } 1 .. 3;
my $X = $A[0];
my $pub = publisher($env);
my @pids = $env->worker_pids;

my $P = prompt('valid', 8);
my @H = block_hashes($P);
cmp_ok(scalar @H, '>=', 8, 'prompt of >= 8 blocks');
$pub->event($X, events => [stored(@H[0 .. 7])]);   # 8: at max_hashes
my $st0 = status($env);
is(server_status($st0, $X)->{state}, 'fresh', 'X fresh at seq 1');
is(server_status($st0, $X)->{entries}{event}, 8, '8 hashes (= max_hashes) ok');

my $B = prompt('other', 4);
my @B = block_hashes($B);
my $h = $B[0];
my %ok = (v => 1, server => $X, seq => 2);
sub msg { $JSON->encode({ %ok, @_ }) }

my %bad = (
    malformed => [
        'this is not json',
        '{"v":1,"server":"' . $X . '","seq":2,',
        '[1,2,3]',
        '"v"',
        '',
    ],
    bad_field => [
        msg(v => '1'),
        '{"server":"' . $X . '","seq":2}',          # no v
        msg(seq => '2'),
        msg(seq => -1),
        msg(seq => 2.5),
        msg(server => 7),
        msg(server => ''),
        msg(events => { type => 'stored' }),
        msg(events => [{ type => 'stolen', hashes => [$h] }]),
        msg(events => [{ type => 'stored', hashes => $h }]),
        msg(events => [{ type => 'stored', hashes => [1234] }]),
        msg(events => [{ type => 'stored', hashes => ['xyz'] }]),
        msg(events => [{ type => 'stored',
                         hashes => ['0x' . substr($h, 2)] }]),
        msg(events => [{ type => 'removed', hashes => ['zz'] }]),
        msg(events => [{ type => 'stored', hashes => [$h . '0'] }]),
        msg(events => [{ type => 'stored', hashes => [$h],
                         parent => 'nothex' }]),
        msg(load => { waiting => -1 }),
        msg(load => { running => 'many' }),
        msg(load => { kv_usage => 1.5 }),
        msg(load => [1]),
        msg(snapshot => 'half'),
        msg(keyspace => 'words'),
        # valid first event, bad second: nothing may be applied
        msg(events => [stored(@B), stored($B[0], 'zz')]),
    ],
    version => [ msg(v => 2), msg(v => 0) ],
    # well formed, but hashes of token ids to a text upstream (keys=text)
    keyspace => [ msg(keyspace => 'tokens'),
                  msg(keyspace => 'tokens', events => [stored(@B)]) ],
    unknown_server => [ msg(server => '127.0.0.1:1'), msg(server => 'b1'),
                        msg(server => "$X ") ],
    too_big => [
        msg(pad => 'x' x 1100),
        msg(events => [stored(@B[0 .. 3], @H[0 .. 4])]),     # 9 hashes
        msg(events => [stored(@B[0 .. 3]), removed(@H[0 .. 4])]),
    ],
);

my @classes = qw(malformed bad_field version keyspace unknown_server too_big);
my %want = map { $_ => 0 } @classes, 'flood';
for my $class (@classes) {
    for my $m (@{ $bad{$class} }) {
        $pub->publish_raw($m);
    }
    $want{$class} = scalar @{ $bad{$class} };
    my $st = status($env);
    is_deeply($st->{events}{rejected}, \%want,
              "$class: counted as $class only ($want{$class})");
    is($st->{events}{messages}, $st0->{events}{messages},
       "$class: nothing applied");
}

my $st = status($env);
my $sx = server_status($st, $X);
is($sx->{entries}{event}, 8, 'event entries unchanged');
is($sx->{seq}, 1, 'seq unchanged');
is($sx->{events}{hashes}, 8, 'server hashes unchanged');
is($st->{index}{used}, $st0->{index}{used}, 'index size unchanged');
my $rb = chat($env, $B);
is("$rb->{reason} $rb->{matched}", 'load 0',
   'no part of a rejected message was applied');

# the sequence goes on from 1: no gap
$pub->event($X, seq => 2, events => [stored(@H)]);
$sx = server_status(status($env), $X);
is("$sx->{state} $sx->{events}{gaps}", 'fresh 0',
   'seq 2 after the rejected ones: in sequence, fresh');
my $r = chat($env, $P);
is("$r->{backend} $r->{reason} $r->{matched}",
   'b1 affinity ' . scalar(@H), 'the index still routes');

# a flood: 500 messages as fast as one connection sends them
sleep 1.1;                          # a fresh max_rate window
my $Z = $A[2];
$st0 = status($env);
my @rep = $pub->pipeline(map {
    [PUBLISH => $CHANNEL, $JSON->encode({ v => 1, server => $Z, seq => $_ })]
} 1 .. 500);
is(scalar(grep { defined && !ref && $_ == 1 } @rep), 500,
   '500 messages published');
$st = wait_status($env, 5, sub { seen($_[0]) >= seen($st0) + 500 });
ok($st, 'all 500 taken in');
my $flood = $st->{events}{rejected}{flood};
my $taken = $st->{events}{messages} - $st0->{events}{messages};
cmp_ok($flood, '>=', 300, "flood counted: $flood rejected");
cmp_ok($taken, '>=', 50, "$taken accepted (max_rate=50 a second)");
cmp_ok($taken, '<=', 200, 'not many more');
is($flood + $taken, 500, 'each message counted once');

sleep 1.1;
my $Q = prompt('after', 6);
my @Q = block_hashes($Q);
$pub->event($A[1], events => [stored(@Q)]);
$r = chat($env, $Q);
is("$r->{backend} $r->{reason} $r->{matched}",
   'b2 affinity ' . scalar(@Q), 'after the flood a stored event routes');

is_deeply([$env->worker_pids], \@pids, 'the worker never crashed');
$env->stop_nginx;
$env->check_logs_clean('bad events');
my @warn = grep { /ignored an event message/ } split /\n/, $env->error_log;
cmp_ok(scalar @warn, '<=', 12,
       scalar(@warn) . ' warn lines for ' . (36 + 450) . ' bad messages');
my @fl = grep { /over max_rate/ } @warn;
cmp_ok(scalar @fl, '>=', 1, 'the flood was logged');
cmp_ok(scalar @fl, '<=', 2, 'once or twice, not per message');
for my $c ('malformed', 'bad field', 'unsupported version',
           'over a size limit', 'unknown server') {
    my $n = grep { /ignored an event message: $c/ } @warn;
    ok($n >= 1 && $n <= 2, "\"$c\" logged $n time(s)");
}
like(join("\n", @warn), qr/\[warn\].*upstream "llm" ignored an event message: unknown server: 127\.0\.0\.1:1 \(1 so far\)/,
     'the warn line names the upstream, the class and the detail');

done_testing;
