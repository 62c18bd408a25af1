package Test::KvAware;

# Integration-test harness for ngx_http_kv_aware_module (Test::Nginx is not
# available here).  Two layers:
#
#   * an object API: one object = one temp prefix + N echo backends
#     (t/lib/backend.pl) + optional redis + one nginx, all on 127.0.0.1;
#   * run_blocks(): a Test::Nginx-like runner for the caller's __DATA__.
#
# Everything it starts is stopped in DESTROY/END, even when the test dies;
# every wait is bounded.
#
# Object API (see t/00-harness.t for examples):
#   $env = Test::KvAware->new(backends => 2, workers => 1, redis => 0,
#                             module => 1, backend_modes => [...],
#                             log_level => 'debug');
#   $env->conf(main_config =>, http_config =>, config =>, module =>,
#              workers =>, log_level =>)      # $TEST_NGINX_* expanded
#   ($ok, $out) = $env->test_config;          # nginx -t
#   $env->start_nginx(quiet => 0) / reload(quiet => 0, keep_old => 0) / stop_nginx
#                                             # one ok() each unless quiet
#   $env->nginx_pid, worker_pids, last_error, prefix, port
#   $r = $env->request($method, $uri, $body, \%headers)
#        # {status, headers (lc), body, json, elapsed, error}
#   @r = $env->concurrent([[$method, $uri, $body, \%headers], ...])
#   $h = $env->hold([...]); @r = $env->release($h)   # in flight meanwhile
#   $env->raw_request($bytes), backend_request($i, $method, $uri, ...)
#   $env->backend_stop($i), backend_start($i, mode => 'ok|fail|close'),
#        backend_port($i), backend_pid($i)
#   $env->redis_cli(@args), redis_stop, redis_start, redis_port
#   $env->error_log([$offset]), error_log_offset, access_log,
#        wait_for_log($pattern, $timeout, $offset), check_logs_clean($name)
#   ($rc, $out) = $env->run_nginx(@args); $env->sanitizer_reports
#
# Block runner: run_blocks(no_module => 1) reads __DATA__ blocks
# ("=== TEST n: name") with sections main_config, http_config, config,
# backends, backend_modes, workers, redis, log_level, no_module, request,
# more_headers, repeat, error_code, response_body, response_body_like,
# response_headers ("Name: value", "!Name" = absent),
# response_headers_like, error_log, no_error_log (substring or qr/.../ per
# line), must_die, wait, SKIP, ONLY.  "--- name: value" is the one-line
# form; "--- name eval" evaluates the section as Perl (an array ref gives
# one value per request of an array-ref request).  request and
# response_body lose only their single trailing newline; the other
# sections are trimmed; blank lines before the next "===" are dropped.

use strict;
use warnings;

use Carp qw(croak);
use Cwd ();
use Errno qw(EINTR EAGAIN EWOULDBLOCK);
use Exporter qw(import);
use File::Basename qw(dirname);
use File::Path qw(make_path);
use File::Spec;
use File::Temp ();
use IO::Select;
use IO::Socket::INET;
use JSON::PP ();
use POSIX qw(WNOHANG);
use Scalar::Util qw(refaddr weaken blessed);
use Test::More ();
use Time::HiRes qw(time sleep);

our @EXPORT    = qw(run_blocks);
our @EXPORT_OK = qw(module_path module_available skip_unless_module
                    log_matches wait_until free_run);

our $NGINX       = $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx';
our $REDIS       = $ENV{TEST_REDIS_SERVER} || 'redis-server';
our $REDIS_CLI   = $ENV{TEST_REDIS_CLI}    || 'redis-cli';
our $BACKEND_PL  = Cwd::abs_path(dirname(__FILE__) . '/../backend.pl');
our $TIMEOUT     = 10;          # s, default for requests and commands

my $JSON = JSON::PP->new->utf8->allow_nonref->canonical;

my %LIVE;                       # refaddr => weak ref, for END cleanup


# ---------------------------------------------------------------------------
# module location

sub module_path {
    my $p = $ENV{KV_AWARE_MODULE} || 'build/ngx_http_kv_aware_module.so';
    return File::Spec->rel2abs($p);
}

sub module_available { return -f module_path() }

# For programmatic tests: skip the whole file when the module is not built,
# unless KV_AWARE_MODULE was set explicitly (then a missing file is an error).
sub skip_unless_module {
    return 1 if module_available();
    croak "KV_AWARE_MODULE=$ENV{KV_AWARE_MODULE}: no such file"
        if $ENV{KV_AWARE_MODULE};
    Test::More::plan(skip_all => 'module not built: ' . module_path());
}


# ---------------------------------------------------------------------------
# construction / destruction

# Test::KvAware->new(backends => 2, workers => 1, redis => 0, module => 1,
#                    backend_modes => [qw(ok fail)], log_level => 'debug')
sub new {
    my ($class, %a) = @_;

    my $self = bless {
        owner     => $$,        # forked helpers must never clean up
        nbackends => $a{backends} // 2,
        workers   => $a{workers} // 1,
        module    => $a{module} // 1,
        log_level => $a{log_level} // 'debug',
        backends  => [],        # index 1..N: {port, pid, mode, name}
        cmd_seq   => 0,
    }, $class;

    $self->{prefix} = File::Temp::tempdir('kvaware-XXXXXX', TMPDIR => 1,
                                          CLEANUP => !$ENV{TEST_KEEP});
    Test::More::diag("TEST_KEEP: prefix $self->{prefix}") if $ENV{TEST_KEEP};
    make_path(map { "$self->{prefix}/$_" } qw(conf logs html));

    $LIVE{refaddr $self} = $self;
    weaken $LIVE{refaddr $self};
    _install_signal_handlers();
    $self->{watchdog} = _start_watchdog($self->{prefix});

    my @ports = _free_ports($self->{nbackends} + 2);
    $self->{port}       = shift @ports;
    $self->{redis_port} = shift @ports;

    my @modes = @{ $a{backend_modes} || [] };
    for my $i (1 .. $self->{nbackends}) {
        $self->{backends}[$i] = { name => "b$i", port => shift @ports };
        $self->backend_start($i, mode => $modes[$i - 1] // 'ok');
    }

    $self->redis_start if $a{redis};

    return $self;
}

sub DESTROY {
    my ($self) = @_;
    $self->cleanup;
}

# Stops nginx, backends and redis; idempotent, owner process only.
sub cleanup {
    my ($self) = @_;
    return if $self->{cleaned} || !$self->{owner} || $self->{owner} != $$;
    $self->{cleaned} = 1;
    local ($?, $@, $!);
    eval { $self->stop_nginx };
    # a report that no check_logs_clean saw still fails the test file
    if (my @san = $self->sanitizer_reports) {
        Test::More::ok(0, "no sanitizer report ($self->{prefix})");
        Test::More::diag(join "\n", @san);
    }
    for my $i (1 .. $self->{nbackends}) {
        eval { $self->backend_stop($i) };
    }
    eval { $self->redis_stop };
    if (my $w = delete $self->{watchdog}) {
        kill 'KILL', $w;
        waitpid($w, 0);
    }
    delete $LIVE{refaddr $self};
}

# A forked sentinel for when the test process is SIGKILLed (CI timeout):
# END never runs then, so it kills what the pid files in PREFIX/logs name
# and removes the prefix.  Normal cleanup kills the sentinel first.
sub _start_watchdog {
    my ($prefix) = @_;
    my $owner = $$;
    my $pid = fork // croak "fork: $!";
    return $pid if $pid;

    $SIG{INT} = 'IGNORE';          # Ctrl-C: the owner's END cleans up
    $SIG{TERM} = 'DEFAULT';
    # never hold the TAP pipe open: prove waits for its EOF
    open(STDIN, '<', '/dev/null');
    open(STDOUT, '>', '/dev/null');
    open(STDERR, '>', '/dev/null');

    sleep 0.5 while getppid() == $owner;

    if (my $ngx = _read_pid("$prefix/logs/nginx.pid")) {
        kill 'KILL', $ngx, _workers_of($ngx) if _alive($ngx);
        kill 'KILL', -$ngx;             # orphaned workers: see stop_nginx
    }
    for my $f (glob "$prefix/logs/*.pgid") {
        my $pg = _read_pid($f) or next;
        kill 'KILL', -$pg;
    }
    File::Path::remove_tree($prefix) unless $ENV{TEST_KEEP};
    POSIX::_exit(0);
}

END {
    for my $env (grep { defined } values %LIVE) {
        $env->cleanup;
    }
}

# Ctrl-C, kill, or a closed TAP pipe: exit normally so END above still
# runs (the default actions would skip it).  Handlers set by the test stay.
sub _install_signal_handlers {
    for my $sig (qw(INT TERM PIPE)) {
        my $cur = $SIG{$sig};
        next if defined $cur && $cur ne '' && $cur ne 'DEFAULT';
        $SIG{$sig} = sub {
            $SIG{PIPE} = 'IGNORE';
            print STDERR "# caught SIG$sig\n" unless $sig eq 'PIPE';
            exit 1;
        };
    }
}

# Free 127.0.0.1 ports: bind port 0, all at once so they are distinct.
sub _free_ports {
    my ($n) = @_;
    my @socks = map {
        IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
                              Proto => 'tcp', Listen => 1)
            or croak "cannot bind a free port: $@";
    } 1 .. $n;
    return map { $_->sockport } @socks;
}

# The first of $n consecutive free 127.0.0.1 ports, for kvsim, which
# listens on a run of them.
sub free_run {
    my ($n) = @_;
    for (1 .. 100) {
        my $base = 20000 + int(rand(40000));
        my @socks = map {
            IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1',
                                  LocalPort => $_, ReuseAddr => 1)
        } $base .. $base + $n - 1;
        next if grep { !defined } @socks;
        close $_ for @socks;
        return $base;
    }
    croak "no free run of $n ports";
}


# ---------------------------------------------------------------------------
# accessors

sub prefix       { $_[0]{prefix} }
sub port         { $_[0]{port} }
sub redis_port   { $_[0]{redis_port} }
sub backends     { $_[0]{nbackends} }
sub backend_port { $_[0]->_backend($_[1])->{port} }
sub backend_pid  { $_[0]->_backend($_[1])->{pid} }

sub _backend {
    my ($self, $i) = @_;
    my $b = ($i && $i =~ /^\d+$/) ? $self->{backends}[$i] : undef;
    croak "no backend " . ($i // 'undef') . " (have $self->{nbackends})"
        unless $b;
    return $b;
}


# ---------------------------------------------------------------------------
# configuration

# Expands $TEST_NGINX_* placeholders; an unknown one is an error rather
# than a confusing nginx message later.
sub subst {
    my ($self, $text) = @_;
    return $text unless defined $text && !ref $text;
    $text =~ s/\$TEST_NGINX_([A-Z0-9_]+)/$self->_placeholder($1)/ge;
    return $text;
}

sub _placeholder {
    my ($self, $name) = @_;
    return $self->{port}         if $name eq 'SERVER_PORT';
    return $self->{prefix}       if $name eq 'PREFIX';
    return module_path()         if $name eq 'MODULE';
    return $self->{redis_port}   if $name eq 'REDIS_PORT';
    return $self->backend_port($1) if $name =~ /^BACKEND_PORT_(\d+)$/;
    return '127.0.0.1:' . $self->backend_port($1)
        if $name =~ /^BACKEND_(\d+)$/;
    croak "unknown placeholder \$TEST_NGINX_$name";
}

# Writes PREFIX/conf/nginx.conf; returns its path.
sub conf {
    my ($self, %a) = @_;

    my $p = $self->{prefix};
    my $module = $a{module} // $self->{module};
    my $workers = $a{workers} // $self->{workers};
    my $level = $a{log_level} // $self->{log_level};

    if ($module && !module_available()) {
        croak "module not built: " . module_path();
    }

    my ($main, $http, $server) =
        map { $self->subst($_ // '') }
            @a{qw(main_config http_config config)};

    my $text = "# generated by Test::KvAware\n";
    $text .= "load_module " . module_path() . ";\n" if $module;
    # as root, workers would become "nobody" and lose the temp dirs
    $text .= "user root;\n" if $> == 0;
    $text .= <<"EOF";
worker_processes $workers;
daemon on;
master_process on;
pid $p/logs/nginx.pid;
error_log $p/logs/error.log $level;

$main

events {
    worker_connections 1024;
}

http {
    access_log $p/logs/access.log;

    client_body_temp_path $p/client_body_temp;
    proxy_temp_path $p/proxy_temp;
    fastcgi_temp_path $p/fastcgi_temp;
    uwsgi_temp_path $p/uwsgi_temp;
    scgi_temp_path $p/scgi_temp;

$http

    server {
        listen 127.0.0.1:$self->{port};
        server_name localhost;

$server
    }
}
EOF

    my $file = "$p/conf/nginx.conf";
    _write_file($file, $text);
    $self->{conf_text} = $text;
    $self->{conf_workers} = $workers;
    return $file;
}

sub conf_text { $_[0]{conf_text} }

# "-e stderr": what nginx logs before it has read error_log (a refused
# "nginx -t" or "nginx -s reload") goes to the command's output, as with
# Debian's nginx (--error-log-path=stderr).  A build from source would
# write it to PREFIX/logs/error.log, the running server's log.
sub _nginx_cmd {
    my ($self, @extra) = @_;
    return ($NGINX, '-p', "$self->{prefix}/", '-e', 'stderr',
            '-c', "$self->{prefix}/conf/nginx.conf", @extra);
}

# ($?, output) of nginx with this prefix and @args ("-t", "-s reload").
# A sanitizer build (make test-asan) writes its reports to files
# PREFIX/logs/sanitizer.PID, which check_logs_clean and cleanup look for:
# the daemon's stderr is the error log only once it is configured, and
# workers inherit the options from the master.
sub run_nginx {
    my ($self, @args) = @_;
    my $log = "log_path=$self->{prefix}/logs/sanitizer";
    # "nginx -t" and "nginx -s" exit without freeing the configuration
    # they read (nginx.c's init_cycle): no leak check for them
    my $leaks = grep({ /^-[ts]$/ } @args) ? 'detect_leaks=0' : '';
    local $ENV{ASAN_OPTIONS} = join ':', grep { length }
                                   $ENV{ASAN_OPTIONS} // '', $log, $leaks;
    local $ENV{UBSAN_OPTIONS} = join ':', grep { length }
                                    $ENV{UBSAN_OPTIONS} // '', $log;
    return $self->_run_cmd([$self->_nginx_cmd(@args)]);
}

# The sanitizer reports not yet seen, as text: each one fails one check.
sub sanitizer_reports {
    my ($self) = @_;
    my @new;
    for my $f (sort glob "$self->{prefix}/logs/sanitizer.*") {
        next if $self->{san_seen}{$f}++;
        my @l = split /\n/, _slurp($f) // '';     # what, where, then who
        push @new, join "\n", "$f:", @l[0 .. ($#l < 39 ? $#l : 39)];
    }
    return @new;
}

# ($ok, $output) of "nginx -t".
sub test_config {
    my ($self) = @_;
    croak "conf() was not called" unless $self->{conf_text};
    my ($rc, $out) = $self->run_nginx('-t');
    return ($rc == 0, $out);
}


# ---------------------------------------------------------------------------
# nginx lifecycle

# Starts nginx; emits one assertion ("nginx started") unless quiet => 1.
# Returns true when the master and all workers are up.
sub start_nginx {
    my ($self, %o) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;

    croak "conf() was not called" unless $self->{conf_text};
    croak "nginx already running" if $self->{nginx_pid};

    my $pidfile = "$self->{prefix}/logs/nginx.pid";
    unlink $pidfile;

    my ($rc, $out) = $self->run_nginx;
    my $err;

    if ($rc != 0) {
        my (undef, $t) = $self->test_config;
        $err = "nginx exited with status " . ($rc >> 8)
             . "\n--- output:\n$out\n--- nginx -t:\n$t";
    } else {
        # The listening sockets are bound before the foreground process
        # exits, so the port accepts already; wait for the daemon's pid
        # file and its workers.
        my $want = $self->{conf_workers} =~ /^\d+$/
                 ? $self->{conf_workers} : 1;
        my $ok = wait_until(5, sub {
            my $pid = _read_pid($pidfile) or return 0;
            return 0 unless _alive($pid);
            $self->{nginx_pid} = $pid;
            return $self->worker_pids >= $want;
        });
        $err = "nginx did not come up within 5 s" unless $ok;
    }

    if ($err) {
        $err .= "\n--- error.log (tail):\n" . _tail($self->error_log, 40);
        $self->stop_nginx if $self->{nginx_pid};
        $self->{last_error} = $err;
        unless ($o{quiet}) {
            Test::More::ok(0, $o{name} // 'nginx started');
            Test::More::diag($err);
        }
        return 0;
    }

    Test::More::ok(1, $o{name} // 'nginx started') unless $o{quiet};
    return 1;
}

# "nginx -s reload", then waits (10 s) until every old worker is gone and
# the new ones run.  One assertion unless quiet => 1; returns success.
sub reload {
    my ($self, %o) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    my $name = $o{name} // 'nginx reloaded';

    croak "nginx is not running" unless $self->{nginx_pid};

    my %old = map { $_ => 1 } $self->worker_pids;
    my $mark = $self->error_log_offset;
    my $want = $self->{conf_workers} =~ /^\d+$/ ? $self->{conf_workers} : 1;

    my ($rc, $out) = $self->run_nginx('-s', 'reload');
    my $err;

    if ($rc != 0) {
        $err = "nginx -s reload failed:\n$out";
    } else {
        my $ok = wait_until(10, sub {
            # the master refused the new configuration: no point waiting
            if ($self->error_log($mark) =~ /\[emerg\]/) {
                $err = "reload rejected";
                return 1;
            }
            # keep_old => 1: old workers may go on serving long requests
            return 0 if !$o{keep_old} && grep { _alive($_) } keys %old;
            my @new = grep { !$old{$_} } $self->worker_pids;
            return @new >= $want;
        });
        $err //= "old workers still alive / new ones missing after 10 s"
            unless $ok;
    }

    if ($err) {
        $err .= "\n--- error.log since reload:\n"
              . _tail($self->error_log($mark), 40);
        $self->{last_error} = $err;
        unless ($o{quiet}) {
            Test::More::ok(0, $name);
            Test::More::diag($err);
        }
        return 0;
    }

    Test::More::ok(1, $name) unless $o{quiet};
    return 1;
}

# Graceful quit (5 s), then SIGKILL to the master and its workers.
sub stop_nginx {
    my ($self) = @_;
    my $pid = delete $self->{nginx_pid}
           // _read_pid("$self->{prefix}/logs/nginx.pid");
    return unless $pid;

    if (_alive($pid)) {
        my @workers = _workers_of($pid);
        kill 'QUIT', $pid;

        unless (wait_until(5, sub { !_alive($pid) })) {
            Test::More::diag("nginx $pid did not quit in 5 s, killing it");
            kill 'KILL', $pid, _workers_of($pid);
            wait_until(2, sub { !_alive($pid) });
        }

        # a killed master leaves its workers behind
        my @left = grep { _alive($_) } @workers;
        kill 'KILL', @left if @left;
        wait_until(2, sub { !grep { _alive($_) } @left });
    }

    # The daemon leads its own process group: workers orphaned by a master
    # that crashed earlier (a sanitizer abort, say) are only found there.
    kill 'KILL', -$pid;
}

sub nginx_pid {
    my ($self) = @_;
    return $self->{nginx_pid};
}

# Why the last start_nginx/reload failed (for quiet => 1 callers).
sub last_error { $_[0]{last_error} }

# Worker processes of the running master (including old workers that are
# "shutting down" during a reload), sorted.
sub worker_pids {
    my ($self) = @_;
    my $pid = $self->{nginx_pid} or return ();
    return _workers_of($pid);
}

sub _workers_of {
    my ($master) = @_;
    my @pids;
    opendir(my $dh, '/proc') or return ();
    for my $pid (grep { /^\d+$/ } readdir $dh) {
        my ($state, $ppid) = _proc_stat($pid) or next;
        next unless $ppid == $master && $state ne 'Z';
        my $cmd = _slurp("/proc/$pid/cmdline") // '';
        push @pids, $pid if $cmd =~ /worker process/;
    }
    closedir $dh;
    @pids = sort { $a <=> $b } @pids;
    return @pids;                   # a count in scalar context
}

# (state, ppid) from /proc/PID/stat; the comm field may hold spaces/parens.
sub _proc_stat {
    my ($pid) = @_;
    my $stat = _slurp("/proc/$pid/stat") // return;
    return $stat =~ /\)\s+(\S)\s+(\d+)/;
}

# A process counts as alive unless it is gone or a zombie (the daemonized
# nginx is not our child, and PID 1 may be slow to reap it).
sub _alive {
    my ($pid) = @_;
    return 0 unless $pid && kill(0, $pid);
    my ($state) = _proc_stat($pid);
    return defined $state && $state ne 'Z' && $state ne 'X';
}

sub _read_pid {
    my ($file) = @_;
    my $t = _slurp($file) // return;
    return $t =~ /^(\d+)/ ? $1 : undef;
}


# ---------------------------------------------------------------------------
# HTTP clients

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
        _write_file("$file.json", $JSON->encode(\@res));
        POSIX::_exit(0);
    }
    return { pid => $pid, file => $file };
}

sub release {
    my ($self, $h) = @_;
    _write_file($h->{file}, '');
    waitpid($h->{pid}, 0);              # bounded by the requests' timeout
    my $res = eval { $JSON->decode(_slurp("$h->{file}.json") // '') };
    croak "release: no responses from the held requests" unless $res;
    return @$res;
}


# ---------------------------------------------------------------------------
# backends and redis

# (Re)starts backend $i on its port; mode => ok|fail|close.
sub backend_start {
    my ($self, $i, %o) = @_;
    my $b = $self->_backend($i);
    $self->backend_stop($i) if $b->{pid};

    $b->{mode} = $o{mode} // 'ok';
    croak "bad backend mode '$b->{mode}'"
        unless $b->{mode} =~ /^(?:ok|fail|close)$/;

    my $log = "$self->{prefix}/logs/backend-$b->{name}.log";
    $b->{pid} = _spawn($log, $^X, $BACKEND_PL, '--port', $b->{port},
                       '--name', $b->{name}, '--mode', $b->{mode});
    _write_file("$self->{prefix}/logs/backend-$b->{name}.pgid", $b->{pid});

    my $ok = wait_until(5, sub {
        return -1 if waitpid($b->{pid}, WNOHANG) == $b->{pid};
        return _port_open($b->{port});
    });
    if (!$ok || $ok == -1) {
        delete $b->{pid};
        croak "backend $b->{name} did not start on port $b->{port}:\n"
            . (_slurp($log) // '');
    }
    return $b->{pid};
}

sub backend_stop {
    my ($self, $i) = @_;
    my $b = $self->_backend($i);
    my $pid = delete $b->{pid} or return;
    _kill_group($pid);
    unlink "$self->{prefix}/logs/backend-$b->{name}.pgid";
}

# Kills a process group we spawned (the process and its forked children):
# TERM first, KILL after 5 s.  The leader is reaped only at the end, so
# its pid (= the group id) cannot be reused by anyone while we signal it.
sub _kill_group {
    my ($pid) = @_;
    kill 'TERM', -$pid;
    wait_until(5, sub { !_alive($pid) });
    kill 'KILL', -$pid;             # stragglers, or a leader that hung
    waitpid($pid, 0);
}

sub redis_start {
    my ($self) = @_;
    return $self->{redis_pid} if $self->{redis_pid};
    my $port = $self->{redis_port};
    my $log = "$self->{prefix}/logs/redis.log";

    $self->{redis_pid} = _spawn($log, $REDIS, '--bind', '127.0.0.1',
        '--port', $port, '--save', '', '--appendonly', 'no',
        '--daemonize', 'no', '--dir', $self->{prefix});

    my $pid = $self->{redis_pid};
    _write_file("$self->{prefix}/logs/redis.pgid", $pid);
    my $ok = wait_until(5, sub {
        return -1 if waitpid($pid, WNOHANG) == $pid;
        return _redis_ping($port);
    });
    if (!$ok || $ok == -1) {
        delete $self->{redis_pid};
        croak "redis did not start on port $port:\n" . (_slurp($log) // '');
    }
    return $pid;
}

sub redis_stop {
    my ($self) = @_;
    my $pid = delete $self->{redis_pid} or return;
    _kill_group($pid);
    unlink "$self->{prefix}/logs/redis.pgid";
}

# Output of "redis-cli -p PORT @args", trailing newline removed.
sub redis_cli {
    my ($self, @args) = @_;
    my (undef, $out) = $self->_run_cmd(
        [$REDIS_CLI, '-h', '127.0.0.1', '-p', $self->{redis_port}, @args]);
    chomp $out;
    return $out;
}

sub _redis_ping {
    my ($port) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Proto => 'tcp', Timeout => 1) or return 0;
    print {$s} "PING\r\n";
    my $sel = IO::Select->new($s);
    my $line = '';
    sysread($s, $line, 64) if $sel->can_read(1);
    return $line =~ /^\+PONG/ ? 1 : 0;
}

# fork + exec in a new process group with output to $log; returns the pid.
sub _spawn {
    my ($log, @cmd) = @_;
    my $pid = fork // croak "fork: $!";
    if ($pid == 0) {
        setpgrp(0, 0);
        $SIG{$_} = 'DEFAULT' for qw(INT TERM PIPE CHLD);
        open(STDIN, '<', '/dev/null');
        open(STDOUT, '>>', $log);
        open(STDERR, '>&', \*STDOUT);
        exec { $cmd[0] } @cmd
            or print STDERR "exec $cmd[0]: $!\n";
        POSIX::_exit(127);
    }
    return $pid;
}

# Runs a command to completion (bounded), returns ($?, stdout+stderr).
sub _run_cmd {
    my ($self, $cmd, %o) = @_;
    my $timeout = $o{timeout} // 20;
    my $out = "$self->{prefix}/logs/cmd-$$-" . ++$self->{cmd_seq} . ".out";

    my $pid = fork // croak "fork: $!";
    if ($pid == 0) {
        $SIG{$_} = 'DEFAULT' for qw(INT TERM PIPE CHLD);
        open(STDIN, '<', '/dev/null');
        open(STDOUT, '>', $out);
        open(STDERR, '>&', \*STDOUT);
        exec { $cmd->[0] } @$cmd
            or print STDERR "exec $cmd->[0]: $!\n";
        POSIX::_exit(127);
    }

    my $rc;
    my $done = wait_until($timeout, sub {
        return 0 unless waitpid($pid, WNOHANG) == $pid;
        $rc = $?;
        return 1;
    });
    unless ($done) {
        kill 'KILL', $pid;
        waitpid($pid, 0);
        $rc = -1;
    }

    my $text = _slurp($out) // '';
    unlink $out;
    $text .= "\n(killed after $timeout s)" unless $done;
    return ($rc, $text);
}

sub _port_open {
    my ($port) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Proto => 'tcp', Timeout => 1);
    return $s ? 1 : 0;
}


# ---------------------------------------------------------------------------
# logs

sub error_log_offset { (-s "$_[0]{prefix}/logs/error.log") || 0 }

# Whole error log, or what was appended after error_log_offset() said $from.
sub error_log {
    my ($self, $from) = @_;
    my $t = _slurp("$self->{prefix}/logs/error.log") // '';
    return $from ? substr($t, $from <= length $t ? $from : length $t) : $t;
}

sub access_log { _slurp("$_[0]{prefix}/logs/access.log") // '' }

# Polls the error log (appended part when $from given) for a pattern.
sub wait_for_log {
    my ($self, $pattern, $timeout, $from) = @_;
    return wait_until($timeout // 5,
                       sub { log_matches($self->error_log($from), $pattern) });
}

my $BAD_LOG = qr/\[(?:alert|emerg|crit)\]|exited on signal
                 |AddressSanitizer|runtime\ error|LeakSanitizer/x;

# One assertion: no alert/emerg/crit, no crashed worker, no sanitizer hit
# (in the error log or a report file).
sub check_logs_clean {
    my ($self, $name) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    my @bad = grep { /$BAD_LOG/ } split /\n/, $self->error_log;
    my @san = $self->sanitizer_reports;
    my $ok = Test::More::ok(!@bad && !@san,
                            ($name // 'logs') . ' - error log clean');
    Test::More::diag(join "\n", 'bad error log lines:',
                     @bad[0 .. ($#bad < 19 ? $#bad : 19)]) if @bad;
    Test::More::diag(join "\n", 'sanitizer reports:', @san) if @san;
    return $ok;
}

# A pattern is a substring, or a Regexp (qr// object).
sub log_matches {
    my ($text, $pat) = @_;
    return ref $pat eq 'Regexp' ? $text =~ $pat : index($text, $pat) >= 0;
}


# ---------------------------------------------------------------------------
# small helpers

sub wait_until {
    my ($timeout, $cond) = @_;
    my $deadline = time + $timeout;
    while (1) {
        my $r = $cond->();
        return $r if $r;
        return 0 if time > $deadline;
        sleep 0.02;
    }
}

sub _slurp {
    my ($file) = @_;
    open(my $fh, '<:raw', $file) or return;
    local $/;
    my $t = <$fh>;
    return $t // '';
}

sub _write_file {
    my ($file, $text) = @_;
    open(my $fh, '>:raw', $file) or croak "$file: $!";
    print {$fh} $text;
    close $fh or croak "$file: $!";
}

sub _tail {
    my ($text, $n) = @_;
    my @l = split /\n/, $text // '';
    return join "\n", @l > $n ? @l[-$n .. -1] : @l;
}


# ===========================================================================
# Test::Nginx-style block runner

# Sections whose text is compared byte for byte: only the single trailing
# newline is removed.  All others are trimmed.
my %EXACT = map { $_ => 1 } qw(request response_body);

# run_blocks(no_module => 1, data => $text): runs each "=== TEST" block of
# the caller's __DATA__ (or of $text) as one subtest.
sub run_blocks {
    my (%o) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;

    my $text = $o{data} // do {
        no strict 'refs';
        my $fh = \*{'main::DATA'};
        local $/;
        croak "run_blocks: no __DATA__ section" unless defined fileno $fh;
        scalar <$fh>;
    };

    my @blocks = parse_blocks($text);
    croak "run_blocks: no blocks found" unless @blocks;

    my @only = grep { exists $_->{sec}{ONLY} } @blocks;
    @blocks = @only if @only;

    for my $blk (@blocks) {
        Test::More::subtest($blk->{name} => sub {
            my $s = $blk->{sec};
            Test::More::plan(skip_all => 'SKIP section') if exists $s->{SKIP};

            my $no_module = $o{no_module} || exists $s->{no_module};
            if (!$no_module && !module_available()) {
                # an explicit KV_AWARE_MODULE must exist; else just skip
                return Test::More::ok(0, "KV_AWARE_MODULE="
                           . "$ENV{KV_AWARE_MODULE}: no such file")
                    if $ENV{KV_AWARE_MODULE};
                Test::More::plan(
                    skip_all => 'module not built: ' . module_path());
            }

            my $ok = eval { _run_block($blk, $no_module); 1 };
            die $@ if !$ok && ref $@;   # Test::Builder control flow
            unless ($ok) {
                (my $why = $@) =~ s/ at \S+ line \d+\.?\n\z/\n/;
                Test::More::ok(0, "$blk->{name} - died");
                Test::More::diag($why);
            }
        });
    }
}

# Splits text into blocks: [{name, sec => {name => value}, mod => {...}}].
sub parse_blocks {
    my ($text) = @_;
    my (@blocks, $blk, $cur);

    for my $line (split /^/m, $text) {
        if ($line =~ /^===\s*(.*?)\s*$/) {
            $blk = { name => $1, sec => {}, mod => {}, order => [] };
            push @blocks, $blk;
            undef $cur;
        } elsif ($blk && $line =~
                 /^---\s+(\w+)((?:[ \t]+\w+)*)[ \t]*(?::[ \t]?(.*?))?\s*$/)
        {
            my ($name, $mods, $inline) = ($1, $2, $3);
            $cur = $name;
            push @{ $blk->{order} }, $name;
            $blk->{mod}{$name} = { map { $_ => 1 } split ' ', $mods };
            $blk->{sec}{$name} = defined $inline ? $inline : '';
            $blk->{inline}{$name} = defined $inline;
        } elsif ($blk && defined $cur && !$blk->{inline}{$cur}) {
            $blk->{sec}{$cur} .= $line;
        }
    }

    for my $b (@blocks) {
        my $last = $b->{order}[-1];
        # blank lines separating blocks are not part of the last section
        $b->{sec}{$last} =~ s/(?:\n[ \t]*)+\z/\n/ if defined $last;

        for my $name (keys %{ $b->{sec} }) {
            my $v = $b->{sec}{$name};
            if ($EXACT{$name}) { $v =~ s/\n\z// }
            else { $v =~ s/^\s+//; $v =~ s/\s+\z// }
            $v = _eval_section($b->{name}, $name, $v)
                if $b->{mod}{$name}{eval};
            $b->{sec}{$name} = $v;
        }
    }
    return @blocks;
}

sub _eval_section {
    my ($block, $name, $code) = @_;
    my @r = eval "package main; no strict; no warnings; $code";
    croak "$block: --- $name eval: $@" if $@;
    return @r == 1 ? $r[0] : \@r;
}

sub _lines {
    my ($v) = @_;
    return () unless defined $v;
    return @$v if ref $v eq 'ARRAY';
    return $v if ref $v;
    return grep { /\S/ } map { s/^\s+|\s+$//gr } split /\n/, $v;
}

# Log patterns: "qr/.../" lines become regexps, others stay substrings.
sub _patterns {
    my ($v) = @_;
    return map {
        my $p = $_;
        if (!ref $p && $p =~ /^qr\W/) {
            $p = eval $p;
            croak "bad pattern $_: $@" if $@;
        }
        $p;
    } _lines($v);
}

sub _header_lines {
    my ($env, $v) = @_;
    my @h;
    for (_lines($v)) {
        my $l = $env->subst($_);
        if ($l =~ /^!\s*([\w-]+)$/) { push @h, [$1, undef]; next }
        my ($k, $val) = $l =~ /^([\w-]+)\s*:\s*(.*)$/
            or croak "bad header line '$l'";
        push @h, [$k, $val];
    }
    return @h;
}

# Per-request expected value: an array ref (from eval) is indexed.
sub _nth { my ($v, $i) = @_; ref $v eq 'ARRAY' ? $v->[$i] : $v }

sub _run_block {
    my ($blk, $no_module) = @_;
    my $s = $blk->{sec};
    my $name = $blk->{name};

    my $env = Test::KvAware->new(
        backends      => $s->{backends} // 2,
        workers       => $s->{workers} // 1,
        redis         => $s->{redis} // 0,
        module        => !$no_module,
        log_level     => $s->{log_level} // 'debug',
        backend_modes => [split ' ', $s->{backend_modes} // ''],
    );

    $env->conf(map { $_ => $s->{$_} } qw(main_config http_config config));

    if (exists $s->{must_die}) {
        my ($ok, $out) = $env->test_config;
        Test::More::ok(!$ok, "$name - nginx -t fails")
            or Test::More::diag($out);
        _check_log_patterns($name, $out, $s, 'nginx -t output');
        return;
    }

    $env->start_nginx(name => "$name - nginx started") or return;

    my @reqs = map { _parse_request($env, $_) }
                   defined $s->{request}
                       ? (ref $s->{request} ? @{ $s->{request} }
                                            : $s->{request})
                       : ();
    my %more;
    for (_header_lines($env, $s->{more_headers})) {
        my ($k, $v) = @$_;
        $more{$k} = exists $more{$k}
            ? [ref $more{$k} ? @{ $more{$k} } : $more{$k}, $v] : $v;
    }

    my $repeat = $s->{repeat} // 1;
    for my $rep (1 .. $repeat) {
        for my $i (0 .. $#reqs) {
            my $tag = "$name - req " . ($i + 1)
                    . ($repeat > 1 ? " #$rep" : '');
            my $r = $env->request(@{ $reqs[$i] }, \%more);
            _check_response($env, $tag, $r, $s, $i);
        }
    }

    sleep $s->{wait} if $s->{wait};

    # stop first: every log line of the block is then written
    $env->stop_nginx;
    _check_log_patterns($name, $env->error_log, $s, 'error log');
    $env->check_logs_clean($name);
}

sub _parse_request {
    my ($env, $text) = @_;
    my ($line, $body) = split /\n/, $text, 2;
    my ($method, $uri) = $env->subst($line) =~ /^\s*(\S+)\s+(\S+)/
        or croak "bad request line '$line'";
    return [$method, $uri, $body];
}

sub _check_response {
    my ($env, $tag, $r, $s, $i) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;

    Test::More::diag("$tag: $r->{error}") if $r->{error};

    Test::More::is($r->{status}, _nth($s->{error_code}, $i) // 200,
                   "$tag - status code");

    if (defined(my $exp = _nth($s->{response_body}, $i))) {
        Test::More::is($r->{body}, $env->subst($exp), "$tag - body");
    }
    if (defined(my $exp = _nth($s->{response_body_like}, $i))) {
        my $re = ref $exp eq 'Regexp' ? $exp : qr/$exp/s;
        Test::More::like($r->{body}, $re, "$tag - body like");
    }
    for (_header_lines($env, _nth($s->{response_headers}, $i))) {
        my ($k, $v) = @$_;
        Test::More::is($r->{headers}{lc $k}, $v, "$tag - header $k");
    }
    for (_header_lines($env, _nth($s->{response_headers_like}, $i))) {
        my ($k, $v) = @$_;
        Test::More::like($r->{headers}{lc $k} // '', qr/$v/,
                         "$tag - header $k like");
    }
}

sub _check_log_patterns {
    my ($name, $text, $s, $what) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    for my $p (_patterns($s->{error_log})) {
        Test::More::ok(log_matches($text, $p), "$name - $what has: $p")
            or Test::More::diag("--- $what (tail):\n" . _tail($text, 30));
    }
    for my $p (_patterns($s->{no_error_log})) {
        next if Test::More::ok(!log_matches($text, $p),
                               "$name - $what lacks: $p");
        my @m = grep { log_matches($_, $p) } split /\n/, $text;
        splice @m, 10;
        Test::More::diag(join "\n", "matching lines (first 10):", @m);
    }
}

1;
