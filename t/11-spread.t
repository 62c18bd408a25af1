# kv_aware integration: new prefixes spread by load, known ones come back.
#
#   * 40 distinct prefixes, one after the other, over 3 servers: nobody
#     holds any of them, so each goes by load ("load", matched 0) and the
#     servers share them evenly; sending each again goes back to the server
#     it first went to ("affinity", matched == blocks);
#   * 9 distinct prefixes in flight at once: the in-flight load spreads
#     them.

use strict;
use warnings;

use Test::More;

use Test::KvAware qw(skip_unless_module);
use Test::KvAware::Chat qw(chat_body llm_upstream llm_location backend_of
                           summary send_body count_by fmt);

skip_unless_module();

# distinct from the first byte: no block of one is a block of another
sub prefix_body {
    my ($i, $tail) = @_;
    my $sys = sprintf("%03d ", $i) . ("Prefix number $i says: be helpful. " x 20);
    return chat_body('m', system => $sys, user => $tail // 'same question');
}

my $HTTP = llm_upstream();
my $LOCATION = llm_location();

# Routing decisions so far: the debug log has one line per decision.
sub decisions {
    my ($env) = @_;
    my @l = $env->error_log =~ /kv_aware: upstream "\w+" chose slot/g;
    return scalar @l;
}

# Sends @reqs at once and keeps them in flight until all are routed, so
# that each decision sees the others' load however slow the machine is.
sub all_in_flight {
    my ($env, @reqs) = @_;
    my $before = decisions($env);
    my $h = $env->hold(\@reqs);
    ok(Test::KvAware::wait_until(30,
           sub { decisions($env) >= $before + @reqs }),
       scalar(@reqs) . ' requests routed while all in flight');
    return $env->release($h);
}


my $env = Test::KvAware->new(backends => 3, log_level => 'debug');
$env->conf(http_config => $HTTP, config => $LOCATION);
$env->start_nginx or BAIL_OUT('nginx does not start');

subtest '40 new prefixes: by load, evenly' => sub {
    my @first = map { send_body($env, prefix_body($_)) } 1 .. 40;

    is(scalar(grep { $_->{status} == 200 && $_->{md5ok} } @first), 40,
       'all 200, body intact');
    is(scalar(grep { $_->{reason} eq 'load' } @first), 40,
       'all 40: reason load') or diag join ' ', map { $_->{reason} } @first;
    is(scalar(grep { $_->{matched} == 0 && $_->{blocks} >= 8 } @first), 40,
       'all 40: matched 0 of >= 8 blocks');

    my %by = %{ count_by(backend => @first) };
    is(scalar(keys %by), 3, 'all 3 servers used') or diag fmt(\%by);
    # mean 13.3: at most 1.5x the mean is 20 (the least-routed tie-break
    # makes it 14/13/13)
    is(scalar(grep { $_ > 40 / 3 * 1.5 } values %by), 0,
       'no server over 1.5x the mean') or diag fmt(\%by);

    # again, with another user turn: each prefix goes home
    my @again = map { send_body($env, prefix_body($_)) } 1 .. 40;
    my @home = grep { $again[$_]{backend} eq $first[$_]{backend} } 0 .. 39;
    is(scalar @home, 40, 'all 40 back on their first server')
        or diag join ' ', map { "$_->{backend}" } @again;
    is(scalar(grep { $_->{reason} eq 'affinity' } @again), 40,
       'all 40: reason affinity');
    is(scalar(grep { $_->{matched} == $_->{blocks} && $_->{blocks} > 0 }
              @again), 40, 'all 40: matched == blocks');

    # same prefix, another question: the shared blocks still count
    my @third = map { send_body($env, prefix_body($_, "other question $_ "
                                                      x 10)) } 1 .. 40;
    is(scalar(grep { $third[$_]{backend} eq $first[$_]{backend}
                     && $third[$_]{reason} eq 'affinity'
                     && $third[$_]{matched} > 0
                     && $third[$_]{matched} < $third[$_]{blocks} } 0 .. 39),
       40, 'new user turn: same server, affinity, 0 < matched < blocks');
};

subtest '9 new prefixes in flight at once: spread by in-flight load' => sub {
    my @reqs = map {
        [POST => '/v1/chat/completions', prefix_body(100 + $_),
         { 'Content-Type' => 'application/json' }]
    } 1 .. 9;
    my @res = all_in_flight($env, @reqs);
    my @r = map { summary($res[$_], $reqs[$_][2]) } 0 .. 8;

    is(scalar(grep { $_->{status} == 200 && $_->{md5ok} } @r), 9,
       'all 200, body intact');
    my %by = %{ count_by(backend => @r) };
    # each new prefix costs the same everywhere, the in-flight load decides
    is(scalar(grep { $_ == 3 } values %by), 3, 'each server took 3 of 9')
        or diag fmt(\%by);
};

$env->stop_nginx;
$env->check_logs_clean('spread');


# Load must beat "least routed": the server that was routed the fewest
# requests is made the busiest, then new prefixes must avoid it.  Without
# the load term they would all go there (ties go to the least routed).
subtest 'new prefixes avoid the busy server even if least routed' => sub {
    my $e = Test::KvAware->new(backends => 3, log_level => 'debug');
    $e->conf(http_config => $HTTP, config => $LOCATION);
    $e->start_nginx or return;

    # prefix A five times on one server, prefix B five times on another:
    # the third server has been routed nothing
    my @a = map { send_body($e, prefix_body(201)) } 1 .. 5;
    my @b = map { send_body($e, prefix_body(202)) } 1 .. 5;
    my %used = map { $_->{backend} => 1 } @a, @b;
    is(scalar(keys %used), 2, 'A and B on two servers') or return;
    my ($idle) = grep { !$used{$_} } qw(b1 b2 b3);

    # three requests of prefix R held in flight: R is new, so the first
    # goes to the least routed server ($idle), the others follow it
    my $h = $e->hold([ map {
        [POST => '/v1/chat/completions', prefix_body(203, "r$_")] } 1 .. 3 ]);
    ok(Test::KvAware::wait_until(30, sub { decisions($e) >= 13 }),
       '3 background requests routed');

    # now six new prefixes, one after the other, while R is in flight
    my @s = map { send_body($e, prefix_body(210 + $_)) } 1 .. 6;
    is(scalar(grep { $_->{reason} eq 'load' } @s), 6, 'new: reason load');
    is(scalar(grep { $_->{backend} eq $idle } @s), 0,
       "none of the 6 on the busy, least routed server $idle")
        or diag join ' ', map { $_->{backend} } @s;

    my $bg = join ' ', map { backend_of($_) } $e->release($h);
    is($bg, "$idle $idle $idle", "the 3 held requests were on $idle");

    $e->stop_nginx;
    $e->check_logs_clean('busy');
};


# weight scales the load: with weight=3 against weight=1, concurrent new
# prefixes land about 3:1 (6:2 of 8 when all 8 overlap, by the cost
# arithmetic: each new request charges 1 + its blocks, divided by the
# weight's share); without weights it would be 4:4
subtest 'weight=3 vs weight=1: concurrent new prefixes about 3:1' => sub {
    my $e = Test::KvAware->new(backends => 2, log_level => 'debug');
    $e->conf(http_config => <<'EOF', config => $LOCATION);
    upstream llm {
        kv_aware block_size=64;
        server $TEST_NGINX_BACKEND_1 weight=3 max_fails=0;
        server $TEST_NGINX_BACKEND_2 weight=1 max_fails=0;
    }
EOF
    $e->start_nginx or return;

    my @reqs = map {
        [POST => '/v1/chat/completions', prefix_body(300 + $_)] } 1 .. 8;
    my @res = all_in_flight($e, @reqs);
    my @r = map { summary($res[$_], $reqs[$_][2]) } 0 .. 7;
    is(scalar(grep { $_->{status} == 200 && $_->{reason} eq 'load' } @r), 8,
       'all 200, reason load');
    my %by = (b1 => 0, b2 => 0);
    $by{ $_->{backend} }++ for @r;
    is(fmt(\%by), 'b1=6 b2=2', 'weight=3 server took 6 of 8');

    $e->stop_nginx;
    $e->check_logs_clean('weight');
};

done_testing;
