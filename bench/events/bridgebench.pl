#!/usr/bin/perl
#
# Helper of bench/bench_bridge.sh: an engine that publishes vLLM's KV
# events (ZeroMQ PUB, msgpack batches by name, as vLLM 0.26 does) straight
# from the benchmark, so that what is timed is the bridge and nginx, not a
# simulator.  Loopback only; every loop is bounded in time.
#
#   bridgebench.pl latency --zmq Z --port P --model M --block B --count K
#       binds PUB on 127.0.0.1:Z; K times: a new prompt of token ids (4
#       blocks), its BlockStored published, then the prompt requested
#       through nginx (keys=tokens) back to back until it is routed with
#       X-KV-Matched > 0.  One line a probe: seconds from the publish to
#       the first matching answer, and the requests it took.
#
#   bridgebench.pl flood --zmq Z --model M --block B --batches N --blocks H
#       binds PUB on 127.0.0.1:Z and, once a subscriber is there, sends N
#       batches (engine steps) of one BlockStored of H fresh blocks and one
#       BlockRemoved of the H stored 64 steps before, as fast as it can.
#       Prints the hashes sent.

use strict;
use warnings;

use Data::MessagePack;
use Getopt::Long qw(GetOptionsFromArray);
use IO::Socket::INET;
use Time::HiRes qw(time sleep);

use FindBin;
use lib $FindBin::Bin;
use ProbeHttp qw(http_post);
use ZMQ::FFI;
use ZMQ::FFI::Constants qw(ZMQ_PUB ZMQ_SNDHWM);

my $mode = shift @ARGV // '';
my %o = (block => 16, count => 100, batches => 10000, blocks => 64);
GetOptionsFromArray(\@ARGV, \%o, 'zmq=i', 'port=i', 'model=s', 'block=i',
    'count=i', 'batches=i', 'blocks=i')
    or die "bad options\n";

my $mp = Data::MessagePack->new->prefer_integer(1);
my $ctx = ZMQ::FFI->new;
my $pub = $ctx->socket(ZMQ_PUB);
$pub->set(ZMQ_SNDHWM, 'int', 0);        # a flood is not dropped here
$pub->bind("tcp://127.0.0.1:$o{zmq}");
my $seq = 0;
my $hash = int(rand(2**31)) * 4096;     # engine hashes, fresh each run

sub publish {
    my (@events) = @_;
    $pub->send_multipart(['', pack('Q>', $seq++),
                          $mp->pack({ ts => time, events => \@events,
                                      data_parallel_rank => 0 })]);
}

sub stored {
    my ($hashes, $ids) = @_;
    return { type => 'BlockStored', block_hashes => $hashes,
             parent_block_hash => undef, token_ids => $ids,
             block_size => $o{block}, lora_id => undef, medium => 'GPU',
             lora_name => undef };
}

sub removed {
    my ($hashes) = @_;
    return { type => 'BlockRemoved', block_hashes => $hashes,
             medium => 'GPU' };
}

if ($mode eq 'latency') {
    my $h = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$o{port}",
                                  Proto => 'tcp') or die "nginx: $!\n";
    $h->autoflush(1);
    sleep 1;                            # the bridge's SUB connects
    for my $i (1 .. $o{count}) {
        my @ids = map { int(rand 151936) } 1 .. 4 * $o{block};
        my $body = '{"model":"' . $o{model} . '","max_tokens":1,'
                 . '"prompt":[' . join(',', @ids) . ']}';
        http_post($h, $body, '/v1/completions') == 0
            or die "probe prompt matched before it was published\n";
        my @hashes = map { $hash++ } 1 .. 4;
        my $t0 = time;
        publish(stored(\@hashes, \@ids));
        my $n = 0;
        while (1) {
            $n++;
            last if http_post($h, $body, '/v1/completions') > 0;
            die "not visible after 2 s\n" if time - $t0 > 2;
        }
        printf "%.6f %d\n", time - $t0, $n;
        sleep 0.002 + rand(0.008);
    }

} elsif ($mode eq 'flood') {
    # the batches first, so that Perl's packing is not what is timed
    my (@batches, @chains);
    for my $b (0 .. $o{batches} - 1) {
        my @hashes = map { $hash++ } 1 .. $o{blocks};
        my @ids = map { int(rand 151936) } 1 .. $o{blocks} * $o{block};
        push @chains, \@hashes;
        my @ev = (stored(\@hashes, \@ids));
        push @ev, removed($chains[$b - 64]) if $b >= 64;
        push @batches, $mp->pack({ ts => 1.0 * $b, events => \@ev,
                                   data_parallel_rank => 0 });
    }
    sleep 1;                            # the bridge's SUB connects
    my $sent = 0;
    for my $b (0 .. $#batches) {
        $pub->send_multipart(['', pack('Q>', $seq++), $batches[$b]]);
        $sent += $o{blocks} + ($b >= 64 ? $o{blocks} : 0);
    }
    sleep 0.5;
    print "$sent\n";

} else {
    die "usage: $0 latency|flood [options]\n";
}

$pub->close;
