# kv_aware integration: the directive's parameters.
#
# Every invalid value fails `nginx -t` with an [emerg] that names the
# parameter and the value (and the file:line); so do a duplicate kv_aware,
# kv_aware outside an upstream block and more than 64 servers.  The
# boundary values are accepted and route.  kv_aware and kv_aware_events
# word their errors alike:
#
#     DIRECTIVE: invalid NAME "VALUE", expected WHAT
#     DIRECTIVE: unknown parameter "NAME"
#
# The refused parameters are tables (one block each, made by refused());
# the blocks of __DATA__ are the rest.

use strict;
use warnings;

use Test::More;

use Test::KvAware qw(run_blocks);

# 654 canonical bytes: 2 blocks at the default block_size of 256, 40 at 16
our $BODY = '{"model":"m","messages":[{"role":"user","content":"'
          . ('configuration test prompt. ' x 24) . '"}]}';

# kv_aware PARAMETERS => what nginx -t says after "kv_aware: "
my @KV_AWARE = (
    'block_size=64 block_size=abc'
        => 'invalid block_size "abc", expected a size from 16 to 64k',
    'block_size=64 block_size=8'
        => 'invalid block_size "8", expected a size from 16 to 64k',
    'block_size=64 block_size=15'      => 'invalid block_size "15"',
    'block_size=64 block_size=65537'   => 'invalid block_size "65537"',
    'block_size=64 block_size='        => 'invalid block_size ""',
    'block_size=64 overlap_weight=-1'
        => 'invalid overlap_weight "-1", expected a number from 0 to 1000',
    'block_size=64 overlap_weight=1000.5'
        => 'invalid overlap_weight "1000.5"',
    'block_size=64 overlap_weight=abc' => 'invalid overlap_weight "abc"',
    'block_size=64 learned_ttl=0'
        => 'invalid learned_ttl "0", expected a time from 1s to 30d',
    'block_size=64 learned_ttl=500ms'  => 'invalid learned_ttl "500ms"',
    'block_size=64 learned_ttl=31d'    => 'invalid learned_ttl "31d"',
    'block_size=64 learned_ttl=soon'   => 'invalid learned_ttl "soon"',
    'block_size=64 index_size=10k'
        => 'invalid index_size "10k", expected a size of at least 256k',
    'block_size=64 index_size=255k'    => 'invalid index_size "255k"',
    'block_size=64 index_size=big'     => 'invalid index_size "big"',
    'block_size=64 imbalance=x'
        => 'invalid imbalance "x", expected a number from 0 to 1000000',
    'block_size=64 imbalance=-1'       => 'invalid imbalance "-1"',
    'block_size=64 imbalance_ratio=0.5'
        => 'invalid imbalance_ratio "0.5", expected a number from 1 to 1000',
    'block_size=64 imbalance_ratio=x'  => 'invalid imbalance_ratio "x"',
    'block_size=64 max_body=1'
        => 'invalid max_body "1", expected a size of at least 1k',
    'block_size=64 max_body=1023'      => 'invalid max_body "1023"',
    'block_size=64 max_body=lots'      => 'invalid max_body "lots"',
    'block_size=64 unknown=1'          => 'unknown parameter "unknown"',
    'block_size=64 Block_Size=64'      => 'unknown parameter "Block_Size"',
    'block_size=64 noequals'
        => 'invalid parameter "noequals", expected name=value',
    'block_size=64 =64'                => 'unknown parameter ""',
    'keys=words' => 'invalid keys "words", expected text or tokens',
    'keys=tokens block_tokens=0'
        => 'invalid block_tokens "0", expected a number from 1 to 65536',
    'keys=tokens block_tokens=65537'
        => 'invalid block_tokens "65537", expected a number from 1 to 65536',
    'data_parallel=0'
        => 'invalid data_parallel "0", expected a number from 1 to 1024',
);

# kv_aware_events PARAMETERS (beside a bare kv_aware) => what nginx -t
# says after "kv_aware_events: ", worded as kv_aware's
my @EVENTS = (
    'redis=127.0.0.1:1 max_rate=0'
        => 'invalid max_rate "0", expected a number of at least 1',
    'redis=127.0.0.1:1 heartbeat=5ms'
        => 'invalid heartbeat "5ms", expected a time from 10ms to 1d',
    'redis=127.0.0.1:1 max_message=255'
        => 'invalid max_message "255", expected a size of at least 256',
    'redis=127.0.0.1:1 pattern=yes'
        => 'invalid pattern "yes", expected on or off',
    'redis=127.0.0.1:99999'
        => 'invalid redis "127.0.0.1:99999", expected an address[:port]',
    'redis=127.0.0.1:1 chanel=kv'   => 'unknown parameter "chanel"',
    'redis=127.0.0.1:1 pattern'
        => 'invalid parameter "pattern", expected name=value',
    'redis=127.0.0.1:1 channel='
        => 'invalid channel "", expected a non-empty value',
    'redis=127.0.0.1:1 share=maybe'
        => 'invalid share "maybe", expected on or off',
);

# kv_aware_tokenize PARAMETERS (in front of kv_aware keys=tokens) => what
# nginx -t says after "kv_aware_tokenize: "
my @TOKENIZE = (
    '/_tok timeout=0'
        => 'invalid timeout "0", expected a time from 1ms to 1m',
    '/_tok timout=10ms' => 'unknown parameter "timout"',
    'tokenize' => 'invalid uri "tokenize", expected one that starts with'
                  . ' "/", or "off"',
);

# One block: nginx -t refuses the upstream's lines @$upstream and the
# location's @$location with an [emerg] saying $says, file:line.
sub refused {
    my ($upstream, $location, $says) = @_;
    my $what = (grep { /^kv_aware/ } @$location, reverse @$upstream)[0];
    my $indent = sub { join '', map { ' ' x 8 . "$_;\n" } @_ };
    return "=== refused: $what\n"
         . "--- http_config\n    upstream llm {\n"
         . $indent->(@$upstream, 'server 127.0.0.1:1') . "    }\n"
         . "--- config\n    location / {\n"
         . $indent->(@$location, 'proxy_pass http://llm') . "    }\n"
         . "--- backends: 0\n--- must_die\n--- error_log\n[emerg]\n$says\n"
         . "qr/nginx\\.conf:\\d+/\n\n";
}

sub pairs { my @l = @_; map { [@l[2 * $_, 2 * $_ + 1]] } 0 .. $#l / 2 }

my $refused = join '',
    (map { refused(["kv_aware $_->[0]"], [], "kv_aware: $_->[1]") }
         pairs(@KV_AWARE)),
    (map { refused(['kv_aware', "kv_aware_events $_->[0]"], [],
                   "kv_aware_events: $_->[1]") } pairs(@EVENTS)),
    (map { refused(['kv_aware keys=tokens'], ["kv_aware_tokenize $_->[0]"],
                   "kv_aware_tokenize: $_->[1]") } pairs(@TOKENIZE));

# The upstream "llm": kv_aware's line, then @servers.
sub llm {
    my ($kv_aware, @servers) = @_;
    return "    upstream llm {\n        $kv_aware\n"
         . join('', map { "        $_;\n" } @servers) . "    }\n";
}

# $n servers on 127.0.0.2 that nginx never connects to, each with @flags
sub servers {
    my ($n, @flags) = @_;
    return map { join ' ', 'server', "127.0.0.2:$_", @flags }
               1000 .. 999 + $n;
}

run_blocks(data => $refused . do { local $/; <DATA> });

done_testing;

__DATA__

=== TEST 1: duplicate kv_aware directive
--- http_config
    upstream llm {
        kv_aware block_size=64;
        kv_aware block_size=128;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
qr/"kv_aware" directive is duplicate in \S+nginx\.conf:\d+/

=== TEST 2: kv_aware in a location
--- config
    location / {
        kv_aware;
        return 204;
    }
--- backends: 0
--- must_die
--- error_log
qr/\[emerg\].*"kv_aware" directive is not allowed here/

=== TEST 3: kv_aware in the http block
--- http_config
    kv_aware;
--- config
    location / { return 204; }
--- backends: 0
--- must_die
--- error_log
qr/\[emerg\].*"kv_aware" directive is not allowed here/

=== TEST 4: 1,025 servers
--- http_config eval
llm('kv_aware;', servers(1025))
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: upstream "llm" has 1025 servers, at most 1024 are supported

=== TEST 5: 1,024 servers and a backup are 1,025
--- http_config eval
llm('kv_aware;', servers(1024), 'server 127.0.0.3:1000 backup')
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
kv_aware: upstream "llm" has 1025 servers, at most 1024 are supported

=== TEST 6: 1,024 servers are fine (1,023 down, one live)
--- backends: 1
--- http_config eval
llm('kv_aware;', servers(1023, 'down'), 'server $TEST_NGINX_BACKEND_1')
--- config
    location / {
        proxy_pass http://llm;
        add_header X-KV-Reason $kv_aware_reason always;
    }
--- request eval
["POST /v1/chat/completions\n$BODY", "POST /v1/chat/completions\n$BODY"]
--- response_headers eval
["X-Backend: b1\nX-KV-Reason: load", "X-Backend: b1\nX-KV-Reason: affinity"]

=== TEST 7: bare kv_aware: defaults route
--- http_config
    upstream llm {
        kv_aware;
        server $TEST_NGINX_BACKEND_1 max_fails=0;
        server $TEST_NGINX_BACKEND_2 max_fails=0;
    }
--- config
    location / {
        proxy_pass http://llm;
        add_header X-KV-Reason $kv_aware_reason always;
        add_header X-KV-Blocks $kv_aware_blocks always;
    }
--- request eval
["POST /v1/chat/completions\n$BODY", "POST /v1/chat/completions\n$BODY"]
--- response_headers eval
["X-KV-Reason: load\nX-KV-Blocks: 2", "X-KV-Reason: affinity\nX-KV-Blocks: 2"]
--- no_error_log
[warn]

=== TEST 8: lowest accepted values
--- http_config
    upstream llm {
        kv_aware block_size=16 overlap_weight=0 learned_ttl=1s
                 index_size=256k imbalance=0 imbalance_ratio=1 max_body=1k;
        server $TEST_NGINX_BACKEND_1 max_fails=0;
        server $TEST_NGINX_BACKEND_2 max_fails=0;
    }
--- config
    location / {
        proxy_pass http://llm;
        add_header X-KV-Reason $kv_aware_reason always;
        add_header X-KV-Blocks $kv_aware_blocks always;
    }
--- request eval
"POST /v1/chat/completions\n$BODY"
--- response_headers
X-KV-Reason: load
X-KV-Blocks: 40

=== TEST 9: highest accepted values
--- http_config
    upstream llm {
        kv_aware block_size=64k overlap_weight=1000 learned_ttl=30d
                 index_size=256k imbalance=1000000 imbalance_ratio=1000
                 max_body=4m;
        server $TEST_NGINX_BACKEND_1 max_fails=0;
        server $TEST_NGINX_BACKEND_2 max_fails=0;
    }
--- config
    location / {
        proxy_pass http://llm;
        add_header X-KV-Reason $kv_aware_reason always;
        add_header X-KV-Blocks $kv_aware_blocks always;
    }
--- request eval
"POST /v1/chat/completions\n$BODY"
--- response_headers
X-KV-Reason: load
X-KV-Blocks: 0

=== TEST 10: block_size=16, overlap_weight with decimals
--- http_config
    upstream llm {
        kv_aware block_size=16 overlap_weight=0.5 imbalance_ratio=2.25;
        server $TEST_NGINX_BACKEND_1 max_fails=0;
        server $TEST_NGINX_BACKEND_2 max_fails=0;
    }
--- config
    location / {
        proxy_pass http://llm;
        add_header X-KV-Reason $kv_aware_reason always;
        add_header X-KV-Blocks $kv_aware_blocks always;
    }
--- request eval
["POST /v1/chat/completions\n$BODY", "POST /v1/chat/completions\n$BODY"]
--- response_headers eval
["X-KV-Reason: load\nX-KV-Blocks: 40", "X-KV-Reason: affinity\nX-KV-Blocks: 40"]

=== TEST 11: two kv_aware upstreams, each with its own zone
--- backends: 3
--- http_config
    upstream one {
        kv_aware block_size=64 index_size=1m;
        server $TEST_NGINX_BACKEND_1 max_fails=0;
        server $TEST_NGINX_BACKEND_2 max_fails=0;
    }
    upstream two {
        kv_aware block_size=64 index_size=1m;
        server $TEST_NGINX_BACKEND_3 max_fails=0;
    }
--- config
    location /one/ {
        proxy_pass http://one;
        add_header X-KV-Reason $kv_aware_reason always;
    }
    location /two/ {
        proxy_pass http://two;
        add_header X-KV-Reason $kv_aware_reason always;
    }
--- request eval
["POST /one/x\n$BODY", "POST /two/x\n$BODY", "POST /one/x\n$BODY", "POST /two/x\n$BODY"]
--- response_headers_like eval
["X-Backend: ^b[12]\$\nX-KV-Reason: ^load\$", "X-Backend: ^b3\$\nX-KV-Reason: ^load\$",
 "X-Backend: ^b[12]\$\nX-KV-Reason: ^affinity\$", "X-Backend: ^b3\$\nX-KV-Reason: ^affinity\$"]
--- error_log
kv_aware: upstream "one" indexes up to
kv_aware: upstream "two" indexes up to

=== TEST 12: upstream zone (peers in shared memory) with kv_aware
--- http_config
    upstream llm {
        zone llm_peers 64k;
        kv_aware block_size=64;
        server $TEST_NGINX_BACKEND_1 max_fails=0;
        server $TEST_NGINX_BACKEND_2 max_fails=0;
    }
--- config
    location / {
        proxy_pass http://llm;
        add_header X-KV-Reason $kv_aware_reason always;
    }
--- request eval
["POST /v1/chat/completions\n$BODY", "POST /v1/chat/completions\n$BODY", "POST /v1/chat/completions\n$BODY"]
--- response_headers eval
["X-KV-Reason: load", "X-KV-Reason: affinity", "X-KV-Reason: affinity"]

=== TEST 13: kv_aware after least_conn: kv_aware routes
--- http_config
    upstream llm {
        least_conn;
        kv_aware block_size=64;
        server $TEST_NGINX_BACKEND_1 max_fails=0;
        server $TEST_NGINX_BACKEND_2 max_fails=0;
    }
--- config
    location / {
        proxy_pass http://llm;
        add_header X-KV-Reason $kv_aware_reason always;
    }
--- request eval
["POST /v1/chat/completions\n$BODY", "POST /v1/chat/completions\n$BODY"]
--- response_headers eval
["X-KV-Reason: load", "X-KV-Reason: affinity"]

=== TEST 14: kv_aware_tokenize off in a location turns an inherited one off
--- http_config
    upstream llm {
        kv_aware keys=tokens;
        server $TEST_NGINX_BACKEND_1;
    }
--- config
    kv_aware_tokenize /_tok timeout=10ms;
    location = /_tok { return 500; }
    location / {
        kv_aware_tokenize off;
        proxy_pass http://llm;
        add_header X-KV-Reason $kv_aware_reason always;
    }
--- request
POST /v1/chat/completions
{"model":"m","messages":[{"role":"user","content":"hello"}]}
--- response_headers
X-KV-Reason: fallback:no_tokens

=== TEST 15: 513 servers of 2 ranks are 1,026 ranks
--- http_config eval
llm('kv_aware data_parallel=2;', servers(513))
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: upstream "llm" has 513 servers of 2 ranks, at most 1024 ranks in all are supported

=== TEST 16: data_parallel=64 of one server routes, and says a rank
--- http_config
    upstream llm {
        kv_aware data_parallel=64 block_size=16;
        server $TEST_NGINX_BACKEND_1;
    }
--- config
    location / {
        proxy_pass http://llm;
        proxy_set_header X-data-parallel-rank $kv_aware_dp_rank;
        add_header X-KV-Rank $kv_aware_dp_rank always;
    }
--- request
POST /v1/chat/completions
$BODY
--- response_headers
X-Backend: b1
--- response_headers_like
X-KV-Rank: ^([0-9]|[1-5][0-9]|6[0-3])$
X-Backend-Rank: ^([0-9]|[1-5][0-9]|6[0-3])$

=== TEST 17: kv_aware_events share=on needs one channel, not a pattern
--- http_config
    upstream llm {
        kv_aware;
        kv_aware_events redis=127.0.0.1:1 channel=kv:* pattern=on
                        resync_channel=kv:resync share=on;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
"kv_aware_events" directive needs pattern=off with share=on
qr/nginx\.conf:\d+/
