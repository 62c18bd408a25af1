# kv_aware integration: disaggregated serving, mode=vllm: nginx runs both
# legs of vLLM's NIXL contract.  Echo backends: b1, b2 decode; b3, b4
# prefill (t/lib/backend.pl answers a body asking for a remote decode as
# a prefill server does, with kv_transfer_params that carry the MD5 of
# the body it received and the X-Request-Id it got).
#
#   * a split: leg 1 gets the client's body rewritten (stream false,
#     max_tokens 1, the remote decode asked for), the decode server the
#     client's body with the prefill answer's kv_transfer_params first,
#     byte for byte (one MD5 covers both legs), the same X-Request-Id on
#     both, the client's or one made;
#   * a body in a temp file works the same;
#   * a prompt the decode server holds: no leg 1, the body untouched;
#   * leg 1 failing in every way (500, no params, null, an array, 200
#     levels deep, an HTML page, an answer past
#     subrequest_output_buffer_size, past proxy_read_timeout): the client
#     still gets the decode server's answer, to its own body untouched,
#     fallback:prefill_failed, one warning;
#   * a client that leaves during leg 1: no leg 2;
#   * the prefill load given back once leg 1 ends; the counters.

use strict;
use warnings;

use Digest::MD5 qw(md5_hex);
use Test::More;

use Test::KvAware ();
use Test::KvAware::Events qw($JSON $BS addr);

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
        server \$TEST_NGINX_BACKEND_3 max_fails=0;
        server \$TEST_NGINX_BACKEND_4 max_fails=0;
    }
EOF

my $LOCATIONS = <<'EOF';
        location /v1/ {
            kv_aware_prefill prefill mode=vllm uri=/_kv_prefill
                             min_uncached=64;
            proxy_set_header X-Request-Id $kv_aware_request_id;
            proxy_pass http://decode;
            add_header X-PD $kv_aware_pd always;
            add_header X-Prefill $kv_aware_prefill_addr always;
        }
        location /file/ {
            client_body_buffer_size 1k;
            client_body_in_file_only on;
            kv_aware_prefill prefill mode=vllm uri=/_kv_prefill
                             min_uncached=64;
            proxy_set_header X-Request-Id $kv_aware_request_id;
            proxy_pass http://decode/;
            add_header X-PD $kv_aware_pd always;
            add_header X-Prefill $kv_aware_prefill_addr always;
        }
        location = /_kv_prefill {
            internal;
            proxy_pass http://$kv_aware_prefill_addr$request_uri;
            proxy_set_header X-Request-Id $kv_aware_request_id;
            proxy_read_timeout 1s;
            subrequest_output_buffer_size 64k;
        }
        location = /kv_status {
            kv_aware_status;
        }
EOF

$env->conf(http_config => $UPSTREAMS, config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

my %PREFILL = map { addr($env, $_) => "b$_" } 3, 4;

my $P = '"kv_transfer_params":{"do_remote_decode":true,'
      . '"do_remote_prefill":false,"remote_engine_id":null,'
      . '"remote_block_ids":null,"remote_host":null,"remote_port":null}';

# a chat body of about $n blocks, new for every $tag, with fields leg 1
# rewrites
sub body {
    my ($tag, $n) = @_;
    my $text = '';
    my $i = 0;
    $text .= sprintf("[%s/%03d] the quick brown fox jumps over the dog. ",
                     $tag, $i++) while length($text) < $n * $BS;
    return '{"model":"m","messages":[{"role":"user","content":"' . $text
         . '"}],"stream":false,"max_tokens":50,"stream_options":'
         . '{"include_usage":true},"temperature":0}';
}

# what leg 1 must receive, what the prefill backend answers, and so what
# the decode backend must receive
sub expected_decode {
    my ($body, $prefill, $rid) = @_;
    (my $leg1 = $body) =~ s/,"stream":false,"max_tokens":50,"stream_options"
                           :\{"include_usage":true\}//x;
    $leg1 =~ s/\}\z/,"stream":false,"max_tokens":1,$P}/;
    my ($port) = $prefill =~ /:(\d+)\z/;
    my $params = '{"do_remote_prefill":true,"remote_engine_id":"'
        . $PREFILL{$prefill} . '","remote_block_ids":[1,2,3],'
        . '"remote_host":"127.0.0.1","remote_port":' . $port
        . ',"remote_request_id":"' . $rid . '","leg1_md5":"'
        . md5_hex($leg1) . '","tp_size":1}';
    return '{"kv_transfer_params":' . $params . ',' . substr($body, 1);
}

sub chat {
    my ($body, %h) = @_;
    my $uri = delete $h{uri} // '/v1/chat/completions';
    my $r = $env->request(POST => $uri, $body,
                          { 'Content-Type' => 'application/json', %h });
    return {
        status  => $r->{status} // 0,
        pd      => $r->{headers}{'x-pd'} // '-',
        prefill => $r->{headers}{'x-prefill'} // '',
        rid     => $r->{headers}{'x-backend-request-id'} // '',
        md5     => ($r->{json} // {})->{md5} // '',
        decode  => $r->{headers}{'x-backend'} // '-',
    };
}

sub show { my ($r) = @_; join ' ', map { "$_=$r->{$_}" } sort keys %$r }

sub status { $env->request(GET => '/kv_status')->{json} }

# a split, the client's request id on both legs
my $b1 = body('alpha', 30);
my $r = chat($b1, 'X-Request-Id' => 'req-alpha-1');
is($r->{status}, 200, 'a long new prompt is answered');
is($r->{pd}, 'split', 'split') or diag(show($r));
ok($PREFILL{ $r->{prefill} }, 'by a prefill server') or diag(show($r));
like($r->{decode}, qr/^b[12]$/, 'decoded by a decode server');
is($r->{rid}, 'req-alpha-1', 'the decode leg carries the client\'s id');
is($r->{md5}, md5_hex(expected_decode($b1, $r->{prefill}, 'req-alpha-1')),
   'leg 1 and leg 2 byte for byte: the rewritten body to prefill, its '
   . 'params verbatim first in the client\'s body to decode, one id');

# a split, an id made for the request
my $b2 = body('beta', 30);
$r = chat($b2);
is($r->{pd}, 'split', 'another split') or diag(show($r));
like($r->{rid}, qr/^[0-9a-f]{32}\z/, 'without an id: one made');
is($r->{md5}, md5_hex(expected_decode($b2, $r->{prefill}, $r->{rid})),
   'the same made id on both legs');

# a body in a temp file
my $b3 = body('gamma', 30);
$r = chat($b3, uri => '/file/v1/chat/completions',
          'X-Request-Id' => 'req-file');
is($r->{pd}, 'split', 'a body in a temp file: split') or diag(show($r));
is($r->{md5}, md5_hex(expected_decode($b3, $r->{prefill}, 'req-file')),
   'and both legs byte for byte');

# held by the decode server: no leg 1
$r = chat($b1);
is($r->{pd}, 'aggregated:cached', 'the same prompt again: aggregated')
    or diag(show($r));
is($r->{md5}, md5_hex($b1), 'the body untouched');

# leg 1 failing
my $off = $env->error_log_offset;
my $n = 0;
for my $how (qw(500 none null array deep html huge slow)) {
    my $b = body("fail-$how", 30);
    $r = chat($b, 'X-Prefill-Answer' => $how);
    is($r->{status}, 200, "prefill answers $how: the client is answered");
    is($r->{pd}, 'fallback:prefill_failed', "fallback:prefill_failed")
        or diag(show($r));
    is($r->{md5}, md5_hex($b), 'by the decode server, to its own body');
    $n++;
}
my $log = $env->error_log($off);
my @warn = $log =~ /kv_aware:\ prefill\ leg\ "\/_kv_prefill"\ to\ \S+
                    [^\n]*\ serving\ the\ request/gx;
is(scalar @warn, 1, 'one warning for them all (once every 5 s)')
    or diag($log);

# a client that leaves during leg 1: leg 2 never starts
sub decoded {
    my $u = status()->{upstreams}{decode};
    my $n = 0;
    $n += $_->{routed} for @{ $u->{servers} };
    return $n;
}
my $before = decoded();
my $gone = $env->request(POST => '/v1/chat/completions', body('gone', 30),
                         { 'Content-Type' => 'application/json',
                           'X-Prefill-Answer' => 'slow' }, timeout => 0.5);
ok($gone->{error}, 'a client that leaves during a slow leg 1');
ok(Test::KvAware::wait_until(5, sub { $env->access_log =~ /" 499 / }),
   'its request ends (499)') or diag($env->access_log);
sleep 1.5;
is(decoded(), $before, 'and no decode leg was sent');

my $s = status();
is(scalar(grep { $_->{in_flight} } @{ $s->{upstreams}{prefill}{servers} }),
   0, 'the prefill load given back once each leg 1 ended');
my $d = $s->{upstreams}{decode}{disaggregated}{decided};
is($d->{split}, 3, 'status: the splits');
is($d->{prefill_failed}, $n, 'status: the failed leg 1s');
is($d->{cached}, 1, 'status: the cached one');
is($d->{client_gone}, 1, 'status: the client gone during leg 1');

$env->stop_nginx;
$env->check_logs_clean('pd-vllm');

done_testing;
