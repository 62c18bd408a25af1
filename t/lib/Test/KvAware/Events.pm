package Test::KvAware::Events;

# Helpers for the precise-mode tests (t/3*.t): kv_aware fed by KV events
# from Redis.  On top of Test::KvAware (nginx, backends, redis):
#
#   * preflight(): skip unless the module, redis and gcc are there;
#   * block_hashes($body), through t/lib/kva_hashes.c built against src/,
#     so that the tests publish exactly the hashes the module computes;
#   * prompt(), chat(), upstream_conf(), $LOCATIONS: requests and config;
#   * status(), server_status(), wait_status(), wait_until(), seen():
#     kv_aware_status polling;
#   * Redis connections (Test::KvAware::Redis, on libredis-perl):
#     redis_connect, redis_subscribe, publisher with ->event /
#     ->publish_raw / ->pipeline, numsub();
#   * traffic(): requests from a forked child while a test disturbs nginx.
#
# Paths are relative to the repository root, where prove runs.

use strict;
use warnings;

use Exporter qw(import);
use File::Temp ();
use JSON::PP ();
use POSIX ();
use Test::More ();
use Time::HiRes qw(time sleep);

use Test::KvAware qw(skip_unless_module);
use Test::KvAware::Redis ();

our @EXPORT_OK = qw(
    $JSON $CHANNEL $BS $LOCATIONS
    preflight block_hashes prompt chat show addr bnum upstream_conf
    status server_status wait_status wait_until seen
    redis_connect redis_subscribe numsub publisher
    stored removed cleared traffic fill_index timed_chats
);

our $JSON = JSON::PP->new->canonical->utf8;
our $CHANNEL = 'kv_aware:events';       # the module's default channel
our $BS = 64;                           # block_size of every test upstream

sub preflight {
    skip_unless_module();
    for my $bin ('redis-server', 'redis-cli', 'gcc') {
        Test::More::plan(skip_all => "$bin is not installed")
            unless grep { -x "$_/$bin" } split /:/, $ENV{PATH};
    }
}

# The module's own hasher (t/lib/kva_hashes.c with the core's libkva.a),
# made once: the Makefile knows what it is built from.
my $HASHER;
sub hasher {
    return $HASHER if $HASHER;
    my $bin = POSIX::getcwd() . '/build/kva_hashes';
    my $out = qx{make -s --no-print-directory $bin 2>&1};
    Test::More::BAIL_OUT("cannot build t/lib/kva_hashes.c:\n$out")
        if $? || !-x $bin;
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

# POSTs a chat body; what the routing headers say.  quiet => 1: no diag
# on a failed request (traffic() expects some during restarts).
sub chat {
    my ($env, $body, %o) = @_;
    my $r = $env->request(POST => '/v1/chat/completions', $body,
                          { 'Content-Type' => 'application/json',
                            %{ $o{headers} || {} } });
    Test::More::diag("request error: $r->{error}")
        if $r->{error} && !$o{quiet};
    return {
        status  => $r->{status},
        backend => $r->{headers}{'x-backend'} // '-',
        reason  => $r->{headers}{'x-kv-reason'} // '-',
        matched => $r->{headers}{'x-kv-matched'} // -1,
        blocks  => $r->{headers}{'x-kv-blocks'} // -1,
        rank    => $r->{headers}{'x-backend-rank'} // '-',
    };
}

sub show { my ($r) = @_; join ' ', map { "$_=$r->{$_}" } sort keys %$r }

# server address of backend bN ("127.0.0.1:PORT"), and back
sub addr { my ($env, $i) = @_; '127.0.0.1:' . $env->backend_port($i) }
sub bnum { my ($name) = @_; $name =~ /^b(\d+)$/ ? $1 : 0 }

# The "llm" upstream: n => servers (3), kv_aware => its parameters,
# events => those of kv_aware_events.
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

# The routing decision goes back in headers, for chat().
our $LOCATIONS = <<'EOF';
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

# wait_until($timeout, $cond): the harness's, re-exported for the tests
{ no warnings qw(once); *wait_until = \&Test::KvAware::wait_until; }

# Every message nginx took from Redis is counted once: applied or rejected.
sub seen {
    my ($st) = @_;
    my $n = $st->{events}{messages};
    $n += $_ for values %{ $st->{events}{rejected} };
    return $n;
}


# --- Redis connections (Test::KvAware::Redis: libredis-perl) -------------

# A connection, AUTH @auth (password, or user and password) if given.
sub redis_connect {
    my ($port, @auth) = @_;
    return Test::KvAware::Redis->new($port, auth => \@auth);
}

# A subscriber connection: ->messages($timeout, $until) collects
# [channel, payload] pairs until $until->(@so_far) holds or time is up.
# A hash ref first: options of the connection ({auth => [...]}).
sub redis_subscribe {
    my ($port, @channels) = @_;
    my %o = ref $channels[0] eq 'HASH' ? %{ shift @channels } : ();
    return Test::KvAware::Redis->new($port, %o)->subscribe(@channels);
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
    my $p = bless redis_connect($env->redis_port, @auth),
                  'Test::KvAware::Events::Publisher';
    $p->{env} = $env;
    $p->{seq} = {};
    return $p;
}

sub stored  { return { type => 'stored',  hashes => [@_] } }
sub removed { return { type => 'removed', hashes => [@_] } }
sub cleared { return { type => 'cleared' } }

# Fills the index past $fill (1.0) of its capacity with made-up hashes of
# the servers @$servers, 8,000 a message (under max_hashes), pacing a
# second every 20 messages per server so that each stays within its
# per-second budget of hashes.  The status afterwards.  Hashes sent are
# not all kept: a chain at its cap evicts within its bucket before the
# index is full, and a message refused as over a budget counts as seen
# (t/45 found 788,510 and once 562,305 of 921,005 entries used; the
# second most likely the bucket hash's weakness on keys in progression,
# such as these, fixed since: t/unit/test_index.c): so
# more are sent, a tenth of the capacity at a time (two rounds at most),
# until 0.97 of $fill of it (of all of it at most) is used.  Each
# round's figures go to note(), or to diag() when it falls short.
sub fill_index {
    my ($env, $pub, $servers, $fill) = @_;
    my $st0 = status($env);
    my $cap = $st0->{index}{capacity};
    my $target = $cap * ($fill // 1);
    my ($m, $sent, $st, $full, @said) = (0, 0);
    for my $round (0 .. 2) {
        while ($sent < $target + $round * $cap * 0.1 && $m < 500) {
            $m++;
            my @h = map { sprintf '%016x', ($m << 32) + $_ } 1 .. 8000;
            $pub->event($servers->[($m - 1) % @$servers],
                        events => [stored(@h)]);
            $sent += @h;
            sleep 1.05 if $m % (20 * @$servers) == 0;
        }
        # the last messages may still be on their way (ASan is slow): the
        # index is as full as it gets once nginx has taken all of them
        $st = wait_status($env, 20, sub { seen($_[0]) - seen($st0) >= $m })
              || status($env);
        my $ev = $st->{events} || {};
        push @said, sprintf 'fill_index round %d: %d messages, %d hashes '
            . 'sent, %d seen, %d refused; %d of %d entries used, %d chain '
            . 'evictions', $round, $m, $sent, seen($st) - seen($st0),
            (seen($st) - seen($st0)) - (($ev->{messages} // 0)
                                        - ($st0->{events}{messages} // 0)),
            $st->{index}{used} // 0, $cap,
            $st->{index}{chain_evictions} // 0;
        $full = ($st->{index}{used} // 0)
                >= 0.97 * ($target < $cap ? $target : $cap);
        last if $full;
        sleep 1.05 if $round < 2;   # a fresh second of the budgets
    }
    # short of it, the rounds' figures are what CI's log must show
    $full ? Test::More::note($_) : Test::More::diag($_) for @said;
    return $st;
}

# Requests of $body in turn, each timed: [start, end, worker] each (the
# worker from an X-Worker header the location adds), until
# $until->(count so far), or $until requests if it is a number (2,000
# at most); () as soon as one is not answered 200 by $backend (said).
# t/39 and t/45 tell by the worker which requests waited for the lock.
sub timed_chats {
    my ($env, $body, $backend, $until) = @_;
    my $enough = ref $until ? $until : sub { $_[0] >= $until };
    my @t;
    for my $i (1 .. 2000) {
        last if $enough->(scalar @t);
        my $t0 = time;
        my $r = $env->request(POST => '/v1/chat/completions', $body,
                              { 'Content-Type' => 'application/json' });
        my $h = $r->{headers} || {};
        push @t, [$t0, time, $h->{'x-worker'} // 0];
        next if ($r->{status} // 0) == 200
                && ($h->{'x-backend'} // '-') eq $backend;
        Test::More::diag("request $i: " . ($r->{status} // '-') . ' '
                         . ($h->{'x-backend'} // '-') . ' '
                         . ($h->{'x-kv-reason'} // $r->{error} // '-'));
        return ();
    }
    return @t;
}

# Requests in a forked child until stop(): ->stop returns their results
# ([status, backend, reason] each).  A child, so that the test can stop
# redis, reload or kill workers meanwhile.  The handle going out of scope
# stops it too (a subtest that returned early), and the child gives up
# after 120 s or when the test is gone: prove waits for every process
# holding its pipe.
sub traffic {
    my ($env, @bodies) = @_;
    my $file = $env->prefix . "/traffic-$$-" . int(rand 1e9);
    my $parent = $$;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        my $stop = 0;
        $SIG{TERM} = sub { $stop = 1 };
        open(my $fh, '>', $file) or POSIX::_exit(1);
        $fh->autoflush(1);
        my $i = 0;
        my $deadline = time + 120;
        until ($stop || time > $deadline || getppid() != $parent) {
            my $r = chat($env, $bodies[$i++ % @bodies], quiet => 1);
            print {$fh} "$r->{status} $r->{backend} $r->{reason}\n";
            sleep 0.01;
        }
        close $fh;
        POSIX::_exit(0);   # the parent's END blocks (Test::More's) are not ours
    }
    return bless { pid => $pid, file => $file, owner => $$ },
                 'Test::KvAware::Events::Traffic';
}


# ---------------------------------------------------------------------------
# A publisher, from publisher(): a Redis connection that knows its nginx.

package Test::KvAware::Events::Publisher;

our @ISA = qw(Test::KvAware::Redis);

# ->event($server, events => [...], seq => N, ...) publishes one v1
# message (seq defaults to the server's next) and waits (5 s) until nginx
# has taken it in (applied or rejected); returns the number of
# subscribers that PUBLISH reported.  Publisher connections only.
sub event {
    my ($p, $server, %m) = @_;
    # a data-parallel server counts seq per rank
    my $key = defined $m{rank} ? "$server#$m{rank}" : $server;
    my $seq = delete $m{seq} // ($p->{seq}{$key} // 0) + 1;
    $p->{seq}{$key} = $seq;
    return $p->publish_raw($JSON->encode({ v => 1, server => $server,
                                           seq => $seq, %m }));
}

# Waiting for nginx to count the message keeps each assertion after a
# publish free of races.  channel => another channel than $CHANNEL.
sub publish_raw {
    my ($p, $msg, %o) = @_;
    my $env = $p->{env};
    my $before = Test::KvAware::Events::seen(
                     Test::KvAware::Events::status($env));
    my $n = $p->cmd(PUBLISH => $o{channel} // $CHANNEL, $msg);
    Test::KvAware::Events::wait_status($env, 5, sub {
            Test::KvAware::Events::seen($_[0]) > $before })
        or Test::More::diag("nginx did not take in: " . substr($msg, 0, 200));
    return $n;
}


# ---------------------------------------------------------------------------
# The handle traffic() returns.

package Test::KvAware::Events::Traffic;

# requests answered so far
sub count {
    my ($t) = @_;
    open(my $fh, '<', $t->{file}) or return 0;
    my @l = <$fh>;
    return scalar @l;
}

sub stop {
    my ($t) = @_;
    my $pid = delete $t->{pid} or return ();
    kill 'TERM', $pid;
    waitpid($pid, 0);
    open(my $fh, '<', $t->{file}) or return ();
    return map { chomp; [split ' '] } <$fh>;
}

sub DESTROY {
    my ($t) = @_;
    local ($?, $!);
    $t->stop if $t->{owner} == $$;
}

1;
