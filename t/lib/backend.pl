#!/usr/bin/perl
#
# Test backend for the kv_aware integration tests: a small HTTP/1.1 server
# on 127.0.0.1 that echoes what it received as JSON.
#
#   perl t/lib/backend.pl --port P --name NAME [--mode ok|fail|close]
#                         [--addr 127.x.y.z]
#
# Every request gets (mode ok) "200", header "X-Backend: NAME" and the body
#   {"server":"NAME","method":"POST","uri":"/v1/...","len":N,"md5":"<hex>"}
# where md5 is over the exact body bytes received (Content-Length or
# chunked).  Mode fail answers 502 with the same JSON; mode close reads the
# request and closes without answering.  Request header "X-Delay-Ms: N"
# sleeps N ms before answering (or closing); "X-Hold: PATH" holds the
# answer until the file PATH exists (at most 30 s), so that a test decides
# when a request ends instead of guessing how long it needs.  A request's
# "X-data-parallel-rank: R" (what vLLM reads) comes back as
# "X-Backend-Rank: R"; "x-prefiller-host-port: H" (what llm-d's decode
# sidecar reads) as "X-Backend-Prefiller: H"; "X-Request-Id: I" as
# "X-Backend-Request-Id: I".  A body asking for a remote decode
# ("do_remote_decode":true, leg 1 of vLLM's NIXL contract) is answered as
# a prefill server does, with "kv_transfer_params" naming this backend
# and carrying "leg1_md5" (the body received) and "remote_request_id"
# (its X-Request-Id); its "X-Prefill-Answer" header asks for a bad answer
# instead: 500, none, null, array, deep, huge, html, slow (3 s).
# SIGUSR1 toggles ok <-> fail
# (any other mode -> ok).  SIGTERM/SIGINT: kill the children and exit.
#
# One forked child per connection (at most 200 alive), persistent
# connections as HTTP/1.1 says.  Only errors are printed, to stderr.

use strict;
use warnings;

use Digest::MD5 qw(md5_hex);
use Errno qw(EINTR EAGAIN);
use Getopt::Long qw(GetOptions);
use IO::Select;
use IO::Socket::INET;
use JSON::PP ();
use POSIX qw(WNOHANG);
use Time::HiRes ();

my $MAX_CHILDREN = 200;
my $IDLE_TIMEOUT = 60;          # s a keep-alive connection may stay idle
my $IO_TIMEOUT   = 30;          # s a started request may take to arrive
my $MAX_HEADER   = 64 * 1024;

my ($port, $name, $mode, $addr) = (undef, undef, 'ok', '127.0.0.1');
GetOptions('port=i' => \$port, 'name=s' => \$name, 'mode=s' => \$mode,
           'addr=s' => \$addr)
    or usage();
usage() unless $addr =~ /^127\.\d+\.\d+\.\d+\z/;    # loopback only
usage() unless $port && defined $name && $mode =~ /^(?:ok|fail|close)$/;

sub usage {
    print STDERR "usage: $0 --port P --name NAME [--mode ok|fail|close]"
        . " [--addr 127.x.y.z]\n";
    exit 2;
}

my $json = JSON::PP->new->allow_nonref->ascii;

my $listen = IO::Socket::INET->new(
    LocalAddr => $addr,
    LocalPort => $port,
    Proto     => 'tcp',
    Listen    => 128,
    ReuseAddr => 1,
) or die "backend $name: cannot listen on $addr:$port: $@\n";

my %children;                   # pid => 1
my $parent_pid = $$;
my $starter_pid = getppid();

# Exit once whoever started us (the test harness) is gone, even if it was
# killed without a chance to clean up: no stray backends between test runs.
$SIG{ALRM} = sub {
    if (getppid() != $starter_pid) {
        kill 'TERM', keys %children;
        exit 0;
    }
    alarm 2;
};
alarm 2;

# Reap every finished child; runs as a (deferred, safe) Perl signal handler.
$SIG{CHLD} = sub {
    while ((my $pid = waitpid(-1, WNOHANG)) > 0) {
        delete $children{$pid};
    }
};

$SIG{USR1} = sub {
    $mode = $mode eq 'ok' ? 'fail' : 'ok';
    # children forked earlier serve persistent connections: tell them too
    kill 'USR1', keys %children if $$ == $parent_pid;
};

my $shutdown = sub {
    local $SIG{CHLD} = 'DEFAULT';
    kill 'TERM', keys %children;
    exit 0;
};
$SIG{TERM} = $shutdown;
$SIG{INT}  = $shutdown;
$SIG{PIPE} = 'IGNORE';          # a peer gone mid-write is just an EOF

while (1) {
    my $client = $listen->accept;
    unless ($client) {
        next if $! == EINTR || $! == EAGAIN;    # SIGCHLD/SIGUSR1 woke us
        die "backend $name: accept: $!\n";
    }

    if (keys %children >= $MAX_CHILDREN) {
        print STDERR "backend $name: $MAX_CHILDREN connections busy, "
                     . "refusing one\n";
        close $client;
        next;
    }

    my $pid = fork;
    if (!defined $pid) {
        print STDERR "backend $name: fork: $!\n";
        close $client;
        next;
    }

    if ($pid == 0) {
        alarm 0;
        $SIG{$_} = 'DEFAULT' for qw(CHLD TERM INT ALRM);
        close $listen;
        serve_connection($client);
        exit 0;
    }

    $children{$pid} = 1;
    close $client;
}


# Serves requests on one connection until the peer or HTTP says to stop.
sub serve_connection {
    my ($sock) = @_;

    binmode $sock;
    my $conn = { sock => $sock, buf => '', sel => IO::Select->new($sock) };

    while (1) {
        my $req = read_request($conn) or return;

        if ($req->{delay_ms}) {
            Time::HiRes::sleep($req->{delay_ms} / 1000);
        }
        if (defined $req->{hold}) {
            my $deadline = time + $IO_TIMEOUT;
            Time::HiRes::sleep(0.01)
                until -e $req->{hold} || time > $deadline;
        }

        return if $mode eq 'close';

        my ($status, $body) = ($mode eq 'fail' ? 502 : 200);
        if ($req->{body} =~ /"do_remote_decode":true/) {
            ($status, $body) = prefill_answer($req, $status);
        }
        $body //= '{"server":' . $json->encode($name)
            . ',"method":' . $json->encode($req->{method})
            . ',"uri":' . $json->encode($req->{uri})
            . ',"len":' . length($req->{body})
            . ',"md5":"' . md5_hex($req->{body}) . '"}';

        my $reason = $status == 200 ? 'OK'
                   : $status == 500 ? 'Internal Server Error' : 'Bad Gateway';
        my $head = "HTTP/1.1 $status $reason\r\n"
            . "X-Backend: $name\r\n"
            . (defined $req->{rank}
               ? "X-Backend-Rank: $req->{rank}\r\n" : '')
            . (defined $req->{prefiller}
               ? "X-Backend-Prefiller: $req->{prefiller}\r\n" : '')
            . (defined $req->{request_id}
               ? "X-Backend-Request-Id: $req->{request_id}\r\n" : '')
            . "Content-Type: application/json\r\n"
            . "Content-Length: " . length($body) . "\r\n"
            . "Connection: " . ($req->{keepalive} ? 'keep-alive' : 'close')
            . "\r\n\r\n";

        write_all($conn, $head . ($req->{method} eq 'HEAD' ? '' : $body))
            or return;

        return unless $req->{keepalive};
    }
}


# A prefill server's answer to leg 1: (status, body).
sub prefill_answer {
    my ($req, $status) = @_;
    my $how = $req->{prefill_answer};
    my $params = '{"do_remote_prefill":true,"remote_engine_id":'
        . $json->encode($name) . ',"remote_block_ids":[1,2,3],'
        . '"remote_host":"' . $addr . '","remote_port":' . $port
        . ',"remote_request_id":' . $json->encode($req->{request_id} // '')
        . ',"leg1_md5":"' . md5_hex($req->{body}) . '","tp_size":1}';
    Time::HiRes::sleep(3) if $how eq 'slow';
    return (500, '{"error":"prefill failed"}') if $how eq '500';
    return ($status, '<html>bad gateway</html>') if $how eq 'html';
    my $v = $how eq 'none'  ? undef
          : $how eq 'null'  ? 'null'
          : $how eq 'array' ? '[1,2]'
          : $how eq 'deep'  ? ('[' x 200) . (']' x 200)
          : $how eq 'huge'  ? '{"pad":"' . ('x' x 200000) . '"}'
          : $params;
    return ($status, '{"id":"cmpl-' . $name . '","choices":[{"text":"x",'
        . '"finish_reason":"length"}]'
        . (defined $v ? ',"kv_transfer_params":' . $v : '')
        . ',"usage":{"prompt_tokens":10,"completion_tokens":1}}');
}


# Reads one request: line, headers, body.  Returns undef on EOF, timeout or
# garbage (the connection is then dropped).
sub read_request {
    my ($conn) = @_;

    # idle wait for the first byte of the next request
    return unless fill_until($conn, sub { length $conn->{buf} },
                             $IDLE_TIMEOUT);

    my $end;
    fill_until($conn, sub {
        $conn->{buf} =~ s/^(?:\r?\n)+//;        # tolerate stray CRLFs
        $end = index($conn->{buf}, "\r\n\r\n");
        $end >= 0 || length $conn->{buf} > $MAX_HEADER;
    }, $IO_TIMEOUT) or return;
    return if $end < 0;

    my $head = substr($conn->{buf}, 0, $end + 4, '');
    my ($line, @lines) = split /\r\n/, $head;

    my ($method, $uri, $proto) = split / /, $line // '';
    return unless $proto && $proto =~ m{^HTTP/1\.([01])$};
    my $minor = $1;

    my %h;
    for (@lines) {
        my ($k, $v) = /^([^:]+):\s*(.*?)\s*$/ or next;
        $k = lc $k;
        $h{$k} = exists $h{$k} ? "$h{$k}, $v" : $v;
    }

    my $connection = lc($h{connection} // '');
    my $keepalive = $minor ? $connection !~ /\bclose\b/
                           : $connection =~ /\bkeep-alive\b/;

    if (lc($h{expect} // '') eq '100-continue') {
        write_all($conn, "HTTP/1.1 100 Continue\r\n\r\n") or return;
    }

    my $body;
    if (lc($h{'transfer-encoding'} // '') =~ /\bchunked\b/) {
        $body = read_chunked($conn) // return;
    } elsif (defined $h{'content-length'}) {
        return unless $h{'content-length'} =~ /^\d+$/;
        $body = read_exact($conn, $h{'content-length'}) // return;
    } else {
        $body = '';
    }

    my ($delay) = ($h{'x-delay-ms'} // '') =~ /^(\d+)/;

    return {
        method    => $method,
        uri       => $uri,
        body      => $body,
        keepalive => $keepalive,
        delay_ms  => $delay || 0,
        hold      => $h{'x-hold'},
        rank      => ($h{'x-data-parallel-rank'} // '') =~ /^(\d{1,4})\z/
                     ? $1 : undef,
        request_id => ($h{'x-request-id'} // '') =~ /^([\w.:-]{1,128})\z/
                      ? $1 : undef,
        prefill_answer => $h{'x-prefill-answer'} // '',
        prefiller => ($h{'x-prefiller-host-port'} // '')
                     =~ /^([\w.:\[\]-]{1,100})\z/ ? $1 : undef,
    };
}


# Decodes a chunked body (chunk extensions and trailers are skipped).
sub read_chunked {
    my ($conn) = @_;
    my $body = '';

    while (1) {
        my $line = read_line($conn) // return;
        my ($hex) = $line =~ /^\s*([0-9a-fA-F]+)/ or return;
        my $size = hex $hex;

        if ($size == 0) {
            while (1) {                         # trailers up to empty line
                my $t = read_line($conn) // return;
                return $body if $t eq '';
            }
        }

        $body .= read_exact($conn, $size) // return;
        my $crlf = read_line($conn) // return;
        return unless $crlf eq '';
    }
}

sub read_line {
    my ($conn) = @_;
    my $pos;
    fill_until($conn, sub { ($pos = index($conn->{buf}, "\n")) >= 0 },
               $IO_TIMEOUT) or return;
    my $line = substr($conn->{buf}, 0, $pos + 1, '');
    $line =~ s/\r?\n\z//;
    return $line;
}

sub read_exact {
    my ($conn, $n) = @_;
    fill_until($conn, sub { length $conn->{buf} >= $n }, $IO_TIMEOUT)
        or return;
    return substr($conn->{buf}, 0, $n, '');
}

# Reads into the buffer until $done->() is true.  False on EOF, error,
# timeout, or when the backend's main process has gone away.
sub fill_until {
    my ($conn, $done, $timeout) = @_;
    my $deadline = time + $timeout;

    until ($done->()) {
        return 0 if time > $deadline || getppid() != $parent_pid;
        next unless $conn->{sel}->can_read(1);
        my $n = sysread($conn->{sock}, $conn->{buf}, 65536,
                        length $conn->{buf});
        next if !defined $n && ($! == EINTR || $! == EAGAIN);
        return 0 unless $n;
    }
    return 1;
}

sub write_all {
    my ($conn, $data) = @_;
    my $off = 0;
    while ($off < length $data) {
        my $n = syswrite($conn->{sock}, $data, length($data) - $off, $off);
        if (!defined $n) {
            next if $! == EINTR || $! == EAGAIN;
            return 0;
        }
        $off += $n;
    }
    return 1;
}
