package KvAware::Launch;

# One launcher for everything that runs nginx with the module on 127.0.0.1:
# the test harness (t/lib/Test/KvAware.pm), make demo (tools/demo.pl) and,
# through tools/kva-launch, the benchmarks (bench/wrk.sh,
# bench/bench_events.sh, bench/e2e/run.sh).  One object = one prefix
# directory (conf/, logs/) and the processes started in it:
#
#   $l = KvAware::Launch->new(prefix => DIR)   # or a fresh temporary one:
#   $l = KvAware::Launch->new(template => 'kvaware-XXXXXX', keep => 0,
#                             watchdog => 1, diag => \&Test::More::diag);
#   $l->prefix; $l->conf_file; $l->write_conf($text [, $file])
#   ($rc, $out) = $l->run_nginx(@args)         # bounded, -e stderr
#   ($ok, $err) = $l->start_nginx(workers => N, timeout => 5)
#   ($ok, $err) = $l->reload(workers => N, keep_old => 0, timeout => 10)
#   $l->stop_nginx(signal => 'QUIT', timeout => 5)
#   $l->nginx_pid, $l->worker_pids
#   $pid = $l->spawn($name, \@cmd, ready => sub {...}, timeout => 5)
#   $pid = $l->start_redis($port, @extra_redis_args)        # PING-ready
#   $pid = $l->start_kvsim($base, $servers, @extra_kvsim_args)  # ports open
#   $pid = $l->start_kvbridge(@kvbridge_args)   # both Redis links up
#   $l->stop($name); $l->stop_all
#
# Conventions every caller shares:
#   * nginx runs as a daemon (daemon on, the default) with its pid file at
#     PREFIX/logs/nginx.pid; "-p PREFIX/ -e stderr -c PREFIX/conf/nginx.conf":
#     what nginx says before it has read error_log (a refused "nginx -t" or
#     "-s reload") is the command's output, as with Debian's nginx;
#   * ready = the pid file names a live master with all its workers (the
#     listening sockets are bound before the foreground nginx exits);
#   * every other process runs in its own process group, output appended
#     to PREFIX/logs/NAME.log, its pid in PREFIX/logs/NAME.pgid; stopped by
#     SIGTERM to the group, SIGKILL after 5 s;
#   * binaries: TEST_NGINX_BINARY (else /usr/sbin/nginx), KV_AWARE_MODULE
#     (else build/ngx_http_kv_aware_module.so), KVSIM_BINARY (else
#     build/kvsim), KVBRIDGE_BINARY (else build/kvbridge),
#     TEST_REDIS_SERVER (else redis-server);
#   * a sanitizer build writes its reports to PREFIX/logs/sanitizer.PID;
#   * everything started is stopped when the object goes away or the
#     process exits (END, or SIGINT/TERM/PIPE), unless detach => 1 (the
#     command-line tool: its processes outlive it until "kva-launch stop");
#     watchdog => 1 also covers a SIGKILLed owner.

use strict;
use warnings;

use Carp qw(croak);
use File::Path qw(make_path remove_tree);
use File::Spec;
use File::Temp ();
use IO::Select;
use IO::Socket::INET;
use Fcntl qw(O_WRONLY O_CREAT O_EXCL LOCK_EX);
use POSIX qw(WNOHANG);
use Scalar::Util qw(refaddr weaken);
use Time::HiRes qw(time sleep);

use Exporter qw(import);
our @EXPORT_OK = qw(wait_until free_ports free_run port_open module_path
                    nginx_binary kvsim_binary kvbridge_binary slurp
                    write_file alive
                    workers_of read_pid);

my %LIVE;                       # refaddr => weak ref, for END cleanup

sub nginx_binary { $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx' }
sub redis_binary { $ENV{TEST_REDIS_SERVER} || 'redis-server' }
sub kvsim_binary {
    File::Spec->rel2abs($ENV{KVSIM_BINARY} || 'build/kvsim');
}
sub kvbridge_binary {
    File::Spec->rel2abs($ENV{KVBRIDGE_BINARY} || 'build/kvbridge');
}
sub module_path {
    File::Spec->rel2abs($ENV{KV_AWARE_MODULE}
                        || 'build/ngx_http_kv_aware_module.so');
}


# ---------------------------------------------------------------------------
# construction / destruction

sub new {
    my ($class, %a) = @_;
    my $self = bless {
        owner  => $$,           # forked helpers must never clean up
        nginx  => $a{nginx} // nginx_binary(),
        diag   => $a{diag} // sub { print STDERR map { "# $_\n" } @_ },
        detach => $a{detach} // 0,
        procs  => {},           # name => pid
        seq    => 0,
    }, $class;

    if (defined $a{prefix}) {
        $self->{prefix} = File::Spec->rel2abs($a{prefix});
        $self->{prefix} =~ s{/+\z}{};
    } else {
        $self->{prefix} = File::Temp::tempdir(
            $a{template} // 'kva-launch-XXXXXX', TMPDIR => 1,
            CLEANUP => !$a{keep});
    }
    make_path(map { "$self->{prefix}/$_" } qw(conf logs));

    unless ($self->{detach}) {
        $LIVE{refaddr $self} = $self;
        weaken $LIVE{refaddr $self};
        _install_signal_handlers();
        $self->{watchdog} = _start_watchdog($self->{prefix}, $a{keep})
            if $a{watchdog};
    }
    return $self;
}

sub DESTROY { $_[0]->cleanup }

# Stops all this object started; idempotent, owner process only.
sub cleanup {
    my ($self) = @_;
    return if $self->{detach} || $self->{cleaned}
           || !$self->{owner} || $self->{owner} != $$;
    $self->{cleaned} = 1;
    local ($?, $@, $!);
    eval { $self->stop_all };
    if (my $w = delete $self->{watchdog}) {
        kill 'KILL', $w;
        waitpid($w, 0);
    }
    delete $LIVE{refaddr $self};
}

END {
    for my $l (grep { defined } values %LIVE) {
        $l->cleanup;
    }
}

# Ctrl-C, kill, or a closed TAP pipe: exit normally so that END blocks run
# (the default actions would skip them).  Handlers set by the caller stay.
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

# A forked sentinel for when the owner is SIGKILLed (a CI timeout): END
# never runs then, so it kills what the pid files in PREFIX/logs name and
# removes the prefix.  Normal cleanup kills the sentinel first.
sub _start_watchdog {
    my ($prefix, $keep) = @_;
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

    kill_prefix($prefix);
    remove_tree($prefix) unless $keep;
    POSIX::_exit(0);
}

# SIGKILL to everything PREFIX/logs names: nginx (master, workers, its
# process group) and each NAME.pgid group.  For a prefix whose owner is
# gone (the watchdog, "kva-launch kill").
sub kill_prefix {
    my ($prefix) = @_;
    if (my $ngx = read_pid("$prefix/logs/nginx.pid")) {
        kill 'KILL', $ngx, workers_of($ngx) if alive($ngx);
        kill 'KILL', -$ngx;             # orphaned workers: see stop_nginx
    }
    for my $f (glob "$prefix/logs/*.pgid") {
        my $pg = read_pid($f) or next;
        kill 'KILL', -$pg;
    }
}


# ---------------------------------------------------------------------------
# accessors, configuration

sub prefix    { $_[0]{prefix} }
sub conf_file { "$_[0]{prefix}/conf/nginx.conf" }
sub pid_file  { "$_[0]{prefix}/logs/nginx.pid" }
sub error_log_file { "$_[0]{prefix}/logs/error.log" }
sub nginx_pid { $_[0]{nginx_pid} }
sub pid       { $_[0]{procs}{$_[1]} }

# Writes the configuration (PREFIX/conf/nginx.conf unless $file); its path.
sub write_conf {
    my ($self, $text, $file) = @_;
    $file //= $self->conf_file;
    write_file($file, $text);
    return $file;
}

# A whole nginx.conf around $o{http} (the http{} block's body): the
# module loaded, $o{workers} workers (1), the error log at $o{log_level}
# (info), $o{connections} connections a worker (1024) and temporary files
# in the prefix; written as write_conf does.  Shell scripts have it as
# "kva-launch conf".
sub write_nginx_conf {
    my ($self, %o) = @_;
    my $prefix = $self->{prefix};
    return $self->write_conf(join '',
        'load_module ', module_path(), ";\n", user_directive(),
        'worker_processes ', $o{workers} // 1, ";\n",
        'error_log logs/error.log ', $o{log_level} // 'info', ";\n",
        "pid logs/nginx.pid;\n",
        'events { worker_connections ', $o{connections} // 1024, "; }\n",
        "http {\n",
        "    access_log off;\n",
        "    client_body_temp_path $prefix/body;\n",
        "    proxy_temp_path $prefix/proxy;\n\n",
        $o{http}, "}\n");
}

# "user root;" when running as root: workers would otherwise become
# "nobody" and lose access to the temporary prefix.
sub user_directive { $> == 0 ? "user root;\n" : '' }

# The worker count the configuration asks for ("auto" and none: 1).
sub conf_workers {
    my ($self) = @_;
    my $t = slurp($self->conf_file) // '';
    return $t =~ /^\s*worker_processes\s+(\d+)\s*;/m ? $1 : 1;
}


# ---------------------------------------------------------------------------
# nginx

sub nginx_cmd {
    my ($self, @extra) = @_;
    return ($self->{nginx}, '-p', "$self->{prefix}/", '-e', 'stderr',
            '-c', $self->conf_file, @extra);
}

# ($?, output) of nginx with this prefix and @args ("-t", "-s reload").
# A sanitizer build (make test-asan) writes its reports to files
# PREFIX/logs/sanitizer.PID: the daemon's stderr is the error log only once
# it is configured, and workers inherit the options from the master.
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
    return $self->run_cmd([$self->nginx_cmd(@args)]);
}

# Starts nginx and waits (timeout, 5 s) for its pid file and workers
# (workers: the count to wait for, from the configuration by default).
# ($ok, $why): on failure nginx is stopped and $why says what happened.
sub start_nginx {
    my ($self, %o) = @_;
    croak "nginx already running" if $self->{nginx_pid};
    my $timeout = $o{timeout} // 5;
    my $want = $o{workers} // $self->conf_workers;
    $want = 1 unless $want =~ /^\d+$/;

    unlink $self->pid_file;
    my ($rc, $out) = $self->run_nginx;
    my $err;
    if ($rc != 0) {
        my (undef, $t) = $self->run_nginx('-t');
        $err = "nginx exited with status " . ($rc >> 8)
             . "\n--- output:\n$out\n--- nginx -t:\n$t";
    } else {
        my $ok = wait_until($timeout, sub {
            my $pid = read_pid($self->pid_file) or return 0;
            return 0 unless alive($pid);
            $self->{nginx_pid} = $pid;
            return $self->worker_pids >= $want;
        });
        $err = "nginx did not come up within $timeout s" unless $ok;
    }
    return (1, '') unless $err;

    $err .= "\n--- error.log (tail):\n"
          . tail(slurp($self->error_log_file) // '', 40);
    $self->stop_nginx if $self->{nginx_pid};
    return (0, $err);
}

# "nginx -s reload", then waits (10 s) until every old worker is gone
# (unless keep_old => 1) and the new ones run; ($ok, $why).
sub reload {
    my ($self, %o) = @_;
    croak "nginx is not running" unless $self->{nginx_pid};
    my $timeout = $o{timeout} // 10;
    my $want = $o{workers} // $self->conf_workers;
    $want = 1 unless $want =~ /^\d+$/;
    my %old = map { $_ => 1 } $self->worker_pids;
    my $mark = -s $self->error_log_file || 0;
    my $since = sub {
        my $t = slurp($self->error_log_file) // '';
        return substr($t, $mark <= length $t ? $mark : length $t);
    };

    my ($rc, $out) = $self->run_nginx('-s', 'reload');
    my $err;
    if ($rc != 0) {
        $err = "nginx -s reload failed:\n$out";
    } else {
        my $ok = wait_until($timeout, sub {
            # the master refused the new configuration: no point waiting
            if ($since->() =~ /\[emerg\]/) {
                $err = "reload rejected";
                return 1;
            }
            # keep_old => 1: old workers may go on serving long requests
            return 0 if !$o{keep_old} && grep { alive($_) } keys %old;
            my @new = grep { !$old{$_} } $self->worker_pids;
            return @new >= $want;
        });
        $err //= "old workers still alive / new ones missing after "
               . "$timeout s" unless $ok;
    }
    return (1, '') unless $err;
    return (0, "$err\n--- error.log since reload:\n" . tail($since->(), 40));
}

# Stops nginx: signal (QUIT, graceful; TERM for "nginx -s stop"), then
# after timeout (5 s) SIGKILL to the master and its workers.
sub stop_nginx {
    my ($self, %o) = @_;
    my $pid = delete $self->{nginx_pid} // read_pid($self->pid_file);
    return unless $pid;
    my $sig = $o{signal} // 'QUIT';
    my $timeout = $o{timeout} // 5;

    if (alive($pid)) {
        my @workers = workers_of($pid);
        kill $sig, $pid;

        unless (wait_until($timeout, sub { !alive($pid) })) {
            $self->{diag}->("nginx $pid did not quit in $timeout s, "
                            . "killing it");
            kill 'KILL', $pid, workers_of($pid);
            wait_until(2, sub { !alive($pid) });
        }

        # a killed master leaves its workers behind
        my @left = grep { alive($_) } @workers;
        kill 'KILL', @left if @left;
        wait_until(2, sub { !grep { alive($_) } @left });
    }

    # The daemon leads its own process group: workers orphaned by a master
    # that crashed earlier (a sanitizer abort, say) are only found there.
    kill 'KILL', -$pid;
}

# Worker processes of the running master (including old workers that are
# "shutting down" during a reload), sorted; a count in scalar context.
sub worker_pids {
    my ($self) = @_;
    my $pid = $self->{nginx_pid} or return ();
    return workers_of($pid);
}

sub workers_of {
    my ($master) = @_;
    my @pids;
    opendir(my $dh, '/proc') or return ();
    for my $pid (grep { /^\d+$/ } readdir $dh) {
        my ($state, $ppid) = proc_stat($pid) or next;
        next unless $ppid == $master && $state ne 'Z';
        my $cmd = slurp("/proc/$pid/cmdline") // '';
        push @pids, $pid if $cmd =~ /worker process/;
    }
    closedir $dh;
    @pids = sort { $a <=> $b } @pids;
    return @pids;
}


# ---------------------------------------------------------------------------
# other processes: backends, redis-server, kvsim

# Starts @$cmd in its own process group, output appended to
# PREFIX/logs/NAME.log (or log => FILE), and waits (timeout, 5 s) until
# ready->() is true; croaks with the log if it exits or never gets ready.
# setsid => 1 also leaves the session (kva-launch: outlives the caller).
sub spawn {
    my ($self, $name, $cmd, %o) = @_;
    croak "$name already running" if $self->{procs}{$name};
    my $log = $o{log} // "$self->{prefix}/logs/$name.log";
    my $pid = _spawn($log, $o{setsid}, @$cmd);
    $self->{procs}{$name} = $pid;
    write_file("$self->{prefix}/logs/$name.pgid", $pid);

    my $timeout = $o{timeout} // 5;
    my $ready = $o{ready} // sub { 1 };
    my $ok = wait_until($timeout, sub {
        return -1 if !alive($pid) || waitpid($pid, WNOHANG) == $pid;
        return $ready->($pid);
    });
    if (!$ok || $ok == -1) {
        $self->stop($name);
        croak(($o{what} // $name) . ' did not start'
              . ($ok ? ' (exited)' : " within $timeout s")
              . ":\n" . tail(slurp($log) // '', 20));
    }
    return $pid;
}

# Stops process NAME: SIGTERM to its group, SIGKILL after timeout (5 s).
sub stop {
    my ($self, $name, %o) = @_;
    my $pid = delete $self->{procs}{$name}
           // read_pid("$self->{prefix}/logs/$name.pgid");
    unlink "$self->{prefix}/logs/$name.pgid";
    kill_group($pid, $o{timeout}) if $pid;
}

# nginx first (it talks to the others), then the rest, newest first.
sub stop_all {
    my ($self, %o) = @_;
    $self->stop_nginx(%o);
    my %names = map { $_ => 1 } keys %{ $self->{procs} },
                map { m{/([^/]+)\.pgid\z} ? $1 : () }
                    glob "$self->{prefix}/logs/*.pgid";
    $self->stop($_) for sort keys %names;
}

# redis-server on 127.0.0.1:PORT, nothing saved, its files in the prefix;
# ready when it answers PING (timeout, 5 s).  @extra: more options
# ("--client-output-buffer-limit", "pubsub 0 0 0").
sub start_redis {
    my ($self, $port, @extra) = @_;
    my %o = ref $extra[0] eq 'HASH' ? %{ shift @extra } : ();
    return $self->spawn($o{name} // 'redis',
        [redis_binary(), '--bind', '127.0.0.1', '--port', $port,
         '--save', '', '--appendonly', 'no', '--daemonize', 'no',
         '--dir', $self->{prefix}, @extra],
        ready => sub { redis_ping($port, $_[0]) },
        what => "redis on port $port",
        %o);
}

# kvsim's SERVERS servers on BASE.. (consecutive ports); ready when each
# accepts (timeout, 10 s).  @extra: more kvsim options.
sub start_kvsim {
    my ($self, $base, $servers, @extra) = @_;
    my %o = ref $extra[0] eq 'HASH' ? %{ shift @extra } : ();
    my @ports = $base .. $base + $servers - 1;
    return $self->spawn($o{name} // 'kvsim',
        [$o{binary} // kvsim_binary(), '--servers', $servers,
         '--base-port', $base, @extra],
        ready => sub { !grep { !port_open($_) } @ports },
        what => "kvsim on ports $ports[0]-$ports[-1]", timeout => 10, %o);
}

# kvbridge with @args (its --redis, --engine ...); ready when both of its
# Redis links are up (its log says so), timeout 10 s
sub start_kvbridge {
    my ($self, @args) = @_;
    my %o = ref $args[0] eq 'HASH' ? %{ shift @args } : ();
    my $name = $o{name} // 'kvbridge';
    my $log = $o{log} // "$self->{prefix}/logs/$name.log";
    my $from = -s $log // 0;
    return $self->spawn($name, [$o{binary} // kvbridge_binary(), @args],
        ready => sub {
            my $t = substr(slurp($log) // '', $from);
            return ($t =~ /publishing on/ && $t =~ /answering resyncs/)
                   ? 1 : 0;
        },
        what => 'kvbridge', timeout => 10, %o);
}

# PONG from a Redis on PORT; with OWNER, only if that Redis is the
# process OWNER (its process_id in INFO): another test's Redis that took
# the port first must not pass for ours (t/42 once talked to t/31's
# Redis, and lost it when t/31 restarted its own)
sub redis_ping {
    my ($port, $owner) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Proto => 'tcp', Timeout => 1) or return 0;
    print {$s} $owner ? "INFO server\r\n" : "PING\r\n";
    my $sel = IO::Select->new($s);
    my $text = '';
    while (length $text < 65536 && $sel->can_read(1)) {
        sysread($s, $text, 4096, length $text) or last;
        last if !$owner || $text =~ /process_id:\d+\r\n/;
    }
    return $text =~ /^\+PONG/ ? 1 : 0 unless $owner;
    my ($id) = $text =~ /process_id:(\d+)\r\n/ or return 0;
    return 1 if $id == $owner;
    my (undef, $ppid) = proc_stat($id);      # a wrapper we started
    return defined $ppid && $ppid == $owner ? 1 : 0;
}

# Kills a process group we spawned (the process and its forked children):
# TERM first, KILL after 5 s.  The leader is reaped only at the end, so
# its pid (= the group id) cannot be reused by anyone while we signal it.
sub kill_group {
    my ($pid, $timeout) = @_;
    kill 'TERM', -$pid;
    wait_until($timeout // 5, sub { !alive($pid) });
    kill 'KILL', -$pid;             # stragglers, or a leader that hung
    waitpid($pid, 0);
}

# fork + exec in a new process group with output to $log; the pid.
sub _spawn {
    my ($log, $setsid, @cmd) = @_;
    my $pid = fork // croak "fork: $!";
    if ($pid == 0) {
        $setsid ? POSIX::setsid() : setpgrp(0, 0);
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

# Runs a command to completion (timeout, 20 s), returns ($?, its output).
sub run_cmd {
    my ($self, $cmd, %o) = @_;
    my $timeout = $o{timeout} // 20;
    my $out = "$self->{prefix}/logs/cmd-$$-" . ++$self->{seq} . ".out";

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

    my $text = slurp($out) // '';
    unlink $out;
    $text .= "\n(killed after $timeout s)" unless $done;
    return ($rc, $text);
}


# ---------------------------------------------------------------------------
# ports, processes, files

# Ports drawn at random are reserved for the process that drew them
# (a file per port, holding its pid) until it exits: tests run side by
# side, and a test that stops its Redis to restart it on the same port
# left that port free to be drawn by another test meanwhile; both then
# spoke to whichever Redis bound it (t/42 lost its Redis when t/31
# restarted its own).  A reservation of a process that is gone is taken
# over.  kva-launch draws for the script that runs it (KVA_PORT_OWNER).
our $PORT_OWNER = $ENV{KVA_PORT_OWNER} || $$;
my $PORT_DIR = File::Spec->tmpdir . "/kv-aware-ports-$<";
our @RESERVED;                  # files this process made, removed at END

# The check of a reservation and its takeover under one lock on the
# directory: two processes that both found the owner gone would each
# remove the file (the second the one the first had just made) and each
# make its own, both then holding the port.
sub reserve_port {
    my ($port) = @_;
    make_path($PORT_DIR, { mode => 0700 }) unless -d $PORT_DIR;
    my $file = "$PORT_DIR/$port";
    sysopen(my $lock, "$PORT_DIR/.lock", O_WRONLY | O_CREAT, 0600)
        or croak "$PORT_DIR/.lock: $!";
    flock($lock, LOCK_EX) or croak "flock $PORT_DIR/.lock: $!";
    for (1 .. 2) {
        if (sysopen(my $fh, $file, O_WRONLY | O_CREAT | O_EXCL, 0600)) {
            print {$fh} "$PORT_OWNER\n";
            close $fh;
            push @RESERVED, $file if $PORT_OWNER == $$;
            return 1;
        }
        my $pid = read_pid($file);
        return 0 if $pid && alive($pid);     # ours or another live test's
        my $mtime = (stat $file)[9];
        return 0 if !$pid && $mtime && $mtime > time - 10;  # being written
        unlink $file;                        # its owner is gone
    }
    return 0;
}

# A port reserved and not used after all: free for others, and not
# removed at END from under whoever reserves it next
sub release_port {
    my ($port) = @_;
    my $file = "$PORT_DIR/$port";
    @RESERVED = grep { $_ ne $file } @RESERVED;
    unlink $file;
}

END {
    if ($PORT_OWNER == $$) { unlink $_ for @RESERVED }
}

# $n free 127.0.0.1 ports, drawn at random below the kernel's ephemeral
# ports (those every outgoing connection takes its source port from: a
# port the kernel handed out here and released could be a client's by
# the time nginx binds it, and with tests side by side it was:
# "bind() ... Address already in use" in t/46), and reserved (above)
sub free_ports {
    my ($n) = @_;
    my $low = ephemeral_low($n);
    my (@socks, %tried);
    for (1 .. 1000) {
        last if @socks == $n;
        my $port = 20000 + int(rand($low - 20000));
        next if $tried{$port}++;
        my $s = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1',
                                      LocalPort => $port, Proto => 'tcp')
            or next;
        reserve_port($port) or next;
        push @socks, $s;
    }
    croak "cannot find $n free ports" unless @socks == $n;
    return map { $_->sockport } @socks;
}

# The first of $n consecutive free 127.0.0.1 ports (kvsim listens on a run),
# drawn below the kernel's ephemeral ports too, and reserved
sub free_run {
    my ($n) = @_;
    my $low = ephemeral_low($n);
    for (1 .. 100) {
        my $base = 20000 + int(rand($low - 20000 - $n));
        my @socks = map {
            IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1',
                                  LocalPort => $_, ReuseAddr => 1)
        } $base .. $base + $n - 1;
        next if grep { !defined } @socks;
        close $_ for @socks;
        my @got = grep { reserve_port($_) } $base .. $base + $n - 1;
        if (@got < $n) {
            release_port($_) for @got;
            next;
        }
        return $base;
    }
    croak "no free run of $n ports";
}

# the lowest of the kernel's ephemeral ports, with room below for $n
sub ephemeral_low {
    my ($n) = @_;
    my ($low) = (slurp('/proc/sys/net/ipv4/ip_local_port_range') // '')
                =~ /^(\d+)/;
    return ($low && $low > 20000 + 1000 + $n) ? $low : 32768;
}

sub port_open {
    my ($port, $addr) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => $addr // '127.0.0.1',
                                  PeerPort => $port,
                                  Proto => 'tcp', Timeout => 1);
    return $s ? 1 : 0;
}

# (state, ppid) from /proc/PID/stat; the comm field may hold spaces/parens.
sub proc_stat {
    my ($pid) = @_;
    my $stat = slurp("/proc/$pid/stat") // return;
    return $stat =~ /\)\s+(\S)\s+(\d+)/;
}

# A process counts as alive unless it is gone or a zombie (the daemonized
# nginx is not our child, and PID 1 may be slow to reap it).
sub alive {
    my ($pid) = @_;
    return 0 unless $pid && kill(0, $pid);
    my ($state) = proc_stat($pid);
    return defined $state && $state ne 'Z' && $state ne 'X';
}

sub read_pid {
    my ($file) = @_;
    my $t = slurp($file) // return;
    return $t =~ /^(\d+)/ ? $1 : undef;
}

# $cond->() until true (its value) or $timeout s (0), polling every 20 ms.
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

sub slurp {
    my ($file) = @_;
    open(my $fh, '<:raw', $file) or return;
    local $/;
    my $t = <$fh>;
    return $t // '';
}

sub write_file {
    my ($file, $text) = @_;
    open(my $fh, '>:raw', $file) or croak "$file: $!";
    print {$fh} $text;
    close $fh or croak "$file: $!";
}

sub tail {
    my ($text, $n) = @_;
    my @l = split /\n/, $text // '';
    return join "\n", @l > $n ? @l[-$n .. -1] : @l;
}

1;
