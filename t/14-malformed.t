# kv_aware integration: bodies the module cannot use are proxied byte for
# byte, routed by load, and say why in $kv_aware_reason; nothing crashes.
#
# Each case checks: status 200, the backend received exactly what was sent
# (len and md5), X-KV-Reason.  At the end: no [alert]/[crit]/[emerg] and no
# "exited on signal" in the error log.

use strict;
use warnings;

use Test::More;
use Digest::MD5 qw(md5_hex);
use JSON::PP ();

use Test::KvAware qw(skip_unless_module);
use Test::KvAware::Chat qw(llm_upstream kv_add_headers);

skip_unless_module();

my $JSON = JSON::PP->new->canonical->utf8;

my $HEADERS = kv_add_headers();

my $env = Test::KvAware->new(backends => 2, log_level => 'info');
$env->conf(http_config => llm_upstream(n => 2) . llm_upstream(
               upstream => 'small', n => 2,
               params => 'block_size=64 max_body=1k index_size=1m'),
           config => <<"EOF");
        location / {
            proxy_pass http://llm;
$HEADERS        }
        location /small/ {
            proxy_pass http://small;
$HEADERS        }
        location /unbuffered/ {
            proxy_pass http://llm;
            proxy_request_buffering off;
$HEADERS        }
EOF
$env->start_nginx or BAIL_OUT('nginx does not start');

my $LONG = 'Tell me everything about the history of the printing press. ' x 8;
my $GOOD = $JSON->encode({ model => 'm', messages => [
    { role => 'system', content => $LONG },
    { role => 'user', content => 'and then?' } ] });

my @cases = (
    # name, method, uri, body, expected reason, extra headers
    [ 'not JSON', POST => '/v1/chat/completions',
      "hello, this is plain text and not JSON at all\n", 'fallback:not_json' ],
    [ 'JSON without a prompt', POST => '/v1/chat/completions',
      '{"model":"m","temperature":0.5,"stop":["a","b"],"n":1}',
      'fallback:no_prompt' ],
    [ 'messages is not an array', POST => '/v1/chat/completions',
      '{"model":"m","messages":"oops"}', 'fallback:no_prompt' ],
    [ 'JSON array at the top', POST => '/v1/chat/completions',
      '[{"role":"user","content":"hi"}]', 'fallback:no_prompt' ],
    [ 'empty body (Content-Length: 0)', POST => '/v1/chat/completions', '',
      'fallback:no_body' ],
    [ 'GET without a body', GET => '/v1/models', undef, 'fallback:no_body' ],
    [ 'body over max_body (4 KB > 1k)', POST => '/small/v1/chat/completions',
      $JSON->encode({ model => 'm', messages => [
          { role => 'user', content => 'x' x 4096 } ] }),
      'fallback:too_large' ],
    [ 'invalid UTF-8 in a string', POST => '/v1/chat/completions',
      qq({"model":"m","messages":[{"role":"user","content":"caf\xe9 \xff\xfe $LONG"}]}),
      'fallback:bad_utf8' ],
    [ 'overlong UTF-8 encoding', POST => '/v1/chat/completions',
      qq({"model":"m","messages":[{"role":"user","content":"\xc0\xaf $LONG"}]}),
      'fallback:bad_utf8' ],
    [ 'lone surrogate escape', POST => '/v1/chat/completions',
      qq({"model":"m","messages":[{"role":"user","content":"\\ud800 $LONG"}]}),
      'fallback:bad_utf8' ],
    [ 'nesting depth 200', POST => '/v1/chat/completions',
      '{"model":"m","messages":[{"role":"user","content":"x"}],"extra":'
      . ('[' x 200) . (']' x 200) . '}', 'fallback:too_deep' ],
    [ 'nesting depth 100000', POST => '/v1/chat/completions',
      ('[' x 100000) . (']' x 100000), 'fallback:too_deep' ],
    # (larger than what nginx can preread with the header: a body that came
    # whole with the header is buffered after all, nginx clears
    # request_body_no_buffering then)
    [ 'proxy_request_buffering off', POST => '/unbuffered/v1/chat/completions',
      $JSON->encode({ model => 'm', messages => [
          { role => 'user', content => $LONG x 40 } ] }),
      'fallback:unbuffered' ],
    [ 'truncated JSON', POST => '/v1/chat/completions',
      substr($GOOD, 0, int(length($GOOD) / 2)), 'fallback:not_json' ],
    [ 'JSON cut inside an escape', POST => '/v1/chat/completions',
      '{"model":"m","messages":[{"role":"user","content":"ab\\u00', 'fallback:not_json' ],
    [ 'raw NUL byte in a string', POST => '/v1/chat/completions',
      qq({"model":"m","messages":[{"role":"user","content":"a\x00b $LONG"}]}),
      'fallback:not_json' ],
    [ 'NUL byte after the JSON', POST => '/v1/chat/completions',
      "$GOOD\x00", 'fallback:not_json' ],
    [ 'trailing garbage', POST => '/v1/chat/completions',
      "$GOOD}", 'fallback:not_json' ],
    [ 'bad escape', POST => '/v1/chat/completions',
      qq({"model":"m","messages":[{"role":"user","content":"\\q $LONG"}]}),
      'fallback:not_json' ],
    [ 'single quotes', POST => '/v1/chat/completions',
      q({'model':'m','messages':[]}), 'fallback:not_json' ],
    [ 'binary garbage', POST => '/v1/chat/completions',
      join('', map { chr(($_ * 73 + 11) % 256) } 1 .. 5000), 'fallback:not_json' ],
    [ 'whitespace only', POST => '/v1/chat/completions', "  \r\n\t ",
      qr/^fallback:(?:not_json|no_body)$/ ],
);

for my $c (@cases) {
    my ($name, $method, $uri, $body, $want) = @$c;
    my %h = ('Content-Type' => 'application/json');
    my $r = $env->request($method, $uri, $body, \%h);
    diag("$name: $r->{error}") if $r->{error};

    is($r->{status}, 200, "$name: 200");
    is($r->{json}{len}, length($body // ''), "$name: backend got the length");
    is($r->{json}{md5}, md5_hex($body // ''), "$name: backend got the bytes");
    if (ref $want) {
        like($r->{headers}{'x-kv-reason'} // '', $want, "$name: reason");
    } else {
        is($r->{headers}{'x-kv-reason'}, $want, "$name: reason $want");
    }
    is($r->{headers}{'x-kv-blocks'}, 0, "$name: 0 blocks");
}

# GET with no body at all, not even a Content-Length header
{
    my $r = $env->raw_request("GET /v1/models HTTP/1.0\r\nHost: x\r\n\r\n");
    is($r->{status}, 200, 'HTTP/1.0 GET: 200');
    is($r->{headers}{'x-kv-reason'}, 'fallback:no_body',
       'HTTP/1.0 GET: fallback:no_body');
}

subtest 'valid prompts with escapes and unicode route by prompt' => sub {
    my @bodies = (
        qq({"model":"m","messages":[{"role":"user","content":"\\u00e9\\u4e2d\\ud83d\\ude00 \\t\\b\\f\\r\\n\\\\ \\/ $LONG"}]}),
        qq({"model":"m","messages":[{"role":"user","content":"\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 $LONG"}]}),
        qq({"model":"m","messages":[{"role":"user","content":"nul \\u0000 escaped $LONG"}]}),
        qq({"model":"\\u006d","messages":[{"role":"user","content":"model escaped $LONG"}]}),
    );
    for my $i (0 .. $#bodies) {
        my $b = $bodies[$i];
        ok(eval { $JSON->decode($b); 1 }, "body $i is valid JSON") or diag $@;
        my $r1 = $env->request(POST => '/v1/chat/completions', $b);
        my $r2 = $env->request(POST => '/v1/chat/completions', $b);
        is($r1->{status} . $r2->{status}, '200200', "body $i: 200");
        is($r1->{json}{md5}, md5_hex($b), "body $i: passed on unchanged");
        is($r1->{headers}{'x-kv-reason'}, 'load', "body $i: 1st load");
        cmp_ok($r1->{headers}{'x-kv-blocks'} // 0, '>=', 7,
               "body $i: blocks");
        is($r2->{headers}{'x-kv-reason'}, 'affinity', "body $i: 2nd affinity");
        is($r2->{headers}{'x-kv-matched'}, $r2->{headers}{'x-kv-blocks'},
           "body $i: 2nd matched all");
        is($r2->{headers}{'x-backend'}, $r1->{headers}{'x-backend'},
           "body $i: same server");
    }
};

subtest 'a prompt shorter than one block' => sub {
    my $b = '{"model":"m","messages":[{"role":"user","content":"hi"}]}';
    my $r = $env->request(POST => '/v1/chat/completions', $b);
    is($r->{status}, 200, 'status 200');
    is($r->{headers}{'x-kv-blocks'}, 0, '0 blocks');
    is($r->{headers}{'x-kv-reason'}, 'load', 'reason load (not a fallback)');
};

# the module must still route normally after all that
subtest 'still routing after the garbage' => sub {
    my $r1 = $env->request(POST => '/v1/chat/completions', $GOOD);
    my $r2 = $env->request(POST => '/v1/chat/completions', $GOOD);
    is($r2->{headers}{'x-kv-reason'}, 'affinity', 'affinity');
    is($r2->{headers}{'x-backend'}, $r1->{headers}{'x-backend'}, 'same server');
};

$env->stop_nginx;
like($env->error_log, qr/\[info\].*kv_aware: routing by load, request body: /,
     'fallbacks logged at info');
unlike($env->error_log, qr/\[(?:warn|error)\].*kv_aware/,
       'no kv_aware warn/error for client faults');
$env->check_logs_clean('malformed');

done_testing;
