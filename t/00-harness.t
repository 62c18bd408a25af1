# Self-test of the integration harness (t/lib/Test/KvAware.pm and
# t/lib/backend.pl).  Plain nginx only: the kv_aware module is NOT loaded.

use strict;
use warnings;

use Digest::MD5 qw(md5_hex);
use IO::Select;
use IO::Socket::INET;
use Test::More;
use File::Path qw(make_path);
use File::Spec;
use POSIX ();
use Time::HiRes qw(time sleep);

use KvAware::Launch ();

use Test::KvAware qw(run_blocks log_matches);
use Test::KvAware::Chat qw(chunked);

my $UPSTREAMS = <<'EOF';
    upstream u {
        server $TEST_NGINX_BACKEND_1 max_fails=0;
        server $TEST_NGINX_BACKEND_2 max_fails=0;
    }
    upstream ka {
        server $TEST_NGINX_BACKEND_1;
        keepalive 4;
    }
EOF

# HTTP/1.0 to u: nginx 1.30 keeps upstream connections alive by
# default, and a request after a backend restart could go out on a
# connection the old process held, be reset and retried on the other
# backend, breaking the alternation the failover subtest expects (t/12)
my $LOCATIONS = <<'EOF';
        location / {
            proxy_pass http://u;
            proxy_http_version 1.0;
        }
        # HTTP/1.1 + unbuffered body: a chunked request reaches the backend
        # chunked, over a kept-alive connection
        location /ka/ {
            proxy_pass http://ka;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_request_buffering off;
        }
EOF

my $env = Test::KvAware->new(backends => 2, workers => 1, module => 0);
$env->conf(http_config => $UPSTREAMS, config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx does not start');

subtest 'round robin alternates b1/b2' => sub {
    my @s = map { $env->request(GET => "/rr$_")->{headers}{'x-backend'} }
                1 .. 4;
    is_deeply([sort @s[0, 1]], [qw(b1 b2)], 'both backends used') or diag "@s";
    is($s[2], $s[0], 'third like first');
    is($s[3], $s[1], 'fourth like second');
    like($env->access_log, qr{"GET /rr4 HTTP/1.1" 200}, 'access log');
};

subtest 'md5 echo of request bodies' => sub {
    my $big = join '', map { chr int rand 256 } 1 .. 200 * 1024;
    for my $body ('', 'hello', '{"messages":[{"role":"user"}]}', $big) {
        my $r = $env->request(POST => '/v1/chat/completions', $body,
                              { 'Content-Type' => 'application/json' });
        my $len = length $body;
        is($r->{status}, 200, "$len bytes: 200");
        is($r->{json}{len}, $len, "$len bytes: len");
        is($r->{json}{md5}, md5_hex($body), "$len bytes: md5");
        is($r->{json}{uri}, '/v1/chat/completions', "$len bytes: uri");
    }

    # chunked from the client, passed on chunked by nginx (keepalive pool)
    for my $round (1 .. 2) {
        my $r = $env->request(POST => '/ka/chunked', chunked($big, 7000),
                              { 'Transfer-Encoding' => 'chunked' });
        is($r->{status}, 200, "chunked via nginx #$round");
        is($r->{json}{md5}, md5_hex($big), "chunked via nginx #$round: md5");
    }

    # and straight to the backend, with extensions and a trailer
    my $r = $env->backend_request(2, POST => '/direct',
        "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
        { 'Transfer-Encoding' => 'chunked' });
    is($r->{headers}{'x-backend'}, 'b2', 'direct: X-Backend');
    is($r->{json}{md5}, md5_hex('hello world'), 'direct chunked: md5');
};

subtest 'backend keep-alive and Connection: close' => sub {
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
        PeerPort => $env->backend_port(1), Timeout => 5) or die $@;
    my $sel = IO::Select->new($s);
    my $read_response = sub {       # one response, by Content-Length
        my $buf = '';
        while ($sel->can_read(5)) {
            sysread($s, $buf, 65536, length $buf) or last;
            my $end = index($buf, "\r\n\r\n");
            next if $end < 0;
            my ($cl) = $buf =~ /Content-Length: (\d+)/;
            last if length($buf) >= $end + 4 + $cl;
        }
        return $buf;
    };
    for my $i (1 .. 2) {
        print {$s} "POST /k$i HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                 . "\r\nhi";
        like($read_response->(), qr{Connection: keep-alive.*"uri":"/k$i"}s,
             "request $i on one connection");
    }
    print {$s} "GET /k3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    like($read_response->(), qr{Connection: close}, 'close honoured');
    my $eof = $sel->can_read(5) && !sysread($s, my $x, 1);
    ok($eof, 'backend closed the connection');
};

subtest 'X-Delay-Ms with concurrent()' => sub {
    my $t0 = time;
    my @r = $env->concurrent([ map { [GET => "/slow$_", undef,
                                      { 'X-Delay-Ms' => 1000 }] } 1 .. 4 ]);
    my $wall = time - $t0;
    is(scalar @r, 4, '4 responses');
    is_deeply([map { $_->{status} } @r], [(200) x 4], 'all 200');
    is_deeply([map { $_->{json}{uri} } @r], [map { "/slow$_" } 1 .. 4],
              'responses in request order');
    ok(!grep({ $_->{elapsed} < 0.99 } @r), 'each took >= 1 s');
    # one after the other, the wall time would be at least the sum of
    # their times; side by side, about one of them (a machine loaded by
    # the tests running beside this one stretches both alike)
    my $sum = 0;
    $sum += $_->{elapsed} for @r;
    cmp_ok($wall, '<', 0.75 * $sum, 'ran in parallel')
        or diag "wall $wall s, the four took $sum s";
};

subtest 'backend_stop / modes / SIGUSR1: failover' => sub {
    my $servers = sub {
        my @r = map { $env->request(GET => "/f$_") } 1 .. 4;
        return join ' ', map { "$_->{status}:"
            . ($_->{headers}{'x-backend'} // '-') } @r;
    };

    my $mark = $env->error_log_offset;
    $env->backend_stop(1);
    is($servers->(), '200:b2 200:b2 200:b2 200:b2', 'b1 down: all on b2');
    like($env->error_log($mark), qr/connect\(\) failed \(111: Connection refused\)/,
         'connect error logged');

    $mark = $env->error_log_offset;
    $env->backend_start(1, mode => 'close');
    is($servers->(), '200:b2 200:b2 200:b2 200:b2', 'b1 closes: all on b2');
    ok(log_matches($env->error_log($mark),
                   'upstream prematurely closed connection'),
       'premature close logged');

    $env->backend_start(1, mode => 'fail');
    like($servers->(), qr/^(?=.*502:b1)(?=.*200:b2)/, 'b1 fails: 502 passed on');

    kill 'USR1', $env->backend_pid(1);          # fail -> ok
    for (1 .. 100) {                            # the signal is async
        last if $env->backend_request(1, GET => '/probe')->{status} == 200;
        Time::HiRes::sleep(0.02);
    }
    unlike($servers->(), qr/502/, 'SIGUSR1 switched b1 back to ok');

    $env->backend_start(1);
    is($servers->(), '200:b1 200:b2 200:b1 200:b2', 'b1 back');
};

subtest 'reload' => sub {
    my @old = $env->worker_pids;
    is(scalar @old, 1, 'one worker');

    $env->conf(http_config => $UPSTREAMS, workers => 2, config => $LOCATIONS
               . 'location = /reloaded { return 200 "yes\n"; }');
    ok($env->reload(quiet => 1), 'reload') or diag $env->last_error;
    my @new = $env->worker_pids;
    is(scalar @new, 2, 'two new workers');
    ok(!grep({ my $o = $_; grep { $_ == $o } @new } @old), 'all replaced');
    is($env->request(GET => '/reloaded')->{body}, "yes\n", 'new config live');

    # a broken configuration is refused; the old workers keep serving
    $env->conf(http_config => $UPSTREAMS, config => 'bogus_thing 1;');
    ok(!$env->reload(quiet => 1), 'broken reload refused');
    like($env->last_error, qr/unknown directive "bogus_thing"/, 'why');
    is_deeply([$env->worker_pids], \@new, 'workers unchanged');
    is($env->request(GET => '/reloaded')->{status}, 200, 'still serving');
};

$env->check_logs_clean('programmatic');

subtest 'redis' => sub {
    my $r = Test::KvAware->new(backends => 0, redis => 1, module => 0);
    is($r->redis_cli('PING'), 'PONG', 'ping');
    is($r->redis_cli(qw(SET k v)), 'OK', 'set');
    is($r->redis_cli(qw(GET k)), 'v', 'get');
    $r->redis_stop;
    like($r->redis_cli('PING'), qr/refused|Could not connect/i, 'stopped');
    $r->redis_start;
    is($r->redis_cli('PING'), 'PONG', 'restarted');
};

subtest 'no stray processes' => sub {
    my $e = Test::KvAware->new(backends => 2, redis => 1, module => 0);
    $e->conf(config => 'location / { return 204; }');
    $e->start_nginx;
    my @pids = ($e->nginx_pid, $e->worker_pids, $e->backend_pid(1),
                $e->backend_pid(2), $e->{redis_pid}, $e->{watchdog});
    is(scalar(grep { $_ } @pids), 6, 'all processes known');
    my $prefix = $e->prefix;
    undef $e;
    is_deeply([grep { Test::KvAware::_alive($_) } @pids], [], 'all gone');
};

subtest 'block parser' => sub {
    my @b = Test::KvAware::parse_blocks(<<'EOT');
=== TEST A: name
--- backends: 3
--- request
POST /x
line1
line2

--- error_code eval: 500 + 2
--- error_log
foo
qr/ba+r/

=== TEST B
--- must_die
--- config: location / {}

EOT
    is(scalar @b, 2, 'two blocks');
    is($b[0]{name}, 'TEST A: name', 'name');
    is($b[0]{sec}{backends}, 3, 'one-line value');
    is($b[0]{sec}{request}, "POST /x\nline1\nline2\n",
       'request: only the last newline is stripped');
    is($b[0]{sec}{error_code}, 502, 'one-line eval');
    my @p = Test::KvAware::_patterns($b[0]{sec}{error_log});
    ok(log_matches('x foo y', $p[0]) && !log_matches('fo', $p[0]),
       'substring pattern');
    ok(log_matches('baaar', $p[1]) && !log_matches('br', $p[1]),
       'qr// pattern');
    ok(exists $b[1]{sec}{must_die}, 'flag section');
    is($b[1]{sec}{config}, 'location / {}', 'last section trimmed');
};

# Tests run side by side: a reservation whose owner is gone is taken over
# by exactly one of the processes that want its port, and a port handed
# back is not removed later from under whoever took it since.
subtest 'port reservations' => sub {
    my $dir = File::Spec->tmpdir . "/kv-aware-ports-$<";
    my $port = 1000 + $$ % 20000;       # below 1024+: never drawn
    my $file = "$dir/$port";
    my $dead = fork // die;
    exit 0 if !$dead;
    waitpid $dead, 0;

    my $double = 0;
    for my $round (1 .. 40) {
        make_path($dir);
        open my $fh, '>', $file or die "$file: $!";
        print {$fh} "$dead\n";
        close $fh;
        pipe my $r, my $w or die;
        pipe my $hold, my $release or die;
        my $go = time + 0.05;
        my @kids;
        for (1 .. 6) {
            my $pid = fork // die;
            if (!$pid) {
                close $r;
                close $release;
                local $KvAware::Launch::PORT_OWNER = $$;
                sleep 0.001 while time < $go;
                my $got = KvAware::Launch::reserve_port($port);
                syswrite $w, $got ? 'y' : 'n';
                sysread $hold, my $eof, 1;  # alive until all have tried
                POSIX::_exit(0);
            }
            push @kids, $pid;
        }
        close $w;
        close $hold;
        my $out = '';
        while (length $out < @kids) {
            sysread $r, $out, 16, length $out or last;
        }
        close $release;
        waitpid $_, 0 for @kids;
        $double++ if ($out =~ tr/y//) != 1;
    }
    unlink $file;
    is($double, 0, 'one taker a round, of 6 at once, in 40 rounds');

    # a run free_run() hands back (a port of it taken) is not removed
    # at this process's exit from under whoever reserves it next
    my $base = KvAware::Launch::free_run(3);
    ok(-e "$dir/$base", 'free_run reserves its ports');
    KvAware::Launch::release_port($base);
    ok(!-e "$dir/$base"
       && !grep({ $_ eq "$dir/$base" } @KvAware::Launch::RESERVED),
       'a port handed back is forgotten');
};

run_blocks(no_module => 1);

done_testing;

__DATA__

=== TEST 1: proxied POST, headers and md5
--- http_config
    upstream u {
        server $TEST_NGINX_BACKEND_1;
        server $TEST_NGINX_BACKEND_2;
    }
--- config
    location / {
        proxy_pass http://u;
    }
--- request
POST /v1/chat/completions
{"model":"m","messages":[{"role":"user","content":"hi"}]}
--- more_headers
Content-Type: application/json
X-Whatever: 1
--- repeat: 2
--- response_headers
Content-Type: application/json
!X-Nothing
--- response_headers_like
X-Backend: ^b[12]$
--- response_body_like eval
my $body = '{"model":"m","messages":[{"role":"user","content":"hi"}]}';
qr/"method":"POST","uri":"\/v1\/chat\/completions","len":57,"md5":"${\ md5_hex($body)}"/
--- no_error_log
[warn]



=== TEST 2: one-line sections, exact body, two workers
--- backends: 0
--- workers: 2
--- config: location = /t { return 200 "hello\n"; }
--- request: GET /t
--- error_code: 200
--- response_body eval: "hello\n"



=== TEST 3: 200 KB body via request eval, buffered to a temp file
--- backends: 1
--- config
    location / {
        proxy_pass http://$TEST_NGINX_BACKEND_1;
    }
--- request eval
"POST /big\n" . ("x" x 204800)
--- response_body_like eval
qr/"len":204800,"md5":"${\ md5_hex("x" x 204800)}"/
--- error_log
a client request body is buffered to a temporary file



=== TEST 4: invalid directive is caught by must_die
--- config
    location / {
        kv_bogus_directive on;
    }
--- must_die
--- error_log
unknown directive "kv_bogus_directive"



=== TEST 5: error_log and no_error_log
--- backends: 0
--- config
    location /files/ {
        root $TEST_NGINX_PREFIX/html;
    }
--- request
GET /files/missing.txt
--- error_code: 404
--- error_log
open() "
qr/\[error\].*No such file or directory/
http request line: "GET /files/missing.txt HTTP/1.1"
--- no_error_log
[warn]
qr/exited on signal \d+/



=== TEST 6: b1 closes without answering: failover to b2
--- backend_modes: close ok
--- http_config
    upstream u {
        server $TEST_NGINX_BACKEND_1 max_fails=0;
        server $TEST_NGINX_BACKEND_2 max_fails=0;
    }
--- config
    location / {
        proxy_pass http://u;
    }
--- request
GET /x
--- repeat: 3
--- response_headers
X-Backend: b2
--- error_log
upstream prematurely closed connection



=== TEST 7: backend in fail mode: its 502 is passed on
--- backends: 1
--- backend_modes: fail
--- config
    location / {
        proxy_pass http://$TEST_NGINX_BACKEND_1;
    }
--- request
GET /y
--- error_code: 502
--- response_headers
X-Backend: b1
--- response_body_like: "server":"b1"



=== TEST 8: several requests, per-request expectations
--- backends: 1
--- config
    location / {
        proxy_pass http://$TEST_NGINX_BACKEND_1;
    }
--- request eval
["GET /a", "POST /b\nxyz"]
--- response_body_like eval
[qr{"uri":"/a","len":0}, qr{"uri":"/b","len":3}]
