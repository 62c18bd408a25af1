# kv_aware integration: where the body lies and how the JSON is written
# must not change the routing.
#
#   * the same 100 KB chat body in memory (client_body_buffer_size 1m), in
#     a temp file (1k), with client_body_in_file_only, and chunked from
#     the client (into memory and into a file): same $kv_aware_blocks,
#     same server (the 2nd and later by affinity with matched == blocks,
#     which only identical hashes give), body passed on byte for byte;
#   * equivalent JSON spellings share a cache: escapes, tools before or
#     after messages, string content or text parts;
#   * /v1/completions "prompt" (string, strings, token ids) and
#     /v1/responses "input" route by prompt too.

use strict;
use warnings;
use utf8;

use Test::More;
use Digest::MD5 qw(md5_hex);
use JSON::PP ();

use Test::KvAware qw(skip_unless_module);

skip_unless_module();

my $JSON = JSON::PP->new->canonical->utf8;

my $HEADERS = join '', map { "            $_\n" }
    'proxy_pass http://llm;',
    'add_header X-KV-Reason $kv_aware_reason always;',
    'add_header X-KV-Blocks $kv_aware_blocks always;',
    'add_header X-KV-Matched $kv_aware_matched always;';

my $env = Test::KvAware->new(backends => 3, log_level => 'info');
$env->conf(http_config => <<'EOF', config => <<"EOF");
    upstream llm {
        kv_aware block_size=64;
        server $TEST_NGINX_BACKEND_1 max_fails=0;
        server $TEST_NGINX_BACKEND_2 max_fails=0;
        server $TEST_NGINX_BACKEND_3 max_fails=0;
    }
EOF
        client_max_body_size 8m;
        location /mem/ {
            client_body_buffer_size 1m;
$HEADERS        }
        location /file/ {
            client_body_buffer_size 1k;
$HEADERS        }
        location /only/ {
            client_body_in_file_only on;
$HEADERS        }
        location / {
$HEADERS        }
EOF
$env->start_nginx or BAIL_OUT('nginx does not start');

sub summary {
    my ($r, $body) = @_;
    diag("request error: $r->{error}") if $r->{error};
    return {
        status  => $r->{status},
        backend => $r->{headers}{'x-backend'} // '-',
        reason  => $r->{headers}{'x-kv-reason'} // '-',
        blocks  => $r->{headers}{'x-kv-blocks'} // -1,
        matched => $r->{headers}{'x-kv-matched'} // -1,
        len     => $r->{json}{len} // -1,
        md5     => $r->{json}{md5} // '-',
    };
}

sub chunked {
    my ($data, $size) = @_;
    my $out = '';
    $out .= sprintf("%x\r\n%s\r\n", length $1, $1)
        while $data =~ /\G(.{1,$size})/gs;
    return $out . "0\r\n\r\n";
}

sub post {
    my ($uri, $body, %o) = @_;
    my %h = ('Content-Type' => 'application/json');
    my $wire = $body;
    if ($o{chunk}) {
        $h{'Transfer-Encoding'} = 'chunked';
        $wire = chunked($body, $o{chunk});
    }
    return summary($env->request(POST => $uri, $wire, \%h), $body);
}


subtest '100 KB body: memory, temp file, file only, chunked' => sub {
    # a long conversation, ~100 KB, with non-ASCII text and escapes
    my @msgs = ({ role => 'system', content => "Système: réponds «bien». " x 40 });
    for my $i (1 .. 100) {
        push @msgs, { role => 'user', content => "Question $i: " . ("q\"$i\"\n" x 60) },
                    { role => 'assistant', content => "Réponse $i: " . ('r' x 500) };
    }
    my $body = $JSON->encode({ model => 'big', messages => \@msgs });
    cmp_ok(length $body, '>', 100_000, 'body > 100 KB (' . length($body) . ')');

    my $mark = $env->error_log_offset;
    my %r = (
        memory        => post('/mem/v1/chat/completions', $body),
        temp_file     => post('/file/v1/chat/completions', $body),
        file_only     => post('/only/v1/chat/completions', $body),
        chunked_mem   => post('/mem/v1/chat/completions', $body, chunk => 7000),
        chunked_file  => post('/file/v1/chat/completions', $body, chunk => 3000),
        chunked_tiny  => post('/mem/v1/chat/completions', $body, chunk => 100),
    );

    like($env->error_log($mark),
         qr/a client request body is buffered to a temporary file/,
         'the 1k location did use a temp file');

    my $m = $r{memory};
    is($m->{status}, 200, 'memory: 200');
    cmp_ok($m->{blocks}, '>', 1000, "memory: $m->{blocks} blocks");
    is($m->{reason}, 'load', 'memory: first seen, load');

    for my $k (sort keys %r) {
        my $x = $r{$k};
        is($x->{status}, 200, "$k: 200");
        is($x->{len}, length $body, "$k: backend got the whole body");
        is($x->{md5}, md5_hex($body), "$k: backend got it byte for byte");
        is($x->{blocks}, $m->{blocks}, "$k: same blocks as in memory");
        is($x->{backend}, $m->{backend}, "$k: same server");
        next if $k eq 'memory';
        is($x->{reason}, 'affinity', "$k: affinity");
        is($x->{matched}, $x->{blocks}, "$k: matched == blocks");
    }
};


# each pair: two spellings of the same prompt; the 2nd must match all of
# the 1st's blocks (a new prefix per pair, so the 1st is always "load")
subtest 'equivalent JSON spellings share the cache' => sub {
    my $long = 'The quick brown fox jumps over the lazy dog. ' x 8;
    my $tools = '[{"type":"function","function":{"name":"get_weather",'
              . '"parameters":{"type":"object","properties":{"city":'
              . '{"type":"string"}}}}}]';

    my @pairs = (
        [ 'escapes vs raw UTF-8',
          qq({"model":"m","messages":[{"role":"user","content":"caf\\u00e9 \\ud83d\\ude00 \\/ \\n \\"q\\" $long"}]}),
          qq({"model":"m","messages":[{"role":"user","content":"caf\xc3\xa9 \xf0\x9f\x98\x80 / \\n \\"q\\" $long"}]}) ],
        [ 'whitespace and key order',
          qq({"model":"m","messages":[{"role":"user","content":"ws $long"}]}),
          qq({ "messages" : [ { "content" : "ws $long" , "role" : "user" } ] ,\n "model" : "m" }) ],
        [ 'tools before or after messages',
          qq({"model":"m","tools":$tools,"messages":[{"role":"user","content":"tools $long"}]}),
          qq({"messages":[{"role":"user","content":"tools $long"}],"model":"m","tools":$tools}) ],
        [ 'string content vs text parts',
          qq({"model":"m","messages":[{"role":"user","content":"parts $long"}]}),
          qq({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"parts "},{"type":"text","text":"$long"}]}]}) ],
        [ 'prompt string vs one-string array',
          qq({"model":"m","prompt":"completion $long"}),
          qq({"model":"m","prompt":["completion $long"]}) ],
        [ 'token ids, same list twice',
          qq({"model":"m","prompt":[${\ join ',', 1 .. 200}]}),
          qq({"model":"m","prompt":[${\ join ',', 1 .. 200}],"max_tokens":5}) ],
        [ 'responses input string vs string array',
          qq({"model":"m","input":"responses $long"}),
          qq({"model":"m","input":["responses $long"]}) ],
    );

    for my $p (@pairs) {
        my ($name, $b1, $b2) = @$p;
        ok(eval { $JSON->decode($b1); $JSON->decode($b2); 1 },
           "$name: both bodies are valid JSON") or diag $@;
        my $r1 = post('/v1/x', $b1);
        my $r2 = post('/v1/x', $b2);
        is($r1->{status} . $r2->{status}, '200200', "$name: 200");
        is($r1->{md5} . $r2->{md5}, md5_hex($b1) . md5_hex($b2),
           "$name: bodies passed on unchanged");
        is($r1->{reason}, 'load', "$name: 1st is new: load");
        cmp_ok($r1->{blocks}, '>=', 5, "$name: $r1->{blocks} blocks");
        is($r2->{blocks}, $r1->{blocks}, "$name: same blocks");
        is($r2->{reason}, 'affinity', "$name: 2nd: affinity");
        is($r2->{matched}, $r2->{blocks}, "$name: 2nd: matched == blocks");
        is($r2->{backend}, $r1->{backend}, "$name: same server");
    }

    # and a control: a different spelling of the *text* is another prompt
    my $c1 = post('/v1/x', qq({"model":"m","messages":[{"role":"user","content":"ctl $long"}]}));
    my $c2 = post('/v1/x', qq({"model":"m","messages":[{"role":"user","content":"CTL $long"}]}));
    is($c2->{matched}, 0, 'control: other text, nothing matched');
    is($c2->{reason}, 'load', 'control: load');
};

$env->stop_nginx;
$env->check_logs_clean('body shapes');

done_testing;
