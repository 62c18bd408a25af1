# kv_aware precise mode: Redis goes away and comes back.
#
#   * redis stopped and restarted on the same port while requests flow
#     (2 workers): every request answers 200; kv_aware_status shows the
#     link down, then up with connects + 1; exactly one subscription again
#     (PUBSUB NUMSUB); servers that had events are degraded and a resync is
#     asked; a snapshot makes them fresh;
#   * redis frozen (SIGSTOP): the liveness ping notices within
#     read_timeout, requests keep working, and after SIGCONT the link is up
#     again with one subscription.

# ---------------------------------------------------------------------------
# Helpers for the precise-mode tests.  The same block is in every t/3*.t so
# that each file stands alone.

use strict;
use warnings;

use Errno qw(EINTR EAGAIN EWOULDBLOCK);
use File::Temp ();
use IO::Select;
use IO::Socket::INET;
use JSON::PP ();
use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);

use Test::KvAware qw(skip_unless_module);

my $JSON = JSON::PP->new->canonical->utf8;
my $CHANNEL = 'kv_aware:events';
my $BS = 64;                            # block_size of every test upstream

sub preflight {
    skip_unless_module();
    for my $bin ('redis-server', 'redis-cli', 'gcc') {
        plan(skip_all => "$bin is not installed")
            unless grep { -x "$_/$bin" } split /:/, $ENV{PATH};
    }
}

# The module's own hasher (t/lib/kva_hashes.c against src/), built once.
my $HASHER;
sub hasher {
    return $HASHER if $HASHER;
    my $dir = File::Temp::tempdir('kvahash-XXXXXX', TMPDIR => 1,
                                  CLEANUP => 1);
    my $bin = "$dir/kva_hashes";
    my $out = qx{gcc -O1 -Isrc -o $bin t/lib/kva_hashes.c src/kva_prompt.c \\
                 src/kva_hash.c -lxxhash 2>&1};
    BAIL_OUT("cannot build t/lib/kva_hashes.c:\n$out") if $? || !-x $bin;
    return $HASHER = $bin;
}

# The block hashes of a request body, as the module computes them.
sub block_hashes {
    my ($body, $bs) = @_;
    my $bin = hasher();
    my ($fh, $file) = File::Temp::tempfile(UNLINK => 1);
    binmode $fh;
    print {$fh} $body;
    close $fh;
    my @h = split /\n/, qx{$bin ${\($bs // $BS)} < $file};
    die "kva_hashes failed on $file" if $?;
    return @h;
}

# A chat body of about $n blocks, different for every $tag from byte 0.
sub prompt {
    my ($tag, $n) = @_;
    my $text = '';
    my $i = 0;
    $text .= sprintf("[%s/%03d] the quick brown fox jumps over the dog. ",
                     $tag, $i++) while length($text) < ($n // 12) * $BS;
    return $JSON->encode({ model => 'm', messages => [
        { role => 'system', content => $text },
        { role => 'user', content => "and $tag?" } ] });
}

sub chat {
    my ($env, $body, %o) = @_;
    my $r = $env->request(POST => '/v1/chat/completions', $body,
                          { 'Content-Type' => 'application/json',
                            %{ $o{headers} || {} } });
    diag("request error: $r->{error}") if $r->{error} && !$o{quiet};
    return {
        status  => $r->{status},
        backend => $r->{headers}{'x-backend'} // '-',
        reason  => $r->{headers}{'x-kv-reason'} // '-',
        matched => $r->{headers}{'x-kv-matched'} // -1,
        blocks  => $r->{headers}{'x-kv-blocks'} // -1,
    };
}

sub show { my ($r) = @_; join ' ', map { "$_=$r->{$_}" } sort keys %$r }

# server address of backend bN ("127.0.0.1:PORT"), and back
sub addr { my ($env, $i) = @_; '127.0.0.1:' . $env->backend_port($i) }
sub bnum { my ($name) = @_; $name =~ /^b(\d+)$/ ? $1 : 0 }

sub upstream_conf {
    my (%o) = @_;
    my $ev = $o{events} // '';
    my $servers = join '', map {
        "        server \$TEST_NGINX_BACKEND_$_ max_fails=0;\n"
    } 1 .. ($o{n} // 3);
    return <<"EOF";
    upstream llm {
        kv_aware block_size=$BS $o{kv_aware};
        kv_aware_events redis=127.0.0.1:\$TEST_NGINX_REDIS_PORT $ev;
$servers    }
EOF
}

my $LOCATIONS = <<'EOF';
        location / {
            proxy_pass http://llm;
            add_header X-KV-Reason $kv_aware_reason always;
            add_header X-KV-Blocks $kv_aware_blocks always;
            add_header X-KV-Matched $kv_aware_matched always;
        }
        location = /kv_status {
            kv_aware_status;
        }
EOF

# the "llm" upstream of kv_aware_status
sub status {
    my ($env) = @_;
    my $r = $env->request(GET => '/kv_status');
    return $r->{json} ? $r->{json}{upstreams}{llm} : undef;
}

sub server_status {
    my ($st, $name) = @_;
    return undef unless $st;
    my ($s) = grep { $_->{name} eq $name } @{ $st->{servers} };
    return $s;
}

# Polls status until $cond->($status) holds; the last status, or undef.
sub wait_status {
    my ($env, $timeout, $cond) = @_;
    my $deadline = time + $timeout;
    while (1) {
        my $st = status($env);
        return $st if $st && $cond->($st);
        return undef if time > $deadline;
        sleep 0.02;
    }
}

sub wait_until {
    my ($timeout, $cond) = @_;
    my $deadline = time + $timeout;
    while (1) {
        my $r = $cond->();
        return $r if $r;
        return 0 if time > $deadline;
        sleep 0.02;
    }
}

# Every message nginx took from Redis is counted once: applied or rejected.
sub seen {
    my ($st) = @_;
    my $n = $st->{events}{messages};
    $n += $_ for values %{ $st->{events}{rejected} };
    return $n;
}


# --- a minimal RESP client (raw socket: pipelining, subscriptions) ------

sub resp_encode {
    my $s = '*' . scalar(@_) . "\r\n";
    $s .= '$' . length($_) . "\r\n$_\r\n" for @_;
    return $s;
}

# Parses one reply at $$buf[$pos..]: ($value, $newpos), or () if partial.
# Errors come back as { error => 'text' }.
sub resp_parse {
    my ($buf, $pos) = @_;
    my $e = index($$buf, "\r\n", $pos);
    return if $e < 0;
    my $type = substr($$buf, $pos, 1);
    my $line = substr($$buf, $pos + 1, $e - $pos - 1);
    $pos = $e + 2;
    return ($line, $pos) if $type eq '+';
    return ({ error => $line }, $pos) if $type eq '-';
    return ($line + 0, $pos) if $type eq ':';
    if ($type eq '$') {
        return (undef, $pos) if $line < 0;
        return if length($$buf) < $pos + $line + 2;
        return (substr($$buf, $pos, $line), $pos + $line + 2);
    }
    if ($type eq '*') {
        return (undef, $pos) if $line < 0;
        my @a;
        for (1 .. $line) {
            my ($v, $p) = resp_parse($buf, $pos) or return;
            push @a, $v;
            $pos = $p;
        }
        return (\@a, $pos);
    }
    die "bad RESP type '$type'";
}

sub redis_connect {
    my ($port, @auth) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Proto => 'tcp', Timeout => 5)
        or die "connect to redis 127.0.0.1:$port: $@";
    binmode $s;
    my $c = bless { sock => $s, buf => '' }, 'KvRedis';
    if (@auth) {
        my $r = $c->cmd(AUTH => @auth);
        die "AUTH: $r->{error}" if ref $r eq 'HASH';
    }
    return $c;
}

sub KvRedis::send_raw {
    my ($c, $data) = @_;
    local $SIG{PIPE} = 'IGNORE';
    my $off = 0;
    while ($off < length $data) {
        my $n = syswrite($c->{sock}, $data, length($data) - $off, $off);
        die "redis write: $!" unless defined $n;
        $off += $n;
    }
}

# Next reply, or undef after $timeout s.
sub KvRedis::reply {
    my ($c, $timeout) = @_;
    my $deadline = time + ($timeout // 5);
    my $sel = IO::Select->new($c->{sock});
    while (1) {
        if (length $c->{buf}) {
            my ($v, $p) = resp_parse(\$c->{buf}, 0);
            if (defined $p) {
                substr($c->{buf}, 0, $p, '');
                return $v;
            }
        }
        my $left = $deadline - time;
        return undef if $left <= 0;
        next unless $sel->can_read($left);
        my $n = sysread($c->{sock}, $c->{buf}, 1 << 20, length $c->{buf});
        next if !defined $n && ($! == EINTR || $! == EAGAIN);
        return undef unless $n;
    }
}

sub KvRedis::cmd {
    my ($c, @args) = @_;
    $c->send_raw(resp_encode(@args));
    return $c->reply(5);
}

# Sends all commands at once, then reads as many replies.
sub KvRedis::pipeline {
    my ($c, @cmds) = @_;
    $c->send_raw(join '', map { resp_encode(@$_) } @cmds);
    return map { $c->reply(10) } @cmds;
}

# A subscriber connection: ->messages($timeout, $until) collects
# [channel, payload] pairs until $until->(@so_far) holds or time is up.
sub redis_subscribe {
    my ($port, @channels) = @_;
    my $c = redis_connect($port);
    $c->send_raw(resp_encode(SUBSCRIBE => @channels));
    for (@channels) {
        my $r = $c->reply(5);
        die "SUBSCRIBE failed" unless ref $r eq 'ARRAY'
                                      && $r->[0] eq 'subscribe';
    }
    return $c;
}

sub KvRedis::messages {
    my ($c, $timeout, $until) = @_;
    my $deadline = time + $timeout;
    my @m;
    while ((my $left = $deadline - time) > 0) {
        my $r = $c->reply($left) // last;
        push @m, [$r->[1], $r->[2]]
            if ref $r eq 'ARRAY' && $r->[0] eq 'message';
        last if $until && $until->(@m);
    }
    return @m;
}

# subscribers of $channel; @cli: redis-cli options (-a ...)
sub numsub {
    my ($env, $channel, @cli) = @_;
    my @l = split /\n/, $env->redis_cli(@cli, PUBSUB => 'NUMSUB',
                                        $channel // $CHANNEL);
    return $l[1] // -1;
}

# Publisher for one nginx under test: tracks each server's seq.
sub publisher {
    my ($env, @auth) = @_;
    my $p = redis_connect($env->redis_port, @auth);
    $p->{env} = $env;
    $p->{seq} = {};
    return $p;
}

# ->event($server, events => [...], seq => N, ...) publishes one v1
# message (seq defaults to the server's next) and waits (5 s) until nginx
# has taken it in (applied or rejected); returns the number of
# subscribers that PUBLISH reported.
sub KvRedis::event {
    my ($p, $server, %m) = @_;
    my $seq = delete $m{seq} // ($p->{seq}{$server} // 0) + 1;
    $p->{seq}{$server} = $seq;
    return $p->publish_raw($JSON->encode({ v => 1, server => $server,
                                           seq => $seq, %m }));
}

sub KvRedis::publish_raw {
    my ($p, $msg, %o) = @_;
    my $env = $p->{env};
    my $before = seen(status($env));
    my $n = $p->cmd(PUBLISH => $o{channel} // $CHANNEL, $msg);
    wait_status($env, 5, sub { seen($_[0]) > $before })
        or diag("nginx did not take in: " . substr($msg, 0, 200));
    return $n;
}

sub stored  { return { type => 'stored',  hashes => [@_] } }
sub removed { return { type => 'removed', hashes => [@_] } }
sub cleared { return { type => 'cleared' } }

# Requests in a forked child until stop(): ->stop returns their results
# ([status, backend, reason] each).
sub traffic {
    my ($env, @bodies) = @_;
    my $file = $env->prefix . "/traffic-$$-" . int(rand 1e9);
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        my $stop = 0;
        $SIG{TERM} = sub { $stop = 1 };
        open(my $fh, '>', $file) or POSIX::_exit(1);
        $fh->autoflush(1);
        my $i = 0;
        until ($stop) {
            my $r = chat($env, $bodies[$i++ % @bodies], quiet => 1);
            print {$fh} "$r->{status} $r->{backend} $r->{reason}\n";
            sleep 0.01;
        }
        close $fh;
        POSIX::_exit(0);
    }
    return bless { pid => $pid, file => $file }, 'KvTraffic';
}

sub KvTraffic::count {
    my ($t) = @_;
    open(my $fh, '<', $t->{file}) or return 0;
    my @l = <$fh>;
    return scalar @l;
}

sub KvTraffic::stop {
    my ($t) = @_;
    kill 'TERM', $t->{pid};
    waitpid($t->{pid}, 0);
    open(my $fh, '<', $t->{file}) or return ();
    return map { chomp; [split ' '] } <$fh>;
}

# ---------------------------------------------------------------------------

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 2,
                             log_level => 'info');
$env->conf(http_config => upstream_conf(
               kv_aware => '',
               events => 'connect_timeout=1s read_timeout=1s heartbeat=60s'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);
ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }), 'redis up');
is(numsub($env), 1, 'one subscription');

my @A = map { addr($env, $_) } 1 .. 3;
my @bodies = map { prompt("conv$_", 8) } 1 .. 4;
my @H = block_hashes($bodies[0]);

subtest 'redis restarted under traffic' => sub {
    my $pub = publisher($env);
    $pub->event($A[0], events => [stored(@H)]);
    my $st0 = status($env);
    is(server_status($st0, $A[0])->{state}, 'fresh', 'b1 fresh');
    is($st0->{redis}{connects}, 1, 'connects 1');

    my $tr = traffic($env, @bodies);
    wait_until(5, sub { $tr->count >= 5 });

    my $mark = $env->error_log_offset;
    $env->redis_stop;
    my $st = wait_status($env, 5, sub { $_[0]{redis}{state} eq 'down' });
    ok($st, 'status: redis down');
    cmp_ok($st && $st->{redis}{failures}, '>', $st0->{redis}{failures},
           'failures counted');
    is($st && server_status($st, $A[0])->{state}, 'degraded',
       'subscription lost: the server with events is degraded');
    ok($env->wait_for_log(qr/\[warn\].*redis \S+ subscriber lost/, 5,
                          $mark), 'warn: subscriber lost');

    my $n = $tr->count;
    sleep 1;                        # requests go on with redis away
    cmp_ok($tr->count, '>', $n, 'requests kept flowing while redis was down');

    $env->redis_start;
    $st = wait_status($env, 8, sub { $_[0]{redis}{state} eq 'up' });
    ok($st, 'status: redis up again');
    is($st && $st->{redis}{connects}, $st0->{redis}{connects} + 1,
       'connects + 1');
    ok(wait_until(5, sub { numsub($env) == 1 }),
       'subscribed again: NUMSUB 1');
    $st = wait_status($env, 3, sub {
        $_[0]{events}{resyncs} > $st0->{events}{resyncs} });
    ok($st, 'reconnect: a resync was asked');
    is(server_status(status($env), $A[0])->{state}, 'degraded',
       'still degraded until the snapshot');

    $pub = publisher($env);
    $pub->{seq}{$A[0]} = 100;
    is($pub->event($A[0], snapshot => 'full', events => [stored(@H)]), 1,
       'snapshot published to one subscriber');
    is(server_status(status($env), $A[0])->{state}, 'fresh',
       'snapshot: fresh again');

    my @r = $tr->stop;
    cmp_ok(scalar @r, '>=', 20, 'traffic: ' . scalar(@r) . ' requests');
    my @bad = grep { $_->[0] != 200 } @r;
    is(scalar @bad, 0, 'every request answered 200')
        or diag explain [@bad[0 .. ($#bad < 9 ? $#bad : 9)]];
};

subtest 'redis frozen, then thawed' => sub {
    my $rpid = $env->{redis_pid} or return fail('no redis pid');
    my $st0 = status($env);
    my $mark = $env->error_log_offset;

    kill 'STOP', $rpid;
    my $t0 = time;
    my $st = wait_status($env, 5, sub { $_[0]{redis}{state} ne 'up' });
    my $dt = time - $t0;
    kill 'CONT', $rpid unless $st;
    ok($st, sprintf('frozen redis noticed after %.1f s', $dt));
    cmp_ok($dt, '<=', 3.5, 'within 2 x read_timeout (+ slack)');
    ok($env->wait_for_log(qr/did not answer in 1000 ms/, 1, $mark),
       'warn: did not answer');

    my @r = map { chat($env, $bodies[$_ % 4]) } 1 .. 5;
    is(scalar(grep { $_->{status} == 200 } @r), 5,
       'requests work while redis is frozen');

    kill 'CONT', $rpid;
    $st = wait_status($env, 8, sub { $_[0]{redis}{state} eq 'up' });
    ok($st, 'thawed: up again');
    cmp_ok($st && $st->{redis}{connects}, '>', $st0->{redis}{connects},
           'reconnected');
    ok(wait_until(5, sub { numsub($env) == 1 }), 'NUMSUB 1');
    sleep 0.5;
    is(numsub($env), 1, 'still exactly one subscription');
};

$env->stop_nginx;
$env->check_logs_clean('redis down');

done_testing;
