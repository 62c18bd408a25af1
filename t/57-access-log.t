# The access log of conf-examples/observability.conf (its log_format is
# read from there, so the documented one is the one tested): each line
# says where the request went ($upstream_addr), why ($kv_aware_reason),
# what it gained ($kv_aware_blocks, $kv_aware_matched) and the server's
# time to the response header ($upstream_header_time).  Real nginx and
# backends; every field is checked against what the client was told.
# Behind kvsim, which sends its header with the first token, the log
# shows what a cache hit gained: the same long prompt's second time to
# first byte is a fraction of its first.

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use Test::More;

use JSON::PP;

use KvAware::Launch ();
use Test::KvAware qw(skip_unless_module wait_until free_run);
use Test::KvAware::Events qw($LOCATIONS prompt chat addr);

skip_unless_module();

my $ROOT = abs_path(dirname(__FILE__) . '/..');
my $example = "$ROOT/conf-examples/observability.conf";
open(my $fh, '<', $example) or die "$example: $!";
my $text = do { local $/; <$fh> };
close $fh;

my ($format) = $text =~ /^(\s*log_format\s+kv_aware\b.*?;)\s*$/ms;
ok($format, 'the example has log_format kv_aware') or BAIL_OUT('no format');
like($format, qr/\$$_\b/, "it logs \$$_")
    for qw(upstream_addr kv_aware_reason kv_aware_blocks kv_aware_matched
           upstream_header_time);

my $env = Test::KvAware->new(backends => 2, workers => 1,
                             log_level => 'info');
my @A = map { addr($env, $_) } 1 .. 2;
my ($dead) = KvAware::Launch::free_ports(1);     # nothing listens there

my $KVSIM = $ENV{KVSIM_BINARY} || 'build/kvsim';
my $sim = -x $KVSIM ? free_run(2) : 0;
if ($sim) {
    ok(eval { $env->launch->start_kvsim($sim, 2, { binary => $KVSIM },
                                        '--redis', 'off', '--quiet') },
       'kvsim listens') or diag $@;
}
my $sim_servers = $sim ? join '', map { "        server 127.0.0.1:$_;\n" }
                                  $sim, $sim + 1
                       : "        server 127.0.0.1:$dead;\n";

$env->conf(http_config => <<"EOF",
$format

    upstream llm {
        kv_aware block_size=64;
        server \$TEST_NGINX_BACKEND_1 max_fails=0;
        server \$TEST_NGINX_BACKEND_2 max_fails=0;
    }

    # the first try always fails (refused), the backup answers
    upstream retry {
        kv_aware block_size=64;
        server 127.0.0.1:$dead max_fails=0;
        server \$TEST_NGINX_BACKEND_1 backup;
    }

    client_body_buffer_size 1m;

    upstream sim {
        kv_aware;
$sim_servers    }
EOF
           config => <<'EOF' . $LOCATIONS);
        access_log $TEST_NGINX_PREFIX/logs/kv.log kv_aware;

        location /retry/ {
            proxy_pass http://retry/;
        }
        location /sim/ {
            proxy_pass http://sim/;
            proxy_buffering off;
        }
EOF
$env->start_nginx or BAIL_OUT('nginx did not start');

my $log = $env->prefix . '/logs/kv.log';

# the fields of the log's lines: key=value and key="value"
sub lines {
    open(my $in, '<', $log) or return ();
    my @l;
    while (my $line = <$in>) {
        my %f;
        while ($line =~ /(\w+)=(?:"([^"]*)"|(\S*))/g) {
            $f{$1} = defined $2 ? $2 : $3;
        }
        ($f{status}) = $line =~ /" (\d{3}) /;
        ($f{request}) = $line =~ /"([A-Z]+ \S+) HTTP/;
        push @l, \%f;
    }
    return @l;
}

sub backend_addr {
    my ($r) = @_;
    return $r->{backend} =~ /^b(\d+)$/ ? $A[$1 - 1] : '?';
}

my $P = prompt('logs', 12);
my @sent;

# 1. by load, the server waits a second before its header (far above a
# loaded machine's own delays: the suite runs tests side by side)
my $r1 = chat($env, $P, headers => { 'X-Delay-Ms' => 1000 });
# 2. the same prompt: affinity, the blocks matched
my $r2 = chat($env, $P);
# 3. a body that is not JSON: routed by load, nothing to gain
my $r3 = chat($env, '{"model": "m", ');
# 4. not balanced by kv_aware at all
my $r4 = $env->request(GET => '/kv_status');
# 5. two tries: the first server refuses, the backup answers
my $r5 = $env->request(POST => '/retry/v1/chat/completions', $P,
                       { 'Content-Type' => 'application/json' });

is("$r1->{status} $r1->{reason}", '200 load', 'first request: by load');
is("$r2->{status} $r2->{reason} $r2->{backend}",
   "200 affinity $r1->{backend}", 'second: by affinity, same server');
is("$r3->{status} $r3->{reason}", '200 fallback:not_json', 'third: fallback');

ok(wait_until(5, sub { lines() >= 5 }), 'five lines logged');
my @l = lines();

my @r = ($r1, $r2, $r3);
for my $i (0 .. 2) {
    my ($r, $f) = ($r[$i], $l[$i]);
    is($f->{upstream}, backend_addr($r),
       "line " . ($i + 1) . ": upstream is $r->{backend}'s address");
    is(join(' ', @$f{qw(reason blocks matched status upstream_status)}),
       join(' ', @$r{qw(reason blocks matched status)}, 200),
       "line " . ($i + 1) . ": reason, blocks, matched, status as the "
       . "client was told ($r->{reason} $r->{blocks} $r->{matched})");
    like($f->{ttfb}, qr/^\d+\.\d{3}$/,
         "line " . ($i + 1) . ": ttfb $f->{ttfb}");
}

cmp_ok($l[0]{ttfb}, '>=', 1, 'the delayed server: ttfb at least 1 s');
cmp_ok($l[1]{ttfb}, '<', 1, 'the next one: less');
# $request_time starts from the time nginx cached when the request came
# in, the upstream's times from the event loop's clock: a millisecond
# apart at most
cmp_ok($l[0]{time} + 0.002, '>=', $l[0]{ttfb}, 'request time covers it');
cmp_ok($l[1]{blocks}, '>', 0, "the second line's blocks: $l[1]{blocks}");
cmp_ok($l[1]{matched}, '<=', $l[1]{blocks}, 'matched within blocks');
cmp_ok($l[1]{matched}, '>', 0, 'and some were gained');

is($r4->{status}, 200, 'a status page request');
is(join(' ', @{ $l[3] }{qw(request upstream reason blocks matched ttfb)}),
   'GET /kv_status - - - - -', 'its line: "-" for every upstream field');

is($r5->{status}, 200, 'the retried request is answered');
my $f = $l[4];
is($f->{upstream}, "127.0.0.1:$dead, $A[0]",
   'a retried request: both servers, in the order tried');
is($f->{upstream_status}, '502, 200', 'and what each answered');
like($f->{ttfb}, qr/^\S+, \d+\.\d{3}$/, "a time per try: $f->{ttfb}");
is(join(' ', @$f{qw(reason blocks matched)}), "load $r1->{blocks} 0",
   'the kv_aware fields: the last try (the backup, by load)');

SKIP: {
    skip "$KVSIM not built (make tools)", 4 unless $sim;

    # about 3,000 pseudo-tokens: 190 ms of prefill in kvsim's model
    my $text = join ' ', map { sprintf 'ttfb%04d', $_ } 1 .. 3000;
    my $body = JSON::PP->new->encode({
        model => 'kvsim', stream => JSON::PP::true, max_tokens => 2,
        messages => [{ role => 'user', content => $text }] });
    my @s = map { $env->request(POST => '/sim/v1/chat/completions', $body,
                                { 'Content-Type' => 'application/json' })
                } 1 .. 2;
    is(join(' ', map { $_->{status} } @s), '200 200', 'kvsim answers twice');
    ok(wait_until(5, sub { lines() >= 7 }), 'both logged');
    my ($cold, $warm) = (lines())[5, 6];
    is("$cold->{reason} $warm->{reason} $warm->{upstream}",
       "load affinity $cold->{upstream}",
       'the second goes where the first went, by affinity');
    cmp_ok($warm->{ttfb}, '<', $cold->{ttfb} / 2,
           "its time to first token: $warm->{ttfb} s against "
           . "$cold->{ttfb} s, $warm->{matched} of $warm->{blocks} "
           . 'blocks matched');
}

$env->stop_nginx;
$env->check_logs_clean('access log');

done_testing;
