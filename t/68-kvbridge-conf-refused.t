# kvbridge refuses at start, exit 2 and a line saying why, what it once
# took silently (issue 18, defect 18): a size that overflowed its
# multiplication ("--max-batch 17592186044417m" ran with a 1 MB cap) and
# two collected engines on one topic and rank (the second never got a
# batch).  What is refused never runs: no Redis is needed.

use strict;
use warnings;

use Test::More;
use IPC::Open3;
use Symbol qw(gensym);

use KvAware::Launch;

my $BRIDGE = KvAware::Launch::kvbridge_binary();

plan skip_all => "$BRIDGE not built" unless -x $BRIDGE;
# it runs no nginx: the stage that only changes nginx's build skips it
plan skip_all => 'no nginx in this test (KVA_NGINX_FREE=0)'
    if ($ENV{KVA_NGINX_FREE} // '') eq '0';

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 60;

my $ENGINE = '127.0.0.1:1 model=m events=tcp://127.0.0.1:9';

# runs the bridge with @args; a refusal exits at once, a start would run
# until killed: 3 s are plenty for either
sub run_bridge {
    my @args = @_;
    my $err = gensym;
    my $pid = open3(my $in, my $out, $err, $BRIDGE, @args);
    close $in;
    my $t0 = time;
    my $rc;
    while (time - $t0 < 3) {
        if (waitpid($pid, 1) == $pid) {     # WNOHANG
            $rc = $? >> 8;
            last;
        }
        select(undef, undef, undef, 0.05);
    }
    unless (defined $rc) {
        kill 'TERM', $pid;
        waitpid($pid, 0);
        $rc = 'running';
    }
    local $/;
    my $text = <$err> // '';
    return ($rc, $text);
}

for my $t (['--max-batch', '17592186044417m', 'expected 1024 to 268435456'],
           ['--max-batch', '18446744073709551617',
            'expected 1024 to 268435456'],
           ['--redis-max-pending', '17592186044417m', 'expected 65536 to'],
           ['--snapshot-rate', '18014398509481985k', 'expected 65536 to'],
           ['--max-hashes', '18446744073709551617', 'expected 16 to'],
           ['--heartbeat', '4294967396', 'expected 100 to'])
{
    my ($opt, $v, $why) = @$t;
    my ($rc, $err) = run_bridge($opt, $v, '--engine', $ENGINE);
    is($rc, 2, "$opt $v: exit 2");
    like($err, qr/kvbridge: invalid \Q${\ substr($opt, 2)} "$v", $why\E/,
         "$opt $v: says why") or diag($err);
}

my @collect = ('--collect', 'tcp://127.0.0.1:1');

for my $t (['127.0.0.1:1 model=m topic=kv', '127.0.0.1:2 model=m topic=kv',
            qr/engines "127\.0\.0\.1:1" and "127\.0\.0\.1:2" are both collected on topic "kv": one would never get a batch; give each its own topic=/],
           ['127.0.0.1:1 model=m topic=kv data_parallel=2',
            '127.0.0.1:2 model=m topic=kv rank=1',
            qr/both collected on topic "kv" rank 1: the second would never get a batch/])
{
    my ($a, $b, $why) = @$t;
    my ($rc, $err) = run_bridge(@collect, '--engine', $a, '--engine', $b);
    is($rc, 2, "collected \"$a\" and \"$b\": exit 2");
    like($err, $why, 'says why') or diag($err);
}

done_testing();
