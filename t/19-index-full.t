# kv_aware integration: a full index evicts, keeps working, keeps the
# newest prompts.
#
# index_size=256k holds a few thousand blocks (the notice at start says
# how many); with block_size=16, prompts of ~16 KB take ~1000 blocks each.
# Writing three times the capacity must not crash or stall anything, the
# latest prompt must still be fully known, and a prompt larger than the
# whole index must simply be routed.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(sleep);

use Test::KvAware qw(skip_unless_module);
use Test::KvAware::Chat qw(chat_body llm_upstream llm_location summary);

skip_unless_module();

sub prompt_body {
    my ($i, $kb) = @_;
    my $text = sprintf("%04d ", $i) . ("prompt $i fills the index. " x (40 * $kb));
    $text = substr($text, 0, $kb * 1024);
    return chat_body('m', user => $text);
}

my $env = Test::KvAware->new(backends => 2, log_level => 'info');
$env->conf(http_config =>
               llm_upstream(params => 'block_size=16 index_size=256k', n => 2),
           config => <<'EOF' . llm_location());
        client_body_buffer_size 1m;
        client_max_body_size 1m;
EOF
$env->start_nginx or BAIL_OUT('nginx does not start');

my ($capacity) = $env->error_log =~ /upstream "llm" indexes up to (\d+) blocks/;
ok($capacity, 'capacity announced: ' . ($capacity // '?'));
$capacity //= 6000;

# to this test's nginx, without a Content-Type header
sub send_prompt {
    my ($body) = @_;
    return summary($env->request(POST => '/v1/chat/completions', $body),
                   $body);
}

subtest 'three times the capacity, prompt after prompt' => sub {
    my $n = int(3 * $capacity / 1000) + 1;
    my @r;
    for my $i (1 .. $n) {
        push @r, send_prompt(prompt_body($i, 16));
        # the index clock ticks every 16 ms: distinct ages make "least
        # recently used" well defined for the eviction
        sleep 0.03;
    }
    is(scalar(grep { $_->{status} == 200 && $_->{md5ok} } @r), $n,
       "$n prompts: all 200, body intact");
    cmp_ok($r[0]{blocks} * $n, '>', 2.5 * $capacity,
           "$n x $r[0]{blocks} blocks: well over the capacity");

    my $last = send_prompt(prompt_body($n, 16));
    is($last->{reason}, 'affinity', 'the newest prompt: affinity');
    is($last->{matched}, $last->{blocks}, 'the newest prompt: all blocks');
    is($last->{backend}, $r[-1]{backend}, 'the newest prompt: same server');
};

subtest 'a prompt larger than the whole index' => sub {
    my $kb = int($capacity * 16 * 1.5 / 1024) + 1;
    my $big = prompt_body(9999, $kb);
    my $r1 = send_prompt($big);
    is($r1->{status}, 200, "$kb KB prompt: 200");
    ok($r1->{md5ok}, 'body intact');
    cmp_ok($r1->{blocks}, '>', $capacity, "$r1->{blocks} blocks > capacity");
    my $r2 = send_prompt($big);
    is($r2->{status}, 200, 'again: 200');
    like($r2->{reason}, qr/^(?:load|affinity)$/, 'again: routed by prompt');

    # and the index still learns afterwards
    my $small = prompt_body(10000, 2);
    my $s1 = send_prompt($small);
    my $s2 = send_prompt($small);
    is($s2->{reason}, 'affinity', 'a small prompt after it: affinity');
    is($s2->{matched}, $s2->{blocks}, '... all blocks');
};

$env->stop_nginx;
$env->check_logs_clean('index full');

done_testing;
