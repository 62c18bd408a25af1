# Router replicas that learn together (kv_aware_events share=on): two nginx
# in front of the same three servers, one Redis, and no events from the
# servers at all.  Each nginx publishes what it routed on
# CHANNEL:learned and takes in what the other routed as learned entries,
# so that the turns of a conversation alternating between the two still
# reach one server; a Redis outage leaves each with its own learning.

use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use KvAware::Launch qw(free_ports wait_until);
use Test::KvAware ();
use Test::KvAware::Events qw($LOCATIONS preflight upstream_conf);

preflight();

my $json = JSON::PP->new->utf8->canonical;
my $http = HTTP::Tiny->new(timeout => 10);

# nginx A: the harness's, with its backends and Redis
my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 2);
$env->conf(http_config => upstream_conf(kv_aware => 'learned_ttl=10m',
                                        events => 'share=on heartbeat=60s'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx A did not start: ' . $env->last_error);

# nginx B: the same upstream, its own prefix and port
my ($port_b) = free_ports(1);
my $lb = KvAware::Launch->new(template => 'share-b-XXXXXX', watchdog => 1,
                              diag => \&diag);
{
    my $servers = join '', map {
        "        server 127.0.0.1:" . $env->backend_port($_)
        . " max_fails=0;\n" } 1 .. 3;
    my $redis = $env->redis_port;
    $lb->write_nginx_conf(workers => 2, http => <<EOF);
    upstream llm {
        kv_aware block_size=64 learned_ttl=10m;
        kv_aware_events redis=127.0.0.1:$redis share=on heartbeat=60s;
$servers    }

    server {
        listen 127.0.0.1:$port_b;
$LOCATIONS    }
EOF
    my ($ok, $err) = $lb->start_nginx(workers => 2);
    ok($ok, 'nginx B starts') or BAIL_OUT($err);
}

my %port = (A => $env->port, B => $port_b);

sub status_of {
    my ($who) = @_;
    my $r = $http->get("http://127.0.0.1:$port{$who}/kv_status");
    my $st = $r->{success} && eval { $json->decode($r->{content}) };
    return $st ? $st->{upstreams}{llm} : undef;
}

for my $who (qw(A B)) {
    ok(wait_until(10, sub {
           my $st = status_of($who);
           $st && $st->{redis}{state} eq 'up' }),
       "nginx $who subscribed");
}

# turn $k of conversation $c: a long system prompt shared by nobody else,
# then the turns so far, each adding a user and an assistant message
sub turn {
    my ($c, $k) = @_;
    my @m = ({ role => 'system',
               content => "conversation $c. " . ('system prompt. ' x 40) });
    for my $t (1 .. $k) {
        push @m, { role => 'user', content => "c$c turn $t: "
                                              . ('question ' x 30) };
        push @m, { role => 'assistant', content => "c$c answer $t: "
                                                   . ('answer ' x 30) }
            if $t < $k;
    }
    return $json->encode({ model => 'm', messages => \@m });
}

sub ask {
    my ($who, $body) = @_;
    my $r = $http->post("http://127.0.0.1:$port{$who}/v1/chat/completions",
                        { content => $body,
                          headers => { 'Content-Type' =>
                                       'application/json' } });
    return {
        status  => $r->{status},
        backend => $r->{headers}{'x-backend'} // '-',
        reason  => $r->{headers}{'x-kv-reason'} // '-',
        matched => $r->{headers}{'x-kv-matched'} // -1,
        blocks  => $r->{headers}{'x-kv-blocks'} // -1,
    };
}

sub received { my $st = status_of($_[0]); $st ? $st->{share}{received} : 0 }

# waits until $who took in more than $before hashes from the other
sub heard {
    my ($who, $before) = @_;
    return wait_until(5, sub { received($who) > $before });
}

subtest 'turns alternating between the two reach one server' => sub {
    for my $c (1 .. 3) {
        my $first = ask('A', turn($c, 1));
        is($first->{status}, 200, "conversation $c turn 1 at A answered");
        my $home = $first->{backend};
        my $blocks = $first->{blocks};

        for my $k (2 .. 5) {
            my $who = $k % 2 ? 'A' : 'B';
            my $other = $who eq 'A' ? 'B' : 'A';
            ok(heard($who, 0), "nginx $who heard from $other")
                if $k == 2;
            my $before = received($who);
            my $r = ask($who, turn($c, $k));
            is($r->{backend}, $home,
               "conversation $c turn $k at $who: its server $home")
                or diag explain $r;
            is($r->{reason}, 'affinity', '  by affinity');
            cmp_ok($r->{matched}, '>=', $blocks,
                   '  matching what the other nginx routed last');
            $blocks = $r->{blocks};
            # the next turn goes to the other nginx: what this one routed
            # must have reached it first
            my $next = $who eq 'A' ? 'B' : 'A';
            my $got = received($next);
            wait_until(5, sub { received($next) > $got });
        }
    }
};

subtest 'the status page counts what was shared' => sub {
    for my $who (qw(A B)) {
        my $sh = status_of($who)->{share};
        cmp_ok($sh->{sent}, '>', 0, "nginx $who sent hashes");
        cmp_ok($sh->{received}, '>', 0, "nginx $who received hashes");
        is($sh->{refused}, 0, "nginx $who refused nothing");
    }
};

subtest 'hostile messages on the learned channel are refused' => sub {
    my $before = status_of('B')->{share}{refused};
    my $addr = '127.0.0.1:' . $env->backend_port(1);
    for my $m ('not json',
               $json->encode({ v => 1, server => $addr, seq => 1,
                               events => [{ type => 'stored',
                                            hashes => ['00000000000000aa'] }]
                             }),
               $json->encode({ v => 1, server => $addr, seq => 1,
                               origin => 'nothex', events => [] }))
    {
        $env->redis_cli(PUBLISH => 'kv_aware:events:learned', $m);
    }
    ok(wait_until(5, sub { status_of('B')->{share}{refused} >= $before + 3 }),
       'broken JSON, no origin, a bad origin: three refused');
    like(KvAware::Launch::slurp($lb->error_log_file) // '',
         qr/\[warn\].*refused a message on "kv_aware:events:learned"/,
         'and logged');
    my $r = ask('B', turn(7, 1));
    is($r->{status}, 200, 'B still routes');
};

subtest 'a Redis outage leaves each nginx its own learning' => sub {
    $env->redis_stop;
    ok(wait_until(10, sub { status_of('A')->{redis}{state} ne 'up' }),
       'A sees Redis down');

    my $first = ask('A', turn(9, 1));
    is($first->{status}, 200, 'a new conversation at A is answered');
    my $again = ask('A', turn(9, 2));
    is($again->{backend}, $first->{backend}, 'its next turn at A: same server');
    is($again->{reason}, 'affinity', '  by what A learned itself');
    my $b = ask('B', turn(9, 3));
    is($b->{status}, 200, 'B still routes');
    ok(wait_until(5, sub { status_of('A')->{share}{dropped} > 0 }),
       'what A could not send is counted as dropped');

    $env->redis_start;
    ok(wait_until(20, sub { status_of('A')->{redis}{state} eq 'up'
                            && status_of('B')->{redis}{state} eq 'up' }),
       'both back on Redis');
    my $before = received('B');
    my $r = ask('A', turn(10, 1));
    ok(heard('B', $before), 'and sharing again');
    is(ask('B', turn(10, 2))->{backend}, $r->{backend},
       'a conversation moves from A to B again');
};

for my $who (qw(A B)) {
    my $log = $who eq 'A' ? $env->error_log
                          : KvAware::Launch::slurp($lb->error_log_file);
    unlike($log, qr/\[(?:alert|emerg|crit)\]/, "nginx $who: no alert");
}

$lb->stop_all;

done_testing;
