package Test::KvAware::Children;

# The processes a soak drives by hand (t/95, t/96): started by name,
# killed with the signal the fault calls for (SIGKILL, SIGSTOP...),
# waited for by pid.  KvAware::Launch's spawn is for processes that are
# started until ready and stopped gracefully; these are not.
#
#   $c = Test::KvAware::Children->new($logs_dir);
#   $c->spawn($name, @cmd)     # output appended to LOGS/NAME.log; its pid
#   $c->adopt($name, $pid)     # a child forked by the test itself
#   $c->pid($name)             # undef once reaped
#   $c->reap($name, $sig)      # $sig (TERM), then waits for it
#   $c->finished($name, $timeout)
#                              # true if it exits in time; else SIGKILLed
#   listening($port)           # something accepts on 127.0.0.1:PORT
#
# Every child still known is SIGKILLed when the object goes away or the
# test exits, so that none outlives the test (prove waits for its pipe).

use strict;
use warnings;

use Exporter qw(import);
use IO::Socket::INET;
use POSIX qw(WNOHANG);
use Scalar::Util qw(refaddr weaken);

use KvAware::Launch qw(wait_until);

our @EXPORT_OK = qw(listening);

my %LIVE;                       # refaddr => weak ref, for END

sub new {
    my ($class, $logs) = @_;
    my $self = bless { logs => $logs, pids => {}, owner => $$ }, $class;
    $LIVE{refaddr $self} = $self;
    weaken $LIVE{refaddr $self};
    return $self;
}

sub spawn {
    my ($self, $name, @cmd) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>>', "$self->{logs}/$name.log";
        open STDERR, '>&', \*STDOUT;
        { exec @cmd }
        POSIX::_exit(127);
    }
    return $self->{pids}{$name} = $pid;
}

sub adopt {
    my ($self, $name, $pid) = @_;
    return $self->{pids}{$name} = $pid;
}

sub pid { $_[0]{pids}{$_[1]} }

sub reap {
    my ($self, $name, $sig) = @_;
    my $pid = delete $self->{pids}{$name} or return;
    kill $sig // 'TERM', $pid;
    waitpid $pid, 0;
}

sub finished {
    my ($self, $name, $timeout) = @_;
    my $pid = $self->{pids}{$name} or return 0;
    if (wait_until($timeout, sub { waitpid($pid, WNOHANG) == $pid })) {
        delete $self->{pids}{$name};
        return 1;
    }
    $self->reap($name, 'KILL');
    return 0;
}

sub reap_all {
    my ($self) = @_;
    return if $self->{owner} != $$;     # a forked child's copy
    local ($?, $!);
    $self->reap($_, 'KILL') for keys %{ $self->{pids} };
}

sub DESTROY { $_[0]->reap_all }

END { $_->reap_all for grep { defined } values %LIVE }

sub listening {
    my ($port) = @_;
    return IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                 Timeout => 0.2);
}

1;
