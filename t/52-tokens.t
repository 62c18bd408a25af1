# The token key space: kv_aware keys=tokens with kv_aware_tokenize, in
# front of kvsim --keyspace tokens (vLLM's /tokenize and its block keys).
#
#   (a) chat requests sharing a long prefix stick to one server, keyed by
#       the tokenizer's ids (blocks = prompt tokens / block_tokens), and
#       kvsim finds the prefix cached;
#   (b) the body that reaches the server is the one the client sent, in
#       memory or in a temp file, the tokenizer answering or not;
#   (c) a prompt of token ids is keyed without a tokenize call, and its
#       keys are the tokenized text's;
#   (d) a tokenizer answering 500, late (2 s), refusing connections or
#       never answering: every request answered 200 and unaltered, within
#       the timeout and a margin, the reason in $kv_aware_reason and the
#       status page, text keys meanwhile;
#   (e) precise mode: kvsim's vLLM events (ZeroMQ) through kvbridge to
#       Redis: a prefix a server computed for a client of its own draws
#       nginx's requests for it;
#   (f) LoRA adapters and cache_salt: the same prompt does not match;
#   (g) a text upstream refuses a tokens message ("keyspace").

use strict;
use warnings;

use Digest::MD5 qw(md5_hex);
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use Test::KvAware qw(skip_unless_module wait_until free_run);

my $KVSIM    = $ENV{KVSIM_BINARY} || 'build/kvsim';
my $KVBRIDGE = $ENV{KVBRIDGE_BINARY} || 'build/kvbridge';
my $BT       = 16;                      # block_tokens, kvsim's block size

skip_unless_module();
plan skip_all => "$KVSIM not built (make tools)" unless -x $KVSIM;
plan skip_all => 'redis-server is not installed'
    unless grep { -x "$_/redis-server" } split /:/, $ENV{PATH};


my $json = JSON::PP->new->canonical->utf8;
my $env  = Test::KvAware->new(backends => 1, redis => 1);
my $L    = $env->launch;

# kvsim: the servers (k), a failing tokenizer (f), a late one (s), the
# precise-mode servers (p) with vLLM's events on ZeroMQ
my ($k, $f, $s, $p) = (free_run(3), free_run(1), free_run(1), free_run(2));
my $zmq = free_run(4);
my $dead = free_run(1);                 # nothing listens there

my @common = ('--keyspace', 'tokens', '--time-scale', 50, '--quiet');

ok(eval {
    $L->start_kvsim($k, 3, { name => 'kvsim-k', binary => $KVSIM },
                    @common, '--redis', 'off', '--lora', 'a,b');
    $L->start_kvsim($f, 1, { name => 'kvsim-f', binary => $KVSIM },
                    @common, '--redis', 'off', '--tokenize-fail');
    $L->start_kvsim($s, 1, { name => 'kvsim-s', binary => $KVSIM },
                    @common, '--redis', 'off', '--tokenize-delay-ms', 2000);
    $L->start_kvsim($p, 2, { name => 'kvsim-p', binary => $KVSIM },
                    @common, '--redis', 'off', '--events', 'zmq',
                    '--zmq-port', $zmq);
    1 }, 'kvsim listens') or diag $@;

# a tokenizer that accepts connections and never answers
my $hang = IO::Socket::INET->new(Listen => 64, LocalAddr => '127.0.0.1',
                                 LocalPort => 0, ReuseAddr => 1)
    or BAIL_OUT("listen: $!");
my $hang_port = $hang->sockport;

my $redis = $env->redis_port;
my $bridge = -x $KVBRIDGE && eval {
    $L->spawn('kvbridge', [$KVBRIDGE, '--redis', "127.0.0.1:$redis",
        '--heartbeat', 200, map {
            ('--engine', "127.0.0.1:" . ($p + $_) . " model=kvsim"
                         . " events=tcp://127.0.0.1:" . ($zmq + 2 * $_)
                         . " replay=tcp://127.0.0.1:" . ($zmq + 2 * $_ + 1))
        } 0, 1], timeout => 5);
};
diag("kvbridge: $@") if $@;

my $servers = sub {
    my ($base, $n) = @_;
    join ' ', map { "server 127.0.0.1:$_;" } $base .. $base + $n - 1;
};

# every location says how it routed; a tokenizer location per behaviour
my $report = '
        add_header X-KV-Reason $kv_aware_reason always;
        add_header X-KV-Blocks $kv_aware_blocks always;
        add_header X-KV-Matched $kv_aware_matched always;';

my $tok = sub {
    my ($name, $port) = @_;
    return "
    location = /_tok_$name {
        internal;
        proxy_pass http://127.0.0.1:$port/tokenize;
        proxy_set_header Accept-Encoding \"\";
        proxy_read_timeout 3s;
        subrequest_output_buffer_size 1m;
        log_subrequest on;
        access_log logs/tok_$name.log;
    }";
};

my $front = sub {
    my ($path, $ups, $tokenizer, $timeout) = @_;
    return "
    location /$path/ {
        kv_aware_tokenize /_tok_$tokenizer timeout=$timeout;
        proxy_pass http://$ups/;$report
    }";
};

$env->conf(http_config => "
    client_body_buffer_size 1m;
    upstream kv { kv_aware keys=tokens block_tokens=$BT; "
                  . $servers->($k, 3) . " }
    upstream echo { kv_aware keys=tokens; server \$TEST_NGINX_BACKEND_1; }
    upstream pr {
        kv_aware keys=tokens block_tokens=$BT;
        kv_aware_events redis=127.0.0.1:$redis heartbeat=3s;
        " . $servers->($p, 2) . "
    }
    upstream txt {
        kv_aware;
        kv_aware_events redis=127.0.0.1:$redis channel=kv:text;
        server \$TEST_NGINX_BACKEND_1;
    }",
           config => join('',
    $tok->('ok', $k), $tok->('fail', $f), $tok->('slow', $s),
    $tok->('dead', $dead), $tok->('hang', $hang_port), $tok->('p', $p),
    $front->('kv', 'kv', 'ok', '1s'),
    $front->('fail', 'kv', 'fail', '1s'),
    $front->('slow', 'kv', 'slow', '100ms'),
    $front->('dead', 'kv', 'dead', '1s'),
    $front->('hang', 'kv', 'hang', '100ms'),
    $front->('echo', 'echo', 'ok', '1s'),
    $front->('echo-hang', 'echo', 'hang', '100ms'), "
    location /echo-file/ {
        client_body_buffer_size 1k;     # the body in a temp file
        kv_aware_tokenize /_tok_ok timeout=1s;
        proxy_pass http://echo/;$report
    }
    location /echo-file-hang/ {
        client_body_buffer_size 1k;
        kv_aware_tokenize /_tok_hang timeout=100ms;
        proxy_pass http://echo/;$report
    }",
    $front->('pr', 'pr', 'p', '1s'), "
    location /plain/ { proxy_pass http://kv/;$report }
    location = /kv_status { kv_aware_status; }"));
$env->start_nginx or BAIL_OUT('nginx did not start');


# A request through nginx, timed to its last byte (Content-Length): what
# a client waits, whatever nginx does with the connection afterwards.
sub send_body {
    my ($path, $body, %o) = @_;
    my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                     PeerPort => $o{port} // $env->port,
                                     Proto => 'tcp', Timeout => 5)
        or return { status => 0, error => "connect: $!" };
    my $start = time;
    print {$sock} "POST $path HTTP/1.1\r\nHost: localhost\r\n"
        . "Content-Type: application/json\r\n"
        . 'Content-Length: ' . length($body) . "\r\n\r\n" . $body;
    my ($raw, $want) = ('', undef);
    my $sel = IO::Select->new($sock);
    while (time - $start < 10) {
        last unless $sel->can_read(10 - (time - $start));
        my $n = sysread($sock, $raw, 65536, length $raw) or last;
        my $end = index($raw, "\r\n\r\n");
        next if $end < 0;
        ($want) = substr($raw, 0, $end) =~ /^content-length:\s*(\d+)/mi;
        last if defined $want && length($raw) >= $end + 4 + $want;
        last if !defined $want && $raw =~ /\r\n0\r\n\r\n\z/;
    }
    my $elapsed = time - $start;
    close $sock;
    my $end = index($raw, "\r\n\r\n");
    return { status => 0, error => 'no answer', elapsed => $elapsed }
        if $end < 0;
    my $head = substr($raw, 0, $end);
    my %h = map { /^([^:]+):\s*(.*?)\s*$/ ? (lc $1 => $2) : () }
            split /\r\n/, $head;
    my $rbody = substr($raw, $end + 4);
    if (($h{'transfer-encoding'} // '') =~ /chunked/i) {
        my $plain = '';
        while ($rbody =~ s/\A([0-9a-fA-F]+)\r\n//) {
            my $n = hex $1;
            last if $n == 0;
            $plain .= substr($rbody, 0, $n, '');
            $rbody =~ s/\A\r\n//;
        }
        $rbody = $plain;
    }
    my ($status) = $head =~ m{^HTTP/\S+ (\d+)};
    my $j = eval { $json->decode($rbody) };
    return {
        status  => $status // 0,
        elapsed => $elapsed,
        body    => $rbody,
        json    => $j,
        reason  => $h{'x-kv-reason'} // '-',
        blocks  => $h{'x-kv-blocks'} // -1,
        matched => $h{'x-kv-matched'} // -1,
        server  => ($j && $j->{kvsim}) ? $j->{kvsim}{server} : '?',
        cached  => $j ? $j->{usage}{prompt_tokens_details}{cached_tokens}
                        // -1 : -1,
        prompt  => $j ? $j->{usage}{prompt_tokens} // 0 : 0,
    };
}

sub chat_body {
    my ($tag, $question, %o) = @_;
    my $sys = join ' ', map { sprintf '%s%04d', $tag, $_ } 1 .. 600;
    return $json->encode({ model => $o{model} // 'kvsim', max_tokens => 1,
        ($o{salt} ? (cache_salt => $o{salt}) : ()),
        messages => [ { role => 'system', content => $sys },
                      { role => 'user', content => $question } ] });
}

sub status_of {
    my ($ups) = @_;
    my $r = $env->request(GET => '/kv_status');
    return $r->{json} ? $r->{json}{upstreams}{$ups} : undef;
}

my $toklog = $env->prefix . '/logs/tok_ok.log';
sub calls { open(my $fh, '<', $toklog) or return 0; my @l = <$fh>;
            scalar @l }


# (a) a shared prefix sticks to one server, keyed by tokens
my @a = map { send_body('/kv/v1/chat/completions',
                        chat_body('alpha', "question $_")) } 1 .. 4;
is(join(' ', map { $_->{status} } @a), '200 200 200 200', '(a) 200s');
is(scalar(keys %{{ map { $_->{server} => 1 } @a }}), 1,
   '(a) one server for the shared prefix');
is($a[0]{blocks}, int($a[0]{prompt} / $BT),
   '(a) blocks are the tokenizer\'s ids / block_tokens')
    or diag("blocks $a[0]{blocks}, prompt tokens $a[0]{prompt}");
is(join(' ', map { $_->{reason} } @a[1 .. 3]),
   'affinity affinity affinity', '(a) affinity after the first');
ok((grep { $_->{cached} >= $BT * 30 } @a[1 .. 3]) == 3,
   '(a) kvsim finds the prefix cached')
    or diag(join ' ', map { $_->{cached} } @a);
is(calls(), 4, '(a) one tokenize call a request');

# (b) the body reaching the server is byte for byte the client's
for my $path ('echo', 'echo-hang', 'echo-file', 'echo-file-hang') {
    my $body = chat_body('bravo', "exactly these bytes \x{e9}t\x{e9} ?");
    my $r = send_body("/$path/v1/chat/completions", $body);
    is($r->{status}, 200, "(b) $path: 200");
    is($r->{json}{md5} // '', md5_hex($body),
       "(b) $path: the backend got the body unaltered");
}

# (c) token ids: no tokenize call, and the same keys as the text
my $ids = $json->decode(do {
    my $r = $env->request(POST => '/tokenize',
                          chat_body('alpha', 'question 9'),
                          { 'Content-Type' => 'application/json' },
                          port => $k);
    $r->{body} })->{tokens};
my $before = calls();
my $c = send_body('/kv/v1/completions',
                  $json->encode({ model => 'kvsim', max_tokens => 1,
                                  prompt => $ids }));
is($c->{status}, 200, '(c) token-id prompt: 200');
is(calls(), $before, '(c) no tokenize call for a token-id prompt');
is($c->{blocks}, int(@$ids / $BT), '(c) keyed by its ids');
is("$c->{reason} $c->{server}", "affinity $a[0]{server}",
   '(c) the tokenized text\'s server: the same keys');
cmp_ok($c->{matched}, '>=', 30, '(c) the shared prefix matched');

# (d) a tokenizer down, late, refusing, silent: routed on text keys
my $st0 = status_of('kv');
for my $case (['fail', 'tokenize_failed', 1],
              ['slow', 'tokenize_timeout', 0.1],
              ['dead', 'tokenize_failed', 1],
              ['hang', 'tokenize_timeout', 0.1])
{
    my ($path, $why, $timeout) = @$case;
    my @r = map { send_body("/$path/v1/chat/completions",
                            chat_body("d$path", "q $_")) } 1 .. 3;
    is(join(' ', map { $_->{status} } @r), '200 200 200',
       "(d) $path: every request answered");
    ok((grep { $_->{json} && $_->{json}{choices} } @r) == 3,
       "(d) $path: answers are completions");
    is(join(' ', map { $_->{reason} } @r),
       join(' ', ("fallback:$why") x 3), "(d) $path: reason $why");
    my $slowest = (sort { $b <=> $a } map { $_->{elapsed} } @r)[0];
    cmp_ok($slowest, '<', $timeout + 0.8,
           "(d) $path: within the timeout and a margin");
    cmp_ok($r[0]{blocks}, '>', 0, "(d) $path: keyed by text meanwhile");
    if ($path eq 'fail') {
        cmp_ok($r[2]{matched}, '>', 0,
               "(d) $path: learned affinity still works on text keys");
        is($r[2]{server}, $r[1]{server}, "(d) $path: on the same server");
    }
}
my $st1 = status_of('kv');
is($st1->{fallback}{tokenize_failed} - $st0->{fallback}{tokenize_failed},
   6, '(d) status counts tokenize_failed');
is($st1->{fallback}{tokenize_timeout} - $st0->{fallback}{tokenize_timeout},
   6, '(d) status counts tokenize_timeout');
my $plain = send_body('/plain/v1/chat/completions', chat_body('echo', 'x'));
is($plain->{reason}, 'fallback:no_tokens',
   'no kv_aware_tokenize: text keys, reason no_tokens');
ok($env->wait_for_log(
       qr/\[warn\].*kv_aware: tokenize "\/_tok_fail" answered 500/, 2),
   '(d) a failing tokenizer is logged');
my $warns = () = $env->error_log
                 =~ /\[warn\].*kv_aware: tokenize "\/_tok_slow" timed out/g;
is($warns, 1, '(d) at a bounded rate');

# (f) adapters and cache_salt keep their blocks apart
my @fa = map { send_body('/kv/v1/chat/completions',
                         chat_body('foxtrot', "q $_", model => 'a')) } 1, 2;
is($fa[1]{reason}, 'affinity', '(f) adapter a: affinity with itself');
my $fb = send_body('/kv/v1/chat/completions',
                   chat_body('foxtrot', 'q 3', model => 'b'));
is("$fb->{status} $fb->{matched}", '200 0',
   '(f) adapter b: nothing of adapter a matches');
my $fs = send_body('/kv/v1/chat/completions',
                   chat_body('foxtrot', 'q 4', model => 'a', salt => 's1'));
is("$fs->{status} $fs->{matched}", '200 0',
   '(f) salted: nothing of the unsalted prompt matches');
$fs = send_body('/kv/v1/chat/completions',
                chat_body('foxtrot', 'q 5', model => 'a', salt => 's1'));
cmp_ok($fs->{matched}, '>=', 30, '(f) salted: matches its own salt');

# (g) a text upstream refuses a tokens message
my $b1 = '127.0.0.1:' . $env->backend_port(1);
ok(wait_until(5, sub {
    $env->redis_cli(PUBLISH => 'kv:text', $json->encode({ v => 1,
        server => $b1, seq => 1, keyspace => 'tokens' })) >= 1 }),
   '(g) published to a subscribed channel');
ok(wait_until(3, sub {
    (status_of('txt')->{events}{rejected}{keyspace} // 0) >= 1 }),
   '(g) refused as keyspace');
is(status_of('txt')->{events}{messages}, 0, '(g) nothing applied');

# (e) precise: kvsim -> ZeroMQ -> kvbridge -> Redis -> nginx
SKIP: {
    skip "$KVBRIDGE did not start", 4 unless $bridge;

    my $B = "127.0.0.1:" . ($p + 1);
    ok(wait_until(10, sub {
        my $st = status_of('pr') or return 0;
        2 == grep { $_->{state} eq 'fresh' } @{ $st->{servers} } }),
       '(e) both servers fresh through the bridge')
        or diag explain status_of('pr');

    # a client of B's own, not through nginx
    my $r = $env->request(POST => '/v1/chat/completions',
                          chat_body('echo-precise', 'direct'),
                          { 'Content-Type' => 'application/json' },
                          port => $p + 1);
    is($r->{status}, 200, '(e) a request straight to B');
    ok(wait_until(5, sub {
        my ($sb) = grep { $_->{name} eq $B } @{ status_of('pr')->{servers} };
        $sb && $sb->{entries}{event} >= 30 }),
       '(e) B\'s blocks arrive as events');
    my $e = send_body('/pr/v1/chat/completions',
                      chat_body('echo-precise', 'through nginx'));
    is("$e->{status} $e->{reason} $e->{server}", "200 affinity $B",
       '(e) nginx sends the prefix to B')
        or diag(join ' ', map { "$_=$e->{$_}" } sort keys %$e);
}

$env->stop_nginx;
$env->check_logs_clean('tokens');

done_testing;
