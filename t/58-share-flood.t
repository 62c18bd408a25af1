# A flood on CHANNEL:learned (kv_aware_events share=on) costs no more than
# one on the events channel.  Anyone holding nginx's Redis credentials can
# publish there; what comes in is bounded by the events channel's budgets
# (max_rate, server_bytes, server_hashes), counted apart, and by the
# server's learned budget (learned_tokens), and what is refused is counted
# where a user looks: "flood" among the rejects of kv_aware_status and of
# its Prometheus page, and "refused" under "share".
#
#   * 1,000 messages a second of 512 hashes for 5 s, max_rate=50: about
#     250 applied, the rest refused and counted; the server's learned
#     entries stay within learned_tokens; requests keep being answered,
#     by affinity, at a rate near the one without the flood;
#   * 1,000 a second for 2 s under the default max_rate but
#     server_hashes=5120: 10 messages of 512 hashes a second applied.
#
# One worker: the subscriber is the worker that answers the requests.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(sleep time);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $LOCATIONS preflight prompt chat addr upstream_conf status
    server_status wait_status wait_until traffic redis_connect
);

preflight();

my $CH = 'kv_aware:events:learned';
my $HASHES = 512;
# another instance's origin: this nginx's own messages are skipped
my $ORIGIN = '0123456789abcdef';

my $env = Test::KvAware->new(backends => 2, redis => 1, workers => 1,
                             log_level => 'info');

my $locations = $LOCATIONS . <<'EOF';
        location = /metrics {
            kv_aware_status prometheus;
        }
EOF

sub start_with {
    my ($events) = @_;
    $env->stop_nginx;
    $env->conf(http_config => upstream_conf(
                   n => 2,
                   kv_aware => 'learned_ttl=10m learned_tokens=800000',
                   events => "share=on heartbeat=60s $events"),
               config => $locations);
    $env->start_nginx or return 0;
    return wait_status($env, 30, sub { $_[0]{redis}{state} eq 'up' });
}

sub share { status($env)->{share} }
sub flood_rejects { status($env)->{events}{rejected}{flood} }

# the flood counter of the Prometheus page
sub prom_flood {
    my $r = $env->request(GET => '/metrics');
    my ($v) = ($r->{body} // '') =~ m{^kv_aware_event_rejects_total
                                      \{upstream="llm",class="flood"\}
                                      \s+(\d+)$}xm;
    return $v // -1;
}

# Publishes $rate messages a second of $HASHES new hashes each, for
# $secs s, in pipelines of a twentieth of a second; stops at $rate * $secs
# messages or 2 s late.  Returns the messages sent and the time taken.
sub flood {
    my ($server, $rate, $secs, $tag) = @_;
    my $r = redis_connect($env->redis_port);
    my @low = map { sprintf '%08x', $_ } 1 .. $HASHES;
    my $step = int($rate / 20);
    my $max = $rate * $secs;
    my ($sent, $t0) = (0, time);
    while ($sent < $max && time - $t0 < $secs + 2) {
        my @cmds;
        for (1 .. $step) {
            $sent++;
            my $high = sprintf '%02x%06x', $tag, $sent;
            my $h = join ',', map { qq("$high$_") } @low;
            push @cmds, [PUBLISH => $CH,
                qq({"v":1,"server":"$server","seq":$sent,)
                . qq("origin":"$ORIGIN","events":[{"type":"stored",)
                . qq("hashes":[$h]}]})];
        }
        $r->pipeline(@cmds);
        my $next = $t0 + $sent / $rate;
        sleep $next - time if $next > time;
    }
    return ($sent, time - $t0);
}

# waits until nginx has taken every message published (applied or not);
# the budgets count seconds of nginx's clock, and a slow nginx (ASan on a
# loaded CI machine) takes a backlog in over longer than it took to send,
# so the bounds on what is applied count from the flood's start to this
sub taken {
    my ($before, $sent) = @_;
    return wait_until(30, sub {
        my $s = share();
        $s->{messages_in} - $before->{messages_in}
            + $s->{refused} - $before->{refused} >= $sent });
}

subtest 'max_rate: a flood is cut to max_rate, and counted' => sub {
    start_with('max_rate=50') or return fail('nginx starts, subscribed');

    my $home = chat($env, prompt('home', 8));
    is($home->{status}, 200, 'the home prompt is answered');
    my ($h) = $home->{backend} =~ /^b(\d)$/ or return fail('a backend');
    my $victim = addr($env, 3 - $h);
    is(chat($env, prompt('home', 8))->{reason}, 'affinity',
       'and returns by affinity');

    # requests without the flood, then with it
    my $t = traffic($env, prompt('home', 8));
    sleep 3;
    my $base = $t->count;
    my $base_rate = $base / 3;

    my $s0 = share();
    my $f0 = flood_rejects();
    my $t0 = time;
    my ($sent, $took) = flood($victim, 1000, 5, 1);
    my $rate = ($t->count - $base) / $took;
    ok(taken($s0, $sent), "nginx took in the $sent messages")
        or diag explain share();
    my $span = time - $t0;
    my @r = $t->stop;
    diag sprintf 'sent %d in %.1f s; requests %.0f/s, %.0f/s without',
                 $sent, $took, $rate, $base_rate;

    my $s = share();
    my $applied = $s->{messages_in} - $s0->{messages_in};
    my $refused = $s->{refused} - $s0->{refused};
    my $floods = flood_rejects() - $f0;
    diag "applied $applied, refused $refused, flood rejects $floods";

    cmp_ok($applied, '<=', 50 * (int($span) + 2),
           'at most max_rate messages a second applied');
    cmp_ok($applied, '>=', 50 * (int($took) - 1), '  and about that many');
    cmp_ok($s->{received} - $s0->{received}, '<=', $applied * $HASHES,
           '  their hashes, no more');
    is($refused, $sent - $applied, 'every other one refused');
    is($floods, $refused, '  counted as a flood in the status');
    is(prom_flood(), flood_rejects(), '  and on the Prometheus page');

    my $v = server_status(status($env), $victim);
    cmp_ok($v->{entries}{learned}, '<=', 50000,
           'learned entries of the server within learned_tokens '
           . '(50,000 blocks)') or diag explain $v->{entries};
    cmp_ok($v->{entries}{learned}, '>', 0, '  though some went in');

    is(scalar(grep { $_->[0] != 200 } @r), 0, 'every request answered');
    is(scalar(grep { $_->[2] ne 'affinity' } @r), 0,
       '  each by affinity');
    cmp_ok($rate, '>=', $base_rate / 3,
           '  at a rate near the one without the flood');
    like($env->error_log,
         qr/\[warn\].*refused a message on "\Q$CH\E": flood: over max_rate/,
         'logged');
};

subtest 'server_hashes: a server gets its budget of hashes a second' => sub {
    start_with('max_hashes=512 server_hashes=5120')
        or return fail('nginx starts, subscribed');
    my $victim = addr($env, 2);
    my $s0 = share();
    my $t0 = time;
    my ($sent, $took) = flood($victim, 1000, 2, 2);
    ok(taken($s0, $sent), "nginx took in the $sent messages")
        or diag explain share();
    my $span = time - $t0;
    my $s = share();
    my $applied = $s->{messages_in} - $s0->{messages_in};
    diag sprintf 'sent %d in %.1f s, taken in %.1f s, applied %d',
                 $sent, $took, $span, $applied;
    cmp_ok($applied, '<=', 10 * (int($span) + 2),
           '10 messages of 512 hashes a second at most');
    cmp_ok($applied, '>=', 10, '  and some');
    is($s->{refused} - $s0->{refused}, $sent - $applied,
       'the rest refused');
    like($env->error_log,
         qr/refused a message on "\Q$CH\E": flood: server_hashes/,
         'logged');
    is(chat($env, prompt('after', 4))->{status}, 200, 'nginx still routes');
};

unlike($env->error_log, qr/\[(?:alert|emerg|crit)\]/, 'no alert');

done_testing;
