#!/usr/bin/perl
#
# A DNS server for the tests, on 127.0.0.1 (UDP and TCP), with Debian's
# Net::DNS: answers A queries from a file the test rewrites between
# queries, so that a name's addresses change while nginx runs.
#
#   perl t/lib/dns.pl --port P --zone FILE [--ttl 1]
#
# FILE: lines "NAME ADDRESS" (one per address; "#" starts a comment).  A
# name in the file gets its A records (NOERROR, none for other types); a
# name not in it gets NXDOMAIN.  The file is read on every query.

use strict;
use warnings;

use Getopt::Long qw(GetOptions);
use Net::DNS::Nameserver;

my ($port, $zone, $ttl) = (undef, undef, 1);
GetOptions('port=i' => \$port, 'zone=s' => \$zone, 'ttl=i' => \$ttl)
    && $port && defined $zone
    or die "usage: $0 --port P --zone FILE [--ttl 1]\n";

sub records {
    my %r;
    open my $fh, '<', $zone or return \%r;
    while (my $line = <$fh>) {
        $line =~ s/#.*//;
        my ($name, $addr) = split ' ', $line;
        next unless defined $addr;
        push @{ $r{lc $name} }, $addr;
    }
    return \%r;
}

sub reply {
    my ($qname, $qclass, $qtype) = @_;
    my $r = records()->{lc $qname};

    return ('NXDOMAIN', [], [], [], { aa => 1 }) unless $r;

    my @ans = $qtype eq 'A'
              ? map { Net::DNS::RR->new("$qname $ttl IN A $_") } @$r
              : ();
    return ('NOERROR', \@ans, [], [], { aa => 1 });
}

my $ns = Net::DNS::Nameserver->new(
    LocalAddr    => ['127.0.0.1'],
    LocalPort    => $port,
    ReplyHandler => \&reply,
    Verbose      => 0,
) or die "dns: cannot listen on 127.0.0.1:$port\n";

$SIG{TERM} = $SIG{INT} = sub { exit 0 };

$ns->main_loop;
