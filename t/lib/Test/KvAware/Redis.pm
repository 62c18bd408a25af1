package Test::KvAware::Redis;

# A Redis connection for the precise-mode tests, on Debian's libredis-perl
# (Redis.pm): commands, pipelines, subscriptions, and for a publisher
# (Test::KvAware::Events::publisher) events that wait until nginx took
# them in.
#
#   $c = Test::KvAware::Redis->new($port, auth => [$password] or
#                                  [$user, $password]);
#   $c->cmd(@command)           # the reply; an error reply is {error => text}
#   $c->pipeline([@cmd], ...)   # sent at once, then the replies in order
#   $c->send(@command); ...; $c->reply   # a reply read later
#   $c->subscribe(@channels); $c->messages($timeout, $until)
#   $p->event($server, %message), $p->publish_raw($json, channel => ...)
#
# Replies are read within 10 s; a connection that failed or timed out
# gives undef for its replies from then on (no reconnect: a test that
# restarts Redis connects again).  Payloads are bytes, any size.

use strict;
use warnings;

use Carp qw(croak);
use Redis;
use Time::HiRes qw(time);

my $READ_TIMEOUT = 10;          # s, any reply

sub new {
    my ($class, $port, %o) = @_;
    my @auth = @{ $o{auth} || [] };
    my $r = eval {
        Redis->new(server => "127.0.0.1:$port", cnx_timeout => 5,
                   read_timeout => $READ_TIMEOUT, write_timeout => 10,
                   reconnect => 0,
                   (@auth == 2 ? (username => $auth[0], password => $auth[1])
                    : @auth ? (password => $auth[0]) : ()));
    } or croak "connect to redis 127.0.0.1:$port: $@";
    return bless { r => $r, queue => [], replies => [] }, $class;
}

sub redis { $_[0]{r} }

# one reply of a callback into $slot->{v}: the value, or {error => text}
sub _keep {
    my ($slot) = @_;
    return sub {
        $slot->{v} = defined $_[1] ? { error => $_[1] } : $_[0];
        $slot->{done} = 1;
    };
}

sub _send {
    my ($c, $slot, $cmd, @args) = @_;
    my $m = lc $cmd;
    $c->{r}->$m(@args, _keep($slot));
}

# Sends one command without waiting: its reply comes from reply().
sub send {
    my ($c, @cmd) = @_;
    my $slot = {};
    $c->_send($slot, @cmd);
    push @{ $c->{replies} }, $slot;
}

# The reply to the oldest send() not yet read; undef if none came.
sub reply {
    my ($c) = @_;
    my $slot = shift @{ $c->{replies} } or return undef;
    eval { $c->{r}->wait_one_response
               until $slot->{done} || !@{ $c->{r}{queue} };
           1 }
        or return undef;
    return $slot->{v};
}

# Redis.pm runs these only synchronously: no send() for them
my %SYNC = map { $_ => 1 } qw(ping info keys quit shutdown select);

sub cmd {
    my ($c, @cmd) = @_;
    if ($SYNC{lc $cmd[0]}) {
        my $m = lc shift @cmd;
        my $v = eval { scalar $c->{r}->$m(@cmd) };
        return $@ =~ /\[\w+\] (.*?), at /s ? { error => $1 } : undef if $@;
        return $v;
    }
    $c->send(@cmd);
    return $c->reply;
}

# Sends all commands at once, then reads as many replies.
sub pipeline {
    my ($c, @cmds) = @_;
    my @slots = map { +{} } @cmds;
    $c->_send($slots[$_], @{ $cmds[$_] }) for 0 .. $#cmds;
    eval { $c->{r}->wait_all_responses; 1 };
    return map { $_->{v} } @slots;
}

# Subscribes; the messages queue up for messages().
sub subscribe {
    my ($c, @channels) = @_;
    my $q = $c->{queue};
    $c->{r}->subscribe(@channels, sub {
        my ($payload, $channel) = @_;
        push @$q, [$channel, $payload];
    });
    return $c;
}

# [channel, payload] pairs, one at a time, until $until->(@so_far) holds
# or $timeout s have passed; what came after stays for the next call.
sub messages {
    my ($c, $timeout, $until) = @_;
    my $deadline = time + $timeout;
    my @m;
    while (1) {
        while (@{ $c->{queue} }) {
            push @m, shift @{ $c->{queue} };
            return @m if $until && $until->(@m);
        }
        my $left = $deadline - time;
        last if $left <= 0;
        # returns once nothing came for this long
        eval { $c->{r}->wait_for_messages($left < 0.05 ? $left : 0.05); 1 }
            or last;
    }
    return @m;
}

1;
