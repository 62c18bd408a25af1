# The core's shape (issue 19): no include cycle among its files, a .c and
# its .h taken as one unit (tools/include-cycles.pl); no file over 800
# lines; and src/core/sources, the one list the Makefile and nginx's
# config build from, names every file of the folder and nothing else.

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use Test::More;

my $root = abs_path(dirname(__FILE__) . '/..');
my $core = "$root/src/core";

my $out = `perl '$root/tools/include-cycles.pl' '$core' 2>&1`;
is($? >> 8, 0, 'no include cycle among the core\'s files') or diag($out);

opendir(my $dh, $core) or die "$core: $!";
my @files = sort grep { /\.[ch]\z/ } readdir $dh;
closedir $dh;

my @long;
for my $f (@files) {
    open(my $fh, '<', "$core/$f") or die "$core/$f: $!";
    my $n = 0;
    $n++ while <$fh>;
    push @long, "$f: $n lines" if $n > 800;
}
ok(!@long, 'no core file over 800 lines (' . scalar(@files) . ' files)')
    or diag(join("\n", @long));

open(my $fh, '<', "$core/sources") or die "$core/sources: $!";
my %listed = map { s/#.*//r =~ s/\s+//gr => 1 } <$fh>;
delete $listed{''};
my @unlisted = grep { !$listed{$_} } @files;
my @gone = grep { !-e "$core/$_" } sort keys %listed;
ok(!@unlisted, 'src/core/sources lists every core file')
    or diag("not listed: @unlisted");
ok(!@gone, 'and only files that exist') or diag("gone: @gone");

done_testing();
