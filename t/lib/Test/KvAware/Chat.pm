package Test::KvAware::Chat;

# Helpers shared by the prompt-mode integration tests (t/1*.t): kv_aware
# routing by the request body alone, no KV events (those are in
# Test::KvAware::Events).  On top of Test::KvAware:
#
#   * chat_body(): an OpenAI-style chat body, canonical JSON, so that the
#     same arguments always give the same bytes (and the same hashes);
#   * chunked(): a body in chunked transfer encoding;
#   * llm_upstream(), llm_location(), kv_add_headers(): the "llm" upstream
#     and a location that returns the routing decision in X-KV-* headers;
#   * kv_fields(), backend_of(), summary(), send_body(): what a response
#     says about the routing;
#   * count_by(), fmt(): tallies and their diagnostics.

use strict;
use warnings;

use Digest::MD5 qw(md5_hex);
use Exporter qw(import);
use JSON::PP ();
use Test::More ();

our @EXPORT_OK = qw(
    chat_body chunked
    llm_upstream llm_location kv_add_headers
    kv_fields backend_of summary send_body
    count_by fmt
);

# canonical: a hash's key order must not change the body's bytes
my $JSON = JSON::PP->new->canonical->utf8;

# chat_body($model, role => content, ...): the messages in the order given
sub chat_body {
    my ($model, @msgs) = @_;
    my @m;
    while (@msgs) {
        my ($role, $content) = splice @msgs, 0, 2;
        push @m, { role => $role, content => $content };
    }
    return $JSON->encode({ model => $model, messages => \@m });
}

# $data in chunks of at most $size bytes, with the last-chunk trailer
sub chunked {
    my ($data, $size) = @_;
    my $out = '';
    $out .= sprintf("%x\r\n%s\r\n", length $1, $1)
        while $data =~ /\G(.{1,$size})/gs;
    return $out . "0\r\n\r\n";
}

# The kv_aware upstream, one server line per backend:
#   params   => kv_aware's parameters ('block_size=64'),
#   servers  => [backend numbers] in that order, or n => how many (3),
#   server   => the parameters of every server line ('max_fails=0': a
#               failed try must not take a server out unless asked),
#   upstream => its name ('llm'), extra => lines before the closing brace.
# Other keys are ignored: callers pass their own options through.
sub llm_upstream {
    my (%o) = @_;
    my $name = $o{upstream} // 'llm';
    my $params = $o{params} // 'block_size=64';
    my $server = $o{server} // 'max_fails=0';
    my @servers = @{ $o{servers} // [1 .. ($o{n} // 3)] };
    return "    upstream $name {\n        kv_aware $params;\n"
         . join('', map { "        server \$TEST_NGINX_BACKEND_$_ $server;\n" }
                        @servers)
         . ($o{extra} // '')
         . "    }\n";
}

# The routing decision in response headers, for kv_fields(); indented for
# a location block.
sub kv_add_headers {
    return join '', map { "            $_\n" }
        'add_header X-KV-Reason $kv_aware_reason always;',
        'add_header X-KV-Blocks $kv_aware_blocks always;',
        'add_header X-KV-Matched $kv_aware_matched always;';
}

# "location /" to the llm upstream with the X-KV-* headers; @directives
# (without indentation) go between proxy_pass and the headers.
sub llm_location {
    my (@directives) = @_;
    return "        location / {\n            proxy_pass http://llm;\n"
         . join('', map { "            $_\n" } @directives)
         . kv_add_headers()
         . "        }\n";
}

# The routing fields of a response's (lower-cased) headers: a missing
# header reads '-' or -1, so that a comparison fails instead of warning.
sub kv_fields {
    my ($h) = @_;
    return (
        backend => $h->{'x-backend'} // '-',
        reason  => $h->{'x-kv-reason'} // '-',
        blocks  => $h->{'x-kv-blocks'} // -1,
        matched => $h->{'x-kv-matched'} // -1,
    );
}

# which backend (b1, b2, ...) answered a Test::KvAware response
sub backend_of { my ($r) = @_; return $r->{headers}{'x-backend'} // '-' }

# A flat summary of a response to $body: status, kv_fields(), and md5ok,
# whether the backend received $body byte for byte.
sub summary {
    my ($r, $body) = @_;
    Test::More::diag("request error: $r->{error}") if $r->{error};
    return {
        status => $r->{status},
        kv_fields($r->{headers}),
        md5ok  => ($r->{json}{md5} // '') eq md5_hex($body // ''),
    };
}

# POST a JSON body (to /v1/chat/completions unless $uri), extra headers
# in \%h; returns summary().
sub send_body {
    my ($env, $body, $uri, $h) = @_;
    return summary($env->request(POST => $uri // '/v1/chat/completions',
                                 $body, { 'Content-Type' => 'application/json',
                                          %{ $h || {} } }), $body);
}

# count_by(backend => @summaries): { value of that key => how many }
sub count_by {
    my ($key, @r) = @_;
    my %c;
    $c{ $_->{$key} }++ for @r;
    return \%c;
}

# a tally as "k1=v1 k2=v2", sorted, for diag
sub fmt { my ($h) = @_; join ' ', map { "$_=$h->{$_}" } sort keys %$h }

1;
