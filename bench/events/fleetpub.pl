#!/usr/bin/perl
#
# Helper of bench/bench_fleet_flood.sh: many engines in one process, each
# a ZeroMQ PUB socket publishing vLLM's KV events (msgpack batches by
# name, its own seq and data_parallel_rank), at a total rate fixed from
# outside, so that what saturates is the bridge, not a simulator.
# Loopback only; every loop is bounded in time.
#
#   fleetpub.pl --zmq Z --servers N --ranks R [--skip I,...] --rate B
#       --blocks H --seconds T
#       Server s rank r binds PUB on 127.0.0.1:Z + R s + r (the ports
#       bench_fleet_flood.sh gives kvbridge: vLLM's rank offset), except
#       the engines numbered in --skip (s R + r: a probe's).  After 1 s
#       for the bridge to connect, B batches a second in all, the engines
#       in turn, each batch H blocks stored and the H stored 16 batches
#       before removed (an engine step that fills and frees), paced in
#       1 ms slices, for T seconds.  Prints "ready" when it starts
#       sending, then "BATCHES SECONDS" (sent so far, since the first) on
#       SIGUSR1, and at the end or on SIGTERM.

use strict;
use warnings;

use Data::MessagePack;
use Getopt::Long;
use Time::HiRes qw(time sleep);
use ZMQ::FFI;
use ZMQ::FFI::Constants qw(ZMQ_PUB ZMQ_SNDHWM);

my %o = (ranks => 1, blocks => 16, block => 16, seconds => 10,
         skip => '');
GetOptions(\%o, 'zmq=i', 'servers=i', 'ranks=i', 'skip=s', 'rate=i',
           'blocks=i', 'block=i', 'seconds=f')
    or die "bad options\n";
defined $o{$_} or die "--$_ is required\n" for qw(zmq servers rate);

# answered from the start: SIGUSR1's default would end the process
my ($sent, $t0) = (0, 0);
$| = 1;
$SIG{USR1} = sub { printf "%d %.3f\n", $sent, $t0 ? time - $t0 : 0 };

my %skip = map { $_ => 1 } grep { length } split /,/, $o{skip};
my $mp = Data::MessagePack->new->prefer_integer(1);
my $ctx = ZMQ::FFI->new;
my $cycle = 32;                    # payloads an engine, sent in turn

my @eng;
my $hash = int(rand(2**20)) * 2**32;
for my $s (0 .. $o{servers} - 1) {
    for my $r (0 .. $o{ranks} - 1) {
        next if $skip{ $s * $o{ranks} + $r };
        my $pub = $ctx->socket(ZMQ_PUB);
        $pub->set(ZMQ_SNDHWM, 'int', 10000);
        $pub->bind('tcp://127.0.0.1:' . ($o{zmq} + $o{ranks} * $s + $r));
        my $base = $hash;
        $hash += $cycle * $o{blocks};
        # payload k stores set k and removes set k + cycle/2: in steady
        # state every store is of blocks absent, every remove of blocks
        # present, as an engine's steps are
        my @set = map { my $b = $base + $_ * $o{blocks};
                        [$b .. $b + $o{blocks} - 1] } 0 .. $cycle - 1;
        my @pay = map {
            my $k = $_;
            $mp->pack({ ts => 1.0 * $k, data_parallel_rank => $r,
                        events => [stored($set[$k]),
                                   removed($set[($k + $cycle / 2)
                                                % $cycle])] });
        } 0 .. $cycle - 1;
        push @eng, { pub => $pub, pay => \@pay, seq => 0 };
    }
}

sub stored {
    my ($hashes) = @_;
    return { type => 'BlockStored', block_hashes => $hashes,
             parent_block_hash => undef,
             # tokens of their own a block
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

my $done = sub {
    printf "%d %.3f\n", $sent, $t0 ? time - $t0 : 0;
    exit 0;
};
$SIG{TERM} = $SIG{INT} = $done;

sleep 1;                            # the bridge's SUB sockets connect
print "ready\n";
$t0 = time;
my $end = $t0 + $o{seconds};
my $i = 0;
while ((my $now = time) < $end) {
    my $due = int(($now - $t0) * $o{rate});
    while ($sent < $due) {
        my $e = $eng[$i++ % @eng];
        $e->{pub}->send_multipart(['', pack('Q>', $e->{seq}),
                                   $e->{pay}[$e->{seq} % $cycle]]);
        $e->{seq}++;
        $sent++;
    }
    sleep 0.001;
}
$done->();
