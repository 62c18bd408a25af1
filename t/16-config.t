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

use strict;
use warnings;

use Test::More;

use Test::KvAware qw(run_blocks);

# 654 canonical bytes: 2 blocks at the default block_size of 256, 40 at 16
our $BODY = '{"model":"m","messages":[{"role":"user","content":"'
          . ('configuration test prompt. ' x 24) . '"}]}';

run_blocks();

done_testing;

__DATA__

=== TEST 1: invalid block_size=abc
--- http_config
    upstream llm {
        kv_aware block_size=64 block_size=abc;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid block_size "abc", expected a size from 16 to 64k
qr/nginx\.conf:\d+/

=== TEST 2: invalid block_size=8
--- http_config
    upstream llm {
        kv_aware block_size=64 block_size=8;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid block_size "8", expected a size from 16 to 64k
qr/nginx\.conf:\d+/

=== TEST 3: invalid block_size=15
--- http_config
    upstream llm {
        kv_aware block_size=64 block_size=15;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid block_size "15"
qr/nginx\.conf:\d+/

=== TEST 4: invalid block_size=65537
--- http_config
    upstream llm {
        kv_aware block_size=64 block_size=65537;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid block_size "65537"
qr/nginx\.conf:\d+/

=== TEST 5: invalid block_size=
--- http_config
    upstream llm {
        kv_aware block_size=64 block_size=;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid block_size ""
qr/nginx\.conf:\d+/

=== TEST 6: invalid overlap_weight=-1
--- http_config
    upstream llm {
        kv_aware block_size=64 overlap_weight=-1;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid overlap_weight "-1", expected a number from 0 to 1000
qr/nginx\.conf:\d+/

=== TEST 7: invalid overlap_weight=1000.5
--- http_config
    upstream llm {
        kv_aware block_size=64 overlap_weight=1000.5;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid overlap_weight "1000.5"
qr/nginx\.conf:\d+/

=== TEST 8: invalid overlap_weight=abc
--- http_config
    upstream llm {
        kv_aware block_size=64 overlap_weight=abc;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid overlap_weight "abc"
qr/nginx\.conf:\d+/

=== TEST 9: invalid learned_ttl=0
--- http_config
    upstream llm {
        kv_aware block_size=64 learned_ttl=0;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid learned_ttl "0", expected a time from 1s to 30d
qr/nginx\.conf:\d+/

=== TEST 10: invalid learned_ttl=500ms
--- http_config
    upstream llm {
        kv_aware block_size=64 learned_ttl=500ms;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid learned_ttl "500ms"
qr/nginx\.conf:\d+/

=== TEST 11: invalid learned_ttl=31d
--- http_config
    upstream llm {
        kv_aware block_size=64 learned_ttl=31d;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid learned_ttl "31d"
qr/nginx\.conf:\d+/

=== TEST 12: invalid learned_ttl=soon
--- http_config
    upstream llm {
        kv_aware block_size=64 learned_ttl=soon;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid learned_ttl "soon"
qr/nginx\.conf:\d+/

=== TEST 13: invalid index_size=10k
--- http_config
    upstream llm {
        kv_aware block_size=64 index_size=10k;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid index_size "10k", expected a size of at least 256k
qr/nginx\.conf:\d+/

=== TEST 14: invalid index_size=255k
--- http_config
    upstream llm {
        kv_aware block_size=64 index_size=255k;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid index_size "255k"
qr/nginx\.conf:\d+/

=== TEST 15: invalid index_size=big
--- http_config
    upstream llm {
        kv_aware block_size=64 index_size=big;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid index_size "big"
qr/nginx\.conf:\d+/

=== TEST 16: invalid imbalance=x
--- http_config
    upstream llm {
        kv_aware block_size=64 imbalance=x;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid imbalance "x", expected a number from 0 to 1000000
qr/nginx\.conf:\d+/

=== TEST 17: invalid imbalance=-1
--- http_config
    upstream llm {
        kv_aware block_size=64 imbalance=-1;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid imbalance "-1"
qr/nginx\.conf:\d+/

=== TEST 18: invalid imbalance_ratio=0.5
--- http_config
    upstream llm {
        kv_aware block_size=64 imbalance_ratio=0.5;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid imbalance_ratio "0.5", expected a number from 1 to 1000
qr/nginx\.conf:\d+/

=== TEST 19: invalid imbalance_ratio=x
--- http_config
    upstream llm {
        kv_aware block_size=64 imbalance_ratio=x;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid imbalance_ratio "x"
qr/nginx\.conf:\d+/

=== TEST 20: invalid max_body=1
--- http_config
    upstream llm {
        kv_aware block_size=64 max_body=1;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid max_body "1", expected a size of at least 1k
qr/nginx\.conf:\d+/

=== TEST 21: invalid max_body=1023
--- http_config
    upstream llm {
        kv_aware block_size=64 max_body=1023;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid max_body "1023"
qr/nginx\.conf:\d+/

=== TEST 22: invalid max_body=lots
--- http_config
    upstream llm {
        kv_aware block_size=64 max_body=lots;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid max_body "lots"
qr/nginx\.conf:\d+/

=== TEST 23: invalid unknown=1
--- http_config
    upstream llm {
        kv_aware block_size=64 unknown=1;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: unknown parameter "unknown"
qr/nginx\.conf:\d+/

=== TEST 24: invalid Block_Size=64
--- http_config
    upstream llm {
        kv_aware block_size=64 Block_Size=64;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: unknown parameter "Block_Size"
qr/nginx\.conf:\d+/

=== TEST 25: invalid noequals
--- http_config
    upstream llm {
        kv_aware block_size=64 noequals;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid parameter "noequals", expected name=value
qr/nginx\.conf:\d+/

=== TEST 26: invalid =64
--- http_config
    upstream llm {
        kv_aware block_size=64 =64;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: unknown parameter ""
qr/nginx\.conf:\d+/

=== TEST 27: duplicate kv_aware directive
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



=== TEST 28: kv_aware in a location
--- config
    location / {
        kv_aware;
        return 204;
    }
--- backends: 0
--- must_die
--- error_log
qr/\[emerg\].*"kv_aware" directive is not allowed here/



=== TEST 29: kv_aware in the http block
--- http_config
    kv_aware;
--- config
    location / { return 204; }
--- backends: 0
--- must_die
--- error_log
qr/\[emerg\].*"kv_aware" directive is not allowed here/



=== TEST 30: 65 servers
--- http_config
    upstream llm {
        kv_aware;
        server 127.0.0.2:1000;
        server 127.0.0.2:1001;
        server 127.0.0.2:1002;
        server 127.0.0.2:1003;
        server 127.0.0.2:1004;
        server 127.0.0.2:1005;
        server 127.0.0.2:1006;
        server 127.0.0.2:1007;
        server 127.0.0.2:1008;
        server 127.0.0.2:1009;
        server 127.0.0.2:1010;
        server 127.0.0.2:1011;
        server 127.0.0.2:1012;
        server 127.0.0.2:1013;
        server 127.0.0.2:1014;
        server 127.0.0.2:1015;
        server 127.0.0.2:1016;
        server 127.0.0.2:1017;
        server 127.0.0.2:1018;
        server 127.0.0.2:1019;
        server 127.0.0.2:1020;
        server 127.0.0.2:1021;
        server 127.0.0.2:1022;
        server 127.0.0.2:1023;
        server 127.0.0.2:1024;
        server 127.0.0.2:1025;
        server 127.0.0.2:1026;
        server 127.0.0.2:1027;
        server 127.0.0.2:1028;
        server 127.0.0.2:1029;
        server 127.0.0.2:1030;
        server 127.0.0.2:1031;
        server 127.0.0.2:1032;
        server 127.0.0.2:1033;
        server 127.0.0.2:1034;
        server 127.0.0.2:1035;
        server 127.0.0.2:1036;
        server 127.0.0.2:1037;
        server 127.0.0.2:1038;
        server 127.0.0.2:1039;
        server 127.0.0.2:1040;
        server 127.0.0.2:1041;
        server 127.0.0.2:1042;
        server 127.0.0.2:1043;
        server 127.0.0.2:1044;
        server 127.0.0.2:1045;
        server 127.0.0.2:1046;
        server 127.0.0.2:1047;
        server 127.0.0.2:1048;
        server 127.0.0.2:1049;
        server 127.0.0.2:1050;
        server 127.0.0.2:1051;
        server 127.0.0.2:1052;
        server 127.0.0.2:1053;
        server 127.0.0.2:1054;
        server 127.0.0.2:1055;
        server 127.0.0.2:1056;
        server 127.0.0.2:1057;
        server 127.0.0.2:1058;
        server 127.0.0.2:1059;
        server 127.0.0.2:1060;
        server 127.0.0.2:1061;
        server 127.0.0.2:1062;
        server 127.0.0.2:1063;
        server 127.0.0.2:1064;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: upstream "llm" has 65 servers, at most 64 are supported



=== TEST 31: 64 servers and a backup are 65
--- http_config
    upstream llm {
        kv_aware;
        server 127.0.0.2:1000;
        server 127.0.0.2:1001;
        server 127.0.0.2:1002;
        server 127.0.0.2:1003;
        server 127.0.0.2:1004;
        server 127.0.0.2:1005;
        server 127.0.0.2:1006;
        server 127.0.0.2:1007;
        server 127.0.0.2:1008;
        server 127.0.0.2:1009;
        server 127.0.0.2:1010;
        server 127.0.0.2:1011;
        server 127.0.0.2:1012;
        server 127.0.0.2:1013;
        server 127.0.0.2:1014;
        server 127.0.0.2:1015;
        server 127.0.0.2:1016;
        server 127.0.0.2:1017;
        server 127.0.0.2:1018;
        server 127.0.0.2:1019;
        server 127.0.0.2:1020;
        server 127.0.0.2:1021;
        server 127.0.0.2:1022;
        server 127.0.0.2:1023;
        server 127.0.0.2:1024;
        server 127.0.0.2:1025;
        server 127.0.0.2:1026;
        server 127.0.0.2:1027;
        server 127.0.0.2:1028;
        server 127.0.0.2:1029;
        server 127.0.0.2:1030;
        server 127.0.0.2:1031;
        server 127.0.0.2:1032;
        server 127.0.0.2:1033;
        server 127.0.0.2:1034;
        server 127.0.0.2:1035;
        server 127.0.0.2:1036;
        server 127.0.0.2:1037;
        server 127.0.0.2:1038;
        server 127.0.0.2:1039;
        server 127.0.0.2:1040;
        server 127.0.0.2:1041;
        server 127.0.0.2:1042;
        server 127.0.0.2:1043;
        server 127.0.0.2:1044;
        server 127.0.0.2:1045;
        server 127.0.0.2:1046;
        server 127.0.0.2:1047;
        server 127.0.0.2:1048;
        server 127.0.0.2:1049;
        server 127.0.0.2:1050;
        server 127.0.0.2:1051;
        server 127.0.0.2:1052;
        server 127.0.0.2:1053;
        server 127.0.0.2:1054;
        server 127.0.0.2:1055;
        server 127.0.0.2:1056;
        server 127.0.0.2:1057;
        server 127.0.0.2:1058;
        server 127.0.0.2:1059;
        server 127.0.0.2:1060;
        server 127.0.0.2:1061;
        server 127.0.0.2:1062;
        server 127.0.0.2:1063;
        server 127.0.0.3:1000 backup;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
kv_aware: upstream "llm" has 65 servers, at most 64 are supported



=== TEST 32: 64 servers are fine (63 down, one live)
--- backends: 1
--- http_config
    upstream llm {
        kv_aware;
        server 127.0.0.2:1000 down;
        server 127.0.0.2:1001 down;
        server 127.0.0.2:1002 down;
        server 127.0.0.2:1003 down;
        server 127.0.0.2:1004 down;
        server 127.0.0.2:1005 down;
        server 127.0.0.2:1006 down;
        server 127.0.0.2:1007 down;
        server 127.0.0.2:1008 down;
        server 127.0.0.2:1009 down;
        server 127.0.0.2:1010 down;
        server 127.0.0.2:1011 down;
        server 127.0.0.2:1012 down;
        server 127.0.0.2:1013 down;
        server 127.0.0.2:1014 down;
        server 127.0.0.2:1015 down;
        server 127.0.0.2:1016 down;
        server 127.0.0.2:1017 down;
        server 127.0.0.2:1018 down;
        server 127.0.0.2:1019 down;
        server 127.0.0.2:1020 down;
        server 127.0.0.2:1021 down;
        server 127.0.0.2:1022 down;
        server 127.0.0.2:1023 down;
        server 127.0.0.2:1024 down;
        server 127.0.0.2:1025 down;
        server 127.0.0.2:1026 down;
        server 127.0.0.2:1027 down;
        server 127.0.0.2:1028 down;
        server 127.0.0.2:1029 down;
        server 127.0.0.2:1030 down;
        server 127.0.0.2:1031 down;
        server 127.0.0.2:1032 down;
        server 127.0.0.2:1033 down;
        server 127.0.0.2:1034 down;
        server 127.0.0.2:1035 down;
        server 127.0.0.2:1036 down;
        server 127.0.0.2:1037 down;
        server 127.0.0.2:1038 down;
        server 127.0.0.2:1039 down;
        server 127.0.0.2:1040 down;
        server 127.0.0.2:1041 down;
        server 127.0.0.2:1042 down;
        server 127.0.0.2:1043 down;
        server 127.0.0.2:1044 down;
        server 127.0.0.2:1045 down;
        server 127.0.0.2:1046 down;
        server 127.0.0.2:1047 down;
        server 127.0.0.2:1048 down;
        server 127.0.0.2:1049 down;
        server 127.0.0.2:1050 down;
        server 127.0.0.2:1051 down;
        server 127.0.0.2:1052 down;
        server 127.0.0.2:1053 down;
        server 127.0.0.2:1054 down;
        server 127.0.0.2:1055 down;
        server 127.0.0.2:1056 down;
        server 127.0.0.2:1057 down;
        server 127.0.0.2:1058 down;
        server 127.0.0.2:1059 down;
        server 127.0.0.2:1060 down;
        server 127.0.0.2:1061 down;
        server 127.0.0.2:1062 down;
        server $TEST_NGINX_BACKEND_1;
    }
--- config
    location / {
        proxy_pass http://llm;
        add_header X-KV-Reason $kv_aware_reason always;
    }
--- request eval
["POST /v1/chat/completions\n$BODY", "POST /v1/chat/completions\n$BODY"]
--- response_headers eval
["X-Backend: b1\nX-KV-Reason: load", "X-Backend: b1\nX-KV-Reason: affinity"]



=== TEST 33: bare kv_aware: defaults route
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



=== TEST 34: lowest accepted values
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



=== TEST 35: highest accepted values
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



=== TEST 36: block_size=16, overlap_weight with decimals
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



=== TEST 37: two kv_aware upstreams, each with its own zone
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



=== TEST 38: upstream zone (peers in shared memory) with kv_aware
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



=== TEST 39: kv_aware after least_conn: kv_aware routes
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



=== TEST 40: kv_aware_events: an invalid value, worded as kv_aware's
--- http_config
    upstream llm {
        kv_aware;
        kv_aware_events redis=127.0.0.1:1 max_rate=0;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware_events: invalid max_rate "0", expected a number of at least 1
qr/nginx\.conf:\d+/



=== TEST 41: kv_aware_events: an invalid time, with its range
--- http_config
    upstream llm {
        kv_aware;
        kv_aware_events redis=127.0.0.1:1 heartbeat=5ms;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware_events: invalid heartbeat "5ms", expected a time from 10ms to 1d
qr/nginx\.conf:\d+/



=== TEST 42: kv_aware_events: an invalid size, with its range
--- http_config
    upstream llm {
        kv_aware;
        kv_aware_events redis=127.0.0.1:1 max_message=255;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware_events: invalid max_message "255", expected a size of at least 256
qr/nginx\.conf:\d+/



=== TEST 43: kv_aware_events: pattern is on or off
--- http_config
    upstream llm {
        kv_aware;
        kv_aware_events redis=127.0.0.1:1 pattern=yes;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware_events: invalid pattern "yes", expected on or off
qr/nginx\.conf:\d+/



=== TEST 44: kv_aware_events: an invalid redis address
--- http_config
    upstream llm {
        kv_aware;
        kv_aware_events redis=127.0.0.1:99999;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware_events: invalid redis "127.0.0.1:99999", expected an address[:port]
qr/nginx\.conf:\d+/



=== TEST 45: kv_aware_events: an unknown parameter, worded as kv_aware's
--- http_config
    upstream llm {
        kv_aware;
        kv_aware_events redis=127.0.0.1:1 chanel=kv;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware_events: unknown parameter "chanel"
qr/nginx\.conf:\d+/



=== TEST 46: kv_aware_events: a parameter without a value
--- http_config
    upstream llm {
        kv_aware;
        kv_aware_events redis=127.0.0.1:1 pattern;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware_events: invalid parameter "pattern", expected name=value
qr/nginx\.conf:\d+/



=== TEST 47: kv_aware_events: an empty value
--- http_config
    upstream llm {
        kv_aware;
        kv_aware_events redis=127.0.0.1:1 channel=;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware_events: invalid channel "", expected a non-empty value
qr/nginx\.conf:\d+/



=== TEST 48: invalid keys=
--- http_config
    upstream llm {
        kv_aware keys=words;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid keys "words", expected text or tokens
qr/nginx\.conf:\d+/



=== TEST 49: invalid block_tokens=0
--- http_config
    upstream llm {
        kv_aware keys=tokens block_tokens=0;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid block_tokens "0", expected a number from 1 to 65536
qr/nginx\.conf:\d+/



=== TEST 50: invalid block_tokens=65537
--- http_config
    upstream llm {
        kv_aware keys=tokens block_tokens=65537;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid block_tokens "65537", expected a number from 1 to 65536
qr/nginx\.conf:\d+/



=== TEST 51: kv_aware_tokenize: invalid timeout, worded as kv_aware's
--- http_config
    upstream llm {
        kv_aware keys=tokens;
        server 127.0.0.1:1;
    }
--- config
    location / {
        kv_aware_tokenize /_tok timeout=0;
        proxy_pass http://llm;
    }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware_tokenize: invalid timeout "0", expected a time from 1ms to 1m
qr/nginx\.conf:\d+/



=== TEST 52: kv_aware_tokenize: an unknown parameter
--- http_config
    upstream llm {
        kv_aware keys=tokens;
        server 127.0.0.1:1;
    }
--- config
    location / {
        kv_aware_tokenize /_tok timout=10ms;
        proxy_pass http://llm;
    }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware_tokenize: unknown parameter "timout"
qr/nginx\.conf:\d+/



=== TEST 53: kv_aware_tokenize: a uri that is not one
--- http_config
    upstream llm {
        kv_aware keys=tokens;
        server 127.0.0.1:1;
    }
--- config
    location / {
        kv_aware_tokenize tokenize;
        proxy_pass http://llm;
    }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware_tokenize: invalid uri "tokenize", expected one that starts with "/", or "off"
qr/nginx\.conf:\d+/



=== TEST 54: kv_aware_tokenize off in a location turns an inherited one off
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

=== TEST 55: data_parallel=0
--- http_config
    upstream llm {
        kv_aware data_parallel=0;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: invalid data_parallel "0", expected a number from 1 to 64
qr/nginx\.conf:\d+/

=== TEST 56: 33 servers of 2 ranks are 66 ranks
--- http_config
    upstream llm {
        kv_aware data_parallel=2;
        server 127.0.0.2:1000; server 127.0.0.2:1001; server 127.0.0.2:1002;
        server 127.0.0.2:1003; server 127.0.0.2:1004; server 127.0.0.2:1005;
        server 127.0.0.2:1006; server 127.0.0.2:1007; server 127.0.0.2:1008;
        server 127.0.0.2:1009; server 127.0.0.2:1010; server 127.0.0.2:1011;
        server 127.0.0.2:1012; server 127.0.0.2:1013; server 127.0.0.2:1014;
        server 127.0.0.2:1015; server 127.0.0.2:1016; server 127.0.0.2:1017;
        server 127.0.0.2:1018; server 127.0.0.2:1019; server 127.0.0.2:1020;
        server 127.0.0.2:1021; server 127.0.0.2:1022; server 127.0.0.2:1023;
        server 127.0.0.2:1024; server 127.0.0.2:1025; server 127.0.0.2:1026;
        server 127.0.0.2:1027; server 127.0.0.2:1028; server 127.0.0.2:1029;
        server 127.0.0.2:1030; server 127.0.0.2:1031; server 127.0.0.2:1032;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware: upstream "llm" has 33 servers of 2 ranks, at most 64 ranks in all are supported

=== TEST 57: data_parallel=64 of one server routes, and says a rank
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

=== TEST 58: kv_aware_events share=on needs one channel, not a pattern
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

=== TEST 59: kv_aware_events share=maybe
--- http_config
    upstream llm {
        kv_aware;
        kv_aware_events redis=127.0.0.1:1 share=maybe;
        server 127.0.0.1:1;
    }
--- config
    location / { proxy_pass http://llm; }
--- backends: 0
--- must_die
--- error_log
[emerg]
kv_aware_events: invalid share "maybe", expected on or off
