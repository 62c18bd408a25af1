# kv_aware: what nginx learned of a server is bounded by what the server
# can hold.
#
#   * learned_tokens=1600 with block_size=64: 100 blocks a server.  Ten
#     prompts of ~21 blocks each, one after the other, all to the one
#     server: it is said to hold no more than 100 of their blocks
#     (kv_aware_status), the oldest prompt is forgotten (routed by load,
#     nothing matched) while the newest is matched whole;
#   * without the parameter the same ten prompts are all kept (the TTL
#     alone bounds them);
#   * the budget from the server's own word: "kv_tokens" in the load of
#     an event message, for a server routed by learned state (its events
#     out of sequence), does the same without learned_tokens.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $LOCATIONS preflight prompt chat addr upstream_conf status
    server_status wait_status publisher
);

preflight();

my $env = Test::KvAware->new(backends => 1, redis => 1, workers => 1,
                             log_level => 'info');
my $A = addr($env, 1);
my @P = map { prompt("p$_", 20) } 1 .. 10;

sub start_with {
    my ($http) = @_;
    $env->stop_nginx;
    $env->conf(http_config => $http, config => $LOCATIONS);
    return $env->start_nginx;
}

sub learned {
    my $s = server_status(status($env), $A);
    return $s ? $s->{entries}{learned} : -1;
}

# the ten prompts in turn; the index clock ticks every 16 ms
sub send_all {
    my @r;
    for my $p (@P) {
        push @r, chat($env, $p);
        sleep 0.04;
    }
    return @r;
}

subtest 'learned_tokens: 100 blocks at most, the oldest forgotten' => sub {
    start_with(<<'EOF') or return fail('start');
    upstream llm {
        kv_aware block_size=64 learned_tokens=1600;
        server $TEST_NGINX_BACKEND_1 max_fails=0;
    }
EOF
    my @r = send_all();
    is(scalar(grep { $_->{status} == 200 } @r), 10, 'ten prompts: 200');
    my $blocks = $r[0]{blocks};
    cmp_ok($blocks * 10, '>', 200, "$blocks blocks a prompt: twice the "
           . 'budget in all');

    my $n = learned();
    cmp_ok($n, '<=', 100, "the server is said to hold $n learned blocks, "
           . 'within 100');
    cmp_ok($n, '>=', 50, '... and not much fewer');

    my $new = chat($env, $P[-1]);
    is("$new->{reason} $new->{matched}", "affinity $new->{blocks}",
       'the newest prompt: matched whole');
    my $old = chat($env, $P[0]);
    is("$old->{reason} $old->{matched}", 'load 0',
       'the oldest prompt: forgotten');
};

subtest 'without a budget: the TTL alone' => sub {
    start_with(<<'EOF') or return fail('start');
    upstream llm {
        kv_aware block_size=64;
        server $TEST_NGINX_BACKEND_1 max_fails=0;
    }
EOF
    send_all();
    my $n = learned();
    cmp_ok($n, '>=', 200, "all $n learned blocks kept");
    my $old = chat($env, $P[0]);
    is("$old->{reason} $old->{matched}", "affinity $old->{blocks}",
       'the oldest prompt: still matched');
};

subtest 'kv_tokens in the server\'s load: the same budget' => sub {
    start_with(upstream_conf(kv_aware => '', events => '', n => 1))
        or return fail('start');
    wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' })
        or return fail('redis link up');

    # a first message in mid-sequence: a gap, so the server stays routed
    # by learned state, and its load says how large its cache is
    my $pub = publisher($env);
    $pub->event($A, seq => 42, load => { waiting => 0, running => 0,
                                         kv_usage => 0, kv_tokens => 1600 });
    isnt(server_status(status($env), $A)->{state}, 'fresh',
         'the server is routed by learned state');

    send_all();
    my $n = learned();
    cmp_ok($n, '<=', 100, "$n learned blocks: within the 100 it announced");
    my $old = chat($env, $P[0]);
    is("$old->{reason} $old->{matched}", 'load 0',
       'the oldest prompt: forgotten');
    my $new = chat($env, $P[-1]);
    is("$new->{reason} $new->{matched}", "affinity $new->{blocks}",
       'the newest prompt: matched whole');
};

subtest 'a bad learned_tokens fails nginx -t' => sub {
    $env->stop_nginx;
    $env->conf(http_config => <<'EOF', config => $LOCATIONS);
    upstream llm {
        kv_aware learned_tokens=-5;
        server $TEST_NGINX_BACKEND_1;
    }
EOF
    my ($ok, $out) = $env->test_config;
    ok(!$ok, 'nginx -t fails');
    like($out // '', qr/invalid learned_tokens "-5"/,
         'and names the parameter');
};

$env->stop_nginx;
$env->check_logs_clean('learned budget');

done_testing;
