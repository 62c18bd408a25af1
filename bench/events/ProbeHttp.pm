package ProbeHttp;

# What the event benchmarks' probes share (bench/events/evbench.pl,
# bench/events/bridgebench.pl): a POST to nginx on a kept-alive
# connection, answered with the X-KV-Matched header nginx adds, so that a
# probe can tell when what it published became visible.  Core Perl only.

use strict;
use warnings;

use Exporter qw(import);
use Time::HiRes qw(time);

our @EXPORT_OK = qw(write_all http_post);

sub write_all {
    my ($s, $data) = @_;
    my $off = 0;
    while ($off < length $data) {
        my $n = syswrite($s, $data, length($data) - $off, $off);
        die "write: $!\n" unless defined $n;
        $off += $n;
    }
}

my $buf = '';

# POSTs $body to $path (default /v1/chat/completions) and returns the
# answer's X-KV-Matched (-1 without one); dies on anything but a 200
sub http_post {
    my ($s, $body, $path) = @_;
    write_all($s, 'POST ' . ($path // '/v1/chat/completions')
                . " HTTP/1.1\r\nHost: bench\r\n"
                . "Content-Type: application/json\r\n"
                . "Content-Length: " . length($body) . "\r\n\r\n$body");
    my $deadline = time + 10;
    while (1) {
        my $e = index($buf, "\r\n\r\n");
        if ($e >= 0) {
            my $head = substr($buf, 0, $e);
            my ($cl) = $head =~ /^Content-Length:\s*(\d+)/mi;
            $cl //= 0;
            if (length($buf) >= $e + 4 + $cl) {
                substr($buf, 0, $e + 4 + $cl, '');
                die "HTTP error: " . ($head =~ /^(\S+ \d+)/)[0] . "\n"
                    unless $head =~ m{^HTTP/1\.1 200};
                my ($m) = $head =~ /^X-KV-Matched:\s*(\d+)/mi;
                return $m // -1;
            }
        }
        die "HTTP timeout\n" if time > $deadline;
        my $n = sysread($s, $buf, 65536, length $buf);
        die "nginx closed the connection\n" unless $n;
    }
}

1;
