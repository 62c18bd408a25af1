# kv_aware integration: reloads that change block_size reset the index
# while workers of the old configuration still route on it.  Once, an
# unlocked reset could leave a cycle in a hash chain and a lookup then
# looped forever under the lock.  With requests flowing through ten such
# reloads every request must succeed, and kv_aware_status?check (which
# verifies the whole index: chains, free list, counters) must say "ok".

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(sleep);

use Test::KvAware qw(skip_unless_module);
use Test::KvAware::Chat qw(chat_body llm_upstream llm_location);
use Test::KvAware::Events qw(traffic);

skip_unless_module();

my $LOCATION = llm_location() . <<'EOF';
        location = /kv_status {
            kv_aware_status;
        }
EOF

my $env = Test::KvAware->new(backends => 3, workers => 2,
                             log_level => 'info');

sub reconf {
    my ($bs) = @_;
    $env->conf(http_config => llm_upstream(params => "block_size=$bs"),
               config => $LOCATION);
}

sub body {
    my ($i) = @_;
    return chat_body('m', system => sprintf("%02d ", $i % 20)
                                    . ("a prefix worth routing. " x 60),
                          user => "question $i");
}

sub check {
    my $r = $env->request(GET => '/kv_status?check');
    return $r->{json} ? $r->{json}{upstreams}{llm}{index} : {};
}

reconf(64);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);
is(check()->{check}, 'ok', 'a fresh index checks ok');

my $plain = $env->request(GET => '/kv_status');
ok($plain->{json} && !exists $plain->{json}{upstreams}{llm}{index}{check},
   'no check unless asked');

my $t = traffic($env, map { body($_) } 1 .. 20);
my ($sent, $failed, $reloads) = (0, 0, 0);

for my $i (1 .. 10) {
    reconf($i % 2 ? 128 : 64);
    $reloads++ if $env->reload(quiet => 1);

    for my $j (1 .. 20) {
        my $r = $env->request(POST => '/v1/chat/completions',
                              body($i * 20 + $j),
                              { 'Content-Type' => 'application/json' });
        $sent++;
        $failed++ unless $r->{status} == 200;
    }
}

my @bg = $t->stop;
is($reloads, 10, 'ten reloads, block_size 64 and 128 in turn');
is("$sent $failed", '200 0', 'every request between them succeeded');
cmp_ok(scalar @bg, '>', 20, scalar(@bg) . ' requests alongside');
is(scalar(grep { $_->[0] != 200 } @bg), 0, 'all of them succeeded');

my $ix = check();
is($ix->{check}, 'ok', 'the index checks ok after the reloads');
cmp_ok($ix->{used}, '>', 0, "and holds entries ($ix->{used})");
like($env->error_log, qr/block_size of upstream "llm" changed, index reset/,
     'the resets happened');

$env->stop_nginx;
$env->check_logs_clean('reloads with block_size changes');

done_testing;
