# kv_aware: in-flight load across many reloads while long requests drain.
#
# Each configuration cycle charges its requests to a load table in the
# zone, and the workers of older cycles give their load back to the table
# they charged for as long as their streams last.  There are 8 tables: a
# table is reused only once nothing is in flight there, so after 8 reloads
# with the first cycle's requests still running, the in-flight
# counts stay exact and drop back to 0, never below.  (Before 0.2.0 the
# 8th reload zeroed the first table under its requests: -N afterwards.)

use strict;
use warnings;

use POSIX ();
use Test::More;

use Test::KvAware ();
use Test::KvAware::Events qw(
    $LOCATIONS preflight prompt chat status wait_until
);

preflight();

my $env = Test::KvAware->new(backends => 2, workers => 1,
                             log_level => 'notice');
$env->conf(http_config => <<'EOF2', config => $LOCATIONS);
    upstream llm {
        kv_aware block_size=64;
        server $TEST_NGINX_BACKEND_1 max_fails=0;
        server $TEST_NGINX_BACKEND_2 max_fails=0;
    }
EOF2
$env->start_nginx or BAIL_OUT('nginx did not start');

sub in_flight {
    my $st = status($env) or return ();
    return map { $_->{in_flight} } @{ $st->{servers} };
}

sub sum { my $n = 0; $n += $_ for @_; $n }

# 6 requests of 5 s in the first cycle
my $N = 6;
my $kid = fork // die "fork: $!";
if ($kid == 0) {
    $SIG{TERM} = 'DEFAULT';
    my @r = $env->concurrent([map {
        [POST => '/v1/chat/completions', prompt("long$_", 4),
         { 'X-Delay-Ms' => 5000, 'Content-Type' => 'application/json' }]
    } 1 .. $N]);
    POSIX::_exit(scalar(grep { $_->{status} == 200 } @r) == $N ? 0 : 1);
}
ok(wait_until(5, sub { sum(in_flight()) == $N }), "$N requests in flight");

# 8 reloads, as many as there are tables: the 9th cycle needs one
my ($ok, $bad) = (0, 0);
for (1 .. 8) {
    $ok++ if $env->reload(quiet => 1, keep_old => 1);
    $bad++ if grep { $_ < 0 } in_flight();
}
is($ok, 8, '8 reloads while the first cycle still serves');
is($bad, 0, 'no in-flight count below 0 meanwhile');

waitpid($kid, 0);
is($?, 0, 'the long requests all answered 200');

# where the old module had zeroed the first cycle's table: -N now
ok(wait_until(5, sub { my @f = in_flight(); @f && !grep { $_ } @f }),
   'in flight back to 0 once they finished')
    or diag('in_flight: ' . join(' ', in_flight()));
my @f = in_flight();
is(scalar(grep { $_ < 0 } @f), 0, 'none below 0: ' . join(' ', @f));

# one more reload, and routing by load still works with the counts
ok($env->reload(quiet => 1), 'a 9th reload');
my $r = chat($env, prompt('after', 4));
is($r->{status}, 200, 'a request afterwards');
is(sum(in_flight()), 0, 'and nothing left in flight');

$env->stop_nginx;
$env->check_logs_clean('load generations');

done_testing;
