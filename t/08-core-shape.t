# The core's and the shell's shape (issue 19): no include cycle among the
# files of src/core/ nor among those of src/, a .c and its .h taken as one
# unit (tools/include-cycles.pl); no core file over 800 lines and no shell
# .c over 700; and src/core/sources, the one list the Makefile and nginx's
# config build from, names every file of the folder and nothing else.

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use Test::More;

my $root = abs_path(dirname(__FILE__) . '/..');
my $core = "$root/src/core";
my $shell = "$root/src";

for ([$core, 'the core\'s files'], [$shell, 'the shell\'s files']) {
    my ($dir, $what) = @$_;
    my $out = `perl '$root/tools/include-cycles.pl' '$dir' 2>&1`;
    is($? >> 8, 0, "no include cycle among $what") or diag($out);
}

# the files of a folder that match re, each with its line count
sub line_counts {
    my ($dir, $re) = @_;
    opendir(my $dh, $dir) or die "$dir: $!";
    my @files = sort grep { $_ =~ $re && -f "$dir/$_" } readdir $dh;
    closedir $dh;
    my %n;
    for my $f (@files) {
        open(my $fh, '<', "$dir/$f") or die "$dir/$f: $!";
        $n{$f} = 0;
        $n{$f}++ while <$fh>;
    }
    return \%n;
}

my $lines = line_counts($core, qr/\.[ch]\z/);
my @files = sort keys %$lines;
my @long = map { "$_: $lines->{$_} lines" } grep { $lines->{$_} > 800 } @files;
ok(!@long, 'no core file over 800 lines (' . scalar(@files) . ' files)')
    or diag(join("\n", @long));

my $shell_lines = line_counts($shell, qr/\.c\z/);
my @shell_c = sort keys %$shell_lines;
@long = map { "$_: $shell_lines->{$_} lines" }
        grep { $shell_lines->{$_} > 700 } @shell_c;
ok(@shell_c && !@long,
   'no shell .c over 700 lines (' . scalar(@shell_c) . ' files)')
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
