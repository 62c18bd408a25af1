# A clone tests on its own: the committed HEAD cloned into an empty
# folder, with no ../shared beside it and no NGINX_VENDOR, builds the
# nginx of make test-nginx (tools/build-nginx.sh 1.30.4) from the tarball
# vendored in vendor/nginx/, and that nginx loads the module it built.
# Before it, build-nginx.sh refuses a tarball whose SHA-256 is not the
# pinned one, and a version that has none, without unpacking anything.
#
# The build is from nothing, no objects reused: a clone has none, and
# what is checked is that a clone needs nothing more.  It costs about
# 100 s of CPU (under a minute on 2 idle cores; 6 minutes when measured
# on a loaded shared machine), so it runs once, in the stage on Debian's
# nginx (no TEST_NGINX_BINARY); the other stages' nginx is built the
# same way by make itself.  What is tested is HEAD: uncommitted changes
# are not in the clone.

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Copy qw(copy);
use File::Temp qw(tempdir);
use Test::More;


my $root    = abs_path('.');
my $VERSION = '1.30.4';

plan skip_all => 'run once, in make test-debian (TEST_NGINX_BINARY is '
               . 'set: its nginx is built by make already)'
    if $ENV{TEST_NGINX_BINARY};
plan skip_all => 'no git' if system('git --version >/dev/null 2>&1') != 0;
my $head = `git -C '$root' rev-parse --verify -q HEAD 2>/dev/null`;
chomp $head;
plan skip_all => 'not a git checkout with a commit' unless $head;

my $d = tempdir(CLEANUP => 1);
my $repo = "$d/repo";
my $out = `git clone -q --no-checkout '$root' '$repo' 2>&1 \\
           && git -C '$repo' checkout -q --detach $head 2>&1`;
is($?, 0, "HEAD ($head) cloned into an empty folder") or diag($out);
ok(!-e "$d/shared", 'no ../shared beside the clone');

# build-nginx.sh, with none of this environment's hints
sub build_nginx {
    my (@args) = @_;
    my $env = 'env -u NGINX_VENDOR';
    if (@args && $args[0] =~ /^NGINX_VENDOR=/) {
        $env = 'env ' . shift @args;
    }
    my $o = `cd '$repo' && $env bash tools/build-nginx.sh @args 2>&1`;
    return ($? >> 8, $o);
}

# a tarball that is not the pinned one is refused before it is unpacked
{
    my $bad = "$d/bad";
    mkdir $bad or die "$bad: $!";
    copy("$repo/vendor/nginx/nginx-$VERSION.tar.gz",
         "$bad/nginx-$VERSION.tar.gz") or die "copy: $!";
    open my $fh, '+<:raw', "$bad/nginx-$VERSION.tar.gz" or die $!;
    seek $fh, 1000, 0;
    print {$fh} 'x';
    close $fh;
    my ($rc, $o) = build_nginx("NGINX_VENDOR=$bad", $VERSION);
    isnt($rc, 0, 'a changed tarball is refused');
    like($o, qr/SHA-256 mismatch for \S+nginx-\Q$VERSION\E\.tar\.gz/,
         '... saying so') or diag($o);

    copy("$repo/vendor/nginx/nginx-$VERSION.tar.gz",
         "$bad/nginx-0.0.1.tar.gz") or die "copy: $!";
    ($rc, $o) = build_nginx("NGINX_VENDOR=$bad", '0.0.1');
    isnt($rc, 0, 'a version with no pinned SHA-256 is refused');
    like($o, qr/nginx-0\.0\.1\.tar\.gz is not in \S+SHA256SUMS/,
         '... saying so') or diag($o);
    ok(!-e "$repo/build", 'nothing was unpacked');
}

# the build of make test-nginx, in the clone
my $t0 = time;
my ($rc, $o) = build_nginx($VERSION);
is($rc, 0, "nginx $VERSION built in the clone (" . (time - $t0) . ' s)')
    or diag($o);
my ($nginx)  = $o =~ /^NGINX=(.*)$/m;
my ($module) = $o =~ /^MODULE=(.*)$/m;
ok($nginx && -x $nginx && index($nginx, "$repo/build/") == 0,
   'its nginx is in the clone\'s build/') or diag($o);
ok($module && -f $module, 'and the module beside it') or diag($o);

SKIP: {
    skip 'no nginx built', 3 unless $nginx && -x $nginx && $module;

    like(`'$nginx' -V 2>&1`, qr{nginx/\Q$VERSION\E\b}, "it is nginx $VERSION");

    my $p = "$d/prefix";
    mkdir $p;
    mkdir "$p/logs";
    open my $fh, '>', "$p/nginx.conf" or die $!;
    print {$fh} "load_module $module;\nevents {}\n",
        "http { upstream u { kv_aware; server 127.0.0.1:1; } }\n";
    close $fh;
    my $msg = `'$nginx' -p '$p' -c '$p/nginx.conf' -e '$p/logs/error.log' \\
                   -t 2>&1`;
    is($?, 0, 'it loads the module, kv_aware configured') or diag($msg);

    # nothing changed: nothing is redone
    my ($rc2, $o2) = build_nginx($VERSION);
    ok($rc2 == 0 && $o2 !~ /building|configuring/,
       'a second run builds nothing') or diag($o2);
}

done_testing;
