# kv_aware integration: the index lives in shared memory and survives
# `nginx -s reload` as long as it can still be right.
#
#   * same configuration, one or two workers: every prefix goes back to
#     its server by affinity after the reload (servers keep their slot by
#     name, even when the server lines are reordered);
#   * block_size changes: the index is reset (a notice says so), also when
#     it changes back: old hashes must not come back to life;
#   * index_size changes: a new zone, nothing known;
#   * a server removed: its prefixes go elsewhere, nothing breaks; added
#     back: what it held was wiped when it left, it gets no stale affinity.

use strict;
use warnings;

use Test::More;

use Test::KvAware qw(skip_unless_module);
use Test::KvAware::Chat qw(chat_body llm_upstream llm_location summary);

skip_unless_module();

sub prefix_body {
    my ($i) = @_;
    return chat_body('m', system => sprintf("%03d ", $i)
                                    . ("reload-proof prefix $i. " x 20),
                          user => 'same question');
}

my $LOCATION = llm_location();

# like send_body(), but without a Content-Type header
sub send_prefix {
    my ($env, $i) = @_;
    my $body = prefix_body($i);
    return summary($env->request(POST => '/v1/chat/completions', $body),
                   $body);
}

sub new_env {
    my (%o) = @_;
    my $env = Test::KvAware->new(backends => 3, log_level => 'info',
                                 workers => $o{workers} // 1);
    $env->conf(http_config => llm_upstream(%o), config => $LOCATION);
    return $env;
}

sub reconf {
    my ($env, %o) = @_;
    $env->conf(http_config => llm_upstream(%o), config => $LOCATION,
               workers => $o{workers});
    return $env->reload(name => $o{name} // 'reloaded');
}


for my $workers (1, 2) {
    subtest "affinity survives reload, $workers worker(s)" => sub {
        my $env = new_env(workers => $workers);
        $env->start_nginx or return;

        my @before = map { send_prefix($env, $_) } 1 .. 9;
        is(scalar(grep { $_->{reason} eq 'load' && $_->{status} == 200 }
                  @before), 9, '9 new prefixes routed by load');
        my %used = map { $_->{backend} => 1 } @before;
        is(scalar(keys %used), 3, 'over all 3 servers');

        # both workers (if 2) see the same index: repeat a few times
        my @rep = map { send_prefix($env, 1 + $_ % 9) } 0 .. 17;
        is(scalar(grep { $rep[$_]{backend} eq $before[$_ % 9]{backend}
                         && $rep[$_]{reason} eq 'affinity' } 0 .. 17), 18,
           'before reload: affinity from every worker');

        reconf($env, workers => $workers) or return;
        my @after = map { send_prefix($env, $_) } 1 .. 9;
        is(scalar(grep { $after[$_]{backend} eq $before[$_]{backend} }
                  0 .. 8), 9, 'after reload: same servers')
            or diag join ' ', map { $_->{backend} } @after;
        is(scalar(grep { $_->{reason} eq 'affinity'
                         && $_->{matched} == $_->{blocks} } @after), 9,
           'after reload: affinity, matched == blocks');

        # server lines reordered: slots follow the names
        reconf($env, workers => $workers, servers => [3, 1, 2],
               name => 'reloaded with the servers reordered') or return;
        @after = map { send_prefix($env, $_) } 1 .. 9;
        is(scalar(grep { $after[$_]{backend} eq $before[$_]{backend}
                         && $after[$_]{reason} eq 'affinity' } 0 .. 8), 9,
           'reordered: same servers by affinity')
            or diag join ' ', map { "$_->{backend}:$_->{reason}" } @after;

        $env->stop_nginx;
        $env->check_logs_clean("reload, $workers worker(s)");
    };
}


subtest 'block_size change resets the index' => sub {
    my $env = new_env();
    $env->start_nginx or return;

    my $r1 = send_prefix($env, 1);
    my $r2 = send_prefix($env, 1);
    is($r2->{reason}, 'affinity', 'block_size=64: learned');

    my $mark = $env->error_log_offset;
    reconf($env, params => 'block_size=128', name => 'reload: block_size=128')
        or return;
    like($env->error_log($mark),
         qr/\[notice\].*kv_aware: block_size of upstream "llm" changed, index reset/,
         'notice: index reset');
    my $r3 = send_prefix($env, 1);
    is($r3->{reason}, 'load', 'block_size=128: load');
    is($r3->{matched}, 0, 'block_size=128: nothing matched');
    is($r3->{blocks}, int($r1->{blocks} * 64 / 128), 'block_size=128: blocks halved')
        or diag "64: $r1->{blocks}, 128: $r3->{blocks}";

    # back to 64: the hashes learned under 64 before must be gone
    reconf($env, params => 'block_size=64', name => 'reload: block_size=64')
        or return;
    my $r4 = send_prefix($env, 1);
    is($r4->{reason}, 'load', 'back to 64: load (old entries were wiped)');
    is($r4->{matched}, 0, 'back to 64: nothing matched');
    my $r5 = send_prefix($env, 1);
    is($r5->{reason}, 'affinity', 'back to 64: learning again');
    is($r5->{backend}, $r4->{backend}, 'back to 64: same server');

    $env->stop_nginx;
    $env->check_logs_clean('block_size');
};


subtest 'index_size change: a new zone' => sub {
    my $env = new_env(params => 'block_size=64 index_size=1m');
    $env->start_nginx or return;

    send_prefix($env, 1);
    is(send_prefix($env, 1)->{reason}, 'affinity', 'learned');
    reconf($env, params => 'block_size=64 index_size=2m',
           name => 'reload: index_size=2m') or return;
    my $r = send_prefix($env, 1);
    is($r->{status}, 200, 'new zone: 200');
    is($r->{reason}, 'load', 'new zone: load');

    $env->stop_nginx;
    $env->check_logs_clean('index_size');
};


subtest 'a server removed, then added back' => sub {
    my $env = new_env();
    $env->start_nginx or return;

    my @r0 = map { send_prefix($env, $_) } 1 .. 9;
    my @on3 = grep { $r0[$_ - 1]{backend} eq 'b3' } 1 .. 9;
    cmp_ok(scalar @on3, '>=', 1, 'b3 holds some prefixes (' . @on3 . ')');

    reconf($env, servers => [1, 2], name => 'reload without b3') or return;
    my @r1 = map { send_prefix($env, $_) } 1 .. 9;
    is(scalar(grep { $_->{status} == 200 && $_->{md5ok} } @r1), 9,
       'without b3: all 200, body intact');
    is(scalar(grep { $_->{backend} eq 'b3' } @r1), 0, 'without b3: none on b3');
    for my $i (1 .. 9) {
        my ($was, $now) = ($r0[$i - 1], $r1[$i - 1]);
        if ($was->{backend} eq 'b3') {
            is($now->{reason}, 'load', "prefix $i (was on b3): load");
        } else {
            is("$now->{backend} $now->{reason}", "$was->{backend} affinity",
               "prefix $i: stays on $was->{backend}");
        }
    }

    # b3 comes back: what it held was dropped when it left, so it must not
    # win the prefixes back (it would, by "least routed", on a stale match)
    reconf($env, servers => [1, 2, 3], name => 'reload with b3 again')
        or return;
    my @r2 = map { send_prefix($env, $_) } 1 .. 9;
    is(scalar(grep { $r2[$_]{backend} eq $r1[$_]{backend}
                     && $r2[$_]{reason} eq 'affinity' } 0 .. 8), 9,
       'b3 back: every prefix stays where it moved')
        or diag join ' ', map { "$_->{backend}:$_->{reason}" } @r2;
    my $n = send_prefix($env, 100);
    is($n->{status}, 200, 'b3 back: a new prefix routes');

    $env->stop_nginx;
    $env->check_logs_clean('server removed');
};

done_testing;
