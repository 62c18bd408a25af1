#!/usr/bin/perl
#
# Helper of bench/bench_events.sh: the Redis and HTTP clients of the
# precise-mode benchmark.  Core Perl only; loopback only; every loop is
# bounded in time.
#
#   evbench.pl gen-ingest --out F --messages N --hashes H --server S
#       [--sentinel-server X --sentinel HASH,...]
#       RESP file of N PUBLISH commands (seq 1..N, H fresh random hashes
#       each, one "stored" event) for `redis-cli --pipe`, then one sentinel
#       message that stores HASHes on server X.  --ranks R: message i
#       goes to rank i % R (each rank its own seq 1, 2, ...), the
#       sentinel to rank 0.
#
#   evbench.pl gen-fresh --out F --server S1,S2,... --ranks R
#       RESP file of a heartbeat (seq 0, no events) for every rank of
#       every server: all of them fresh, so that routing trusts events
#       only.
#
#   evbench.pl probe --port P --body F [--timeout S] [--interval MS]
#       Sends the request body F to nginx (keep-alive) until X-KV-Matched
#       > 0; prints the time (epoch s) when it did.  Used to time (1).
#
#   evbench.pl stream --redis P --server S --rate R --hashes H --seconds D
#       [--channel C]
#       Publishes R messages/s (one "stored" event of H fresh hashes each)
#       for D seconds, paced in 1 ms slices; first a snapshot "full" so the
#       server is fresh whatever came before.  Prints the rate achieved.
#
#   evbench.pl latency --redis P --port N --server X --hasher BIN
#       --block-size B --count K [--channel C]
#       K times: a new prompt; PUBLISH a "stored" event of its block
#       hashes on server X, then request the prompt back to back until
#       nginx routes it with X-KV-Matched > 0.  Prints one line per probe:
#       publish-to-visible seconds, and the number of requests it took.

use strict;
use warnings;

use Getopt::Long qw(GetOptionsFromArray);
use IO::Select;
use IO::Socket::INET;
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Time::HiRes qw(time sleep);

use FindBin;
use lib $FindBin::Bin;
use ProbeHttp qw(write_all http_post);

my $mode = shift @ARGV // '';
my %o = (channel => 'kv_aware:events', timeout => 30, interval => 1);
GetOptionsFromArray(\@ARGV, \%o, 'out=s', 'messages=i', 'hashes=i',
    'server=s', 'sentinel-server=s', 'sentinel=s', 'port=i', 'body=s',
    'timeout=f', 'interval=f', 'redis=i', 'rate=i', 'seconds=f',
    'channel=s', 'hasher=s', 'block-size=i', 'count=i', 'tag=s',
    'ranks=i')
    or die "bad options\n";

sub rand_hash { sprintf '%08x%08x', int(rand 2**32), int(rand 2**32) }

sub resp {
    my $s = '*' . scalar(@_) . "\r\n";
    $s .= '$' . length($_) . "\r\n$_\r\n" for @_;
    return $s;
}

sub message {
    my ($server, $seq, $hashes, $snapshot, $rank) = @_;
    my $ev = @$hashes
        ? '[{"type":"stored","hashes":["' . join('","', @$hashes) . '"]}]'
        : '[]';
    my $r = defined $rank ? qq("rank":$rank,) : '';
    return qq({"v":1,"server":"$server",$r"seq":$seq,"events":$ev)
         . ($snapshot ? qq(,"snapshot":"$snapshot"}) : '}');
}

sub connect_tcp {
    my ($port) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Proto => 'tcp', Timeout => 5)
        or die "connect 127.0.0.1:$port: $@\n";
    setsockopt($s, IPPROTO_TCP, TCP_NODELAY, 1);
    binmode $s;
    return $s;
}

sub drain {
    my ($s) = @_;
    my $sel = IO::Select->new($s);
    my $buf;
    while ($sel->can_read(0)) {
        my $n = sysread($s, $buf, 1 << 20);
        die "redis closed the connection\n" unless $n;
    }
}

sub slurp { local (@ARGV, $/) = @_; <> }

# the block hashes of a body, by the module's own code (kva_hashes)
sub block_hashes {
    my ($bin, $bs, $body) = @_;
    my $file = "/tmp/evbench-$$.json";
    open(my $fh, '>', $file) or die "$file: $!";
    print {$fh} $body;
    close $fh;
    my @h = split /\n/, qx{$bin $bs < $file};
    unlink $file;
    return @h;
}

sub prompt_body {
    my ($tag, $bytes) = @_;
    my $text = '';
    my $i = 0;
    $text .= "[$tag/" . $i++ . "] a probe prompt, one of a kind. "
        while length $text < $bytes;
    return qq({"model":"bench","messages":[{"role":"user","content":")
         . $text . qq("}]});
}


if ($mode eq 'gen-ingest') {
    open(my $fh, '>', $o{out}) or die "$o{out}: $!\n";
    my $ranks = $o{ranks};
    for my $i (0 .. $o{messages} - 1) {
        my @h = map { rand_hash() } 1 .. $o{hashes};
        print {$fh} resp('PUBLISH', $o{channel},
                         $ranks ? message($o{server}, int($i / $ranks) + 1,
                                          \@h, undef, $i % $ranks)
                                : message($o{server}, $i + 1, \@h));
    }
    if ($o{sentinel}) {
        print {$fh} resp('PUBLISH', $o{channel},
                         message($o{'sentinel-server'}, $ranks ? 1 : 2,
                                 [split /,/, $o{sentinel}], undef,
                                 $ranks ? 0 : undef));
    }
    close $fh or die "$o{out}: $!\n";

} elsif ($mode eq 'gen-fresh') {
    open(my $fh, '>', $o{out}) or die "$o{out}: $!\n";
    for my $server (split /,/, $o{server}) {
        print {$fh} resp('PUBLISH', $o{channel},
                         message($server, 0, [], undef, $_))
            for 0 .. $o{ranks} - 1;
    }
    close $fh or die "$o{out}: $!\n";

} elsif ($mode eq 'probe') {
    my $body = slurp($o{body});
    my $s = connect_tcp($o{port});
    my $deadline = time + $o{timeout};
    while (time < $deadline) {
        if (http_post($s, $body) > 0) {
            printf "%.6f\n", time;
            exit 0;
        }
        sleep $o{interval} / 1000;
    }
    die "probe: no match within $o{timeout} s\n";

} elsif ($mode eq 'stream') {
    my $s = connect_tcp($o{redis});
    my $seq = int(time * 1000);
    write_all($s, resp('PUBLISH', $o{channel},
                       message($o{server}, $seq, [], 'full')));
    my $t0 = time;
    my $end = $t0 + $o{seconds};
    my $sent = 0;
    while ((my $now = time) < $end) {
        my $due = int(($now - $t0) * $o{rate});
        my $buf = '';
        while ($sent < $due) {
            my @h = map { rand_hash() } 1 .. $o{hashes};
            $buf .= resp('PUBLISH', $o{channel},
                         message($o{server}, ++$seq, \@h));
            $sent++;
        }
        write_all($s, $buf) if length $buf;
        drain($s);
        sleep 0.001;
    }
    my $dt = time - $t0;
    printf "%d messages in %.2f s: %.0f/s\n", $sent, $dt, $sent / $dt;

} elsif ($mode eq 'latency') {
    my $r = connect_tcp($o{redis});
    my $h = connect_tcp($o{port});
    my $tag = $o{tag} // "p$$";
    my $seq = int(time * 1000);
    write_all($r, resp('PUBLISH', $o{channel},
                       message($o{server}, $seq, [], 'full')));
    my @probes;
    for my $i (1 .. $o{count}) {
        my $body = prompt_body("$tag-$i", 4 * $o{'block-size'});
        push @probes, [$body, [block_hashes($o{hasher}, $o{'block-size'},
                                            $body)]];
    }
    sleep 0.2;
    drain($r);
    for my $p (@probes) {
        my ($body, $hashes) = @$p;
        http_post($h, $body) == 0
            or die "probe prompt matched before it was published\n";
        my $msg = resp('PUBLISH', $o{channel},
                       message($o{server}, ++$seq, $hashes));
        my $t0 = time;
        write_all($r, $msg);
        my $n = 0;
        while (1) {
            $n++;
            last if http_post($h, $body) > 0;
            die "not visible after 2 s\n" if time - $t0 > 2;
        }
        my $dt = time - $t0;
        printf "%.6f %d\n", $dt, $n;
        drain($r);
        sleep 0.002 + rand(0.008);
    }

} else {
    die "usage: $0 gen-ingest|probe|stream|latency [options]\n";
}
