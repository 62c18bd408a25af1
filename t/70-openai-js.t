# A real client: the official OpenAI SDK for JavaScript (npm's "openai",
# pinned in t/js/package-lock.json, installed into build/js/ by
# t/js/install.sh) on the machine's Node.js, talking to kvsim servers
# through nginx kv_aware as an application would: chat completions whole
# and streamed, text completions, usage with cached tokens, a stream the
# client leaves half read, and conversations whose second turn goes to
# the first turn's server; and a stream through a disaggregated route
# (kv_aware_prefill mode=header before kvsim's prefill and sidecar decode
# roles).  kvsim names the server that answered in the X-Kvsim-Server
# header and in the body's "kvsim" member.

use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use Test::More;

use Test::KvAware qw(skip_unless_module wait_until free_run);

my $KVSIM   = $ENV{KVSIM_BINARY} || 'build/kvsim';
my $NODE    = $ENV{NODE_BINARY}  || 'node';
my $SERVERS = 3;

skip_unless_module();
plan skip_all => "$KVSIM not built (make tools)" unless -x $KVSIM;
plan skip_all => "no Node.js ('$NODE' not found; Debian: apt-get install "
               . 'nodejs npm, which make deps does)'
    unless system("$NODE --version >/dev/null 2>&1") == 0;

# the SDK: installed once, from npm's cache afterwards
chomp(my $modules = `bash t/js/install.sh 2>&1 | tail -1`);
ok(-d "$modules/openai", "the OpenAI SDK is installed ($modules)")
    or BAIL_OUT("t/js/install.sh failed: $modules");
my $sdk = decode_json(KvAware::Launch::slurp("$modules/openai/package.json")
                      // '{}');
my $lock = decode_json(KvAware::Launch::slurp('t/js/package-lock.json'));
is($sdk->{version}, $lock->{packages}{'node_modules/openai'}{version},
   "the pinned SDK version ($sdk->{version})");

my $base = free_run($SERVERS);
my $env  = Test::KvAware->new(backends => 0);
my %addr = map { ("127.0.0.1:$_" => 1) } $base .. $base + $SERVERS - 1;

# time scale 5: a step is 2 ms, so a long stream lasts seconds and can be
# left half way
ok(eval { $env->launch->start_kvsim($base, $SERVERS, { binary => $KVSIM },
              '--time-scale', 5, '--redis', 'off', '--quiet') },
   'kvsim listens') or diag $@;

my $servers = join "\n", map { "server $_;" } sort keys %addr;
my $p = $env->prefix;

# a disaggregated pool beside it: one prefill kvsim, two decode kvsims in
# llm-d's sidecar role, nginx naming the prefill server (mode=header)
my $pf = free_run(1);
my $dc = free_run(2);
my $PREFILL = "127.0.0.1:$pf";
my %decode = map { ("127.0.0.1:$_" => 1) } $dc, $dc + 1;
ok(eval { $env->launch->start_kvsim($pf, 1,
              { binary => $KVSIM, name => 'kvsim-prefill' },
              '--time-scale', 5, '--redis', 'off', '--quiet',
              '--role', 'prefill') }, 'prefill kvsim listens') or diag $@;
ok(eval { $env->launch->start_kvsim($dc, 2,
              { binary => $KVSIM, name => 'kvsim-decode' },
              '--time-scale', 5, '--redis', 'off', '--quiet',
              '--role', 'decode', '--sidecar') }, 'decode kvsims listen')
    or diag $@;
my $pd_servers = join "\n", map { "server $_;" } sort keys %decode;

# what an SSE deployment sets: no buffering, keepalive to the servers
$env->conf(http_config => "
    client_body_buffer_size 1m;
    log_format llm '\$request_uri \$status \$upstream_addr '
                   '\$kv_aware_reason \$kv_aware_matched';
    upstream llm {
        kv_aware;
        $servers
        keepalive 8;
    }
    upstream pd_decode {
        kv_aware;
        $pd_servers
        keepalive 8;
    }
    upstream pd_prefill {
        kv_aware;
        server $PREFILL;
    }",
           config => "
    location /pd/v1/ {
        kv_aware_prefill pd_prefill mode=header min_uncached=64;
        access_log $p/logs/pd.log llm;
        proxy_pass http://pd_decode/v1/;
        proxy_http_version 1.1;
        proxy_set_header Connection '';
        proxy_set_header x-prefiller-host-port \$kv_aware_prefill_addr;
        proxy_buffering off;
        add_header X-PD \$kv_aware_pd always;
    }
    location /v1/ {
        access_log $p/logs/llm.log llm;
        proxy_pass http://llm;
        proxy_http_version 1.1;
        proxy_set_header Connection '';
        proxy_buffering off;
    }");
$env->start_nginx or BAIL_OUT('nginx did not start');

my $url = 'http://127.0.0.1:' . $env->port . '/v1';

# one scenario of t/js/openai-client.js: its JSON, or undef and a diag
sub client {
    my ($scenario, $opt, $base_url) = @_;
    my @cmd = ('timeout', '60', $NODE, 't/js/openai-client.js',
               $base_url // $url, $scenario, encode_json($opt || {}));
    local $ENV{NODE_PATH} = $modules;
    open my $out, '-|', @cmd or die "$NODE: $!";
    my $text = do { local $/; <$out> };
    close $out;
    if ($? != 0) {
        diag("openai-client.js $scenario: wait status $?");
        return undef;
    }
    my $r = eval { decode_json($text) };
    diag("openai-client.js $scenario: not JSON: $text") unless $r;
    return $r;
}

sub metrics {
    my ($addr) = @_;
    my $r = HTTP::Tiny->new(timeout => 5)->get("http://$addr/metrics");
    my %m;
    # summed over label sets (model_name, and ranks should a server have
    # several)
    my $t = $r->{content} // '';
    $m{$1} += $2 while $t =~ /^([^\s{]+)(?:\{[^}]*\})? (\S+)$/mg;
    return \%m;
}

sub log_lines {
    my $t = KvAware::Launch::slurp("$p/logs/llm.log") // '';
    return [ map { [ split / / ] } split /\n/, $t ];
}

# the server that answered: the header and the body agree, and it is one
# of ours
sub answered_by {
    my ($r, $what) = @_;
    ok($r->{server} && $addr{ $r->{server} },
       "$what: X-Kvsim-Server names a server ("
       . ($r->{server} // 'none') . ')');
    is($r->{body_server}, $r->{server},
       "$what: the body's kvsim.server agrees");
}

subtest 'chat completion' => sub {
    my $r = client('chat', { max_tokens => 6 }) or return fail('ran');
    is($r->{object}, 'chat.completion', 'object');
    is($r->{role}, 'assistant', 'role');
    is(scalar(() = $r->{content} =~ /\S+/g), 6, 'six tokens of content');
    is($r->{finish}, 'length', 'finish_reason');
    ok($r->{usage}{prompt} > 250, "usage.prompt_tokens ($r->{usage}{prompt})");
    is($r->{usage}{completion}, 6, 'usage.completion_tokens');
    is($r->{usage}{total}, $r->{usage}{prompt} + 6, 'usage.total_tokens');
    is($r->{usage}{cached}, 0, 'prompt_tokens_details.cached_tokens: none yet');
    answered_by($r, 'chat');
};

subtest 'chat completion, streamed' => sub {
    my $r = client('chat-stream', { max_tokens => 12 }) or return fail('ran');
    like($r->{type} // '', qr{^text/event-stream}, 'an event stream');
    is_deeply([ sort keys %{ $r->{objects} } ], ['chat.completion.chunk'],
              'every chunk a chat.completion.chunk');
    is($r->{chunks}, 12, 'one chunk a token, each passed on');
    is_deeply($r->{roles}, ['assistant'], 'the role once, first');
    is(scalar(() = $r->{content} =~ /\S+/g), 12, 'twelve tokens');
    is($r->{finish}, 'length', 'finish_reason');
    is($r->{usage}{completion}, 12, 'usage in the stream');
    ok(defined $r->{usage}{cached}, 'cached_tokens in the stream');
    answered_by($r, 'stream');
};

subtest 'completions, whole and streamed' => sub {
    my $r = client('completion', { max_tokens => 5 }) or return fail('ran');
    is($r->{object}, 'text_completion', 'object');
    is(scalar(() = $r->{text} =~ /\S+/g), 5, 'five tokens');
    is($r->{usage}{completion}, 5, 'usage.completion_tokens');
    answered_by($r, 'completion');

    my $s = client('completion-stream', { max_tokens => 7 })
        or return fail('ran streamed');
    is_deeply([ sort keys %{ $s->{objects} } ], ['text_completion'],
              'streamed: text_completion chunks');
    is($s->{chunks}, 7, 'streamed: a chunk a token');
    is($s->{usage}{completion}, 7, 'streamed: usage');
    ok($s->{body_server} && $addr{ $s->{body_server} }, 'streamed: a server');
};

subtest 'usage with cached tokens' => sub {
    my $r = client('cached') or return fail('ran');
    my ($a, $b, $c) = @$r{qw(first second third)};
    is($a->{usage}{cached}, 0, 'first: nothing cached');
    is($b->{server}, $a->{server}, 'second: the same server');
    is($c->{server}, $a->{server}, 'third (streamed): the same server');
    # the system prompt is ~7 kB: all but the tail block and the question
    ok($b->{usage}{cached} >= $a->{usage}{prompt} - 128,
       "second: the system prompt found cached ($b->{usage}{cached} of "
       . "$b->{usage}{prompt})");
    ok($c->{usage}{cached} >= $a->{usage}{prompt} - 128,
       "streamed: cached_tokens in its usage ($c->{usage}{cached})");
};

subtest 'a client that leaves a stream' => sub {
    my $from = scalar @{ log_lines() };
    my %gen0 = map { $_ => metrics($_)->{'vllm:generation_tokens_total'} }
               keys %addr;
    my $r = client('abort', { max_tokens => 4000, after => 3 })
        or return fail('ran');
    my $a = $r->{aborted};
    is($a->{chunks}, 3, 'three chunks read, then the loop left');
    ok($a->{server} && $addr{ $a->{server} }, "it ran on $a->{server}");
    ok(length($r->{next}{content} // ''), 'the next request is answered');

    # kvsim hears the close through nginx and drops the sequence; 4000
    # tokens at 2 ms a step would take 8 s
    my $running = wait_until(5, sub {
        my $m = metrics($a->{server});
        return ($m->{'vllm:num_requests_running'} // -1) == 0
            && ($m->{'vllm:num_requests_waiting'} // -1) == 0;
    });
    ok($running, 'the abandoned sequence stops running on its server');
    my $gen = (metrics($a->{server})->{'vllm:generation_tokens_total'} // 0)
              - ($gen0{ $a->{server} } // 0);
    ok($gen < 2000, "it generated $gen tokens, not 4000");

    # nginx keeps serving, on every server
    my @lines = @{ log_lines() }[$from .. $#{ log_lines() }];
    is(scalar @lines, 2, 'two requests logged');
    my $c = client('chat') or return fail('then another');
    ok(length $c->{content}, 'and one more after that');
};

subtest 'the second turn goes to the first turn\'s server' => sub {
    my $from = scalar @{ log_lines() };
    my $users = 6;
    my $r = client('conversation', { users => $users, turns => 3 })
        or return fail('ran');
    my @conv = @{ $r->{conversations} };
    is(scalar @conv, $users, "$users conversations");

    my (%first, $stayed, $grew) = ();
    for my $turns (@conv) {
        $first{ $turns->[0]{server} // '?' }++;
        $stayed++ unless grep { ($_->{server} // '') ne $turns->[0]{server} }
                         @$turns;
        # all of the turn before but its last, partial block
        $grew++ unless grep {
            $turns->[$_]{usage}{cached}
                < $turns->[$_ - 1]{usage}{prompt} - 128
        } 1 .. $#$turns;
    }
    ok(keys %first >= 2, 'new conversations spread over the servers ('
       . join(' ', map { "$_=$first{$_}" } sort keys %first) . ')');
    is($stayed, $users, 'every turn on its first turn\'s server');
    is($grew, $users, 'each turn finds the previous one cached')
        or diag(join "\n", map { join ' ', map { "$_->{usage}{cached}/"
                                                 . "$_->{usage}{prompt}" } @$_ }
                              @conv);

    # nginx's reason for each later turn: the blocks that server held
    my @lines = @{ log_lines() }[$from .. $#{ log_lines() }];
    is(scalar @lines, 3 * $users, 'every turn logged');
    my @later = @lines[grep { $_ % 3 } 0 .. $#lines];
    is(scalar(grep { $_->[3] eq 'affinity' && $_->[4] > 0 } @later),
       2 * $users, 'turns two and three routed by affinity')
        or diag(join "\n", map { "@$_" } @lines);
};

# the SDK's stream through a split: the decode kvsim runs leg 1 against
# the prefill kvsim nginx named, pulls the blocks, then streams
subtest 'streamed through a disaggregated route' => sub {
    my $legs0 = metrics($PREFILL)->{kvsim_pd_prefill_legs_total} // 0;
    my $r = client('chat-stream', { max_tokens => 12 },
                   'http://127.0.0.1:' . $env->port . '/pd/v1')
        or return fail('ran');
    like($r->{type} // '', qr{^text/event-stream}, 'an event stream');
    is($r->{chunks}, 12, 'one chunk a token, each passed on');
    is($r->{finish}, 'length', 'finish_reason');
    ok($r->{server} && $decode{ $r->{server} },
       'answered by a decode server (' . ($r->{server} // 'none') . ')');
    is((metrics($PREFILL)->{kvsim_pd_prefill_legs_total} // 0) - $legs0, 1,
       'its prompt was computed on the prefill server');
    ok(($r->{usage}{cached} // 0) > 0,
       'the pulled prompt counts as cached in the stream\'s usage ('
       . ($r->{usage}{cached} // 'none') . ')');
    my $t = KvAware::Launch::slurp("$p/logs/pd.log") // '';
    like($t, qr/ 200 \S+ \S+/, 'nginx logged it');
};

ok(KvAware::Launch::alive($env->launch->pid('kvsim')),
   'kvsim still runs');
$env->stop_nginx;
$env->check_logs_clean('OpenAI SDK through nginx');

done_testing;
