# kv_aware integration: disaggregated serving, mode=header (llm-d's
# contract): nginx chooses the decode server, decides whether to split,
# chooses the prefill server and only names it to the decode server in
# x-prefiller-host-port, for its sidecar to run both legs.
#
# Two kv_aware upstreams of echo backends (b1, b2 decode; b3, b4
# prefill), learning from what they route (no events).  What a user would
# notice, from the headers the decode backend received:
#
#   * a long new prompt is split: the header names a prefill server;
#   * the same prompt again is served aggregated on the decode server
#     that holds it (no header; aggregated:cached), a short prompt too
#     (aggregated:short);
#   * the prefill server follows the prefix (a longer prompt on the same
#     prefix goes to the same one) and its load: while one split's decode
#     request is in flight (the sidecar is still prefilling), another new
#     prompt goes to the other prefill server, whose in_flight shows;
#     the load is given back when the decode server answers;
#   * prefill servers all down: aggregated, fallback:no_prefill;
#   * each decision counted on the status page and in Prometheus.

use strict;
use warnings;

use Test::More;

use Test::KvAware ();
use Test::KvAware::Events qw($JSON $BS prompt addr);

Test::KvAware::skip_unless_module();

my $env = Test::KvAware->new(backends => 4, workers => 1,
                             log_level => 'info');

my $UPSTREAMS = <<"EOF";
    upstream decode {
        kv_aware block_size=$BS;
        server \$TEST_NGINX_BACKEND_1 max_fails=0;
        server \$TEST_NGINX_BACKEND_2 max_fails=0;
    }
    upstream prefill {
        kv_aware block_size=$BS;
        server \$TEST_NGINX_BACKEND_3;
        server \$TEST_NGINX_BACKEND_4;
    }
    upstream prefill_down {
        kv_aware block_size=$BS;
        server \$TEST_NGINX_BACKEND_3 down;
        server \$TEST_NGINX_BACKEND_4 down;
    }
EOF

my $LOCATIONS = <<'EOF';
        location /v1/ {
            kv_aware_prefill prefill min_uncached=64;
            proxy_set_header x-prefiller-host-port $kv_aware_prefill_addr;
            proxy_pass http://decode;
            add_header X-PD $kv_aware_pd always;
        }
        location /down/ {
            kv_aware_prefill prefill_down min_uncached=64;
            proxy_set_header x-prefiller-host-port $kv_aware_prefill_addr;
            proxy_pass http://decode/;
            add_header X-PD $kv_aware_pd always;
        }
        location = /kv_status {
            kv_aware_status;
        }
EOF

$env->conf(http_config => $UPSTREAMS, config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

my %PREFILL = (addr($env, 3) => 'b3', addr($env, 4) => 'b4');

sub summary {
    my ($r) = @_;
    my $p = $r->{headers}{'x-backend-prefiller'};
    return {
        status  => $r->{status} // 0,
        decode  => $r->{headers}{'x-backend'} // '-',
        pd      => $r->{headers}{'x-pd'} // '-',
        prefill => defined $p ? ($PREFILL{$p} // "?$p") : '-',
    };
}

# what the decode backend received and said
sub split_req {
    my ($body, $uri) = @_;
    return summary($env->request(POST => $uri // '/v1/chat/completions',
                                 $body,
                                 { 'Content-Type' => 'application/json' }));
}

sub show { my ($r) = @_; join ' ', map { "$_=$r->{$_}" } sort keys %$r }

sub status { $env->request(GET => '/kv_status')->{json} }

sub prefill_in_flight {
    my ($s) = @_;
    return grep { $_->{in_flight} }
           @{ $s->{upstreams}{prefill}{servers} // [] };
}

# 64-byte blocks, 16 tokens each: min_uncached=64 is 4 blocks
my $a1 = split_req(prompt('alpha', 30));
is($a1->{status}, 200, 'a long new prompt is answered');
is($a1->{pd}, 'split', 'and split') or diag(show($a1));
like($a1->{prefill}, qr/^b[34]$/,
     'the decode backend received x-prefiller-host-port, a prefill server')
    or diag(show($a1));
like($a1->{decode}, qr/^b[12]$/, 'served by a decode backend');

my $a2 = split_req(prompt('alpha', 30));
is($a2->{pd}, 'aggregated:cached',
   'the same prompt again: aggregated, its decode server holds it')
    or diag(show($a2));
is($a2->{decode}, $a1->{decode}, 'on the decode server that holds it');
is($a2->{prefill}, '-', 'no x-prefiller-host-port');

my $short = split_req(prompt('tiny', 2));
is($short->{pd}, 'aggregated:short', 'a short prompt: aggregated')
    or diag(show($short));
is($short->{prefill}, '-', 'no x-prefiller-host-port');

# the same prefix and a long new part: the decode server holds the
# prefix, the rest is still worth a split, and the prefill server that
# computed the prefix is chosen again
my $long = $JSON->decode(prompt('alpha', 30));
$long->{messages}[1]{content} = 'and then ' . ('more words, ' x 60);
my $a3 = split_req($JSON->encode($long));
is($a3->{pd}, 'split', 'the prefix and a long new part: split')
    or diag(show($a3));
is($a3->{prefill}, $a1->{prefill}, 'to the prefill server of the prefix');
is($a3->{decode}, $a1->{decode}, 'decoded where the prefix is');

# load: a split whose decode answer is held keeps its prefill server
# charged; a new prompt meanwhile goes to the other one
my $h = $env->hold([[POST => '/v1/chat/completions', prompt('beta', 30),
                     { 'Content-Type' => 'application/json' }]]);
my ($busy);
ok(Test::KvAware::wait_until(10, sub { ($busy) = prefill_in_flight(status());
                                       $busy }),
   'a split in flight shows in its prefill server\'s in_flight');
my $g = split_req(prompt('gamma', 30));
my ($held) = $env->release($h);
my $b = summary($held);
is($b->{pd}, 'split', 'the held prompt was split') or diag(show($b));
is($g->{pd}, 'split', 'the prompt sent meanwhile too') or diag(show($g));
isnt($g->{prefill}, $b->{prefill},
     'to the other prefill server, the first one busy');
is($PREFILL{ $busy ? $busy->{name} : '' } // '', $b->{prefill},
   'the busy one was the held request\'s');
is(scalar(prefill_in_flight(status())), 0,
   'the prefill load is given back once the decode server answered');

# no prefill server to take the prompt: aggregated
my $d = split_req(prompt('delta', 30), '/down/v1/chat/completions');
is($d->{status}, 200, 'prefill servers all down: answered');
is($d->{pd}, 'fallback:no_prefill', 'aggregated, fallback:no_prefill')
    or diag(show($d));
is($d->{prefill}, '-', 'no x-prefiller-host-port');

# counted
my $s = status();
my $pd = $s->{upstreams}{decode}{disaggregated};
is_deeply($pd->{decided}, { split => 4, short => 1, cached => 1,
                            no_prompt => 0, no_decode => 0,
                            no_prefill => 1, prefill_failed => 0,
                            client_gone => 0 },
          'status: the decisions counted on the decode upstream')
    or diag($JSON->encode($pd));
ok(($pd->{prefill_tokens} // 0) >= 4 * 64,
   'status: the prefill tokens counted') or diag($JSON->encode($pd));
is($s->{upstreams}{prefill}{requests}, 4,
   'status: the prefill upstream counts the splits it took');

my $prom = $env->request(GET => '/kv_status?format=prometheus')->{body};
like($prom, qr/^kv_aware_disaggregated_total\{upstream="decode",
               decision="split"\}\ 4$/mx, 'prometheus: the splits');
like($prom, qr/^kv_aware_disaggregated_total\{upstream="decode",
               decision="cached"\}\ 1$/mx, 'prometheus: the cached one');

$env->stop_nginx;
$env->check_logs_clean('pd-header');

done_testing;
