# docs/development.md's "Layout" names every file of the repository in the
# first column of its tables, one or more a row (the fuzz corpora and the
# benchmark results by their folders, written with a trailing slash), so
# that a reader finds what a file is for, and a file added without a line
# there fails here.  Files listed that no longer exist fail too.

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use Test::More;

my $root = abs_path(dirname(__FILE__) . '/..');

plan skip_all => 'not a git checkout'
    unless -d "$root/.git" || -f "$root/.git";

my @files = grep { !m{^(fuzz/corpus|bench/results)/} }
            split /\n/, `git -C '$root' ls-files 2>/dev/null`;
plan skip_all => 'git ls-files gave nothing' unless @files;

my $doc = 'docs/development.md';
open my $fh, '<', "$root/$doc" or die "$doc: $!";
my $text = do { local $/; <$fh> };
my ($layout) = $text =~ /^## Layout\n(.*?)(?=^## |\z)/ms;

ok(defined $layout, "$doc has a Layout section");
$layout //= '';

# the first column of the Layout's tables: one or more `path`s
my %named;
for my $cell ($layout =~ /^\|([^|\n]*)\|/mg) {
    $named{$_} = 1 for $cell =~ /`([^`\s]+)`/g;
}
delete $named{$_} for grep { m{/$} } keys %named;   # folders
my @missing = grep { !$named{$_} } @files;
ok(!@missing, 'every file is named in the Layout (' . scalar(@files)
              . ' files)')
    or diag("not in ${doc}'s Layout:\n  " . join("\n  ", @missing));

my @gone = grep { !-e "$root/$_" } keys %named;
ok(!@gone, 'every file the Layout names exists')
    or diag("named but missing:\n  " . join("\n  ", sort @gone));

done_testing();
