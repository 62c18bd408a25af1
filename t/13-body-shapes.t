# kv_aware integration: where the body lies and how the JSON is written
# must not change the routing.
#
#   * the same 100 KB chat body in memory (client_body_buffer_size 1m), in
#     a temp file (1k), with client_body_in_file_only, and chunked from
#     the client (into memory and into a file), and over HTTP/2 (with and
#     without a content length): same $kv_aware_blocks,
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
use IO::Socket::INET;

use Test::KvAware qw(skip_unless_module);
use Test::KvAware::Chat qw(chunked llm_upstream kv_add_headers kv_fields);

skip_unless_module();

my $JSON = JSON::PP->new->canonical->utf8;

my $HEADERS = "            proxy_pass http://llm;\n" . kv_add_headers();

my $LOCATIONS = <<"EOF";
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

# a second server block speaks HTTP/2 (prior knowledge, no TLS) for curl
my $H2_PORT = do {
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
                                  Proto => 'tcp', Listen => 1) or die $@;
    $s->sockport;
};

my $env = Test::KvAware->new(backends => 3, log_level => 'info');
$env->conf(http_config => llm_upstream() . <<"EOF", config => $LOCATIONS);
    server {
        listen 127.0.0.1:$H2_PORT http2;
$LOCATIONS    }
EOF
$env->start_nginx or BAIL_OUT('nginx does not start');

# not Test::KvAware::Chat's summary(): these tests compare what the
# backend got (len, md5) across the ways of sending one body
sub summary {
    my ($r, $body) = @_;
    diag("request error: $r->{error}") if $r->{error};
    return {
        status  => $r->{status},
        kv_fields($r->{headers}),
        len     => $r->{json}{len} // -1,
        md5     => $r->{json}{md5} // '-',
    };
}

# POST over HTTP/2 with curl; the same summary as for HTTP/1.1
sub h2_post {
    my ($uri, $data) = @_;
    my $out = qx{curl -s -i -m 10 --http2-prior-knowledge -H 'Content-Type: application/json' $data http://127.0.0.1:$H2_PORT$uri 2>&1};
    my ($head, $body) = split /\r\n\r\n/, $out, 2;
    my %h = map { /^([^:]+):\s*(.*?)\s*$/ ? (lc $1 => $2) : () }
            split /\r\n/, $head // '';
    my ($status) = ($head // '') =~ m{^HTTP/2 (\d+)};
    my $json = eval { $JSON->decode($body // '') } // {};
    return {
        status  => $status // 0,
        kv_fields(\%h),
        len     => $json->{len} // -1,
        md5     => $json->{md5} // '-',
    };
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


# a long conversation with non-ASCII text and escapes: ~100 KB (many
# buffers / file pages) and ~3 KB (one small buffer); another model each,
# so that the first request of each is new
for my $size ([big => 100, 100_000], [small => 3, 3_000]) {
  my ($model, $pairs, $min) = @$size;
  subtest "$model body: memory, temp file, file only, chunked, HTTP/2" => sub {
    my @msgs = ({ role => 'system', content => "Système: réponds «bien». " x 40 });
    for my $i (1 .. $pairs) {
        push @msgs, { role => 'user', content => "Question $i: " . ("q\"$i\"\n" x 60) },
                    { role => 'assistant', content => "Réponse $i: " . ('r' x 500) };
    }
    my $body = $JSON->encode({ model => $model, messages => \@msgs });
    cmp_ok(length $body, '>', $min, "body > $min bytes (" . length($body) . ')');

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
    cmp_ok($m->{blocks}, '>', $min / 100, "memory: $m->{blocks} blocks");
    is($m->{reason}, 'load', 'memory: first seen, load');

    # HTTP/2: the body comes in DATA frames; with curl's Content-Length,
    # and streamed without one (-T -)
    SKIP: {
        skip 'curl without HTTP/2', 1
            unless (qx{curl -V 2>/dev/null} // '') =~ /\bHTTP2\b/;
        my $file = $env->prefix . '/logs/h2-body.json';
        open(my $fh, '>:raw', $file) or die $!;
        print {$fh} $body;
        close $fh;
        for my $loc (qw(mem file only)) {
            $r{"h2_$loc"} = h2_post("/$loc/v1/chat/completions",
                                    "--data-binary \@$file");
            $r{"h2_stream_$loc"} = h2_post("/$loc/v1/chat/completions",
                                           "-X POST -T - < $file");
        }
    }

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
}


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
        # 2 bytes of JSON per id, 4 canonical bytes: the canonical form
        # outgrows the body (and is cut to a prefix), both spellings agree
        [ 'single-digit token ids',
          qq({"model":"m","prompt":[${\ join ',', map { $_ % 10 } 1 .. 600}]}),
          qq({"model":"m","prompt":[${\ join ',', map { $_ % 10 } 1 .. 600}],"n":1}) ],
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
