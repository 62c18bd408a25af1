# kvbridge --metrics ADDR (issue 18): the bridge's own Prometheus page,
# read by the reference parser (Debian's python3-prometheus-client,
# t/lib/prom_parse.py): the naming rules (kvbridge_ prefix, _total
# counters, _seconds units, HELP and TYPE), per engine series labelled
# engine and rank, Redis' link, the loop's turn and per-source histograms;
# the values move as an engine publishes; a scrape that always fails is
# counted; the listener answers once and closes, refuses what is not a
# GET of the page, and a client that never asks blocks nobody.  Real
# redis-server, kvsim (vLLM's events on ZeroMQ) and kvbridge.

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use HTTP::Tiny;
use IO::Socket::INET;
use IPC::Open2;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use KvAware::Launch qw(free_ports free_run wait_until slurp);

my $BRIDGE = KvAware::Launch::kvbridge_binary();
my $MODEL  = 'llama';
my $ROOT   = abs_path(dirname(__FILE__) . '/..');
my $PARSE  = "$ROOT/t/lib/prom_parse.py";
my $PY     = -x '/usr/bin/python3' ? '/usr/bin/python3' : 'python3';

plan skip_all => "$BRIDGE not built" unless -x $BRIDGE;
# it runs no nginx: the stage that only changes nginx's build skips it
plan skip_all => 'no nginx in this test (KVA_NGINX_FREE=0)'
    if ($ENV{KVA_NGINX_FREE} // '') eq '0';
plan skip_all => 'python3-prometheus-client is not installed'
    if system("$PY -c 'import prometheus_client.parser' 2>/dev/null");

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 120;

my $json = JSON::PP->new->utf8->canonical;
my $ct_checked = 0;
my $http = HTTP::Tiny->new(timeout => 10);
my $l = KvAware::Launch->new(template => 'kvbridge-metrics-XXXXXX',
                             watchdog => 1, diag => \&diag);

my ($redis, $port, $page, $dead) = free_ports(4);
my $zmq = free_run(2);
my $ENGINE = "127.0.0.1:$port";
my $DEAD = '127.0.0.1:7';                       # its /metrics never answers

$l->start_redis($redis);
$l->start_kvsim($port, 1, { name => 'kvsim' },
    qw(--time-scale 50 --keyspace tokens --events zmq --redis off),
    '--model', $MODEL, '--zmq-port', $zmq);
$l->start_kvbridge('--redis', "127.0.0.1:$redis",
    '--engine', "$ENGINE model=$MODEL events=tcp://127.0.0.1:$zmq"
                . ' replay=tcp://127.0.0.1:' . ($zmq + 1)
                . " metrics=http://$ENGINE/metrics",
    '--engine', "$DEAD model=$MODEL events=tcp://127.0.0.1:1"
                . " metrics=http://127.0.0.1:$dead/metrics",
    '--metrics', "127.0.0.1:$page", '--metrics-interval', 100);

# --- 1. the page, as the reference parser reads it --------------------

my $m1 = scrape();
ok($m1, 'the page parses with prometheus_client') or BAIL_OUT('no page');

my @bad = grep { $_ !~ /^kvbridge_/ } keys %{ $m1->{fam} };
is("@bad", '', 'every family has the kvbridge_ prefix');
@bad = grep { $m1->{fam}{$_}{type} eq 'counter'
              && !grep { $_->{name} =~ /_total$/ }
                 @{ $m1->{fam}{$_}{samples} } } keys %{ $m1->{fam} };
is("@bad", '', 'every counter\'s samples end in _total');
@bad = grep { !length $m1->{fam}{$_}{help} } keys %{ $m1->{fam} };
is("@bad", '', 'every family has its HELP');

for my $f (qw(engine_batches engine_gaps engine_replays_ok
              engine_replays_given_up engine_restarts engine_mirror_blocks
              engine_scrape_failures engine_last_event_age_seconds
              redis_up redis_published redis_dropped redis_pending_bytes
              redis_pending_messages redis_timeouts redis_link_up
              engine_scrape_failures_by_kind engine_stream_vouched
              loop_turn_seconds
              source_seconds source_max_seconds source_cpu_max_seconds
              source_cpu_seconds))
{
    ok($m1->{fam}{"kvbridge_$f"}, "kvbridge_$f is there");
}

is($m1->{fam}{kvbridge_loop_turn_seconds}{type}, 'histogram',
   'the loop\'s turn time is a histogram');
is(value($m1, 'kvbridge_redis_up'), 1, 'Redis\' link is up');
ok(defined value($m1, 'kvbridge_source_max_seconds',
                 { source => "$ENGINE events" }),
   'a source per engine\'s events, with its longest turn');

# --- 2. values move as the engine publishes -----------------------------

my $b1 = value($m1, 'kvbridge_engine_batches_total',
               { engine => $ENGINE, rank => '0' });
is($b1, 0, 'no batches before the engine has cached anything');
chat($_) for 1 .. 3;
my $m2;
ok(wait_until(10, sub {
       $m2 = scrape();
       (value($m2, 'kvbridge_engine_batches_total',
              { engine => $ENGINE }) // 0) >= 3;
   }), 'batches grow as the engine publishes: '
       . (value($m2, 'kvbridge_engine_batches_total',
                { engine => $ENGINE }) // '?'));
cmp_ok(value($m2, 'kvbridge_engine_mirror_blocks', { engine => $ENGINE }),
       '>', 0, 'the mirror holds blocks');
is(value($m2, 'kvbridge_engine_stream_vouched', { engine => $ENGINE }), 1,
   'the stream of an engine that publishes is vouched for');
is(value($m2, 'kvbridge_engine_stream_vouched', { engine => $DEAD }), 0,
   'and that of an engine never connected is not');
my $age = value($m2, 'kvbridge_engine_last_event_age_seconds',
                { engine => $ENGINE });
ok($age >= 0 && $age < 10, "the last event is $age s old");
is(value($m2, 'kvbridge_engine_last_event_age_seconds',
         { engine => $DEAD }), -1, 'an engine never heard: -1');
cmp_ok(value($m2, 'kvbridge_redis_published_total'), '>',
       value($m1, 'kvbridge_redis_published_total'),
       'publishes to Redis grow');
cmp_ok(value($m2, 'kvbridge_loop_turn_seconds_count'), '>',
       value($m1, 'kvbridge_loop_turn_seconds_count'), 'turns are counted');
my $cpu = value($m2, 'kvbridge_source_cpu_seconds_total',
                { source => "$ENGINE events" });
cmp_ok($cpu, '>', value($m1, 'kvbridge_source_cpu_seconds_total',
                        { source => "$ENGINE events" }),
       "the engine's events cost CPU time: $cpu s");
cmp_ok($cpu, '<=', value($m2, 'kvbridge_source_seconds_sum',
                         { source => "$ENGINE events" }) + 0.01,
       'no more CPU time than time');
cmp_ok(value($m2, 'kvbridge_engine_scrapes_ok_total', { engine => $ENGINE }),
       '>', 0, 'the engine\'s /metrics is scraped');
cmp_ok(value($m2, 'kvbridge_engine_scrape_failures_total',
             { engine => $DEAD }), '>', 0,
       'a /metrics that never answers counts failures');
is(value($m2, 'kvbridge_engine_scrape_failing', { engine => $DEAD }), 1,
   'and says it is failing');
my $kinds = 0;
$kinds += value($m2, 'kvbridge_engine_scrape_failures_by_kind_total',
                { engine => $DEAD, kind => $_ }) // 0
    for qw(connect timeout status encoding parse closed size other);
is($kinds, value($m2, 'kvbridge_engine_scrape_failures_total',
                 { engine => $DEAD }),
   "the failures by kind add up to them ($kinds)");
is(value($m2, 'kvbridge_redis_link_up', { link => 'publish' }), 1,
   'the publishing link is up');
is(value($m2, 'kvbridge_redis_link_up', { link => 'subscribe' }), 1,
   'the resync link is up');

# --- 3. the listener: one answer, bounded requests, never blocked --------

my $idle = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$page")
    or die "connect: $!";
print $idle "GET /metr";                        # and nothing more
# the page's own fetch is timed, not the parser's start (python3, slow
# on a loaded machine)
my $t0 = time;
ok($http->get("http://127.0.0.1:$page/metrics")->{success},
   'a client that never finishes its request holds up no other');
cmp_ok(time - $t0, '<', 3, 'the page came at once');

is($http->get("http://127.0.0.1:$page/nothing")->{status}, 404,
   'another path: 404');
is($http->post("http://127.0.0.1:$page/metrics")->{status}, 405,
   'another method: 405');

my $big = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$page")
    or die "connect: $!";
print $big 'GET /metrics HTTP/1.1' . ("\r\nX-A: " . ('a' x 100)) x 60;
my $answer = '';
$big->read($answer, 64);
like($answer, qr{^HTTP/1\.1 431 }, 'a request past 4 KB: 431, then closed');
close $big;
close $idle;

ok(kill(0, $l->pid('kvbridge')), 'the bridge is still running');

done_testing();


# --- helpers ------------------------------------------------------------

# the page, parsed: { fam => { name => family } }
sub scrape {
    my $r = $http->get("http://127.0.0.1:$page/metrics");
    unless ($r->{success}) {
        diag("metrics: $r->{status} $r->{content}");
        return undef;
    }
    like($r->{headers}{'content-type'}, qr{^text/plain; version=0\.0\.4},
         'the text format\'s content type') if !$ct_checked++;
    my $pid = open2(my $out, my $in, $PY, $PARSE);
    print $in $r->{content};
    close $in;
    my $text = do { local $/; <$out> };
    waitpid($pid, 0);
    return undef if $?;
    my $doc = $json->decode($text);
    return { fam => { map { $_->{name} => $_ } @{ $doc->{families} } } };
}

# the value of a sample, by its name and some of its labels
sub value {
    my ($m, $name, $labels) = @_;
    for my $f (values %{ $m->{fam} }) {
        for my $s (@{ $f->{samples} }) {
            next unless $s->{name} eq $name;
            next if grep { ($s->{labels}{$_} // '') ne $labels->{$_} }
                    keys %{ $labels // {} };
            return $s->{value};
        }
    }
    return undef;
}

sub chat {
    my ($n) = @_;
    my $text = join ' ', map { sprintf 'm%x%02d', $n, $_ % 97 } 1 .. 200;
    my $r = $http->post("http://$ENGINE/v1/chat/completions",
        { content => $json->encode({ model => $MODEL, max_tokens => 1,
              messages => [{ role => 'user', content => $text }] }),
          headers => { 'Content-Type' => 'application/json' } });
    diag("chat: $r->{status} $r->{content}") unless $r->{success};
}
