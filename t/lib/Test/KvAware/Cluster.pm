package Test::KvAware::Cluster;

# A Redis 7 Cluster on loopback for the cluster=on tests (t/82, t/83):
# three masters and three replicas in the harness's prefix, made by
# redis-cli --cluster create, stopped with the rest.  And what a client
# of sharded pub/sub does: who owns a slot, SPUBLISH that follows the
# slot through MOVED and dead nodes, an SSUBSCRIBEd connection.
#
#   $c = Test::KvAware::Cluster->start($env->launch, $channel);
#   $c->nodes, $c->cli($port, @cmd), $c->owner($from), $c->owner_now
#   $c->spublish($channel, $msg), $c->kill_node($port)
#   $s = $c->ssubscribe($port, $channel); $c->smessages($s, $t, $until)
#   @ports = Test::KvAware::Cluster->start_bounce($launch, $name)

use strict;
use warnings;

use IO::Select;
use IO::Socket::INET;
use Time::HiRes qw(sleep time);

use KvAware::Launch qw(wait_until);
use Test::KvAware::Redis;

# A fake pair of nodes, each answering every command with a CLUSTER SLOTS
# that gives all slots to the other (nodes that disagree on the owner):
# a client that follows them moves back and forth.  Its two ports.
my $BOUNCE = <<'PERL';
use IO::Socket::INET; use IO::Select;
my ($sel, %to, %lis) = (IO::Select->new);
for ([@ARGV], [reverse @ARGV]) {
    my $l = IO::Socket::INET->new(LocalAddr => '127.0.0.1', Listen => 16,
                                  LocalPort => $_->[0], ReuseAddr => 1)
        or die "listen: $!";
    ($to{fileno $l}, $lis{fileno $l}) = ($_->[1], 1);
    $sel->add($l);
}
while (1) {
    for my $s ($sel->can_read) {
        if ($lis{fileno $s}) {
            my $c = $s->accept or next;
            $to{fileno $c} = $to{fileno $s};
            $sel->add($c);
            next;
        }
        if (!sysread($s, my $b, 4096)) { $sel->remove($s); close $s; next }
        syswrite($s, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n\$9\r\n"
                     . "127.0.0.1\r\n:$to{fileno $s}\r\n");
    }
}
PERL

sub start_bounce {
    my ($class, $launch, $name) = @_;
    my @pair = KvAware::Launch::free_ports(2);
    $launch->spawn($name, [$^X, '-e', $BOUNCE, @pair],
                   ready => sub { KvAware::Launch::port_open($pair[1]) });
    return @pair;
}

# undef, and a reason, when the cluster did not come up
sub start {
    my ($class, $launch, $channel) = @_;
    my $c = bless { launch => $launch }, $class;

    # each node its bus port (the default, port + 10000, may be taken)
    my @p = KvAware::Launch::free_ports(12);
    $c->{nodes} = [ @p[0 .. 5] ];
    for my $i (0 .. 5) {
        my $port = $p[$i];
        $launch->start_redis($port, { name => "redis-$port" },
            '--cluster-enabled', 'yes', '--cluster-port', $p[6 + $i],
            '--cluster-config-file', "nodes-$port.conf",
            '--cluster-node-timeout', '1000')
            or return (undef, "redis node $port did not start");
    }

    my (undef, $out) = $launch->run_cmd(['redis-cli', '--cluster', 'create',
        (map { "127.0.0.1:$_" } $c->nodes), '--cluster-replicas', '1',
        '--cluster-yes']);
    return (undef, "redis-cli --cluster create: $out")
        unless $out =~ /All 16384 slots covered/;

    $c->{slot} = $c->cli($p[0], CLUSTER => KEYSLOT => $channel);

    # every node says ok, and the slot's master has a replica in sync
    wait_until(20, sub {
        return 0 if grep { $c->cli($_, CLUSTER => 'INFO')
                           !~ /cluster_state:ok/ } $c->nodes;
        my $o = $c->owner($p[0]) or return 0;
        return @{ $o->{replicas} }
               && $c->cli($o->{replicas}[0], INFO => 'replication')
                  =~ /master_link_status:up/;
    }) or return (undef, 'the cluster did not settle');

    return $c;
}

sub nodes { @{ $_[0]{nodes} } }
sub slot  { $_[0]{slot} }

sub cli {
    my ($c, $port, @cmd) = @_;
    my (undef, $o) = $c->{launch}->run_cmd(['redis-cli', '-h', '127.0.0.1',
                                            '-p', $port, @cmd]);
    chomp $o;
    return $o;
}

# the master of the slot and its replicas as node $from sees them
# ({port, replicas => [port...]}), failed nodes left out
sub owner {
    my ($c, $from) = @_;
    my @lines = map { [split ' '] }
                split /\n/, $c->cli($from, CLUSTER => 'NODES');
    my (%port, $master);
    for (@lines) {
        my ($id, $addr, $flags, $of, @rest) = @$_;
        next unless $addr && $addr =~ /:(\d+)@/ && $flags !~ /fail/;
        $port{$id} = $1;
        next unless $flags =~ /master/;
        for (@rest[4 .. $#rest]) {
            my ($lo, $hi) = split /-/;
            $master = $id if defined $lo && $lo =~ /^\d+$/
                             && $lo <= $c->{slot}
                             && $c->{slot} <= ($hi // $lo);
        }
    }
    return undef unless $master;
    my @replicas = map { $port{$_->[0]} }
                   grep { $_->[2] =~ /slave/ && $_->[2] !~ /fail/
                          && $_->[3] eq $master && $port{$_->[0]} } @lines;
    return { port => $port{$master}, replicas => \@replicas };
}

# as a node still alive sees it
sub owner_now {
    my ($c) = @_;
    for my $p ($c->nodes) {
        next unless KvAware::Launch::redis_ping($p);
        my $o = $c->owner($p);
        return $o if $o;
    }
    return undef;
}

# SPUBLISH on the slot's master: MOVED, a dead node or a refused
# connection, it asks who owns the slot now (for 4 s); the receivers
sub spublish {
    my ($c, $channel, $msg) = @_;
    for (1 .. 40) {
        $c->{pub_port} //= ($c->owner_now // {})->{port};
        my $r = $c->{pub} //= eval {
            Test::KvAware::Redis->new($c->{pub_port}) };
        my $n = $r ? $r->cmd(SPUBLISH => $channel, $msg) : undef;
        return $n if defined $n && !ref $n;
        delete @$c{qw(pub pub_port)};
        sleep 0.1;
    }
    return undef;
}

# SIGKILL, as a crash
sub kill_node {
    my ($c, $port) = @_;
    kill 'KILL', $c->{launch}->pid("redis-$port");
    $c->{launch}->stop("redis-$port");
    return !KvAware::Launch::port_open($port);
}

# a raw connection, SSUBSCRIBEd (Redis.pm knows no sharded pub/sub)
sub ssubscribe {
    my ($c, $port, $channel) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $port, Timeout => 2)
        or return undef;
    print {$s} sprintf("*2\r\n\$10\r\nSSUBSCRIBE\r\n\$%d\r\n%s\r\n",
                       length $channel, $channel);
    return { s => $s, buf => '' };
}

# the payloads of "smessage"s within $timeout s, until $until->(@so_far)
sub smessages {
    my ($c, $sub, $timeout, $until) = @_;
    return () unless $sub;
    my $deadline = time + $timeout;
    my $sel = IO::Select->new($sub->{s});
    my @m;
    while (time < $deadline) {
        while ($sub->{buf} =~ /\A\*3\r\n\$\d+\r\n(\w+)\r\n\$\d+\r\n[^\r]*\r\n
                                (?:\$(\d+)\r\n|:\d+\r\n)/x) {
            my ($kind, $len, $head) = ($1, $2, $+[0]);
            my $need = $head + (defined $len ? $len + 2 : 0);
            last if length $sub->{buf} < $need;     # the rest is on its way
            my $payload = defined $len ? substr($sub->{buf}, $head, $len) : '';
            substr($sub->{buf}, 0, $need, '');
            push @m, $payload if $kind eq 'smessage';
            return @m if $until && @m && $until->(@m);
        }
        next unless $sel->can_read(0.05);
        sysread($sub->{s}, $sub->{buf}, 65536, length $sub->{buf}) or last;
    }
    return @m;
}

1;
