# kv_aware core under libFuzzer: every fuzz/fuzz_<name>.c runs for
# KVA_FUZZ_SECONDS (default 20 under CI=true: eight targets, else 10) through fuzz/run.sh,
# one test per target, failing on any crash (the input and log are left in
# build/fuzz/).  Skipped where clang cannot link a libFuzzer target
# (`make deps` installs clang and libclang-rt-14-dev).

use strict;
use warnings;

use Test::More;
use File::Temp qw(tempdir);
use FindBin;

my $root = "$FindBin::Bin/..";
my @targets = sort map { m{fuzz_(\w+)\.c$} ? $1 : () }
              glob("$root/fuzz/fuzz_*.c");

plan skip_all => 'no fuzz targets' unless @targets;
plan skip_all => 'KVA_FUZZ_SECONDS=0: fuzzing left to another stage'
    if ($ENV{KVA_FUZZ_SECONDS} // '') eq '0';

# the probe links a target: clang alone, without the runtime, is not enough
my $tmp = tempdir(CLEANUP => 1);
open(my $fh, '>', "$tmp/probe.c") or die "$tmp/probe.c: $!";
print $fh "#include <stdint.h>\n#include <stddef.h>\n"
        . "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);\n"
        . "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)"
        . " { return 0; }\n";
close($fh);

plan skip_all => 'clang with libFuzzer is not available'
    if system("clang -fsanitize=fuzzer,address,undefined -o $tmp/probe"
              . " $tmp/probe.c >/dev/null 2>&1") != 0;

my $secs = $ENV{KVA_FUZZ_SECONDS}
           || (($ENV{CI} // '') eq 'true' ? 20 : 10);

my $out = `make -s -C $root fuzz-build 2>&1`;
ok($? == 0, 'fuzz targets build') or diag($out);

for my $name (@targets) {
    # niced: the suite runs this beside tests that wait on the clock, and
    # fuzzing for a fixed time only explores less when they take the CPU
    $out = `nice -n 10 bash $root/fuzz/run.sh $secs $name 2>&1`;
    my $rc = $?;
    my ($line) = $out =~ /^(fuzz \Q$name\E: .*)$/m;

    ok($rc == 0 && $out =~ /crashes=0/, $line // "fuzz $name")
        or diag($out);
}

done_testing;
