#!/usr/bin/perl
#
# Helper of bench/bench_fanout.sh: the publisher of 256 caches' events and
# the probe that times them in several nginx at once.  Core Perl only;
# loopback only; every loop is bounded in time.
#
#   fanout.pl stream --redis P --first PORT --servers N --ranks R
#       --rate M --hashes H --seconds D --seq-file F
#       The caches 127.0.0.1:PORT .. PORT+N-1, ranks 0 .. R-1 each: M
#       messages a second in all (one "stored" event of H fresh hashes
#       each), the caches in turn, paced in 1 ms slices, for D seconds.
#       Each cache's seq goes on from F (and is written back there at
#       the end): a jump would be a gap to nginx; the first run starts
#       with an empty snapshot "full" of each.  Prints "SENT
#       SECONDS" at the end or on SIGTERM.
#
#   fanout.pl probe --redis P --nginx PORT,PORT,... --server S --ranks R
#       --hasher BIN --block-size B --count K --seq-file F
#       Seqs as stream's.  K times: a prompt nobody holds, checked
#       unmatched in every nginx; a "stored" event of its block hashes on server S, rank K mod R;
#       then the prompt sent to every nginx at once, again to those that
#       did not match it yet, until all did.  One line a probe: the
#       seconds from the publish to each nginx's first matching answer,
#       then "agree" (1 when every nginx's matching answer came from one
#       cache) and "right" (1 when that cache is the one published).
#
#   fanout.pl spread --nginx PORT,PORT,... --count K
#       K prompts nobody holds, each sent once to every nginx: prints how
#       many of them every nginx routed to one cache (without events
#       each nginx picks alone among equals).

use strict;
use warnings;

use Getopt::Long qw(GetOptionsFromArray);
use IO::Select;
use IO::Socket::INET;
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Time::HiRes qw(time sleep);

my $mode = shift @ARGV // '';
my %o = (channel => 'kv_aware:events', ranks => 1, hashes => 8,
         'block-size' => 256, count => 100);
GetOptionsFromArray(\@ARGV, \%o, 'redis=i', 'first=i', 'servers=i',
    'ranks=i', 'rate=i', 'hashes=i', 'seconds=f', 'nginx=s', 'server=s',
    'hasher=s', 'block-size=i', 'count=i', 'channel=s', 'tag=s',
    'seq-file=s')
    or die "bad options\n";

sub resp {
    my $s = '*' . scalar(@_) . "\r\n";
    $s .= '$' . length($_) . "\r\n$_\r\n" for @_;
    return $s;
}

sub message {
    my ($server, $rank, $seq, $hashes, $snapshot) = @_;
    my $ev = @$hashes
        ? '[{"type":"stored","hashes":["' . join('","', @$hashes) . '"]}]'
        : '[]';
    return qq({"v":1,"server":"$server","rank":$rank,"seq":$seq,)
         . qq("events":$ev) . ($snapshot ? qq(,"snapshot":"$snapshot"}) : '}');
}

# each cache's last seq, "SERVER RANK SEQ" a line; a first run starts
# every cache with an empty snapshot: nginx trusts a server's events from
# its first snapshot on (a first seq of its own would be a gap), and
# clearing is cheap while the index is empty, where later a clear scans
# the index under a budget of nginx's own
sub load_seqs {
    my ($caches, $buf) = @_;
    my %seq;
    if ($o{'seq-file'} && open(my $fh, '<', $o{'seq-file'})) {
        while (<$fh>) {
            my ($s, $r, $n) = split;
            $seq{"$s $r"} = $n;
        }
    }
    my $seq0 = int(time * 1000);
    for my $c (@$caches) {
        next if defined $seq{"@$c"};
        $seq{"@$c"} = $seq0;
        $$buf .= resp('PUBLISH', $o{channel},
                      message(@$c, $seq0, [], 'full'));
    }
    return \%seq;
}

sub save_seqs {
    my ($seq) = @_;
    return unless $o{'seq-file'};
    open(my $fh, '>', $o{'seq-file'}) or die "$o{'seq-file'}: $!\n";
    print {$fh} "$_ $seq->{$_}\n" for sort keys %$seq;
    close $fh;
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

sub write_all {
    my ($s, $data) = @_;
    my $off = 0;
    while ($off < length $data) {
        my $n = syswrite($s, $data, length($data) - $off, $off);
        die "write: $!\n" unless defined $n;
        $off += $n;
    }
}

# Redis answers every PUBLISH with a count: read them off as they come
sub drain {
    my ($s) = @_;
    my $sel = IO::Select->new($s);
    my $buf;
    while ($sel->can_read(0)) {
        my $n = sysread($s, $buf, 1 << 20);
        die "redis closed the connection\n" unless $n;
    }
}

sub block_hashes {
    my ($bin, $bs, $body) = @_;
    my $file = "/tmp/fanout-$$.json";
    open(my $fh, '>', $file) or die "$file: $!";
    print {$fh} $body;
    close $fh;
    my @h = split /\n/, qx{$bin $bs < $file};
    unlink $file;
    @h or die "$bin gave no hashes\n";
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

# POSTs $body to every socket of @$socks at once; returns, for each, the
# time its answer came, its X-KV-Matched and its body (the cache that
# served it: "PORT/RANK")
sub post_all {
    my ($socks, $body) = @_;
    my $req = "POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"
            . "Content-Type: application/json\r\n"
            . "Content-Length: " . length($body) . "\r\n\r\n$body";
    write_all($_, $req) for @$socks;
    my %buf = map { $_ => '' } @$socks;
    my %ans;
    my $sel = IO::Select->new(@$socks);
    my $deadline = time + 10;
    while ($sel->count) {
        die "HTTP timeout\n" if time > $deadline;
        for my $s ($sel->can_read(1)) {
            my $n = sysread($s, $buf{$s}, 65536, length $buf{$s});
            die "nginx closed the connection\n" unless $n;
            my $e = index($buf{$s}, "\r\n\r\n");
            next if $e < 0;
            my $head = substr($buf{$s}, 0, $e);
            my ($cl) = $head =~ /^Content-Length:\s*(\d+)/mi;
            $cl //= 0;
            next if length($buf{$s}) < $e + 4 + $cl;
            die "HTTP error: " . ($head =~ /^(\S+ \d+)/)[0] . "\n"
                unless $head =~ m{^HTTP/1\.1 200};
            my ($m) = $head =~ /^X-KV-Matched:\s*(\d+)/mi;
            $ans{$s} = [time, $m // -1, substr($buf{$s}, $e + 4, $cl)];
            $sel->remove($s);
        }
    }
    return map { $ans{$_} } @$socks;
}

if ($mode eq 'stream') {
    my $s = connect_tcp($o{redis});
    my @caches;
    for my $p ($o{first} .. $o{first} + $o{servers} - 1) {
        push @caches, ["127.0.0.1:$p", $_] for 0 .. $o{ranks} - 1;
    }
    my $buf = '';
    my $seq = load_seqs(\@caches, \$buf);
    write_all($s, $buf) if length $buf;
    # hashes: a counter from a random start, 16 hex digits, never repeated
    my $h = int(rand(2**30)) * 2**30;
    my $t0 = time;
    my $end = $t0 + $o{seconds};
    my ($sent, $i) = (0, 0);
    $SIG{TERM} = $SIG{INT} = sub { $end = 0 };
    while ((my $now = time) < $end) {
        my $due = int(($now - $t0) * $o{rate});
        $buf = '';
        while ($sent < $due) {
            my $c = $caches[$i++ % @caches];
            my @h = map { sprintf '%016x', $h++ } 1 .. $o{hashes};
            $buf .= resp('PUBLISH', $o{channel},
                         message(@$c, ++$seq->{"@$c"}, \@h));
            $sent++;
        }
        write_all($s, $buf) if length $buf;
        drain($s);
        sleep 0.001;
    }
    save_seqs($seq);
    printf "%d %.3f\n", $sent, time - $t0;

} elsif ($mode eq 'probe') {
    my $r = connect_tcp($o{redis});
    my @ports = split /,/, $o{nginx};
    my @h = map { connect_tcp($_) } @ports;
    my $tag = $o{tag} // "p$$";
    my ($port) = $o{server} =~ /:(\d+)$/ or die "--server HOST:PORT\n";
    my $buf = '';
    my $seq = load_seqs([map { [$o{server}, $_] } 0 .. $o{ranks} - 1],
                        \$buf);
    write_all($r, $buf) if length $buf;
    my @probes;
    for my $i (1 .. $o{count}) {
        my $body = prompt_body("$tag-$i", 4 * $o{'block-size'});
        push @probes, [$body, [block_hashes($o{hasher}, $o{'block-size'},
                                            $body)]];
    }
    sleep 0.2;
    drain($r);
    my $n = 0;
    for my $p (@probes) {
        my ($body, $hashes) = @$p;
        my $rank = $n++ % $o{ranks};
        $_->[1] == 0 or die "probe prompt matched before it was published\n"
            for post_all(\@h, $body);
        my $msg = resp('PUBLISH', $o{channel},
                       message($o{server}, $rank, ++$seq->{"$o{server} $rank"},
                               $hashes));
        my $t0 = time;
        write_all($r, $msg);
        my @left = (0 .. $#h);
        my (@dt, @where);
        while (@left) {
            die "not visible in every nginx after 5 s\n" if time - $t0 > 5;
            my @a = post_all([@h[@left]], $body);
            my @still;
            for my $k (0 .. $#left) {
                if ($a[$k][1] > 0) {
                    $dt[$left[$k]] = $a[$k][0] - $t0;
                    $where[$left[$k]] = $a[$k][2];
                } else {
                    push @still, $left[$k];
                }
            }
            @left = @still;
        }
        my $agree = (grep { $_ eq $where[0] } @where) == @where ? 1 : 0;
        my $right = $agree && $where[0] eq "$port/$rank" ? 1 : 0;
        print join(' ', (map { sprintf '%.6f', $_ } @dt), $agree, $right),
              "\n";
        drain($r);
        sleep 0.002 + rand(0.008);
    }
    save_seqs($seq);

} elsif ($mode eq 'spread') {
    my @h = map { connect_tcp($_) } split /,/, $o{nginx};
    my $tag = $o{tag} // "s$$";
    my $agree = 0;
    for my $i (1 .. $o{count}) {
        my @a = post_all(\@h, prompt_body("$tag-$i", 1024));
        $agree++ if (grep { $_->[2] eq $a[0][2] } @a) == @a;
    }
    print "$agree $o{count}\n";

} else {
    die "usage: $0 stream|probe|spread [options]\n";
}
