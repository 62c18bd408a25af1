# Storage tiers in the prediction: KV events whose `medium` says where a
# server's copy of a block is (docs/events.md, "Storage tiers").
#
#   * one server holds a prompt in GPU memory, another in host memory
#     ("medium":"cpu"), a third nothing: with cost=ttft and equal rates
#     the GPU holder wins, and $kv_aware_ranking_llm ranks the CPU holder
#     between it and the cold server; with the GPU copy gone the CPU
#     holder wins over the cold one, its whole prompt matched;
#   * the status page counts the entries per tier (servers[].tiers), and
#     a store on GPU lifts them; a removal removes; the predicted time to
#     first token counts a block in host memory as a quarter of a miss;
#   * a hostile medium (a 1 KB string, a number, an unknown name) is a
#     rejected message, counted and logged; nothing is applied, nothing
#     crashes, and a snapshot brings the server back.

use strict;
use warnings;

use Test::More;

use Test::KvAware ();
use Test::KvAware::Events qw(
    $LOCATIONS preflight block_hashes prompt chat show addr bnum
    upstream_conf status server_status wait_status publisher stored
    removed
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 1,
                             log_level => 'info');

(my $locations = $LOCATIONS) =~ s{(add_header X-KV-Matched[^\n]*\n)}
    {$1            add_header X-KV-Ranking \$kv_aware_ranking_llm always;\n};

# speculative_ttl: a request's own guesses must not outlive a subtest
$env->conf(http_config => upstream_conf(
               kv_aware => 'cost=ttft affinity_min=0',
               events => 'heartbeat=60s speculative_ttl=1s'),
           config => $locations);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }),
   'subscribed to redis');

my $pub = publisher($env);
my @A = map { addr($env, $_) } 1 .. 3;
my ($GPU, $CPU, $COLD) = @A;

$pub->event($_, events => []) for @A;
is(scalar(grep { $_->{state} eq 'fresh' } @{ status($env)->{servers} }), 3,
   'three fresh servers');

# a stored event with a medium
sub tiered {
    my ($medium, @h) = @_;
    return +{ %{ stored(@h) }, medium => $medium };
}

# the ranking header: server -> cost
sub ranking {
    my ($env, $body) = @_;
    my $r = $env->request(POST => '/v1/chat/completions', $body,
                          { 'Content-Type' => 'application/json' });
    my %cost = map { split / / } split /,/,
                   $r->{headers}{'x-kv-ranking'} // '';
    return \%cost;
}

my $P = prompt('tiers', 16);
my @H = block_hashes($P);
cmp_ok(scalar @H, '>=', 16, 'the prompt has 16 blocks or more');

subtest 'GPU beats host memory beats cold' => sub {
    $pub->event($GPU, events => [stored(@H)]);
    $pub->event($CPU, events => [tiered('cpu', @H)]);

    my $st = status($env);
    is(server_status($st, $CPU)->{tiers}{cpu}, scalar @H,
       'status: the CPU holder\'s entries are in host memory');
    is(server_status($st, $CPU)->{entries}{event}, scalar @H,
       '... and are event entries all the same');
    is(server_status($st, $GPU)->{tiers}{cpu}, 0,
       'the GPU holder has none there');

    my $cost = ranking($env, $P);
    ok($cost->{$GPU} < $cost->{$CPU} && $cost->{$CPU} < $cost->{$COLD},
       'ranked: GPU, then host memory, then cold')
        or diag explain $cost;

    # the CPU holder's miss-equivalents: 16 x 0.25 of the cold one's
    my $share = ($cost->{$CPU} - $cost->{$GPU})
                / ($cost->{$COLD} - $cost->{$GPU});
    ok($share > 0.15 && $share < 0.35,
       'the copy weighs about a quarter of a miss (' .
       sprintf('%.2f', $share) . ')');

    sleep 1.1;      # the ranking request's guesses, if any, expire
    my $r = chat($env, $P);
    is($r->{backend}, 'b1', 'routed to the GPU holder') or diag show($r);
    is($r->{reason}, 'affinity', 'by affinity');
};

subtest 'the GPU copy gone: the CPU holder beats a cold server' => sub {
    sleep 1.1;      # b1's speculative entries from the last request
    $pub->event($GPU, events => [removed(@H)]);
    is(server_status(status($env), $GPU)->{entries}{event}, 0,
       'removed: the GPU holder holds nothing');

    my $r = chat($env, $P);
    is($r->{backend}, 'b2', 'routed to the host-memory holder')
        or diag show($r);
    is($r->{reason}, 'affinity', 'by affinity');
    is($r->{matched}, scalar @H, 'the whole prompt matched through it');

    # nothing learned, no queue: the prior rate, 1000 blocks a second, and
    # the copies at a quarter of a miss each: about 16 / 4 ms, not 16
    my $ms = server_status(status($env), $CPU)->{ttft}{predicted_ms};
    ok($ms >= 0.2 * @H && $ms <= 0.3 * @H,
       "the predicted time to first token counts the copies ($ms ms)");
};

subtest 'a store on GPU lifts, a removal removes' => sub {
    $pub->event($CPU, events => [stored(@H[0 .. 3])]);
    my $s = server_status(status($env), $CPU);
    is($s->{tiers}{cpu}, @H - 4, 'stored on GPU: 4 entries lifted');

    $pub->event($CPU, events => [tiered('DISK', @H[4 .. 5])]);
    $s = server_status(status($env), $CPU);
    is($s->{tiers}{disk}, 2, 'vLLM\'s spelling: 2 on disk');
    is($s->{tiers}{cpu}, @H - 6, 'and 2 fewer in host memory');

    $pub->event($CPU, events => [removed(@H)]);
    $s = server_status(status($env), $CPU);
    is($s->{entries}{event} + $s->{tiers}{cpu} + $s->{tiers}{disk}, 0,
       'removed: nothing left in any tier');
};

subtest 'a hostile medium is refused, nothing applied' => sub {
    my $before = status($env);
    my $off = $env->error_log_offset;
    my @bad = ('x' x 1024, 7, 'STORAGE');

    $pub->event($CPU, events => [tiered($_, @H)]) for @bad;

    my $st = status($env);
    is($st->{events}{rejected}{bad_field},
       $before->{events}{rejected}{bad_field} + 3,
       'three messages rejected as a bad field');
    is(server_status($st, $CPU)->{entries}{event}, 0, 'nothing applied');
    ok($env->wait_for_log(qr/medium: not gpu, cpu or disk/, 5, $off),
       'the log says why');

    # the gaps the refused messages left: a snapshot brings it back
    $pub->event($CPU, snapshot => 'full', events => [tiered('cpu', @H)]);
    ok(wait_status($env, 5, sub {
           server_status($_[0], $CPU)->{state} eq 'fresh' }),
       'a snapshot: fresh again');
    is(server_status(status($env), $CPU)->{tiers}{cpu}, scalar @H,
       'the snapshot\'s tier applied');
    is(chat($env, $P)->{status}, 200, 'nginx still answers');
};

$env->check_logs_clean('tiers');

done_testing();
