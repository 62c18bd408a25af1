# kv_aware_status in the Prometheus text format, scraped through nginx
# and read by the reference parser (Debian's python3-prometheus-client,
# t/lib/prom_parse.py): how the format is chosen, the naming rules, label
# escaping, a page of 60 servers read whole, and the values moving as a
# user's traffic goes: requests routed by load then by affinity, matched
# blocks, a fallback on a bad body, tokenizer calls, events applied after
# a publish on Redis, a reject after a bad message.  The Grafana dashboard
# (docs/grafana-kv-aware.json) parses and uses only metrics of a scrape.

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Temp ();
use JSON::PP;
use Test::More;

use Test::KvAware ();
use Test::KvAware::Events qw(
    $LOCATIONS preflight block_hashes prompt chat addr upstream_conf status
    server_status publisher stored
);

preflight();

my $ROOT = abs_path(dirname(__FILE__) . '/..');
my $PARSE = "$ROOT/t/lib/prom_parse.py";
# Debian's python3, the one python3-prometheus-client installs for (a
# python3 earlier on PATH, of pyenv say, does not see it)
my $PY = -x '/usr/bin/python3' ? '/usr/bin/python3' : 'python3';
plan skip_all => 'python3-prometheus-client is not installed'
    if system("$PY -c 'import prometheus_client.parser' 2>/dev/null");

my $json = JSON::PP->new->utf8->canonical;

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 2,
                             log_level => 'info');
my @A = map { addr($env, $_) } 1 .. 3;

# 60 servers, none listening: only their samples matter
my $many = join '', map { "        server 127.0.0.1:" . (20000 + $_)
                          . " max_fails=0;\n" } 1 .. 60;

$env->conf(http_config => upstream_conf(kv_aware => '',
                                        events => 'heartbeat=60s')
                          . <<"EOF",
    # a name with a double quote and a backslash, escaped in labels
    upstream "odd\\"name\\\\x" {
        kv_aware block_size=64;
        server 127.0.0.1:1;
    }

    upstream many {
        kv_aware block_size=64;
$many    }

    upstream tok {
        kv_aware keys=tokens block_tokens=4;
        server \$TEST_NGINX_BACKEND_1 max_fails=0;
    }
EOF
           config => $LOCATIONS . <<'EOF');
        location = /metrics {
            kv_aware_status prometheus;
        }
        location = /json {
            kv_aware_status json;
        }
        location /kvs {
            kv_aware_status;
        }
        location /tok/ok/ {
            kv_aware_tokenize /_tok_ok;
            proxy_pass http://tok/;
            add_header X-KV-Reason $kv_aware_reason always;
        }
        location /tok/bad/ {
            kv_aware_tokenize /_tok_bad;
            proxy_pass http://tok/;
            add_header X-KV-Reason $kv_aware_reason always;
        }
        location = /_tok_ok {
            internal;
            return 200 '{"count":8,"tokens":[1,2,3,4,5,6,7,8]}';
        }
        location = /_tok_bad {
            internal;
            return 500;
        }
EOF
$env->start_nginx or BAIL_OUT('nginx did not start');

# --- scraping ------------------------------------------------------------

# The page at $uri as the parser read it: {r, families (by sample name's
# family), value => {"name|k=v,..." => value}, series => [...]}.
sub scrape {
    my ($uri, $headers) = @_;
    my $r = $env->request(GET => $uri, undef, $headers // {});
    my $s = { r => $r, value => {}, families => {}, series => [] };
    return $s unless $r->{status} && $r->{status} == 200;

    my $tmp = File::Temp->new;
    print {$tmp} $r->{body};
    close $tmp;
    my $out = qx{$PY $PARSE < $tmp 2>&1};
    if ($?) {
        diag("parser: $out");
        return $s;
    }
    my $doc = $json->decode($out);
    $s->{parsed} = 1;
    for my $f (@{ $doc->{families} }) {
        $s->{families}{ $f->{name} } = $f;
        for my $x (@{ $f->{samples} }) {
            my $key = key($x->{name}, %{ $x->{labels} });
            push @{ $s->{series} }, $key;
            $s->{value}{$key} = $x->{value};
            $s->{names}{ $x->{name} } = 1;
        }
    }
    return $s;
}

sub key {
    my ($name, %l) = @_;
    return "$name|" . join ',', map { "$_=$l{$_}" } sort keys %l;
}

# a sample of the llm upstream (or upstream => ... given)
sub v {
    my ($s, $name, %l) = @_;
    $l{upstream} //= 'llm';
    return $s->{value}{ key($name, %l) };
}

# a sample summed over the llm upstream's servers
sub sum_servers {
    my ($s, $name) = @_;
    my $t = 0;
    $t += v($s, $name, server => $_) // 0 for @A;
    return $t;
}

sub is_prometheus {
    my ($s, $what) = @_;
    like($s->{r}{headers}{'content-type'} // '',
         qr{^text/plain; version=0\.0\.4}, "$what: Prometheus text format");
}

sub is_json {
    my ($r, $what) = @_;
    ok($r->{status} == 200 && $r->{json} && $r->{json}{upstreams}{llm},
       "$what: JSON");
}

# --- how the format is chosen --------------------------------------------

my $PROM_ACCEPT = 'application/openmetrics-text;version=1.0.0,'
                . 'application/openmetrics-text;version=0.0.1;q=0.75,'
                . 'text/plain;version=0.0.4;q=0.5,*/*;q=0.1';

is_prometheus(scrape('/metrics'), 'kv_aware_status prometheus');
is_prometheus(scrape('/kv_status?format=prometheus'), '?format=prometheus');
is_prometheus(scrape('/kvs/format/prometheus'), '/format/prometheus');
is_prometheus(scrape('/kvs', { Accept => $PROM_ACCEPT }),
              "a Prometheus scraper's Accept");
is_json($env->request(GET => '/kvs', undef, { Accept => '*/*' }),
        'curl\'s Accept');
is_json($env->request(GET => '/kv_status'), 'kv_aware_status, no Accept');
is_json($env->request(GET => '/metrics?format=json'), '?format=json');
is_json($env->request(GET => '/json', undef, { Accept => $PROM_ACCEPT }),
        'kv_aware_status json, whatever Accept says');
is($env->request(GET => '/metrics?format=xml')->{status}, 400,
   'an unknown format is a 400');
is($env->request(HEAD => '/metrics')->{status}, 200, 'HEAD');

# --- the page, before any traffic ----------------------------------------

my $s0 = scrape('/metrics');
ok($s0->{parsed}, 'the parser reads the page');

my (@bad_help, @bad_type, @bad_name, @no_labels, %dup);
for my $f (values %{ $s0->{families} }) {
    push @bad_help, $f->{name} unless length $f->{help};
    push @bad_type, "$f->{name} ($f->{type})"
        unless $f->{type} =~ /^(?:counter|gauge)$/;
    for my $x (@{ $f->{samples} }) {
        push @bad_name, $x->{name}
            unless $x->{name} =~ /^kv_aware_[a-z_]+$/
                   && ($f->{type} eq 'counter') == ($x->{name} =~ /_total$/);
        push @no_labels, $x->{name}
            unless defined $x->{labels}{upstream}
                   && (($x->{name} =~ /^kv_aware_server_/)
                       == defined $x->{labels}{server});
    }
}
$dup{$_}++ for @{ $s0->{series} };
is_deeply(\@bad_help, [], 'every family has HELP');
is_deeply(\@bad_type, [], 'every family has TYPE counter or gauge');
is_deeply(\@bad_name, [], 'kv_aware_ names, _total on counters only');
is_deeply(\@no_labels, [], 'labels upstream, and server on server metrics');
is_deeply([grep { $dup{$_} > 1 } sort keys %dup], [], 'no series twice');

ok(defined v($s0, 'kv_aware_requests_total', upstream => 'odd"name\\x'),
   'an upstream name with " and \\ comes back whole');
is(scalar(grep { /^kv_aware_server_requests_total\|server=.*upstream=many$/ }
          @{ $s0->{series} }), 60, 'a page of 60 servers, read whole');
ok(!defined v($s0, 'kv_aware_event_messages_total', upstream => 'many'),
   'no event metrics for an upstream without events');
ok(defined v($s0, 'kv_aware_tokenize_calls_total', upstream => 'tok',
             result => 'ok'), 'tokenizer calls for a keys=tokens upstream');
is(v($s0, 'kv_aware_redis_state', state => 'up'), 1, 'Redis link up');
is(v($s0, 'kv_aware_redis_state', state => 'down'), 0, 'and only up');
cmp_ok(v($s0, 'kv_aware_index_capacity_entries') // 0, '>', 0,
       'index capacity');
is(v($s0, 'kv_aware_server_state', server => $A[0], state => 'learned'), 1,
   'a server never heard from: state learned');

# --- routing moves its counters ------------------------------------------

my $P = prompt('prom', 12);
my $r1 = chat($env, $P);
my $r2 = chat($env, $P);
is("$r1->{status} $r1->{reason}", '200 load', 'first request: by load');
is("$r2->{status} $r2->{reason} $r2->{backend}",
   "200 affinity $r1->{backend}", 'second: affinity, same server');
cmp_ok($r2->{matched}, '>', 0, "second: $r2->{matched} blocks matched");

my $bad = $env->request(POST => '/v1/chat/completions', '{"model": "m", ',
                        { 'Content-Type' => 'application/json' });
is($bad->{status}, 200, 'a bad body is answered');

my $s1 = scrape('/metrics');
my $d = sub { my ($name, %l) = @_;
              (v($s1, $name, %l) // 0) - (v($s0, $name, %l) // 0) };
is($d->('kv_aware_requests_total'), 3, 'requests_total +3');
is($d->('kv_aware_routed_total', reason => 'load'), 2,
   'routed_total{reason="load"} +2 (the first and the bad body)');
is($d->('kv_aware_routed_total', reason => 'affinity'), 1,
   'routed_total{reason="affinity"} +1');
is($d->('kv_aware_fallbacks_total', reason => 'not_json'), 1,
   'fallbacks_total{reason="not_json"} +1');
is(sum_servers($s1, 'kv_aware_server_prompt_blocks_total')
   - sum_servers($s0, 'kv_aware_server_prompt_blocks_total'),
   $r1->{blocks} + $r2->{blocks}, 'prompt blocks of both requests');
is(sum_servers($s1, 'kv_aware_server_matched_blocks_total')
   - sum_servers($s0, 'kv_aware_server_matched_blocks_total'),
   $r2->{matched}, 'matched blocks as $kv_aware_matched said');
my $srv = $A[$r1->{backend} =~ /(\d+)/ ? $1 - 1 : 0];
is($d->('kv_aware_server_requests_total', server => $srv), 2,
   "server_requests_total of $r1->{backend} +2");
cmp_ok(v($s1, 'kv_aware_server_index_entries', server => $srv,
         source => 'learned') // 0, '>=', $r1->{blocks},
       'its learned index entries');
is(sum_servers($s1, 'kv_aware_server_in_flight_requests'), 0,
   'nothing in flight at rest');

# the JSON page counts the same
my $st = status($env);
is(join(' ', map { $st->{routed}{$_} // '-' } qw(affinity load gate)),
   join(' ', map { v($s1, 'kv_aware_routed_total', reason => $_) // '-' }
                 qw(affinity load gate)), 'routed by reason as in JSON');
for my $i (0 .. 2) {
    my $js = server_status($st, $A[$i]);
    is(join(' ', map { v($s1, "kv_aware_server_${_}_total",
                         server => $A[$i]) // '-' }
                 qw(requests prompt_blocks matched_blocks)),
       join(' ', map { $js->{$_} } qw(routed blocks matched)),
       "server $A[$i]: routed, blocks, matched as in JSON");
}

# --- the tokenizer -------------------------------------------------------

my $tb = $json->encode({ model => 'm', messages => [
                         { role => 'user', content => 'hello there' }] });
my %hdr = ('Content-Type' => 'application/json');
my $ok = $env->request(POST => '/tok/ok/v1/chat/completions', $tb, \%hdr);
my $ko = $env->request(POST => '/tok/bad/v1/chat/completions', $tb, \%hdr);
is(($ok->{status} // 0) . ' ' . ($ok->{headers}{'x-kv-reason'} // '-'),
   '200 load', 'a request with the tokenizer\'s ids');
is(($ko->{status} // 0) . ' ' . ($ko->{headers}{'x-kv-reason'} // '-'),
   '200 fallback:tokenize_failed', 'one whose tokenizer failed');

my $s2 = scrape('/metrics');
my $d2 = sub { my ($name, %l) = @_;
               (v($s2, $name, %l) // 0) - (v($s1, $name, %l) // 0) };
is($d2->('kv_aware_tokenize_calls_total', upstream => 'tok',
         result => 'ok'), 1, 'tokenize_calls_total{result="ok"} +1');
is($d2->('kv_aware_tokenize_calls_total', upstream => 'tok',
         result => 'failed'), 1, 'tokenize_calls_total{result="failed"} +1');
is($d2->('kv_aware_fallbacks_total', upstream => 'tok',
         reason => 'tokenize_failed'), 1,
   'fallbacks_total{reason="tokenize_failed"} +1');

# --- events --------------------------------------------------------------

my $pub = publisher($env);
my @H = block_hashes(prompt('prom-events', 6));
$pub->event($A[2], events => [stored(@H)],
            load => { waiting => 3, running => 12, kv_usage => 0.43 });
$pub->publish_raw('{"v":1,"server":');

my $s3 = scrape('/metrics');
if ($ENV{PROM_DUMP}) {          # the page, to read: PROM_DUMP=file prove ...
    open(my $dump, '>', $ENV{PROM_DUMP}) or die "$ENV{PROM_DUMP}: $!";
    print {$dump} $s3->{r}{body};
}
my $d3 = sub { my ($name, %l) = @_;
               (v($s3, $name, %l) // 0) - (v($s2, $name, %l) // 0) };
is($d3->('kv_aware_event_messages_total'), 1, 'event_messages_total +1');
is($d3->('kv_aware_event_block_hashes_total'), scalar @H,
   'event_block_hashes_total +' . scalar @H);
is($d3->('kv_aware_server_event_messages_total', server => $A[2]), 1,
   'server_event_messages_total of the publishing server +1');
is($d3->('kv_aware_event_rejects_total', class => 'malformed'), 1,
   'event_rejects_total{class="malformed"} +1');
is(v($s3, 'kv_aware_server_index_entries', server => $A[2],
     source => 'event'), scalar @H, 'its event entries');
is(join(' ', map { v($s3, "kv_aware_server_engine_$_", server => $A[2]) }
             qw(waiting_requests running_requests kv_cache_usage_ratio)),
   '3 12 0.43', 'the engine load its event carried, usage as a ratio');
ok(!defined v($s3, 'kv_aware_server_engine_waiting_requests',
              server => $A[0]), 'no load for a server that sent none');

$st = status($env);
for my $i (0 .. 2) {
    my $state = server_status($st, $A[$i])->{state};
    is(v($s3, 'kv_aware_server_state', server => $A[$i], state => $state),
       1, "server $A[$i]: state $state as in JSON");
}

# --- the dashboard -------------------------------------------------------

my $file = "$ROOT/docs/grafana-kv-aware.json";
my $dash = eval {
    open(my $fh, '<', $file) or die "$file: $!";
    local $/;
    $json->decode(<$fh>);
};
ok($dash, 'docs/grafana-kv-aware.json is valid JSON') or diag $@;

my (%used, @walk);
@walk = ($dash // {});
while (defined(my $x = shift @walk)) {
    if (ref $x eq 'HASH') {
        $used{$1} = 1 while defined $x->{expr} && !ref $x->{expr}
                            && $x->{expr} =~ /\b(kv_aware_[a-z0-9_]+)/g;
        push @walk, values %$x;
    } elsif (ref $x eq 'ARRAY') {
        push @walk, @$x;
    }
}
cmp_ok(scalar keys %used, '>=', 10,
       'the dashboard uses ' . scalar(keys %used) . ' metrics');
is_deeply([grep { !$s3->{names}{$_} } sort keys %used], [],
          'every one of them is in a scrape');

$env->stop_nginx;
$env->check_logs_clean('prometheus');

# --- the directive's argument --------------------------------------------

for my $case (
    ['kv_aware_status xml;',
     qr/\[emerg\].*kv_aware_status: invalid format "xml", /
     . qr/expected "json" or "prometheus"/],
    ['kv_aware_status; kv_aware_status prometheus;',
     qr/\[emerg\].*"kv_aware_status" directive is duplicate/],
    ['kv_aware_status json prometheus;',
     qr/\[emerg\].*invalid number of arguments in "kv_aware_status"/])
{
    $env->conf(config => "location = /s { $case->[0] }");
    my ($ok, $out) = $env->test_config;
    my $re = $case->[1];
    ok(!$ok && $out =~ /$re/, "nginx -t refuses: $case->[0]")
        or diag $out;
}

done_testing;
