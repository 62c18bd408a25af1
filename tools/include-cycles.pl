#!/usr/bin/perl
# Include cycles among the files of a folder, a file's .c and .h taken as
# one unit (kva_hash.c and kva_hash.h are "kva_hash"): prints each cycle
# and exits 1 when there is one.  Only #include "..." of files in the same
# folder count.
#
#   tools/include-cycles.pl src/core
#   tools/include-cycles.pl -v src/core     also the units and their edges

use strict;
use warnings;

my $verbose = @ARGV && $ARGV[0] eq '-v' ? shift : 0;
my $dir = shift // 'src/core';

opendir(my $dh, $dir) or die "$dir: $!\n";
my @files = grep { /\.[ch]\z/ } readdir $dh;
closedir $dh;

my %unit = map { $_ => (/\A(.*)\.[ch]\z/)[0] } @files;
my %edges;

for my $f (@files) {
    open(my $fh, '<', "$dir/$f") or die "$dir/$f: $!\n";
    while (<$fh>) {
        next unless /^\s*#\s*include\s+"([^"]+)"/;
        my $to = $unit{$1} or next;
        $edges{ $unit{$f} }{$to} = 1 unless $to eq $unit{$f};
    }
    close $fh;
}

if ($verbose) {
    for my $u (sort { $a cmp $b } keys %{ { map { $_ => 1 } values %unit } }) {
        printf "%-20s -> %s\n", $u, join(' ', sort keys %{ $edges{$u} // {} });
    }
}

# depth-first: a unit met again while still on the path closes a cycle
my (%state, @path, $cycles);

sub visit {
    my ($u) = @_;
    $state{$u} = 1;
    push @path, $u;
    for my $v (sort keys %{ $edges{$u} // {} }) {
        if (($state{$v} // 0) == 1) {
            my @c = @path;
            shift @c while $c[0] ne $v;
            print "cycle: ", join(' -> ', @c, $v), "\n";
            $cycles++;
        } elsif (!$state{$v}) {
            visit($v);
        }
    }
    pop @path;
    $state{$u} = 2;
}

visit($_) for sort values %unit;

print "no include cycle among the units of $dir\n" unless $cycles;
exit($cycles ? 1 : 0);
