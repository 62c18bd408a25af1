# kv_aware precise mode: KV events from Redis drive routing.
#
#   * a "stored" event for a prefix on server X routes it to X although
#     nginx learned another server for it; once that other server is fresh
#     too, its learned guess is ignored;
#   * routing to a fresh server leaves speculative entries for
#     speculative_ttl, no longer;
#   * "removed" cuts the match at the removed block, events apply in
#     order, "cleared" empties the server;
#   * a gap in seq makes the server degraded (its events are not trusted),
#     publishes one resync request on <channel>:resync (at most one a
#     second), and snapshots ("full", "begin".."end") make it fresh again;
#   * pattern=on: PSUBSCRIBE, events from any matching channel, resync
#     requests on resync_channel.
#
# Block hashes come from t/lib/kva_hashes.c, built against src/.

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
$env->conf(http_config => upstream_conf(
               kv_aware => 'learned_ttl=10m',
               events => 'heartbeat=60s speculative_ttl=1s'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }),
   'subscribed to redis');
my $pub = publisher($env);
my @A = map { addr($env, $_) } 1 .. 3;      # $A[i-1]: server of bi

sub other { my ($i) = @_; $i % 3 + 1 }      # another backend number

subtest 'stored events beat learned affinity' => sub {
    my $P = prompt('alpha', 12);
    my @H = block_hashes($P);
    cmp_ok(scalar @H, '>=', 12, 'prompt has >= 12 blocks');

    my $r1 = chat($env, $P);
    is($r1->{reason}, 'load', 'first sight: routed by load');
    my $y = bnum($r1->{backend});
    my $r2 = chat($env, $P);
    is($r2->{backend}, "b$y", 'learned: same server again');
    is($r2->{reason}, 'affinity', 'learned: affinity');

    my $x = other($y);
    is($pub->event($A[$x - 1], events => [stored(@H)]), 1,
       'PUBLISH reached exactly one subscriber');
    my $st = status($env);
    my $sx = server_status($st, $A[$x - 1]);
    is($sx->{state}, 'fresh', 'first message (seq 1): fresh');
    is($sx->{entries}{event}, scalar @H, 'event entries = stored hashes');
    is($sx->{events}{messages}, 1, 'server counted 1 message');
    is($sx->{events}{hashes}, scalar @H, 'server counted the hashes');
    is($st->{events}{hashes}, scalar @H, 'upstream counted the hashes');
    is(server_status($st, $A[$y - 1])->{state}, 'learned',
       'the learned server has no events: learned');

    my $r3 = chat($env, $P);
    is($r3->{backend}, "b$x", "now the event server b$x wins")
        or diag show($r3);
    is($r3->{reason}, 'affinity', 'reason affinity');
    is($r3->{matched}, scalar @H, 'matched == blocks');
    is($r3->{blocks}, scalar @H, 'blocks as computed by the hasher');

    # the learned server becomes fresh too: its learned guess is dropped
    $pub->event($A[$y - 1], events => []);
    is(server_status(status($env), $A[$y - 1])->{state}, 'fresh',
       'a heartbeat (seq 1) makes the learned server fresh');
    sleep 1.1;                      # b$x's speculative entries expire
    my $r4 = chat($env, $P);
    is($r4->{backend}, "b$x", 'still the event server') or diag show($r4);
    is($r4->{matched}, scalar @H, 'matched == blocks');
};

subtest 'fresh servers: learned ignored, speculative bridges' => sub {
    # every server fresh (a heartbeat each)
    $pub->event($_, events => []) for @A;
    my $st = status($env);
    is(scalar(grep { $_->{state} eq 'fresh' } @{ $st->{servers} }), 3,
       'three fresh servers');

    my $Q = prompt('bravo', 10);
    my @H = block_hashes($Q);
    my $r1 = chat($env, $Q);
    is($r1->{reason}, 'load', 'new prompt: load');
    my $t = bnum($r1->{backend});
    my $sp = server_status(status($env), $A[$t - 1]);
    is($sp->{entries}{speculative}, scalar @H,
       'routing to a fresh server records speculative entries');
    my $r2 = chat($env, $Q);
    is($r2->{backend}, "b$t", 'within speculative_ttl: same server');
    is($r2->{reason}, 'affinity', 'affinity from speculative entries');
    is($r2->{matched}, scalar @H, 'matched == blocks');

    sleep 1.2;                      # speculative_ttl=1s
    my $r3 = chat($env, $Q);
    is($r3->{reason}, 'load',
       'speculative entries expired, learned ones ignored: load')
        or diag show($r3);
    is($r3->{matched}, 0, 'matched 0');

    my $s = other(bnum($r3->{backend}));
    $pub->event($A[$s - 1], events => [stored(@H)]);
    sleep 1.1;
    my $r4 = chat($env, $Q);
    is($r4->{backend}, "b$s", 'the server that reported it wins');
    is($r4->{matched}, scalar @H, 'matched == blocks');
};

subtest 'removed and cleared' => sub {
    my $R = prompt('charlie', 12);
    my @H = block_hashes($R);
    my $x = 2;
    $pub->event($A[$x - 1], events => [stored(@H)]);
    my $r1 = chat($env, $R);
    is($r1->{backend}, "b$x", 'stored: routed to it');
    is($r1->{matched}, scalar @H, 'matched == blocks');

    my $before = server_status(status($env), $A[$x - 1])->{entries}{event};
    $pub->event($A[$x - 1], events => [removed($H[5])]);
    my $sx = server_status(status($env), $A[$x - 1]);
    is($sx->{entries}{event}, $before - 1, 'removed: one event entry less');
    my $r2 = chat($env, $R);
    is($r2->{backend}, "b$x", 'removed block 5: still there');
    is($r2->{matched}, 5, 'matched stops at the removed block');

    # stored + removed in one message, applied in order
    $pub->event($A[$x - 1], events => [stored(@H), removed(@H[2 .. 11])]);
    my $r3 = chat($env, $R);
    is($r3->{matched}, 2, 'events apply in order: matched 2');

    $pub->event($A[$x - 1], events => [cleared()]);
    $sx = server_status(status($env), $A[$x - 1]);
    is($sx->{entries}{event}, 0, 'cleared: no event entries');
    is($sx->{entries}{speculative}, 0, 'cleared: no speculative entries');
    is($sx->{entries}{learned}, 0, 'cleared: no learned entries');
    is($sx->{state}, 'fresh', 'still fresh');
    my $r4 = chat($env, $R);
    is($r4->{reason}, 'load', 'cleared: nobody holds it') or diag show($r4);
    is($r4->{matched}, 0, 'matched 0');
};

subtest 'gap: degraded, resync asked; snapshots restore' => sub {
    my $x = 3;
    my $name = $A[$x - 1];
    my $sub = redis_subscribe($env->redis_port, "$CHANNEL:resync");
    my $G = prompt('delta', 12);
    my @G = block_hashes($G);
    my $P = prompt('echo', 8);
    my @P = block_hashes($P);
    $pub->event($name, events => [stored(@P)]);

    my $st0 = status($env);
    my $seq = $pub->{seq}{$name};
    $pub->event($name, seq => $seq + 2, events => [stored(@G)]);
    my $st = status($env);
    my $sx = server_status($st, $name);
    is($sx->{state}, 'degraded', 'seq skipped one: degraded');
    is($sx->{seq}, $seq + 2, 'status shows the last seq');
    is($sx->{events}{gaps}, server_status($st0, $name)->{events}{gaps} + 1,
       'gap counted');
    is($st->{events}{resyncs}, $st0->{events}{resyncs} + 1,
       'one resync request counted');
    my @m = $sub->messages(3, sub { @_ >= 1 });
    is(scalar @m, 1, 'a resync request was published');
    is_deeply($m[0] && $JSON->decode($m[0][1]),
              { v => 1, type => 'resync', server => $name },
              'resync request: v, type, server');
    is($m[0] && $m[0][0], "$CHANNEL:resync", 'on <channel>:resync');

    my $r1 = chat($env, $G);
    is($r1->{reason}, 'load', 'degraded: its events are not trusted')
        or diag show($r1);

    # more gaps right away: no second request within a second
    $pub->event($name, seq => $seq + 5, events => []);
    $pub->event($name, seq => $seq + 9, events => []);
    @m = $sub->messages(0.3);
    is(scalar @m, 0, 'resync requests: at most one a second per server');
    is(server_status(status($env), $name)->{events}{gaps},
       $sx->{events}{gaps} + 2, 'the later gaps counted too');

    # the answer: a one-message snapshot with G only
    $pub->event($name, seq => $seq + 20, snapshot => 'full',
                events => [stored(@G)]);
    $sx = server_status(status($env), $name);
    is($sx->{state}, 'fresh', 'snapshot "full": fresh');
    is($sx->{entries}{event}, scalar @G,
       'snapshot replaced the event entries (P dropped, G kept)');
    sleep 1.1;                      # speculative entries of $r1 expire
    my $r2 = chat($env, $G);
    is($r2->{backend}, "b$x", 'fresh again: routed by its events')
        or diag show($r2);
    is($r2->{matched}, scalar @G, 'matched == blocks');
    my $r3 = chat($env, $P);
    is("$r3->{reason} $r3->{matched}", 'load 0',
       'what the snapshot dropped no longer matches');

    $pub->event($name, events => []);
    is(server_status(status($env), $name)->{state}, 'fresh',
       'the next seq after the snapshot: still fresh');

    # a snapshot in parts: syncing until "end"
    my $gaps = server_status(status($env), $name)->{events}{gaps};
    $pub->event($name, snapshot => 'begin', events => [stored(@P[0 .. 3])]);
    $sx = server_status(status($env), $name);
    is($sx->{state}, 'syncing', 'snapshot "begin": syncing');
    is($sx->{entries}{event}, 4, 'begin replaced the event entries');
    $pub->event($name, snapshot => 'more', events => [stored(@P[4 .. 5])]);
    is(server_status(status($env), $name)->{state}, 'syncing',
       '"more": still syncing');
    $pub->event($name, snapshot => 'end', events => [stored(@P[6 .. $#P])]);
    $sx = server_status(status($env), $name);
    is($sx->{state}, 'fresh', '"end": fresh');
    is($sx->{entries}{event}, scalar @P, 'all parts applied');
    is($sx->{events}{gaps}, $gaps, 'no gap counted');
    sleep 1.1;
    my $r4 = chat($env, $P);
    is($r4->{backend}, "b$x", 'routed by the snapshot') or diag show($r4);
    is($r4->{matched}, scalar @P, 'matched == blocks');
};

subtest 'pattern=on: one subscription for many channels' => sub {
    like($env->error_log, qr/\[info\].*events of "\Q$A[2]\E" out of sequence/,
         'the gap above was logged at info');
    $env->stop_nginx;
    $env->conf(http_config => upstream_conf(kv_aware => '',
                   events => 'heartbeat=60s channel=kv:ev:* pattern=on '
                           . 'resync_channel=kv:resync'),
               config => $LOCATIONS);
    $env->start_nginx or return;
    ok(wait_until(5, sub { $env->redis_cli(PUBSUB => 'NUMPAT') == 1 }),
       'PSUBSCRIBE: one pattern');
    my $p = publisher($env);
    my $sub = redis_subscribe($env->redis_port, 'kv:resync');
    my $T = prompt('pattern', 8);
    my @H = block_hashes($T);
    for my $i (1, 3) {
        is($p->publish_raw($JSON->encode({ v => 1, server => $A[$i - 1],
                seq => 1, events => $i == 3 ? [stored(@H)] : [] }),
                channel => "kv:ev:b$i"), 1, "published on kv:ev:b$i");
    }
    my $r = chat($env, $T);
    is("$r->{backend} $r->{reason} $r->{matched}",
       'b3 affinity ' . scalar(@H), 'events from a matching channel route');
    $p->publish_raw($JSON->encode({ v => 1, server => $A[0], seq => 3 }),
                    channel => 'kv:ev:b1');
    my @m = $sub->messages(3, sub { @_ >= 1 });
    is_deeply(@m ? $JSON->decode($m[0][1]) : undef,
              { v => 1, type => 'resync', server => $A[0] },
              'a gap: resync request on resync_channel');
    is(seen(status($env)), 3, 'nothing else came in (pings are not events)');
};

$env->stop_nginx;
$env->check_logs_clean('events');

done_testing;
