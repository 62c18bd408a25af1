#!/usr/bin/perl
#
# Helper of bench/bench_loop.sh: engines that publish vLLM's KV events
# (ZeroMQ PUB and replay ROUTER, msgpack batches by name) straight from the
# benchmark, one hostile, one timed.  Loopback only; every loop is bounded
# in time.
#
#   loopbench.pl flood --zmq Z --seconds T [--replay]
#       binds PUB on 127.0.0.1:Z and the replay ROUTER on Z + 1.  Without
#       --replay, sends batches of 64 stored and 64 removed blocks (about
#       40 KB) as fast as it can for T s.  With --replay, publishes one
#       batch, then one 3,001 seqs ahead: the bridge asks for the gap,
#       and the 3,000 batches are answered at once, as a replay burst;
#       again each time the last one ends, for T s.  Prints what it sent.
#
#   loopbench.pl steady --zmq Z --redis P --server S --rate R --seconds T
#       binds PUB on 127.0.0.1:Z, subscribes to kv_aware:events on Redis
#       P, and R times a second publishes a batch of one new block; the
#       latency is from the publish to the bridge's message for server S
#       with a "stored" event.  Prints count, p50, p99 and max in ms.

use strict;
use warnings;

use Data::MessagePack;
use Getopt::Long qw(GetOptionsFromArray);
use JSON::PP;
use Redis;
use Time::HiRes qw(time sleep);
use ZMQ::FFI;
use ZMQ::FFI::Constants qw(ZMQ_PUB ZMQ_ROUTER ZMQ_SNDHWM ZMQ_DONTWAIT);

my $mode = shift @ARGV // '';
my %o = (seconds => 10, rate => 100, block => 16);
GetOptionsFromArray(\@ARGV, \%o, 'zmq=i', 'redis=i', 'server=s', 'rate=i',
    'seconds=f', 'replay', 'block=i')
    or die "bad options\n";

my $mp = Data::MessagePack->new->prefer_integer(1);
my $ctx = ZMQ::FFI->new;
my $pub = $ctx->socket(ZMQ_PUB);
$pub->set(ZMQ_SNDHWM, 'int', 100000);
$pub->bind("tcp://127.0.0.1:$o{zmq}");
my $hash = int(rand(2**31)) * 4096;     # engine hashes, fresh each run

sub batch {
    my (@events) = @_;
    return $mp->pack({ ts => time, events => \@events,
                       data_parallel_rank => 0 });
}

sub stored {
    my ($hashes) = @_;
    return { type => 'BlockStored', block_hashes => $hashes,
             parent_block_hash => undef,
             # tokens of their own a block: blocks of one key are one
             # block to nginx, published once
             token_ids => [map { my $h = $_;
                                 map { 1000 + ($h * $o{block} + $_)
                                              % 1_000_000_000 }
                                     0 .. $o{block} - 1 } @$hashes],
             block_size => $o{block}, lora_id => undef, medium => 'GPU',
             lora_name => undef };
}

sub removed {
    my ($hashes) = @_;
    return { type => 'BlockRemoved', block_hashes => $hashes,
             medium => 'GPU' };
}

if ($mode eq 'flood') {
    # 64 payloads made once: Perl packs far slower than the bridge reads
    my @pay = map {
        my $b = $hash + $_ * 64;
        batch(stored([$b .. $b + 63]), removed([$b - 4096 .. $b - 4033]));
    } 0 .. 63;
    sleep 1;                            # the bridge's SUB connects
    my $end = time + $o{seconds};
    my ($seq, $sent) = (0, 0);

    if (!$o{replay}) {
        while (time < $end) {
            for (1 .. 256) {
                $pub->send_multipart(['', pack('Q>', $seq), $pay[$seq % 64]]);
                $seq++;
            }
        }
        print "flood: $seq batches on the event socket\n";
        exit 0;
    }

    my $router = $ctx->socket(ZMQ_ROUTER);
    $router->set(ZMQ_SNDHWM, 'int', 0);
    $router->bind('tcp://127.0.0.1:' . ($o{zmq} + 1));
    my $bursts = 0;
    $pub->send_multipart(['', pack('Q>', $seq), $pay[0]]);
    while (time < $end) {
        # a gap of 3,000, then its replay at once when asked
        $seq += 3001;
        $pub->send_multipart(['', pack('Q>', $seq), $pay[$seq % 64]]);
        my $asked = time + 3;
        while (time < $asked && !$router->has_pollin) {
            sleep 0.001;
        }
        last unless $router->has_pollin;
        my ($id, $empty, $from) = $router->recv_multipart;
        $from = unpack('Q>', $from);
        for my $s ($from .. $seq - 1) {
            $router->send_multipart([$id, '', pack('Q>', $s),
                                     $pay[$s % 64]]);
            $sent++;
        }
        $router->send_multipart([$id, '', pack('Q>', 2**64 - 1), '']);
        $bursts++;
        sleep 0.2;
    }
    print "flood: $bursts replay bursts, $sent batches replayed\n";
    exit 0;
}

if ($mode eq 'steady') {
    my $json = JSON::PP->new->utf8;
    my $r = Redis->new(server => "127.0.0.1:$o{redis}", cnx_timeout => 5);
    my @due;                            # publish times, oldest first
    my @lat;
    $r->subscribe('kv_aware:events', sub {
        my ($payload) = @_;
        my $t = time;
        my $m = eval { $json->decode($payload) } or return;
        return unless ($m->{server} // '') eq $o{server};
        return unless grep { $_->{type} eq 'stored' }
                      @{ $m->{events} // [] };
        my $t0 = shift @due;
        push @lat, $t - $t0 if defined $t0;
    });
    sleep 1;                            # the bridge's SUB connects
    my $seq = 0;
    my $every = 1 / $o{rate};
    my $next = time;
    my $end = $next + $o{seconds};
    while (time < $end) {
        if (time >= $next) {
            my $h = $hash + $seq;
            $pub->send_multipart(['', pack('Q>', $seq++),
                                  batch(stored([$h]))]);
            push @due, time;
            $next += $every;
        }
        my $wait = $next - time;
        $r->wait_for_messages($wait > 0 ? $wait : 0);
    }
    my $drain = time + 2;
    $r->wait_for_messages(0.05) while @due && time < $drain;
    my @s = sort { $a <=> $b } @lat;
    my $pct = sub { @s ? 1000 * $s[int($_[0] * $#s + 0.5)] : -1 };
    printf "steady: %d sent, %d seen, p50 %.2f ms, p99 %.2f ms, "
           . "max %.2f ms\n", $seq, scalar @s, $pct->(0.5), $pct->(0.99),
           $pct->(1);
    exit 0;
}

die "usage: loopbench.pl flood|steady ...\n";
