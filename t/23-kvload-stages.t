# The benchmark's own tools as a user of `bench/e2e/run.sh --workloads
# llm-d` relies on them: kvload runs a warm-up and stages of their own
# lengths (llm-d's ladder) and reports the warm-up apart; kvsim takes
# --calibration llm-d and refuses what it does not know; kvload refuses
# malformed ladders.  kvload against kvsim directly, on loopback, at a
# high time scale so that the whole ladder takes a fraction of a second.

use strict;
use warnings;

use File::Temp qw(tempdir);
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(WNOHANG);
use Test::More;
use Time::HiRes qw(time sleep);

use Test::KvAware qw(free_run);

my $KVSIM  = $ENV{KVSIM_BINARY} || 'build/kvsim';
my $KVLOAD = $ENV{KVLOAD_BINARY} || 'build/kvload';

plan skip_all => "$KVSIM or $KVLOAD not built"
    unless -x $KVSIM && -x $KVLOAD;

my $dir = tempdir(CLEANUP => 1);
my @pids;

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 60;

END {
    for my $pid (@pids) {
        kill 'TERM', $pid;
        waitpid($pid, 0);
    }
}

sub run_quiet {
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>', "$dir/out.txt" or POSIX::_exit(127);
        open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
        exec @_ or POSIX::_exit(127);
    }
    waitpid($pid, 0);
    return $? >> 8;
}

sub slurp {
    open my $fh, '<', $_[0] or return '';
    local $/;
    return <$fh>;
}

# --- kvsim: the calibration by name ------------------------------------------

isnt(run_quiet($KVSIM, '--servers', 1, '--redis', 'off',
               '--calibration', 'h100'), 0,
     'kvsim refuses an unknown --calibration');
like(slurp("$dir/out.txt"), qr/invalid value "h100" for --calibration/,
     'and says which');

my $port = free_run(1);
my $pid = fork // die "fork: $!";
if ($pid == 0) {
    open STDERR, '>', "$dir/kvsim.log" or POSIX::_exit(127);
    exec $KVSIM, '--servers', 1, '--base-port', $port, '--redis', 'off',
        '--calibration', 'llm-d', '--time-scale', 50, '--quiet'
        or POSIX::_exit(127);
}
push @pids, $pid;

my $up;
for (1 .. 200) {
    last if $up = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port");
    sleep 0.05;
}
ok($up, 'kvsim --calibration llm-d serves');

# --- kvload: a warm-up, then stages of their own lengths ---------------------

my @load = ($KVLOAD, '--target', "127.0.0.1:$port", '--time-scale', 50,
            '--groups', 4, '--prompts-per-group', 2, '--system-tokens', 256,
            '--question-tokens', 64, '--output-tokens', 4, '--seed', 3);

is(run_quiet(@load, '--warmup', '40:4', '--qps-ladder', '20:2,40:6',
             '--json', "$dir/run.json", '--csv', "$dir/run.csv"), 0,
   'kvload runs a warm-up and a ladder of its own lengths');

my $run = eval { JSON::PP->new->decode(slurp("$dir/run.json")) } || {};
my @st = @{ $run->{stages} || [] };
is(scalar @st, 3, 'three stages reported');
is_deeply([ map { [ $_->{qps}, $_->{seconds}, $_->{warmup} ? 1 : 0 ] } @st ],
          [ [ 40, 4, 1 ], [ 20, 2, 0 ], [ 40, 6, 0 ] ],
          'the warm-up first and marked, each stage with its own length');

# Poisson arrivals: 160, 40 and 240 expected; each stage's own length shows
my @sent = map { $_->{sent} } @st;
ok($sent[0] > 100 && $sent[0] < 230 && $sent[1] > 15 && $sent[1] < 70
   && $sent[2] > 170 && $sent[2] < 320,
   "requests follow QPS x each stage's length (@sent)");
ok(!grep({ $_->{errors} || $_->{dropped} } @st), 'all of them answered');

my ($head, $first) = split /\n/, slurp("$dir/run.csv");
my %col;
my @names = split /,/, $head // '';
@col{@names} = split /,/, $first // '';
is($col{warmup}, 1, 'the CSV marks the warm-up too');

# --- kvload: ladders it cannot run are refused, with the usage ----------------

for my $bad (['--qps-ladder', '3:0'], ['--qps-ladder', '3:x'],
             ['--qps-ladder', '3,'], ['--warmup', '15'],
             ['--warmup', '15:5,20:5'],
             ['--workload', 'agent', '--warmup', '15:5'])
{
    is(run_quiet(@load, @$bad), 2, "kvload refuses @$bad");
    like(slurp("$dir/out.txt"), qr/usage: kvload/, '... with the usage');
}

done_testing();
