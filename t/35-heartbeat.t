# kv_aware precise mode: heartbeats and load.
#
#   * heartbeat=1s: a server silent past it is reported stale (not before),
#     warned about, asked for a resync; its event entries are then ignored
#     (a prefix only its events knew is routed by load) while what nginx
#     learned by routing still holds; its next message in sequence makes
#     it fresh again and its events count again; a first message in
#     mid-sequence (seq 42) is a gap;
#   * a server silent while degraded or syncing becomes stale as well, and
#     the load it reported stops counting;
#   * "load" of a message shows in kv_aware_status (waiting, running,
#     kv_usage) and weighs in routing: a server reporting a long queue
#     loses a prefix it holds; once it reports an empty one it wins again.

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

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 1,
                             log_level => 'info');
my @A = map { addr($env, $_) } 1 .. 3;

sub start_with {
    my ($events) = @_;
    $env->stop_nginx;
    $env->conf(http_config => upstream_conf(kv_aware => '',
                                            events => $events),
               config => $LOCATIONS);
    $env->start_nginx or return 0;
    return wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' });
}

subtest 'silent past the heartbeat: stale' => sub {
    start_with('heartbeat=1s speculative_ttl=1s') or return fail('start');
    my $pub = publisher($env);
    my $sub = redis_subscribe($env->redis_port, "$CHANNEL:resync");
    my $x = 2;
    my $X = $A[$x - 1];
    my $P = prompt('routed', 8);        # routed to X: learned there
    my $Q = prompt('events', 8);        # known from X's events only
    my @P = block_hashes($P);
    my @Q = block_hashes($Q);
    my $mark = $env->error_log_offset;

    $pub->event($X, events => [stored(@P), stored(@Q)]);
    my $t0 = time;
    is(server_status(status($env), $X)->{state}, 'fresh', 'fresh');
    my $r = chat($env, $P);
    is("$r->{backend} $r->{matched}", "b$x " . scalar(@P), 'P routed to X');

    ok(!wait_status($env, 0.6, sub {
           server_status($_[0], $X)->{state} ne 'fresh' }),
       'still fresh 0.6 s after its message');
    my $st = wait_status($env, 3, sub {
        server_status($_[0], $X)->{state} eq 'stale' });
    my $dt = time - $t0;
    ok($st, sprintf('stale %.1f s after its last message', $dt));
    cmp_ok($dt, '>=', 0.95, 'not before the heartbeat');
    cmp_ok($dt, '<=', 2.5, 'soon after it');
    ok($env->wait_for_log(
           qr/\[warn\].*server "\Q$X\E" silent for \d+ ms, routing it by learned state/,
           1, $mark), 'warn: silent');
    my @m = $sub->messages(2, sub { @_ >= 1 });
    is_deeply($m[0] && $JSON->decode($m[0][1]),
              { v => 1, type => 'resync', server => $X },
              'a resync request for it');

    my $rq = chat($env, $Q);
    is("$rq->{reason} $rq->{matched}", 'load 0',
       'stale: its event entries are ignored') or diag show($rq);
    my $rp = chat($env, $P);
    is("$rp->{backend} $rp->{reason} $rp->{matched}",
       "b$x affinity " . scalar(@P), 'stale: learned state still routes');

    # one more message in sequence: fresh again, its events count again
    my $R = prompt('again', 8);
    my @R = block_hashes($R);
    $pub->event($X, events => [stored(@R)]);
    is(server_status(status($env), $X)->{state}, 'fresh',
       'the next seq: fresh again');
    my $rr = chat($env, $R);
    is("$rr->{backend} $rr->{reason} $rr->{matched}",
       "b$x affinity " . scalar(@R), 'its events route again');

    ok(wait_status($env, 3, sub {
           server_status($_[0], $X)->{state} eq 'stale' }),
       'silent again: stale again');
    is(scalar(grep { $_->{state} eq 'stale' } @{ status($env)->{servers} }),
       1, 'servers never heard from stay "learned", not stale');

    # a server first heard from in mid-sequence: it missed something
    my $W = $A[0];
    is(server_status(status($env), $W)->{state}, 'learned', 'b1: learned');
    my @n = $sub->messages(0.01);   # drop older resync requests
    $pub->event($W, seq => 42, events => []);
    my $sw = server_status(status($env), $W);
    is("$sw->{state} $sw->{seq} $sw->{events}{gaps}", 'degraded 42 1',
       'first message at seq 42: degraded, a gap');
    @m = $sub->messages(2, sub { grep { $_->[1] =~ /\Q"$W"\E/ } @_ });
    ok((grep { $_->[1] =~ /"server":"\Q$W\E"/ } @m),
       'and asked for a resync');
};

# A server that goes silent while degraded (a gap) or syncing (a snapshot
# that never ends) is silent all the same: past the heartbeat it must be
# stale, and the load it last reported must stop counting.
subtest 'silent while degraded or syncing: stale too' => sub {
    start_with('heartbeat=1s') or return fail('start');
    my $pub = publisher($env);
    my %heavy = (waiting => 400, running => 100);
    my ($D, $S) = @A[0, 1];
    $pub->event($D, events => [], load => \%heavy);
    $pub->event($S, events => [], load => \%heavy);
    $pub->event($D, seq => 5, events => []);            # a gap
    $pub->event($S, snapshot => 'begin', events => []);  # never ends
    my $st = status($env);
    is(server_status($st, $D)->{state}, 'degraded', 'b1 degraded');
    is(server_status($st, $S)->{state}, 'syncing', 'b2 syncing');
    my $r = chat($env, prompt('heavy', 4));
    is($r->{backend}, 'b3', 'their reported queues keep requests away');

    $st = wait_status($env, 3, sub {
        !grep { $_->{state} ne 'stale' }
            map { server_status($_[0], $_) } $D, $S });
    ok($st, 'both stale within 3 s of silence (heartbeat=1s)')
        or diag explain [map { "$_->{name}: $_->{state}" }
                         @{ status($env)->{servers} }];
    my %to;
    $to{ chat($env, prompt("light$_", 4))->{backend} }++ for 1 .. 6;
    ok($to{b1} && $to{b2}, 'their last load no longer counts: b1 and b2 '
                           . 'get new prompts again')
        or diag explain \%to;
};

subtest 'load figures' => sub {
    start_with('heartbeat=60s speculative_ttl=200ms') or return fail('start');
    my $pub = publisher($env);
    # the others fresh: only events and speculative entries count for them
    $pub->event($_, events => []) for @A[1, 2];
    my $x = 1;
    my $X = $A[$x - 1];
    my $P = prompt('loaded', 10);
    my @P = block_hashes($P);

    my $sx = server_status(status($env), $X);
    ok(!exists $sx->{load}, 'no load before the server reports one');

    $pub->event($X, events => [stored(@P)],
                load => { waiting => 3, running => 12, kv_usage => 0.43 });
    $sx = server_status(status($env), $X);
    is_deeply($sx->{load}, { waiting => 3, running => 12,
                             kv_usage => 0.43 }, 'status shows the load');
    my $r = chat($env, $P);
    is("$r->{backend} $r->{reason}", "b$x affinity",
       'a light load: the prefix stays with its server');

    $pub->event($X, load => { waiting => 400, running => 100,
                              kv_usage => 1 });
    $sx = server_status(status($env), $X);
    is_deeply($sx->{load}, { waiting => 400, running => 100,
                             kv_usage => 1 }, 'status: a heavy load');
    $r = chat($env, $P);
    isnt($r->{backend}, "b$x", "a queue of 500: the prefix goes elsewhere "
                               . "($r->{backend}, $r->{reason})");
    is($r->{status}, 200, 'answered');

    $pub->event($X, events => [stored(@P)],
                load => { waiting => 0, running => 0, kv_usage => 0 });
    is_deeply(server_status(status($env), $X)->{load},
              { waiting => 0, running => 0, kv_usage => 0 },
              'status: idle');
    sleep 0.3;                      # the speculative entry of $r expires
    $r = chat($env, $P);
    is("$r->{backend} $r->{reason}", "b$x affinity",
       'idle again: back to its server');

    $pub->event($X, load => { waiting => 2 });
    is(server_status(status($env), $X)->{load}{waiting}, 2,
       'a partial load object updates what it names');
};

$env->stop_nginx;
$env->check_logs_clean('heartbeat');

done_testing;
