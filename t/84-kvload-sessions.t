# kvload's sessions workload (issue 21): recorded Claude Code sessions
# replayed against real kvsim servers, directly and through nginx.  What a
# user of the benchmark relies on:
#
#   * each session's requests go in order, sub-agents' among them;
#   * a session's turns extend its prefix: the server finds them cached;
#   * two sessions share no block, even where their ids are equal (ids are
#     local to a session), unless --sessions-shared-prefix makes the
#     first system + tool tokens of every session the same text;
#   * every request carries the session's id in x-session-affinity, which
#     nginx sees (here: logs, and hashes on to keep a session on one
#     server, which kvload's report shows).
#
# A few small sessions are unpacked from the shared archive into a
# temporary directory (KVA_SESSIONS_TRACE, else ../shared/traces/); the
# test is skipped without it.

use strict;
use warnings;

use File::Copy qw(copy);
use File::Temp qw(tempdir);
use JSON::PP;
use POSIX ();
use Test::More;

use Test::KvAware qw(free_run);

my $KVSIM  = $ENV{KVSIM_BINARY} || 'build/kvsim';
my $KVLOAD = $ENV{KVLOAD_BINARY} || 'build/kvload';
my $TRACE  = $ENV{KVA_SESSIONS_TRACE}
             || '../shared/traces/claude_code_sessions.tar.gz';

plan skip_all => "$KVSIM or $KVLOAD not built (make tools)"
    unless -x $KVSIM && -x $KVLOAD;
plan skip_all => "no session archive at $TRACE (KVA_SESSIONS_TRACE)"
    unless -r $TRACE;

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 90;

my $dir = tempdir(CLEANUP => 1);
my $json = JSON::PP->new;

# trace_0291 has two sub-agents; the others are short main agents only
my @names = qw(trace_0291 trace_0187 trace_0103 trace_0174 trace_0057);
mkdir "$dir/$_" for qw(all a b copy);
is(system('tar', '-xzf', $TRACE, '-C', "$dir/all",
          map { "traces/$_.json" } @names), 0, 'the sample unpacked')
    or BAIL_OUT('tar failed');
copy("$dir/all/traces/trace_0291.json", "$dir/a/") or die;
copy("$dir/all/traces/trace_0187.json", "$dir/b/") or die;

# the same session under another id: equal hash ids, another session
{
    my $s = $json->decode(slurp("$dir/a/trace_0291.json"));
    $s->{id} = 'other_0291';
    open my $fh, '>', "$dir/copy/other_0291.json" or die;
    print $fh $json->encode($s);
}

sub slurp {
    open my $fh, '<', $_[0] or return '';
    local $/;
    return <$fh>;
}

my $env = Test::KvAware->new(backends => 0, module => 0);
my $base = free_run(3);

ok(eval { $env->launch->start_kvsim($base, 3, { binary => $KVSIM },
              '--time-scale', 100, '--quiet', '--redis', 'off') },
   'kvsim listens') or BAIL_OUT($@);

# kvload's run: (exit status, its JSON report, its log of requests)
my $runs = 0;
sub kvload {
    my ($target, @args) = @_;
    my $n = ++$runs;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>', "$dir/run$n.txt" or POSIX::_exit(127);
        open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
        exec $KVLOAD, '--workload', 'sessions', '--target', $target,
            '--time-scale', 100, '--session-idle-max', 10,
            '--json', "$dir/run$n.json", '--sessions-log', "$dir/run$n.log",
            @args
            or POSIX::_exit(127);
    }
    waitpid($pid, 0);
    my $rc = $? >> 8;
    diag(slurp("$dir/run$n.txt")) if $rc;
    my $res = eval { $json->decode(slurp("$dir/run$n.json")) } || {};
    my @log = map { [ split /\t/ ] } split /\n/, slurp("$dir/run$n.log");
    return ($rc, $res, \@log);
}

# --- one session, its turns and its sub-agents, on one server ---------------

my $k0 = "127.0.0.1:$base";
my ($rc, $res, $log) = kvload($k0, '--trace-dir', "$dir/a");
my ($st) = @{ $res->{stages} || [{}] };
is($rc, 0, 'one session replayed');
is($st->{errors}, 0, 'no request failed');
ok($st->{completed} >= 30, "all its requests answered ($st->{completed})");
ok($res->{sessions}{subagent_requests} > 0,
   "sub-agents' requests sent ($res->{sessions}{subagent_requests})");

my @idx = map { $_->[1] } @$log;
is_deeply(\@idx, [ 0 .. $#idx ], 'in the order of the session');
ok(!grep({ $log->[$_][2] < $log->[$_ - 1][2] } 1 .. $#$log),
   'at times that never go back');
ok($st->{hit_rate} > 0.8,
   "each turn extends the session's prefix: hit rate $st->{hit_rate}");

# --- a session's first request: cached when it is the same session ---------

sub first_request {
    my ($what, @args) = @_;
    my ($rc, $res) = kvload($k0, '--session-requests', 1, @args);
    my ($st) = @{ $res->{stages} || [{}] };
    ok($rc == 0 && $st->{completed} == 1, "$what: answered");
    return ($st->{cached_tokens} // -1, $st->{prompt_tokens} // 0);
}

my ($cached, $prompt) = first_request('the same session again',
                                      '--trace-dir', "$dir/a");
ok($cached > 0.9 * $prompt, "finds its blocks ($cached of $prompt)");

($cached, $prompt) = first_request('another session, the same ids',
                                   '--trace-dir', "$dir/copy");
is($cached, 0, "shares no block ($cached of $prompt)");

($cached, $prompt) = first_request('a third session',
                                   '--trace-dir', "$dir/b");
is($cached, 0, "shares no block either ($cached of $prompt)");

# --- the shared system prompt and tools, as an assumption -------------------

my $sys = $json->decode(slurp("$dir/b/trace_0187.json"));
my $shared = int(($sys->{system_tokens} + $sys->{tool_tokens}) / 64) * 64;

first_request('with --sessions-shared-prefix 1, a first session',
              '--trace-dir', "$dir/copy", '--sessions-shared-prefix', 1);
($cached, $prompt) = first_request('then another',
    '--trace-dir', "$dir/b", '--sessions-shared-prefix', 1);
ok($cached >= $shared - 64 && $cached <= $shared,
   "shares its system prompt and tools: $cached of $prompt cached, "
   . "$shared the shared part");

# --- through nginx: the session header arrives -------------------------------

$env->conf(http_config => "
    client_body_buffer_size 1m;
    client_max_body_size 16m;
    log_format sessions '\$http_x_session_affinity \$upstream_addr';
    upstream kvsim {
        hash \$http_x_session_affinity;
        server 127.0.0.1:" . ($base + 1) . ";
        server 127.0.0.1:" . ($base + 2) . ";
    }",
           config => '
    location / {
        proxy_pass http://kvsim;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_buffering off;
        access_log $TEST_NGINX_PREFIX/logs/sessions.log sessions;
    }');
$env->start_nginx or BAIL_OUT('nginx did not start');

($rc, $res, $log) = kvload('127.0.0.1:' . $env->port,
                           '--trace-dir', "$dir/all/traces",
                           '--sessions-live', 3, '--servers', 2);
($st) = @{ $res->{stages} || [{}] };
is($rc, 0, 'five sessions through nginx');
is($res->{sessions}{sessions}, 5, 'all five replayed');
is($st->{errors}, 0, 'no request failed');

my %sent;
$sent{ $_->[0] }++ for @$log;
my %seen;
my @lines = split /\n/, slurp($env->prefix . '/logs/sessions.log');
$seen{ (split / /)[0] }++ for @lines;
is_deeply(\%seen, \%sent,
          'nginx saw each request with its session id in x-session-affinity');
is($res->{sessions}{session_top_share_mean}, 1,
   'hashed on it, every session stays on one server');

done_testing();
