# kv_aware precise mode: one subscription per nginx instance.
#
#   * worker_processes 2: one worker subscribes (PUBSUB NUMSUB 1, one
#     <channel>:ping:<pid>:<upstream> channel, <pid> a worker);
#   * nginx -s reload under traffic: every request 200, exactly one
#     subscription once the old workers are gone, held by a new worker;
#   * an old worker kept alive by a slow request gives its subscription up
#     at once: the new worker holds the only one meanwhile;
#   * a reload that renames the channel moves the subscription;
#   * SIGKILL to the subscribing worker: the master respawns it and there is
#     exactly one subscription again, by the new process, and events still
#     route.

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
my %conf = (http_config => upstream_conf(kv_aware => '',
                                         events => 'heartbeat=60s'),
            config => $LOCATIONS);
$env->conf(%conf);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

my @A = map { addr($env, $_) } 1 .. 3;
my @bodies = map { prompt("reload$_", 6) } 1 .. 4;

# pids in the <channel>:ping:<pid>:llm channels: who is subscribed
sub ping_pids {
    my ($channel) = @_;
    $channel //= $CHANNEL;
    return map { /:ping:(\d+):llm$/ ? $1 : () }
           split /\n/, $env->redis_cli(PUBSUB => 'CHANNELS',
                                       "$channel:ping:*");
}

sub one_subscriber {
    my ($channel) = @_;
    my @p = ping_pids($channel);
    return numsub($env, $channel) == 1 && @p == 1 ? $p[0] : 0;
}

subtest 'one subscription with 2 workers' => sub {
    my $pid = wait_until(5, sub { one_subscriber() });
    ok($pid, "one subscription, by pid $pid");
    my %w = map { $_ => 1 } $env->worker_pids;
    is(scalar(keys %w), 2, 'two workers');
    ok($w{$pid}, 'the subscriber is a worker');
    sleep 0.3;
    is(numsub($env), 1, 'and only one');
};

subtest 'reload under traffic' => sub {
    my %old = map { $_ => 1 } $env->worker_pids;
    my $tr = traffic($env, @bodies);
    wait_until(5, sub { $tr->count >= 5 });
    $env->reload or return;
    my $pid = wait_until(5, sub { one_subscriber() });
    ok($pid, "one subscription after the reload (pid $pid)");
    ok($pid && !$old{$pid}, 'held by a new worker');
    my %w = map { $_ => 1 } $env->worker_pids;
    ok($w{$pid}, 'which is alive');
    my $n = $tr->count;
    wait_until(5, sub { $tr->count >= $n + 5 });
    my @r = $tr->stop;
    my @bad = grep { $_->[0] != 200 } @r;
    is(scalar @bad, 0, scalar(@r) . ' requests, all 200')
        or diag explain [@bad[0 .. ($#bad < 9 ? $#bad : 9)]];
    sleep 0.3;
    is(numsub($env), 1, 'still one subscription');

    my $pub = publisher($env);
    my $fresh = prompt('after-reload', 6);  # never routed before
    my @H = block_hashes($fresh);
    is($pub->event($A[1], events => [stored(@H)]), 1,
       'an event reaches one subscriber');
    my $r = chat($env, $fresh);
    is("$r->{backend} $r->{reason} $r->{matched}",
       'b2 affinity ' . scalar(@H), 'and routes');
};

subtest 'an old worker busy with a slow request lets go at once' => sub {
    my %old = map { $_ => 1 } $env->worker_pids;
    my $oldsub = wait_until(5, sub { one_subscriber() });
    # slow requests, so that the old workers (one holds the channel) stay
    my $kid = fork // die "fork: $!";
    if ($kid == 0) {
        my @r = $env->concurrent([map {
            [POST => '/v1/chat/completions', $bodies[$_],
             { 'X-Delay-Ms' => 2500 }]
        } map { $_ % 4 } 0 .. 7]);
        POSIX::_exit(scalar(grep { $_->{status} == 200 } @r) == 8 ? 0 : 1);
    }
    sleep 0.5;
    my ($rc, $out) = $env->_run_cmd([$Test::KvAware::NGINX, '-p',
        $env->prefix . '/', '-c', $env->prefix . '/conf/nginx.conf',
        '-s', 'reload']);
    is($rc, 0, 'nginx -s reload') or diag $out;
    my $pid = wait_until(2, sub {
        my $p = one_subscriber();
        return $p && !$old{$p} ? $p : 0;
    });
    ok($pid, 'the new worker holds the only subscription');
    SKIP: {
        skip 'no slow request landed on the old subscriber', 1
            unless _zombie_free($oldsub);
        ok($pid, "while the old subscriber $oldsub still serves requests");
    }
    waitpid($kid, 0);
    is($?, 0, 'the slow requests all answered 200');
    ok(wait_until(5, sub { !grep { kill(0, $_) && _zombie_free($_) }
                                 keys %old }), 'old workers gone');
    is(numsub($env), 1, 'one subscription');
};

sub _zombie_free {
    my ($pid) = @_;
    open(my $fh, '<', "/proc/$pid/stat") or return 0;
    my $s = <$fh> // return 0;
    return $s !~ /\)\s+Z/;
}

subtest 'reload renames the channel' => sub {
    $env->conf(%conf, http_config => upstream_conf(
        kv_aware => '', events => 'heartbeat=60s channel=kv:other'));
    $env->reload or return;
    ok(wait_until(5, sub { one_subscriber('kv:other') }),
       'one subscription on the new channel');
    ok(wait_until(5, sub { numsub($env) == 0 }),
       'none left on the old one');
    $env->conf(%conf);
    $env->reload or return;
    ok(wait_until(5, sub { one_subscriber() }), 'and back');
    is(numsub($env, 'kv:other'), 0, 'none left on kv:other');
};

subtest 'the subscribing worker is killed' => sub {
    my $pid = wait_until(5, sub { one_subscriber() });
    ok($pid, "subscriber pid $pid") or return;   # never kill 0
    my $st0 = status($env);
    kill 'KILL', $pid;
    my $new = wait_until(8, sub {
        my $p = one_subscriber();
        return $p && $p != $pid ? $p : 0;
    });
    ok($new, "one subscription again, by the respawned worker $new");
    my %w = map { $_ => 1 } $env->worker_pids;
    ok($new && $w{$new}, 'a live worker of this master');
    is(scalar(keys %w), 2, 'two workers again');
    sleep 0.5;
    is(numsub($env), 1, 'exactly one subscription');
    my $st = status($env);
    cmp_ok($st->{redis}{connects}, '>', $st0->{redis}{connects},
           'status: connects counted the new subscription');
    is($st->{redis}{state}, 'up', 'status: up');

    my $pub = publisher($env);
    my $fresh = prompt('after-kill', 6);    # never routed before
    my @H = block_hashes($fresh);
    $pub->{seq}{$A[2]} = 50;
    is($pub->event($A[2], snapshot => 'full', events => [stored(@H)]), 1,
       'events reach the new subscriber');
    my $r = chat($env, $fresh);
    is("$r->{status} $r->{backend} $r->{matched}",
       "200 b3 " . scalar(@H), 'and route');
};

$env->stop_nginx;
my @bad = grep { /\[(?:alert|emerg|crit)\]|exited on signal/
                 && !/exited on signal 9/ } split /\n/, $env->error_log;
is(scalar @bad, 0, 'no alert/crit in the error log but the SIGKILL')
    or diag join "\n", @bad[0 .. ($#bad < 9 ? $#bad : 9)];

done_testing;
