# kv_aware integration: the imbalance gate.
#
# One hot prefix, 12 slow requests at once (each waits 1.5 s at the
# backend, so all are in flight together), overlap_weight=1000 so that
# the cache alone would send every one of them to the server holding the
# prefix:
#
#   * imbalance=2 imbalance_ratio=1.5: once the holder has 3 requests in
#     flight more than the idlest server (and 1.5x as many), the gate sends
#     the next one elsewhere: more than one server, reason "gate";
#   * imbalance=0 (gate off), same load: all 12 on the holder.
#
# Deterministic: the 12 requests reach nginx within a few hundred ms, long
# before the first one is answered; the 4th decision at the latest sees 3
# in flight on the holder and 0 elsewhere.

use strict;
use warnings;

use Test::More;
use Digest::MD5 qw(md5_hex);

use Test::KvAware qw(skip_unless_module);
use Test::KvAware::Chat qw(chat_body llm_upstream backend_of fmt);

skip_unless_module();

my $SYS = join ' ', map { "Hot rule $_: this prefix is shared by everyone." } 1 .. 16;

sub chat {
    my ($user) = @_;
    return chat_body('m', system => $SYS, user => $user);
}

sub burst {
    my ($params) = @_;
    my $env = Test::KvAware->new(backends => 3, log_level => 'info');
    # its own location: no X-KV-Blocks, unlike llm_location()
    $env->conf(http_config => llm_upstream(params => "block_size=64 $params"),
               config => <<'EOF');
        location / {
            proxy_pass http://llm;
            add_header X-KV-Reason $kv_aware_reason always;
            add_header X-KV-Matched $kv_aware_matched always;
        }
EOF
    $env->start_nginx or return;

    my $warm = $env->request(POST => '/v1/chat/completions', chat('warm-up'));
    is($warm->{status}, 200, 'warm-up: 200');
    my $holder = backend_of($warm);

    my @bodies = map { chat("hot question $_") } 1 .. 12;
    my @r = $env->concurrent([ map {
        [POST => '/v1/chat/completions', $_, { 'X-Delay-Ms' => 1500 }]
    } @bodies ]);

    is(scalar(grep { $r[$_]{status} == 200
                     && ($r[$_]{json}{md5} // '') eq md5_hex($bodies[$_]) }
              0 .. 11), 12, '12 concurrent: all 200, body intact');

    my (%by, %why);
    for (@r) {
        $by{ backend_of($_) }++;
        $why{ $_->{headers}{'x-kv-reason'} // '-' }++;
    }
    $env->stop_nginx;
    $env->check_logs_clean($params);

    return { holder => $holder, by => \%by, why => \%why };
}


subtest 'gate on: the hot prefix spills over' => sub {
    my $x = burst('imbalance=2 imbalance_ratio=1.5 overlap_weight=1000')
        or return;
    cmp_ok(scalar(keys %{ $x->{by} }), '>', 1, 'more than one server used')
        or diag fmt($x->{by});
    cmp_ok($x->{why}{gate} // 0, '>=', 1, 'at least one X-KV-Reason: gate')
        or diag fmt($x->{why});
    # the holder keeps taking its share up to the gap: at least 3
    cmp_ok($x->{by}{ $x->{holder} } // 0, '>=', 3,
           "the holder $x->{holder} still took >= 3") or diag fmt($x->{by});
};

subtest 'gate off (imbalance=0): all on the holder' => sub {
    my $x = burst('imbalance=0 overlap_weight=1000') or return;
    is_deeply($x->{by}, { $x->{holder} => 12 }, "all 12 on $x->{holder}")
        or diag fmt($x->{by});
    is_deeply($x->{why}, { affinity => 12 }, 'all 12: affinity')
        or diag fmt($x->{why});
};

done_testing;
