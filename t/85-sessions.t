# kv_aware session=: sessions stay where their context lives.
#
#   * a session's requests all go to one server, even when its prompt
#     changes completely from one turn to the next; sessions spread;
#     requests without the header are routed as before;
#   * new sessions whose first prompts share most of their text (a
#     system prompt and tools) spread by capacity instead of piling on
#     the server that holds it;
#   * an idle session (session_timeout) is placed anew;
#   * the binding yields, and the session moves, when its server is
#     stopped (failed), full (max_conns), overloaded (session_margin), or
#     cold (it holds nothing of the prompt that another does not), and
#     $kv_aware_reason says which;
#   * a full table forgets the least recently used; reloads keep the
#     bindings, and a reload may turn session= on; a data-parallel
#     session stays on one rank;
#   * a 1 MB session header: refused by nginx's header limits as any
#     header, or, with room for it, hashed and bound like any other;
#   * the counters in kv_aware_status and its Prometheus page;
#   * nginx -t refuses a constant or empty session=.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(sleep time);

use Test::KvAware qw(skip_unless_module);
use Test::KvAware::Chat qw(chat_body llm_upstream kv_add_headers send_body
                           count_by fmt);

skip_unless_module();

my $SESSION = 'session=$http_x_session_affinity';

sub locations {
    my ($extra) = @_;
    return "        location / {\n            proxy_pass http://llm;\n"
         . ($extra ? "            $extra\n" : '')
         . kv_add_headers()
         . "        }\n"
         . "        location = /kv_status {\n"
         . "            kv_aware_status;\n"
         . "        }\n";
}

# a prompt that shares nothing with any other: a new subject each time
sub prompt {
    my ($tag) = @_;
    return join ' ', map { "$tag-$_ asks about subject $tag number $_." }
                     1 .. 6;
}

sub turn {
    my ($env, $session, $tag, %o) = @_;
    return send_body($env, chat_body('m', user => prompt($tag)), undef,
                     { defined $session
                           ? ('X-Session-Affinity' => $session) : (),
                       %{ $o{headers} || {} } });
}

sub write_conf {
    my ($env, %o) = @_;
    $env->conf(http_config => ($o{http} // '')
                   . llm_upstream(params => 'block_size=64 '
                                  . ($o{session} // $SESSION) . ' '
                                  . ($o{params} // ''),
                                  n => $o{n},
                                  server => $o{server} // 'max_fails=0'),
               config => locations($o{location}));
}

sub start {
    my (%o) = @_;
    my $env = Test::KvAware->new(backends => $o{n} // 3,
                                 log_level => 'info');
    write_conf($env, %o);
    $env->start_nginx or return;
    return $env;
}

sub sessions {
    my ($env) = @_;
    my $r = $env->request(GET => '/kv_status');
    return $r->{json} ? $r->{json}{upstreams}{llm}{sessions} : {};
}


subtest 'nginx -t: session= wants a variable' => sub {
    for my $bad ('session=', 'session=constant', 'session_timeout=500ms',
                 'session_capacity=1', 'session_margin=-1')
    {
        my $env = Test::KvAware->new(backends => 1);
        $env->conf(http_config => llm_upstream(params => $bad, n => 1),
                   config => locations());
        my ($ok, $out) = $env->test_config;
        ok(!$ok, "$bad: refused");
        like($out, qr/kv_aware: invalid session\w* "[^"]*", expected/,
             "$bad: named, with what is expected") or diag $out;
    }
};


subtest 'a session stays on one server, whatever its prompt' => sub {
    my $env = start() or return;

    my @a = map { turn($env, 'alpha', "a$_") } 1 .. 8;
    is(scalar(grep { $_->{status} == 200 && $_->{md5ok} } @a), 8,
       '8 turns: 200, body intact');
    is(scalar(keys %{ count_by(backend => @a) }), 1,
       '8 turns of unrelated prompts on one server')
        or diag fmt(count_by(backend => @a));
    isnt($a[0]{reason}, 'session', 'the first is placed by cost: '
         . $a[0]{reason});
    is(scalar(grep { $_->{reason} eq 'session' } @a[1 .. 7]), 7,
       'the next 7: reason session');

    # sessions spread as new requests do, then each keeps its server
    my %first = map { $_ => turn($env, "s$_", "f$_")->{backend} } 1 .. 9;
    my %by;
    $by{$_}++ for values %first;
    cmp_ok(scalar(keys %by), '>=', 2, 'nine sessions on >= 2 servers')
        or diag fmt(\%by);
    my @moved = grep { turn($env, "s$_", "g$_")->{backend} ne $first{$_} }
                1 .. 9;
    is(scalar @moved, 0, 'each keeps its server on its second turn');

    # no header, or an empty one: routed as before, by cost
    my @none = map { turn($env, undef, "n$_") } 1 .. 6;
    ok(!grep({ $_->{reason} =~ /session/ } @none), 'no header: no session');
    cmp_ok(scalar(keys %{ count_by(backend => @none) }), '>=', 2,
           'no header: unrelated prompts spread');
    my $e = turn($env, '', 'empty');
    unlike($e->{reason}, qr/session/, 'an empty header: no session');

    my $s = sessions($env);
    is($s->{routed}{bound}, 7 + 9, 'status: bound 16');
    is($s->{routed}{new}, 1 + 9, 'status: new 10');
    is($s->{entries}, 10, 'status: 10 sessions');
    is($s->{capacity}, 65536, 'status: capacity, the default');

    my $p = $env->request(GET => '/kv_status?format=prometheus')->{body};
    like($p, qr/^kv_aware_session_requests_total\{upstream="llm",outcome="bound"\} 16$/m,
         'Prometheus: bound');
    like($p, qr/^kv_aware_session_entries\{upstream="llm"\} 10$/m,
         'Prometheus: entries');

    $env->stop_nginx;
    $env->check_logs_clean('sessions');
};


subtest 'an idle session is placed anew' => sub {
    my $env = start(params => 'session_timeout=1s') or return;

    my $a = turn($env, 'idle', 'i1');
    is(turn($env, 'idle', 'i2')->{reason}, 'session', 'bound at first');
    sleep 1.6;
    my $b = turn($env, 'idle', 'i3');
    unlike($b->{reason}, qr/session/, 'after 1.6 s idle: placed anew, '
           . $b->{reason});
    my $s = sessions($env);
    is($s->{expired}, 1, 'status: expired 1');
    is($s->{routed}{new}, 2, 'status: new 2');
    is(turn($env, 'idle', 'i4')->{reason}, 'session', 'then bound again');

    # a session back after its binding expired, its context still held
    # where it was (a history sent again with a new turn): it goes home,
    # though a new session would be placed by capacity
    my $ctx = join ' ', map { "Turn $_: the agent read file $_ and edited "
                              . "it." } 1 .. 30;
    my $h1 = send_body($env, chat_body('m', user => $ctx), undef,
                       { 'X-Session-Affinity' => 'back' });
    sleep 1.6;
    my $h2 = send_body($env, chat_body('m', user => "$ctx And then?"),
                       undef, { 'X-Session-Affinity' => 'back' });
    is($h2->{backend}, $h1->{backend}, 'back after expiry: its own server, '
       . "where its history is ($h2->{reason})");

    $env->stop_nginx;
    $env->check_logs_clean('idle');
};


subtest 'its server stopped: the binding yields and moves' => sub {
    # a connection to it kept alive (nginx 1.30's default) is reset once
    # the request is sent: a POST is retried with non_idempotent (t/12)
    my $env = start(location => 'proxy_next_upstream error timeout '
                                . 'non_idempotent;') or return;

    my $a = turn($env, 'gone', 'd1');
    my ($i) = $a->{backend} =~ /(\d+)$/;
    $env->backend_stop($i);

    my $b = turn($env, 'gone', 'd2');
    is($b->{status}, 200, 'answered by another server');
    isnt($b->{backend}, $a->{backend}, "not $a->{backend}");
    is($b->{reason}, 'session:yielded:failed', 'reason: yielded, failed');

    # max_fails=0: the stopped server is a candidate again, but the
    # session is bound where it moved
    $env->backend_start($i);
    my $c = turn($env, 'gone', 'd3');
    is("$c->{backend} $c->{reason}", "$b->{backend} session",
       'the next turn follows it where it moved');
    is(sessions($env)->{routed}{failed}, 1, 'status: failed 1');

    $env->stop_nginx;
    $env->check_logs_clean('stopped');
};


subtest 'its server full or overloaded: the binding yields' => sub {
    my $env = start(server => 'max_fails=0 max_conns=1') or return;

    my $a = turn($env, 'full', 'x1');
    my $h = $env->hold([[POST => '/v1/chat/completions',
                         chat_body('m', user => prompt('x2')),
                         { 'Content-Type' => 'application/json',
                           'X-Session-Affinity' => 'full' }]]);
    my $t0 = time;
    sleep 0.2 while time - $t0 < 10 && !grep { $_->{in_flight} }
        @{ $env->request(GET => '/kv_status')->{json}{upstreams}{llm}{servers} };
    my $b = turn($env, 'full', 'x3');
    isnt($b->{backend}, $a->{backend}, 'its server at max_conns: another');
    is($b->{reason}, 'session:yielded:full', 'reason: yielded, full');
    my ($held) = $env->release($h);
    is($held->{headers}{'x-kv-reason'}, 'session', 'the held one was bound');
    is(turn($env, 'full', 'x4')->{backend}, $b->{backend},
       'the session moved with it');
    $env->stop_nginx;
    $env->check_logs_clean('full');

    # a margin of half a request in flight: one held request overloads
    for my $case ([ 'session_margin=0.5', 'session:yielded:overloaded' ],
                  [ '', 'session' ])
    {
        my ($params, $want) = @$case;
        $env = start(params => $params) or return;
        $a = turn($env, 'busy', 'y1');
        $h = $env->hold([[POST => '/v1/chat/completions',
                          chat_body('m', user => prompt('y2')),
                          { 'Content-Type' => 'application/json',
                            'X-Session-Affinity' => 'busy' }]]);
        $t0 = time;
        sleep 0.2 while time - $t0 < 10 && !grep { $_->{in_flight} }
            @{ $env->request(GET => '/kv_status')
                   ->{json}{upstreams}{llm}{servers} };
        $b = turn($env, 'busy', 'y3');
        is($b->{reason}, $want, ($params || 'the default margin')
           . ": one request in flight there: $want");
        $env->release($h);
        $env->stop_nginx;
        $env->check_logs_clean("margin $params");
    }
};


subtest 'its server holds nothing more than another: cold' => sub {
    my $env = start() or return;

    # ~1 KB of system prompt all sessions share, a short question each
    my $sys = join ' ', map { "Rule $_: answer precisely, cite sources." }
                        1 .. 24;
    my $a = turn($env, 'cold', 'k1');
    my $b = send_body($env, chat_body('m', system => $sys, user => 'q0'),
                      undef, { 'X-Session-Affinity' => 'warm' });
    isnt($b->{backend}, $a->{backend},
         'another session took the shared prompt elsewhere');
    my $c = send_body($env, chat_body('m', system => $sys, user => 'q1'),
                      undef, { 'X-Session-Affinity' => 'cold' });
    is("$c->{backend} $c->{reason}", "$b->{backend} session:yielded:cold",
       'its server holds none of it: the session moves where it is');
    my $d = send_body($env, chat_body('m', system => $sys, user => 'q2'),
                      undef, { 'X-Session-Affinity' => 'cold' });
    is("$d->{backend} $d->{reason}", "$b->{backend} session",
       'and stays there');

    # unrelated prompts (nothing held anywhere) never make it cold
    is(turn($env, 'cold', 'k2')->{reason}, 'session',
       'a prompt nobody holds: bound');
    is(sessions($env)->{routed}{cold}, 1, 'status: cold 1');

    $env->stop_nginx;
    $env->check_logs_clean('cold');
};


# A session whose server holds under affinity_min of a long prompt (a
# context its server evicted, a large tool output) goes where the usual
# choice puts it by capacity, as it would without session=: kept, it
# overfilled a server its sessions had outgrown (bench/README.md).
subtest 'its server holds little of a long prompt, another has room: cold'
    => sub {
    my $env = start(n => 2) or return;

    # three turns of unrelated prompts: its server stores all three
    my @t = map { turn($env, 'thin', "t$_") } 1 .. 3;
    my $home = $t[0]{backend};
    my ($other) = grep { $_ ne $home } qw(b1 b2);
    is(scalar(grep { $_->{backend} eq $home } @t), 3,
       "three turns on $home");

    # the last prompt, then much more: its server holds a few blocks
    my $long = prompt('t3') . ' ' . join ' ', map {
        "Then tool output $_ came back with a line of text." } 1 .. 60;
    my $r = send_body($env, chat_body('m', user => $long), undef,
                      { 'X-Session-Affinity' => 'thin' });
    is("$r->{backend} $r->{reason}", "$other session:yielded:cold",
       "it moves to $other, emptier once what $home holds is counted");
    my $n = send_body($env, chat_body('m', user => "$long And then?"),
                      undef, { 'X-Session-Affinity' => 'thin' });
    is("$n->{backend} $n->{reason}", "$other session", 'and stays there');
    is(sessions($env)->{routed}{cold}, 1, 'status: cold 1');

    $env->stop_nginx;
    $env->check_logs_clean('thin');
};


subtest 'new sessions sharing a system prompt spread by capacity' => sub {
    my $env = start() or return;

    # ~1 KB of system prompt and tools all sessions share, most of a
    # first prompt: by the match, every first turn would follow the
    # server that holds it, and the sessions grow there
    my $sys = join ' ', map { "Tool $_: reads a file and returns it." }
                        1 .. 24;
    my $task = 'read the files of the repository and sum them up. ' x 4;
    my @first = map {
        send_body($env, chat_body('m', system => $sys,
                                  user => "task $_: $task"),
                  undef, { 'X-Session-Affinity' => "agent$_" })
    } 1 .. 6;
    is(scalar(grep { $_->{status} == 200 } @first), 6, '6 first turns: 200');
    is(scalar(keys %{ count_by(backend => @first) }), 3,
       'six new sessions on all three servers')
        or diag fmt(count_by(backend => @first));
    is(scalar(grep { $_->{reason} eq 'capacity' } @first[1 .. 5]), 5,
       'those after the first (which matched nothing): reason capacity')
        or diag join ' ', map { $_->{reason} } @first;

    # without the header, as before: the match draws them to its holder
    my @plain = map {
        send_body($env, chat_body('m', system => $sys,
                                  user => "plain $_: $task"))
    } 1 .. 6;
    is(scalar(grep { $_->{reason} eq 'affinity' } @plain), 6,
       'without a session: by the match (affinity)')
        or diag join ' ', map { $_->{reason} } @plain;

    $env->stop_nginx;
    $env->check_logs_clean('new sessions');
};


subtest 'a full table forgets the least recently used' => sub {
    my $env = start(params => 'session_capacity=16') or return;

    turn($env, "c$_", "c$_") for 1 .. 20;
    my $s = sessions($env);
    is("$s->{entries} $s->{capacity} $s->{evicted}", '16 16 4',
       '20 sessions in 16: 16 held, 4 evicted');
    unlike(turn($env, 'c1', 'c1b')->{reason}, qr/^session$/,
           'the oldest was forgotten');
    is(turn($env, 'c20', 'c20b')->{reason}, 'session',
       'the newest is still bound');

    $env->stop_nginx;
    $env->check_logs_clean('capacity');
};


subtest 'reloads: bindings kept, session= turned on' => sub {
    my $env = start(session => '') or return;
    unlike(turn($env, 'r', 'r1')->{reason}, qr/session/,
           'without session=: no session');
    is(sessions($env)->{capacity}, 0, 'status: capacity 0');

    write_conf($env);
    $env->reload or return;
    my $a = turn($env, 'r', 'r2');
    unlike($a->{reason}, qr/session/, 'turned on: the first is placed');
    is(turn($env, 'r', 'r3')->{reason}, 'session', 'then bound');

    $env->reload or return;
    my $b = turn($env, 'r', 'r4');
    is("$b->{backend} $b->{reason}", "$a->{backend} session",
       'a reload keeps the binding');

    $env->stop_nginx;
    $env->check_logs_clean('reloads');
};


subtest 'data-parallel: a session stays on one rank' => sub {
    my $env = start(n => 2, params => 'data_parallel=2',
                    location => 'proxy_set_header X-data-parallel-rank '
                                . '$kv_aware_dp_rank;') or return;
    my %at;
    for my $t (1 .. 6) {
        my $r = $env->request(POST => '/v1/chat/completions',
                              chat_body('m', user => prompt("dp$t")),
                              { 'Content-Type' => 'application/json',
                                'X-Session-Affinity' => 'ranked' });
        $at{ ($r->{headers}{'x-backend'} // '-') . '#'
             . ($r->{headers}{'x-backend-rank'} // '-') }++;
    }
    is(scalar(keys %at), 1, '6 turns on one server and rank')
        or diag fmt(\%at);
    unlike((keys %at)[0], qr/#-$/, 'the rank went to the server');

    $env->stop_nginx;
    $env->check_logs_clean('data-parallel');
};


subtest 'a 1 MB session header' => sub {
    my $big = 'k' x (1024 * 1024);

    # nginx's own limits (large_client_header_buffers) refuse it first
    my $env = start() or return;
    my $r = turn($env, $big, 'h1');
    cmp_ok($r->{status}, '>=', 400, "default header limits: $r->{status}");
    is(turn($env, 'small', 'h2')->{status}, 200, 'nginx goes on');
    $env->stop_nginx;
    $env->check_logs_clean('1 MB refused');

    # with room for it: hashed, bound as any session, never stored (nor
    # sent on: the test backends take headers of 64 KB at most)
    $env = start(http => "    large_client_header_buffers 4 2m;\n",
                 location => 'proxy_set_header X-Session-Affinity "";')
        or return;
    my $t0 = time;
    my @r = map { turn($env, $big, "h$_") } 1 .. 5;
    my $took = time - $t0;
    is(scalar(grep { $_->{status} == 200 } @r), 5, '5 requests: 200')
        or diag join ' ', map { $_->{status} } @r;
    is(scalar(keys %{ count_by(backend => @r) }), 1, 'all on one server');
    is(scalar(grep { $_->{reason} eq 'session' } @r), 4, '4 bound');
    my $other = turn($env, substr($big, 1) . 'x', 'h9');
    isnt($other->{reason}, 'session', 'one byte apart: another session');
    cmp_ok($took, '<', 10, sprintf('5 requests in %.2f s', $took));
    is(sessions($env)->{entries}, 2, 'two sessions in the table');
    $env->stop_nginx;
    $env->check_logs_clean('1 MB bound');
};

done_testing();
