# Every configuration in conf-examples/ passes `nginx -t` with the module
# built here.  The directory is globbed: a new example is covered as soon
# as it is added.
#
# Each example is copied (with its siblings, for relative includes) into a
# temp prefix; its "load_module ...ngx_http_kv_aware_module.so;" line is
# pointed at the built module; pid and error log go to the temp prefix.

use strict;
use warnings;

use Test::More;
use File::Basename qw(basename dirname);
use File::Copy qw(copy);
use File::Path qw(make_path);
use File::Temp qw(tempdir);
use Cwd qw(abs_path);

use Test::KvAware qw(skip_unless_module module_path);

skip_unless_module();

my $NGINX = $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx';
# make test-asan: "nginx -t" exits without freeing the configuration it
# read, so no leak check; any other sanitizer report is in the output
$ENV{ASAN_OPTIONS} = join ':', grep { length } $ENV{ASAN_OPTIONS} // '',
                                               'detect_leaks=0';
my $root = abs_path(dirname(__FILE__) . '/..');
my @examples = sort glob("$root/conf-examples/*.conf");

cmp_ok(scalar @examples, '>=', 2, 'conf-examples/ has examples ('
       . join(' ', map { basename $_ } @examples) . ')');

my $module = module_path();

for my $file (@examples) {
    my $name = basename $file;
    my $tmp = tempdir("kvaware-example-XXXXXX", TMPDIR => 1,
                      CLEANUP => !$ENV{TEST_KEEP});
    make_path("$tmp/conf", "$tmp/logs");

    for my $sib (glob "$root/conf-examples/*") {
        copy($sib, "$tmp/conf/" . basename $sib) or die "copy $sib: $!";
    }

    open(my $in, '<', $file) or die "$file: $!";
    my $text = do { local $/; <$in> };
    close $in;

    my $n = ($text =~ s{^(\s*load_module\s+)\S*ngx_http_kv_aware_module\.so\s*;}
                        {$1$module;}mg);
    is($n, 1, "$name: loads the module once");
    like($text, qr/^\s*kv_aware\b/m, "$name: uses kv_aware");

    # a pid of its own would clash with the -g one below: rewrite it
    my $pid = ($text =~ s{^(\s*pid\s+)[^;]*;}{$1$tmp/logs/nginx.pid;}mg)
            ? '' : "pid $tmp/logs/nginx.pid; ";

    open(my $out, '>', "$tmp/conf/$name") or die $!;
    print {$out} $text;
    close $out;

    my @cmd = ($NGINX, '-t', '-p', "$tmp/", '-e', "$tmp/logs/error.log",
               '-c', "$tmp/conf/$name",
               '-g', "${pid}error_log $tmp/logs/error.log;");
    my $output = qx{@{[ map { quotemeta } @cmd ]} 2>&1};
    my $rc = $?;
    is($rc, 0, "$name: nginx -t passes") or diag $output;
    unlike($output, qr/\[(?:emerg|alert|crit|warn)\]|runtime error|Sanitizer/,
           "$name: no warnings")
        or diag $output;
}

done_testing;
