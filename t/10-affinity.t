# kv_aware integration: cache affinity.
#
#   * one long system prompt + 50 different user turns, sent one after the
#     other, all land on ONE server; the control with overlap_weight=0 (a
#     pure load balancer) spreads them: the stickiness comes from the cache
#     logic, not from chance or from a stable hash of something else;
#   * a conversation growing by a turn per request stays on its server and
#     $kv_aware_matched grows every turn (= the previous request's blocks);
#   * the model seeds the hash chain: same prompt, other model, no match;
#   * learned_ttl ages out what was learned;
#   * keepalive (after kv_aware) keeps the routing;
#   * the access log shows the three variables.
#
# Sequential requests only: the harness reads each response until nginx
# closes the connection, which happens after the balancer's free (the
# in-flight load is back to 0), so every decision below is deterministic.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(sleep);

use Test::KvAware qw(skip_unless_module);
use Test::KvAware::Chat qw(chat_body llm_upstream llm_location send_body
                           count_by fmt);

skip_unless_module();

# 16 rules of ~60 bytes: ~1 KB of system prompt, 15 blocks of 64 bytes
my $SYS = join ' ', map {
    sprintf "Rule %02d: answer precisely, cite the sources, never guess.", $_
} 1 .. 16;
my $SYS_BLOCKS = int(length($SYS) / 64);

# a user turn that differs from every other one from its 3rd byte on
sub user_turn {
    my ($i) = @_;
    return sprintf "U%03d asks: " . ("tell me more about item %d. " x 8), $i,
                   ($i) x 8;
}

my $LOCATION = llm_location();


subtest 'one system prompt, 50 user turns: one server' => sub {
    my $env = Test::KvAware->new(backends => 3, log_level => 'info');
    $env->conf(http_config => llm_upstream(),
               config => $LOCATION);
    $env->start_nginx or return;

    my @r = map { send_body($env, chat_body('m', system => $SYS,
                                            user => user_turn($_))) } 1 .. 50;

    is(scalar(grep { $_->{status} == 200 && $_->{md5ok} } @r), 50,
       'all 50: 200, body intact');
    my $by = count_by(backend => @r);
    is(scalar(keys %$by), 1, 'all 50 on one server') or diag fmt($by);
    is($r[0]{reason}, 'load', 'first: nobody held the prompt: load');
    is($r[0]{matched}, 0, 'first: matched 0');
    cmp_ok($r[0]{blocks}, '>', $SYS_BLOCKS, "blocks > $SYS_BLOCKS");

    my @aff = grep { $_->{reason} eq 'affinity' } @r[1 .. 49];
    is(scalar @aff, 49, 'the other 49: affinity')
        or diag fmt(count_by(reason => @r));
    # the system prompt's full blocks are shared; the user turn is not
    is(scalar(grep { $_->{matched} >= $SYS_BLOCKS
                     && $_->{matched} < $_->{blocks} } @r[1 .. 49]), 49,
       "the other 49: $SYS_BLOCKS <= matched < blocks");

    $env->stop_nginx;
    $env->check_logs_clean('sticky');
};


subtest 'control: overlap_weight=0 does not stick' => sub {
    my $env = Test::KvAware->new(backends => 3, log_level => 'info');
    $env->conf(http_config =>
                   llm_upstream(params => 'block_size=64 overlap_weight=0'),
               config => $LOCATION);
    $env->start_nginx or return;

    my @r = map { send_body($env, chat_body('m', system => $SYS,
                                            user => user_turn($_))) } 1 .. 50;

    is(scalar(grep { $_->{status} == 200 } @r), 50, 'all 50: 200');
    my $by = count_by(backend => @r);
    cmp_ok(scalar(keys %$by), '>=', 2, 'spread over >= 2 servers')
        or diag fmt($by);
    # cost is only the load (0 between sequential requests), ties go to the
    # least routed server: 17/17/16 exactly; >= 10 leaves a wide margin
    is(scalar(grep { $_ >= 10 } values %$by), 3,
       'each of the 3 servers got >= 10 of 50') or diag fmt($by);

    $env->stop_nginx;
    $env->check_logs_clean('overlap_weight=0');
};


subtest 'a conversation growing turn by turn stays; matched grows' => sub {
    my $env = Test::KvAware->new(backends => 3, log_level => 'info');
    $env->conf(http_config => llm_upstream(),
               config => $LOCATION);
    $env->start_nginx or return;

    # parallel noise: other conversations keep the other servers busy with
    # their own prefixes (and take their share of "least routed")
    my @conv = (system => $SYS);
    my @r;
    for my $turn (1 .. 10) {
        push @conv, user => "Turn $turn question: " . ("why is that so? " x 6);
        push @r, send_body($env, chat_body('m', @conv));
        send_body($env, chat_body('m', system => "Other $turn " . ('z' x 300),
                                  user => 'x'));
        push @conv, assistant => "Turn $turn answer: " . ("because. " x 10);
    }

    is(scalar(grep { $_->{status} == 200 } @r), 10, 'all 200');
    my $by = count_by(backend => @r);
    is(scalar(keys %$by), 1, '10 turns on one server') or diag fmt($by);
    is($r[0]{reason}, 'load', 'turn 1: load');
    is(scalar(grep { $_->{reason} eq 'affinity' } @r[1 .. 9]), 9,
       'turns 2-10: affinity') or diag fmt(count_by(reason => @r));

    # every request was learned whole, and the canonical form of turn n is a
    # prefix of turn n+1's: turn n+1 matches exactly turn n's full blocks
    for my $t (1 .. 9) {
        is($r[$t]{matched}, $r[$t - 1]{blocks},
           "turn " . ($t + 1) . ": matched = blocks of turn $t "
           . "($r[$t - 1]{blocks})");
        cmp_ok($r[$t]{matched}, '>', $r[$t - 1]{matched},
               "turn " . ($t + 1) . ": matched grew");
    }

    $env->stop_nginx;
    $env->check_logs_clean('conversation');
};


subtest 'the model seeds the hash chain' => sub {
    my $env = Test::KvAware->new(backends => 2, log_level => 'info');
    $env->conf(http_config => llm_upstream(n => 2),
               config => $LOCATION);
    $env->start_nginx or return;

    my $a1 = send_body($env, chat_body('model-a', system => $SYS,
                                       user => 'hi'));
    my $a2 = send_body($env, chat_body('model-a', system => $SYS,
                                       user => 'hi'));
    my $b1 = send_body($env, chat_body('model-b', system => $SYS,
                                       user => 'hi'));

    is($a2->{reason}, 'affinity', 'same model again: affinity');
    is($a2->{matched}, $a2->{blocks}, 'same model again: all blocks');
    is($a2->{backend}, $a1->{backend}, 'same model again: same server');
    is($b1->{blocks}, $a1->{blocks}, 'other model: same number of blocks');
    is($b1->{matched}, 0, 'other model: nothing matched');
    is($b1->{reason}, 'load', 'other model: load');

    $env->stop_nginx;
    $env->check_logs_clean('model');
};


subtest 'learned_ttl ages out what was learned' => sub {
    my $env = Test::KvAware->new(backends => 2, log_level => 'info');
    $env->conf(http_config =>
                   llm_upstream(params => 'block_size=64 learned_ttl=1s',
                                n => 2),
               config => $LOCATION);
    $env->start_nginx or return;

    my $body = chat_body('m', system => $SYS, user => 'ttl');
    my $r1 = send_body($env, $body);
    my $r2 = send_body($env, $body);
    is($r2->{reason}, 'affinity', 'at once: affinity');
    is($r2->{backend}, $r1->{backend}, 'at once: same server');

    sleep 1.6;                      # > 1s, in 16 ms ticks with room
    my $r3 = send_body($env, $body);
    is($r3->{reason}, 'load', 'after learned_ttl: load');
    is($r3->{matched}, 0, 'after learned_ttl: nothing matched');

    $env->stop_nginx;
    $env->check_logs_clean('learned_ttl');
};


subtest 'keepalive after kv_aware keeps affinity' => sub {
    my $env = Test::KvAware->new(backends => 3, log_level => 'info');
    $env->conf(http_config => llm_upstream(extra => "        keepalive 8;\n"),
               config => llm_location('proxy_http_version 1.1;',
                                      'proxy_set_header Connection "";'));
    $env->start_nginx or return;

    my @r = map { send_body($env, chat_body('m', system => $SYS,
                                            user => user_turn($_))) } 1 .. 12;
    is(scalar(grep { $_->{status} == 200 && $_->{md5ok} } @r), 12,
       'all 200, body intact');
    my $by = count_by(backend => @r);
    is(scalar(keys %$by), 1, 'one server') or diag fmt($by);
    is(scalar(grep { $_->{reason} eq 'affinity' } @r[1 .. 11]), 11,
       'affinity after the first');

    $env->stop_nginx;
    $env->check_logs_clean('keepalive');
};


subtest 'access log shows the variables' => sub {
    my $env = Test::KvAware->new(backends => 2, log_level => 'info');
    my $log = '$TEST_NGINX_PREFIX/logs/kv.log';
    $env->conf(
        http_config => llm_upstream(n => 2) . <<'EOF',
    log_format kv '$request_uri $upstream_addr blocks=$kv_aware_blocks '
                  'matched=$kv_aware_matched reason=$kv_aware_reason';
EOF
        config => <<"EOF");
        access_log $log kv;
        location / {
            proxy_pass http://llm;
        }
        location /plain/ {
            proxy_pass http://\$TEST_NGINX_BACKEND_1;
        }
EOF
    $env->start_nginx or return;

    my $body = chat_body('m', system => $SYS, user => 'log me');
    my $r1 = $env->request(POST => '/one', $body);
    my $r2 = $env->request(POST => '/two', $body);
    my $r3 = $env->request(POST => '/three', 'not json at all');
    my $r4 = $env->request(POST => '/plain/four', $body);
    is_deeply([map { $_->{status} } $r1, $r2, $r3, $r4], [(200) x 4],
              'all 200');
    $env->stop_nginx;           # flushes the log

    my $text = do {
        open(my $fh, '<', $env->prefix . '/logs/kv.log') or die $!;
        local $/;
        <$fh>;
    };
    my %line = map { /^(\S+) (.*)$/ ? ($1 => $2) : () } split /\n/, $text;

    my $port = sub {
        my ($r) = @_;
        my ($n) = ($r->{headers}{'x-backend'} // '') =~ /^b(\d)$/;
        return $n ? $env->backend_port($n) : 'none';
    };

    like($line{'/one'} // '',
         qr/^127\.0\.0\.1:${\ $port->($r1)} blocks=([1-9]\d*) matched=0 reason=load$/,
         '1st: blocks, matched=0, reason=load, the server it went to');
    my ($blocks) = ($line{'/one'} // '') =~ /blocks=(\d+)/;
    like($line{'/two'} // '',
         qr/^127\.0\.0\.1:${\ $port->($r2)} blocks=$blocks matched=$blocks reason=affinity$/,
         '2nd: matched = blocks, reason=affinity');
    is($r2->{headers}{'x-backend'}, $r1->{headers}{'x-backend'},
       '2nd: same server');
    like($line{'/three'} // '', qr/ blocks=0 matched=0 reason=fallback:not_json$/,
         'not JSON: reason=fallback:not_json');
    like($line{'/plain/four'} // '', qr/ blocks=- matched=- reason=-$/,
         'a location without kv_aware: variables not found');

    $env->check_logs_clean('access log');
};

done_testing;
