package Test::KvAware::Http;

# The HTTP side of the harness: methods of a Test::KvAware object (which
# inherits them) that send requests to its nginx or its backends.
#
#   $r = $env->request($method, $uri, $body, \%headers, port =>, timeout =>)
#        # {status, headers (lc), body, json, elapsed, error}
#   $r = $env->raw_request($bytes, %opt); backend_request($i, $method, ...)
#   @r = $env->concurrent([[$method, $uri, $body, \%headers], ...])
#   $h = $env->hold([...]); @r = $env->release($h)   # in flight meanwhile

use strict;
use warnings;

use Carp qw(croak);
use Errno qw(EINTR EAGAIN EWOULDBLOCK);
use IO::Select;
use IO::Socket::INET;
use JSON::PP ();
use POSIX ();
use Time::HiRes qw(time);

use KvAware::Launch qw(slurp write_file);

our $TIMEOUT = 10;              # s, default for requests

my $JSON = JSON::PP->new->utf8->allow_nonref->canonical;

# request($method, $uri, $body, \%headers, %opt) -> {status, headers, body,
# json, elapsed, error}.  HTTP/1.1 + Connection: close, 10 s timeout.
# Content-Length is added for a defined body unless the caller gave
# Content-Length or Transfer-Encoding itself (then $body goes raw).
# Header values may be array refs (repeated header).  opt: port, timeout.
sub request {
    my ($self, $method, $uri, $body, $headers, %o) = @_;

    my %h = %{ $headers || {} };
    my %lc = map { lc($_) => 1 } keys %h;
    $h{Host} = 'localhost' unless $lc{host};
    $h{Connection} = 'close' unless $lc{connection};
    if (defined $body && !$lc{'content-length'}
        && !$lc{'transfer-encoding'})
    {
        $h{'Content-Length'} = length $body;
    }

    my $req = "$method $uri HTTP/1.1\r\n";
    for my $k (sort keys %h) {
        for my $v (ref $h{$k} ? @{ $h{$k} } : $h{$k}) {
            $req .= "$k: $v\r\n";
        }
    }
    $req .= "\r\n" . ($body // '');

    return $self->raw_request($req, %o);
}

# The same against backend $i directly (bypassing nginx).
sub backend_request {
    my ($self, $i, @args) = @_;
    my @req = @args[0 .. 3];
    return $self->request(@req, port => $self->backend_port($i));
}

# Sends raw bytes, reads the response until the peer closes (or timeout).
sub raw_request {
    my ($self, $data, %o) = @_;
    my $port = $o{port} // $self->{port};
    my $timeout = $o{timeout} // $TIMEOUT;
    my $start = time;
    my $deadline = $start + $timeout;
    my $res = { status => 0, headers => {}, body => '' };

    local $SIG{PIPE} = 'IGNORE';    # an early close is an answer too

    my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                     PeerPort => $port, Proto => 'tcp',
                                     Timeout => $timeout);
    unless ($sock) {
        $res->{error} = "connect to 127.0.0.1:$port: $@";
        return $res;
    }
    binmode $sock;
    $sock->blocking(0);
    my $sel = IO::Select->new($sock);

    # write everything, but keep watching the clock
    my $off = 0;
    while ($off < length $data) {
        my $left = $deadline - time;
        if ($left <= 0) { $res->{error} = 'timeout writing'; last }
        $sel->can_write($left) or next;
        my $n = syswrite($sock, $data, length($data) - $off, $off);
        if (!defined $n) {
            next if $! == EINTR || $! == EAGAIN || $! == EWOULDBLOCK;
            last;                   # peer closed: read what it said
        }
        $off += $n;
    }

    my $raw = '';
    while (1) {
        my $left = $deadline - time;
        if ($left <= 0) { $res->{error} = 'timeout reading'; last }
        $sel->can_read($left) or next;
        my $n = sysread($sock, $raw, 65536, length $raw);
        if (!defined $n) {
            next if $! == EINTR || $! == EAGAIN || $! == EWOULDBLOCK;
            $res->{error} = "read: $!";
            last;
        }
        last if $n == 0;
    }
    close $sock;

    _parse_response($raw, $res);
    $res->{elapsed} = time - $start;
    return $res;
}

sub _parse_response {
    my ($raw, $res) = @_;

    my $end = index($raw, "\r\n\r\n");
    if ($end < 0) {
        $res->{error} //= length $raw ? 'incomplete response header'
                                      : 'empty response';
        return $res;
    }

    my ($line, @lines) = split /\r\n/, substr($raw, 0, $end);
    my $body = substr($raw, $end + 4);

    ($res->{status}) = $line =~ m{^HTTP/\d\.\d\s+(\d{3})};
    $res->{status} //= 0;

    for (@lines) {
        my ($k, $v) = /^([^:]+):\s*(.*?)\s*$/ or next;
        $k = lc $k;
        $res->{headers}{$k} = exists $res->{headers}{$k}
                            ? "$res->{headers}{$k}, $v" : $v;
    }

    if (($res->{headers}{'transfer-encoding'} // '') =~ /chunked/i) {
        my $out = '';
        while ($body =~ s/^([0-9a-fA-F]+)[^\r\n]*\r\n//) {
            my $size = hex $1;
            last if $size == 0;
            $out .= substr($body, 0, $size, '');
            $body =~ s/^\r\n//;
        }
        $body = $out;
    } elsif (defined(my $cl = $res->{headers}{'content-length'})) {
        $res->{error} //= 'short body' if length $body < $cl;
        $body = substr($body, 0, $cl) if $cl =~ /^\d+$/;
    }

    $res->{body} = $body;
    if ($body =~ /^\s*[\[{]/) {
        $res->{json} = eval { $JSON->decode($body) };
    }
    return $res;
}

# concurrent([[method, uri, body, \%headers], ...], %opt) -> responses in
# order.  One forked child per request, at most 64 at once; each child
# sends its response back as JSON through a pipe.
sub concurrent {
    my ($self, $reqs, %o) = @_;
    my $max = $o{max} // 64;
    my $stall = $o{timeout} // ($TIMEOUT * 2 + 5);

    my @res;
    my @queue = (0 .. $#$reqs);
    my %kids;                       # fileno => {pid, idx, fh, buf}
    my $sel = IO::Select->new;
    my $last_progress = time;

    while (@queue || %kids) {
        while (@queue && keys %kids < $max) {
            my $idx = shift @queue;
            pipe(my $r, my $w) or croak "pipe: $!";
            my $pid = fork // croak "fork: $!";
            if ($pid == 0) {
                close $r;
                $SIG{$_} = 'DEFAULT' for qw(INT TERM);
                my $resp = eval { $self->request(@{ $reqs->[$idx] }) }
                        // { status => 0, error => "died: $@" };
                binmode $w;
                print {$w} $JSON->encode($resp);
                close $w;
                POSIX::_exit(0);    # no END blocks, no DESTROY in here
            }
            close $w;
            binmode $r;
            $kids{fileno $r} = { pid => $pid, idx => $idx, fh => $r,
                                 buf => '' };
            $sel->add($r);
        }

        for my $fh ($sel->can_read(0.5)) {
            my $fd = fileno $fh;
            my $k = $kids{$fd};
            my $n = sysread($fh, $k->{buf}, 65536, length $k->{buf});
            next if !defined $n && $! == EINTR;
            $last_progress = time;
            next if $n;
            # EOF (or error): the child is done
            $sel->remove($fh);
            close $fh;
            delete $kids{$fd};
            waitpid($k->{pid}, 0);
            $res[$k->{idx}] = eval { $JSON->decode($k->{buf}) }
                // { status => 0, headers => {}, body => '',
                     error => 'no result from child' };
        }

        if (%kids && time - $last_progress > $stall) {
            for my $k (values %kids) {
                kill 'KILL', $k->{pid};
                waitpid($k->{pid}, 0);
                $res[$k->{idx}] = { status => 0, headers => {}, body => '',
                                    error => 'concurrent: stalled' };
            }
            %kids = ();
            @queue and croak "concurrent: stalled for $stall s";
        }
    }

    return @res;
}


# Requests held in flight until the test lets them go:
#   $h = $env->hold([[method, uri, body, \%headers], ...]);
#   ...                       # they are in flight, in any order, meanwhile
#   @responses = $env->release($h);
# Sent at once by a forked child, each with "X-Hold: FILE": the backends
# answer when release() creates FILE (or after 30 s).  No guess of how
# long the checks in between take, on a fast machine or a slow one.
sub hold {
    my ($self, $reqs) = @_;
    my $file = "$self->{prefix}/logs/hold-" . ++$self->{hold_seq};
    my @held = map { [@$_[0 .. 2], { %{ $_->[3] || {} }, 'X-Hold' => $file },
                      timeout => 40] } @$reqs;
    my $pid = fork // croak "fork: $!";
    if ($pid == 0) {
        $SIG{$_} = 'DEFAULT' for qw(INT TERM);
        open(STDOUT, '>', '/dev/null');     # never hold the TAP pipe
        my @res = $self->concurrent(\@held, timeout => 45);
        write_file("$file.json", $JSON->encode(\@res));
        POSIX::_exit(0);
    }
    return { pid => $pid, file => $file };
}

sub release {
    my ($self, $h) = @_;
    write_file($h->{file}, '');
    waitpid($h->{pid}, 0);              # bounded by the requests' timeout
    my $res = eval { $JSON->decode(slurp("$h->{file}.json") // '') };
    croak "release: no responses from the held requests" unless $res;
    return @$res;
}

1;
