# Agent conversations through nginx to kvsim (issue 11): many
# conversations share a short system prompt and each grows a private
# history, one turn at a time.  What a user needs:
#
#   * new conversations spread over the servers, although the shared
#     system prompt is cached on one of them: their first turn matches
#     only that small part of the prompt, so it is placed by capacity
#     (reason "capacity"), not drawn to the holder;
#   * every later turn goes to its conversation's server (reason
#     "affinity") and finds its history cached there.
#
# Both without events (what nginx learned from its own routing) and with
# kvsim's KV events through Redis.  And the behaviour before, which the
# spread replaces: affinity_min=0 lets the system prompt draw every new
# conversation to one server.

use strict;
use warnings;

use JSON::PP;
use Test::More;

use Test::KvAware qw(skip_unless_module wait_until free_run);

my $KVSIM   = $ENV{KVSIM_BINARY} || 'build/kvsim';
my $SERVERS = 4;
my $CONVS   = 8;
my $TURNS   = 4;

skip_unless_module();
plan skip_all => "$KVSIM not built (make tools)" unless -x $KVSIM;
plan skip_all => 'redis-server is not installed'
    unless grep { -x "$_/redis-server" } split /:/, $ENV{PATH};

my $env  = Test::KvAware->new(backends => 0, redis => 1);
my $base = free_run($SERVERS);

ok(eval { $env->launch->start_kvsim($base, $SERVERS, { binary => $KVSIM },
              '--time-scale', 50, '--quiet',
              '--redis', '127.0.0.1:' . $env->redis_port) },
   'kvsim listens') or diag $@;

my $servers = join "\n", map { "server 127.0.0.1:$_;" }
                         $base .. $base + $SERVERS - 1;

$env->conf(http_config => "
    client_body_buffer_size 1m;
    upstream learned { kv_aware; $servers }
    upstream events {
        kv_aware;
        kv_aware_events redis=127.0.0.1:\$TEST_NGINX_REDIS_PORT;
        $servers
    }
    upstream before { kv_aware affinity_min=0; $servers }",
           config => '
    location /learned/ { proxy_pass http://learned/; }
    location /events/ { proxy_pass http://events/; }
    location /before/ { proxy_pass http://before/; }
    location = /status { kv_aware_status; }
    add_header X-KV-Reason $kv_aware_reason always;');
$env->start_nginx or BAIL_OUT('nginx did not start');

my $json = JSON::PP->new->canonical;

# about 4 bytes a kvsim token: "tag00001 " is two
sub words {
    my ($tag, $n) = @_;
    return join ' ', map { sprintf '%s%05d', $tag, $_ } 1 .. $n;
}

# turn t of conversation c: the shared system prompt (~1k tokens), the
# task (~2k), then t tool calls and their results (~900 tokens each)
sub messages {
    my ($part, $c, $t) = @_;
    my @m = ({ role => 'system', content => words("$part-sys-", 400) },
             { role => 'user', content => words("$part-c$c-task-", 800) });
    for my $k (1 .. $t) {
        push @m, { role => 'assistant',
                   content => words("$part-c$c-call$k-", 40) },
                 { role => 'tool',
                   content => words("$part-c$c-result$k-", 320) };
    }
    return \@m;
}

sub turn {
    my ($part, $c, $t) = @_;
    my $r = $env->request(POST => "/$part/v1/chat/completions",
                          $json->encode({ model => 'kvsim', max_tokens => 1,
                                          messages => messages($part, $c,
                                                               $t) }),
                          { 'Content-Type' => 'application/json' });
    return { status => $r->{status},
             server => $r->{json}{kvsim}{server} // '?',
             reason => $r->{headers}{'x-kv-reason'} // '-',
             prompt => $r->{json}{usage}{prompt_tokens} // 0,
             cached => $r->{json}{usage}{prompt_tokens_details}
                                {cached_tokens} // -1 };
}

sub count {
    my ($key, @r) = @_;
    my %n;
    $n{ $_->{$key} }++ for @r;
    return \%n;
}

sub show { my ($h) = @_; join ' ', map { "$_=$h->{$_}" } sort keys %$h }

# the first turns one at a time (nothing in flight: load is equal), then
# the later turns of all conversations, a round at a time
sub conversations {
    my ($part) = @_;
    my @first = map { turn($part, $_, 0) } 1 .. $CONVS;
    my @later;
    for my $t (1 .. $TURNS - 1) {
        push @later, map { { %{ turn($part, $_, $t) }, conv => $_ } }
                     1 .. $CONVS;
    }
    return (\@first, \@later);
}

if ($env->redis_port) {
    ok(wait_until(10, sub {
           my $r = $env->request(GET => '/status');
           ($r->{body} // '') =~ /"state":"up"/ }),
       'events: subscribed to redis');
}

for my $part ('learned', 'events') {
    subtest "$part: new conversations spread, later turns stay" => sub {
        my ($first, $later) = conversations($part);
        my @all = (@$first, @$later);

        is(scalar(grep { $_->{status} == 200 } @all), scalar @all,
           'every turn 200');

        my $reasons = count(reason => @$first);
        is($reasons->{capacity} // 0, $CONVS - 1,
           'first turns after the first: reason capacity')
            or diag show($reasons);

        my $by = count(server => @$first);
        is(scalar keys %$by, $SERVERS, "all $SERVERS servers took some")
            or diag show($by);
        my ($busiest) = sort { $b <=> $a } values %$by;
        cmp_ok($busiest, '<=', 1.5 * $CONVS / $SERVERS,
               'busiest server at most 1.5x the mean of conversations')
            or diag show($by);

        my @home = grep { $_->{server} eq $first->[$_->{conv} - 1]{server} }
                   @$later;
        is(scalar @home, scalar @$later,
           'every later turn on its conversation\'s server')
            or diag join ' ', map { "c$_->{conv}:$_->{server}" } @$later;
        is(scalar(grep { $_->{reason} eq 'affinity' } @$later),
           scalar @$later, 'later turns: reason affinity')
            or diag show(count(reason => @$later));

        # the history before this turn's new messages is found cached:
        # the task and the system prompt at least (3,000 tokens or so)
        is(scalar(grep { $_->{cached} >= 2500 } @$later), scalar @$later,
           'later turns find their history cached')
            or diag join ' ', map { $_->{cached} } @$later;
    };
}

subtest 'affinity_min=0: the system prompt draws every new conversation' =>
sub {
    my ($first) = conversations('before');
    my $by = count(server => @$first);
    is(scalar keys %$by, 1, 'all first turns on one server')
        or diag show($by);
    is(count(reason => @$first)->{affinity} // 0, $CONVS - 1,
       'drawn by affinity');
};

$env->stop_nginx;
$env->check_logs_clean('agent placement');

# a share of the prompt: from 0 to 1
{
    my $bad = Test::KvAware->new(backends => 0);
    $bad->conf(http_config => '
    upstream llm { kv_aware affinity_min=1.5; server 127.0.0.1:1; }',
               config => 'location / { proxy_pass http://llm; }');
    my ($ok, $out) = $bad->test_config;
    ok(!$ok && index($out, 'kv_aware: invalid affinity_min "1.5", '
                       . 'expected a number from 0 to 1 ') >= 0,
       'affinity_min=1.5 is refused by nginx -t') or diag $out;
}

done_testing;
