# kv_aware integration: server states and failures.
#
#   * a server marked `down` is never chosen, not even for prefixes it
#     would otherwise get by "least routed";
#   * a server that holds the prefix but fails (stopped, closes without
#     answering, answers 502) with max_fails=1 and proxy_next_upstream:
#     the client still gets 200 from another server, and the next request
#     with the same prefix goes where the retry went;
#   * what was learned for a failed try is forgotten (NGX_PEER_FAILED);
#   * `backup` servers only when every primary is gone;
#   * max_conns=1 spreads concurrent slow requests of one hot prefix.
#
# Our requests are POSTs: nginx retries a non-idempotent request that was
# already sent (502, or a close after the request) only with
# "proxy_next_upstream ... non_idempotent"; a refused connection (request
# never sent) is retried without it.
#
# nginx 1.30 keeps upstream connections alive by default (a cache of 32 a
# worker, HTTP/1.1).  The first request after a server stops can then go
# out on a connection that server's process held, be reset once sent
# ("recv() failed (104 ...)") and, a POST, end in 502: a few stops in 100
# here under load, and t/12 failed so in CI.  Where a stopped server is
# only the way to make a server fail, the location retries with
# non_idempotent, as an operator should (docs/reference.md); a refused
# connection is tested over HTTP/1.0, which keeps no connection.

use strict;
use warnings;

use Test::More;

use Test::KvAware qw(skip_unless_module);
use Test::KvAware::Chat qw(chat_body llm_upstream llm_location summary
                           send_body count_by fmt);

skip_unless_module();

my $SYS = join ' ', map { "Policy $_: keep answers short and correct." } 1 .. 20;

sub chat {
    my ($user, $sys) = @_;
    return chat_body('m', system => $sys // $SYS, user => $user);
}

# a system prompt of its own per $i: distinct from the first byte
sub new_prefix { chat('q', sprintf("%03d ", $_[0]) . ('distinct prefix text. ' x 30)) }

# A check here failed once under CI's load only: on failure, what each
# request got and what nginx logged, so that the next one says why.
sub diag_when_failed {
    my ($env, @r) = @_;
    return if Test::More->builder->is_passing;
    diag join "\n", 'responses:', map {
        my $r = $_ // {};
        join ' ', map { "$_=" . ($r->{$_} // '-') }
                      qw(status backend reason matched md5ok);
    } @r;
    diag "error log:\n" . $env->error_log;
}

sub bnum { my ($name) = @_; $name =~ /^b(\d+)$/ ? $1 : die "bad backend $name" }


subtest 'a down server is never chosen' => sub {
    my $env = Test::KvAware->new(backends => 3, log_level => 'info');
    $env->conf(http_config => <<'EOF', config => llm_location());
    upstream llm {
        kv_aware block_size=64;
        server $TEST_NGINX_BACKEND_1 max_fails=0;
        server $TEST_NGINX_BACKEND_2 down;
        server $TEST_NGINX_BACKEND_3 max_fails=0;
    }
EOF
    $env->start_nginx or return;

    my @r = map { send_body($env, new_prefix($_)) } 1 .. 15;
    push @r, map { send_body($env, new_prefix($_)) } 1 .. 15;
    push @r, map { send_body($env, chat("turn $_")) } 1 .. 10;
    my %by = %{ count_by(backend => @r) };
    is(scalar(grep { $_->{status} == 200 } @r), 40, 'all 40: 200');
    ok(!$by{b2}, 'b2 (down) never chosen') or diag fmt(\%by);
    ok($by{b1} && $by{b3}, 'b1 and b3 both used') or diag fmt(\%by);

    $env->stop_nginx;
    $env->check_logs_clean('down');
};


subtest 'failing server: retry elsewhere, the prefix follows the retry' => sub {
    my $env = Test::KvAware->new(backends => 3, log_level => 'info');
    $env->conf(http_config =>
                   llm_upstream(server => 'max_fails=1 fail_timeout=30s'),
               config => llm_location(
                   'proxy_next_upstream error timeout http_502 non_idempotent;'));
    $env->start_nginx or return;

    my $r0 = send_body($env, chat('first'));
    is($r0->{status}, 200, 'prefix learned');
    my $first = $r0->{backend};

    # 1. the holder closes the connection without answering
    $env->backend_stop(bnum($first));
    $env->backend_start(bnum($first), mode => 'close');
    my $body = chat('second');
    my $r1 = send_body($env, $body);
    is($r1->{status}, 200, "$first closes: 200 all the same");
    ok($r1->{md5ok}, 'body intact on the retry');
    isnt($r1->{backend}, $first, "answered by another server ($r1->{backend})");
    like($env->error_log, qr/upstream prematurely closed connection/,
         'the close was seen');

    my $r2 = send_body($env, chat('third'));
    is($r2->{backend}, $r1->{backend},
       'next request with the prefix: where the retry went');
    is($r2->{reason}, 'affinity', '... by affinity');
    cmp_ok($r2->{matched}, '>', 0, '... with matched > 0');
    my $second = $r2->{backend};

    # 2. the new holder answers 502
    $env->backend_stop(bnum($second));
    $env->backend_start(bnum($second), mode => 'fail');
    my $r3 = send_body($env, chat('fourth'));
    is($r3->{status}, 200, "$second fails (502): 200 all the same");
    ok($r3->{md5ok}, 'body intact on the retry');
    my ($third) = grep { $_ ne $first && $_ ne $second } qw(b1 b2 b3);
    is($r3->{backend}, $third, "answered by the last server $third");

    my $r4 = send_body($env, chat('fifth'));
    is($r4->{backend}, $third, 'next request with the prefix: there too');
    is($r4->{reason}, 'affinity', '... by affinity');

    # 3. the last one goes too: the two others are still failed
    # (fail_timeout=30s): 502, no crash
    $env->backend_stop(bnum($third));
    my $r5 = send_body($env, chat('sixth'));
    is($r5->{status}, 502, 'all three failed: 502');

    $env->stop_nginx;
    $env->check_logs_clean('retry');
    diag_when_failed($env, $r0, $r1, $r2, $r3, $r4, $r5);
};


subtest 'stopped holder: refused connection retried, prefix follows' => sub {
    my $env = Test::KvAware->new(backends => 3, log_level => 'info');
    $env->conf(http_config =>
                   llm_upstream(server => 'max_fails=1 fail_timeout=30s'),
               config => llm_location(
                   'proxy_next_upstream error timeout http_502;',
                   'proxy_http_version 1.0;'));
    $env->start_nginx or return;

    my $first = send_body($env, chat('one'))->{backend};
    $env->backend_stop(bnum($first));
    my @r = map { send_body($env, chat("turn $_")) } 1 .. 5;
    is(scalar(grep { $_->{status} == 200 && $_->{md5ok} } @r), 5,
       "$first stopped: all 200, body intact");
    is(scalar(grep { $_->{backend} eq $first } @r), 0, "none from $first");
    my %by = %{ count_by(backend => @r) };
    is(scalar(keys %by), 1, 'all on the one server the retry chose')
        or diag fmt(\%by);
    is(scalar(grep { $_->{reason} eq 'affinity' } @r[1 .. 4]), 4,
       'after the retry: affinity');
    like($env->error_log, qr/connect\(\) failed \(111/, 'refusal logged');

    $env->stop_nginx;
    $env->check_logs_clean('stopped');
    diag_when_failed($env, @r);
};


# With max_fails=0 the failed server stays eligible; only forgetting what
# was learned for it can make the prompt "new" again.
subtest 'a failed try is forgotten' => sub {
    my $env = Test::KvAware->new(backends => 2, log_level => 'info');
    $env->conf(http_config => llm_upstream(n => 2),
               config => llm_location('proxy_next_upstream off;'));
    $env->start_nginx or return;

    my $body = chat('the same question');
    my $r1 = send_body($env, $body);
    my $r2 = send_body($env, $body);
    is($r2->{reason}, 'affinity', 'learned: affinity');
    is($r2->{backend}, $r1->{backend}, 'learned: same server');
    my $holder = $r1->{backend};

    $env->backend_stop(bnum($holder));
    $env->backend_start(bnum($holder), mode => 'close');
    my $r3 = send_body($env, $body);
    is($r3->{status}, 502, "$holder closes, no retry: 502");
    is($r3->{reason}, 'affinity', '... it was chosen by affinity');

    $env->backend_stop(bnum($holder));
    $env->backend_start(bnum($holder));
    my $r4 = send_body($env, $body);
    is($r4->{status}, 200, "$holder is back");
    is($r4->{reason}, 'load', 'the prompt is new again: load');
    is($r4->{matched}, 0, 'nothing matched');

    $env->stop_nginx;
    $env->check_logs_clean('forget');
};


subtest 'backup only when all primaries are gone' => sub {
    my $env = Test::KvAware->new(backends => 3, log_level => 'info');
    my $retry = 'proxy_next_upstream error timeout non_idempotent;';
    $env->conf(http_config => <<'EOF', config => llm_location($retry));
    upstream llm {
        kv_aware block_size=64;
        server $TEST_NGINX_BACKEND_1 max_fails=1 fail_timeout=30s;
        server $TEST_NGINX_BACKEND_2 max_fails=1 fail_timeout=30s;
        server $TEST_NGINX_BACKEND_3 backup;
    }
EOF
    $env->start_nginx or return;

    my @r = map { send_body($env, new_prefix($_)) } 1 .. 12;
    my %by = %{ count_by(backend => @r) };
    is(scalar(grep { $_->{status} == 200 } @r), 12, 'all 200');
    ok(!$by{b3}, 'backup not used while primaries are up') or diag fmt(\%by);
    is_deeply([sort keys %by], [qw(b1 b2)], 'both primaries used')
        or diag fmt(\%by);

    $env->backend_stop(1);
    @r = map { send_body($env, new_prefix($_)) } 1 .. 6;
    is(scalar(grep { $_->{status} == 200 && $_->{backend} eq 'b2' } @r), 6,
       'b1 stopped: all 6 on b2, none on the backup')
        or diag join ' ', map { "$_->{status}:$_->{backend}" } @r;

    $env->backend_stop(2);
    @r = map { send_body($env, new_prefix($_)) } 1 .. 4;
    is(scalar(grep { $_->{status} == 200 && $_->{md5ok}
                     && $_->{backend} eq 'b3' } @r), 4,
       'both primaries stopped: backup b3 answers, body intact')
        or diag join ' ', map { "$_->{status}:$_->{backend}" } @r;
    is(scalar(grep { $_->{reason} =~ /^(?:load|affinity)$/ } @r), 4,
       'backup routed with a prompt decision');

    $env->stop_nginx;
    $env->check_logs_clean('backup');
    diag_when_failed($env, @r);
};


# What an operator gets from keepalive and non_idempotent (the default
# connection cache of nginx 1.30, written out so that older nginx does the
# same): the holder stopped with connections to it cached, its requests
# go to another server whether a connection is refused or reset.  A
# check of the behaviour, not a test of the race: nginx closes idle
# cached connections once it reads their FIN, and the reset is seen in a
# few stops of 100 under load (the script in 3e4c161's message).
subtest 'kept-alive connections to a stopped holder: retried' => sub {
    my $env = Test::KvAware->new(backends => 3, log_level => 'info');
    $env->conf(http_config => llm_upstream(
                   server => 'max_fails=1 fail_timeout=30s',
                   extra => "        keepalive 8;\n"),
               config => llm_location(
                   'proxy_http_version 1.1;',
                   'proxy_set_header Connection "";',
                   'proxy_next_upstream error timeout non_idempotent;'));
    $env->start_nginx or return;

    # the prefix's holder and connections cached to every server
    my @warm = map { send_body($env, chat("warm $_")) } 1 .. 3;
    push @warm, map { send_body($env, new_prefix($_)) } 1 .. 9;
    is(scalar(grep { $_->{status} == 200 } @warm), 12, 'warm-up: all 200');
    my $first = $warm[0]{backend};
    is(scalar(grep { $_->{backend} eq $first } @warm[0 .. 2]), 3,
       "the prefix held by $first");

    $env->backend_stop(bnum($first));
    my @r = map { send_body($env, chat("after $_")) } 1 .. 5;
    is(scalar(grep { $_->{status} == 200 && $_->{md5ok} } @r), 5,
       "$first stopped: all 200, body intact");
    is(scalar(grep { $_->{backend} eq $first } @r), 0, "none from $first");

    $env->stop_nginx;
    $env->check_logs_clean('keepalive');
    diag_when_failed($env, @warm, @r);
};


subtest 'max_conns=1: concurrent slow requests spread' => sub {
    my $env = Test::KvAware->new(backends => 3, log_level => 'info');
    $env->conf(http_config => llm_upstream(
                   params => 'block_size=64 overlap_weight=1000',
                   server => 'max_conns=1 max_fails=0'),
               config => llm_location());
    $env->start_nginx or return;

    my $warm = send_body($env, chat('warm up'));
    is($warm->{status}, 200, 'warm-up');

    # overlap_weight=1000: without max_conns all three would go to the
    # holder (see t/18-hot-prefix.t, imbalance=0)
    my @body = map { chat("concurrent $_") } 1 .. 3;
    my @res = $env->concurrent([ map {
        [POST => '/v1/chat/completions', $_, { 'X-Delay-Ms' => 1000 }]
    } @body ]);
    my @r = map { summary($res[$_], $body[$_]) } 0 .. 2;
    is(scalar(grep { $_->{status} == 200 && $_->{md5ok} } @r), 3,
       'all 3: 200, body intact');
    my %by = %{ count_by(backend => @r) };
    is(scalar(keys %by), 3, 'one per server') or diag fmt(\%by);
    ok($by{ $warm->{backend} }, 'the holder took one');

    $env->stop_nginx;
    $env->check_logs_clean('max_conns');
};

done_testing;
