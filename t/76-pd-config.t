# kv_aware integration: kv_aware_prefill's configuration.
#
# nginx -t refuses, with an [emerg] that says why and where, what could
# not work: a prefill upstream that is missing or not kv_aware, a
# location whose proxy_pass is not a kv_aware upstream (or has none),
# two upstreams whose blocks are keyed differently (keys, block_size,
# block_tokens), a prefill upstream of data-parallel servers (the
# prefill address names a server, not a rank), mode=vllm or mode=sglang
# without the uri of the prefill leg, bootstrap_port= outside
# mode=sglang, and bad parameters, worded as the other directives' are.
# A valid one starts, wherever the upstreams are written; mode=sglang
# with its uri too.

use strict;
use warnings;

use Test::More;

use Test::KvAware qw(run_blocks);

# prefill's kv_aware parameters, decode's, the location's lines (the
# kv_aware_prefill line first), the location's proxy_pass => what
# nginx -t says after "kv_aware_prefill: "
my @REFUSED = (
    ['', '', 'kv_aware_prefill nowhere', 'decode']
        => 'no upstream "nowhere"',
    [undef, '', 'kv_aware_prefill prefill', 'decode']
        => 'upstream "prefill" is not kv_aware, expected one with the '
           . 'kv_aware directive',
    ['', undef, 'kv_aware_prefill prefill', 'decode']
        => 'the location proxies to "decode", which is not a kv_aware '
           . 'upstream',
    ['', '', 'kv_aware_prefill prefill', undef]
        => 'the location has no proxy_pass to an upstream{}',
    ['', '', 'kv_aware_prefill prefill', 'prefill_$host']
        => 'the location has no proxy_pass to an upstream{}',
    ['keys=tokens', '', 'kv_aware_prefill prefill', 'decode']
        => 'upstream "prefill" has keys=tokens and "decode" keys=text, '
           . 'expected the same keys in both',
    ['block_size=64', '', 'kv_aware_prefill prefill', 'decode']
        => 'upstream "prefill" has block_size=64 and "decode" '
           . 'block_size=256, expected the same block_size in both',
    ['keys=tokens block_tokens=32', 'keys=tokens',
     'kv_aware_prefill prefill', 'decode']
        => 'upstream "prefill" has block_tokens=32 and "decode" '
           . 'block_tokens=16',
    ['data_parallel=2', '', 'kv_aware_prefill prefill', 'decode']
        => 'upstream "prefill" has data_parallel=2, which '
           . '$kv_aware_prefill_addr cannot name',
    ['', '', 'kv_aware_prefill prefill mode=vllm', 'decode']
        => 'mode=vllm needs uri=, expected the uri of an internal location',
    ['', '', 'kv_aware_prefill prefill mode=vllm uri=prefill', 'decode']
        => 'mode=vllm needs uri=',
    ['', '', 'kv_aware_prefill prefill uri=/_kv_prefill', 'decode']
        => 'uri= is for mode=vllm and mode=sglang, expected no uri with '
           . 'mode=header',
    ['', '', 'kv_aware_prefill prefill mode=sglang', 'decode']
        => 'mode=sglang needs uri=, expected the uri of an internal '
           . 'location',
    ['', '', 'kv_aware_prefill prefill mode=sglang bootstrap_port=0 '
             . 'uri=/_kv_prefill', 'decode']
        => 'invalid bootstrap_port "0", expected a number from 1 to 65535',
    ['', '', 'kv_aware_prefill prefill mode=vllm uri=/_kv_prefill '
             . 'bootstrap_port=8998', 'decode']
        => 'bootstrap_port= is for mode=sglang, expected none with '
           . 'mode=vllm',
    ['', '', 'kv_aware_prefill prefill mode=nixl', 'decode']
        => 'invalid mode "nixl", expected header, vllm or sglang',
    ['', '', 'kv_aware_prefill prefill min_uncached=-1', 'decode']
        => 'invalid min_uncached "-1", expected a number from 0 to '
           . '1073741824',
    ['', '', 'kv_aware_prefill prefill timeout=5s', 'decode']
        => 'unknown parameter "timeout"',
    ['', '', 'kv_aware_prefill mode=header', 'decode']
        => 'invalid upstream "mode=header", expected the name of a '
           . 'kv_aware upstream',
    ['', '', "kv_aware_prefill prefill;\n        kv_aware_prefill prefill",
     'decode']
        => qr/"kv_aware_prefill" directive is duplicate/,
);

# an upstream NAME: kv_aware PARAMETERS (undef: not kv_aware), a server
sub upstream {
    my ($name, $kv_aware, $port) = @_;
    return "    upstream $name {\n"
         . (defined $kv_aware ? "        kv_aware $kv_aware;\n" : '')
         . "        server 127.0.0.1:$port;\n    }\n";
}

sub refused {
    my ($p, $d, $line, $pass, $says) = @_;
    my $err = ref $says ? "qr/$says/" : "kv_aware_prefill: $says";
    return "=== refused: $line, " . ($pass // 'no proxy_pass') . "\n"
         . "--- http_config\n" . upstream('prefill', $p, 1)
         . upstream('decode', $d, 2)
         . "--- config\n    location / {\n        $line;\n"
         . (defined $pass ? "        proxy_pass http://$pass;\n" : '')
         . "        return 204;\n    }\n"
         . "--- backends: 0\n--- must_die\n--- error_log\n[emerg]\n$err\n"
         . ($err =~ /^qr/ ? '' : "qr/nginx\\.conf:\\d+/\n") . "\n";
}

my $refused = '';
for (my $i = 0; $i < @REFUSED; $i += 2) {
    $refused .= refused(@{ $REFUSED[$i] }, $REFUSED[$i + 1]);
}

run_blocks(data => $refused . do { local $/; <DATA> });

done_testing;

__DATA__

=== TEST 1: kv_aware_prefill in the http block
--- config
    kv_aware_prefill prefill;
    location / { return 204; }
--- backends: 0
--- must_die
--- error_log
qr/\[emerg\].*"kv_aware_prefill" directive is not allowed here/

=== TEST 2: valid, the upstreams written after the location
--- config
    location / {
        kv_aware_prefill prefill mode=header min_uncached=0;
        proxy_set_header x-prefiller-host-port $kv_aware_prefill_addr;
        proxy_pass http://decode;
        add_header X-PD $kv_aware_pd always;
    }
    location /plain/ {
        proxy_pass http://decode;
        add_header X-PD "[$kv_aware_pd]" always;
    }
--- http_config
    upstream decode {
        kv_aware block_size=64;
        server $TEST_NGINX_BACKEND_1;
    }
    upstream prefill {
        kv_aware block_size=64;
        server $TEST_NGINX_BACKEND_2;
    }
--- backends: 2
--- request eval
["POST /v1/chat/completions\n" . '{"model":"m","prompt":"' . ('x' x 300) . '"}',
 "POST /plain/v1/chat/completions\n" . '{"model":"m","prompt":"hi"}']
--- response_headers eval
["X-Backend: b1\nX-PD: split\nX-Backend-Prefiller: \$TEST_NGINX_BACKEND_2",
 "X-Backend: b1\nX-PD: []\n!X-Backend-Prefiller"]

=== TEST 3: valid, mode=sglang with its uri, bootstrap_port's default
--- config
    location / {
        kv_aware_prefill prefill mode=sglang uri=/_kv_prefill
                         min_uncached=0;
        proxy_pass http://decode;
        add_header X-PD $kv_aware_pd always;
    }
    location = /_kv_prefill {
        internal;
        proxy_pass http://$kv_aware_prefill_addr$request_uri;
    }
--- http_config
    upstream decode {
        kv_aware block_size=64;
        server $TEST_NGINX_BACKEND_1;
    }
    upstream prefill {
        kv_aware block_size=64;
        server $TEST_NGINX_BACKEND_2;
    }
--- backends: 2
--- request eval
"POST /v1/chat/completions\n" . '{"model":"m","prompt":"' . ('x' x 300) . '"}'
--- response_headers
X-Backend: b1
X-PD: split
