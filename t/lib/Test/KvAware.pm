package Test::KvAware;

# Integration-test harness for ngx_http_kv_aware_module (Test::Nginx is not
# available here).  Two layers:
#
#   * an object API: one object = one temp prefix + N echo backends
#     (t/lib/backend.pl) + optional redis + one nginx, all on 127.0.0.1;
#   * run_blocks(): a Test::Nginx-like runner for the caller's __DATA__
#     (Test::KvAware::Blocks).
#
# Processes are started and stopped by KvAware::Launch (t/lib/KvAware/,
# shared with make demo and the benchmarks); requests are in
# Test::KvAware::Http, logs and sanitizer reports in Test::KvAware::Logs,
# whose methods this object inherits.  Everything it starts is stopped in
# DESTROY/END, even when the test dies; every wait is bounded.
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
#   $env->nginx_pid, worker_pids, last_error, prefix, port, launch
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

use strict;
use warnings;

use Carp qw(croak);
use Cwd ();
use Exporter qw(import);
use File::Basename qw(dirname);
use File::Path qw(make_path);
use Scalar::Util qw(refaddr weaken);
use Test::More ();

use KvAware::Launch ();
use Test::KvAware::Blocks ();
use Test::KvAware::Http ();
use Test::KvAware::Logs ();

our @ISA = qw(Test::KvAware::Http Test::KvAware::Logs);

our @EXPORT    = qw(run_blocks);
our @EXPORT_OK = qw(module_path module_available skip_unless_module
                    log_matches wait_until free_run);

our $NGINX       = KvAware::Launch::nginx_binary();
our $REDIS_CLI   = $ENV{TEST_REDIS_CLI}    || 'redis-cli';
our $BACKEND_PL  = Cwd::abs_path(dirname(__FILE__) . '/../backend.pl');

# what the tests and the other helpers call by these names
no warnings qw(once);
*run_blocks   = \&Test::KvAware::Blocks::run_blocks;
*parse_blocks = \&Test::KvAware::Blocks::parse_blocks;
*_patterns    = \&Test::KvAware::Blocks::_patterns;
*log_matches  = \&Test::KvAware::Logs::log_matches;
*wait_until   = \&KvAware::Launch::wait_until;
*free_run     = \&KvAware::Launch::free_run;
*module_path  = \&KvAware::Launch::module_path;
*_alive       = \&KvAware::Launch::alive;
*TIMEOUT      = \$Test::KvAware::Http::TIMEOUT;

my %LIVE;                       # refaddr => weak ref, for END cleanup


# ---------------------------------------------------------------------------
# module location

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
    }, $class;

    $self->{launch} = KvAware::Launch->new(
        template => 'kvaware-XXXXXX', keep => $ENV{TEST_KEEP},
        watchdog => 1, nginx => $NGINX,
        diag => sub { Test::More::diag(@_) });
    $self->{prefix} = $self->{launch}->prefix;
    $self->{watchdog} = $self->{launch}{watchdog};     # t/00 looks
    Test::More::diag("TEST_KEEP: prefix $self->{prefix}") if $ENV{TEST_KEEP};
    make_path("$self->{prefix}/html");

    $LIVE{refaddr $self} = $self;
    weaken $LIVE{refaddr $self};

    my @ports = KvAware::Launch::free_ports($self->{nbackends} + 2);
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
    eval { $self->{launch}->cleanup };
    delete $LIVE{refaddr $self};
}

END {
    for my $env (grep { defined } values %LIVE) {
        $env->cleanup;
    }
}


# ---------------------------------------------------------------------------
# accessors

sub prefix       { $_[0]{prefix} }
sub launch       { $_[0]{launch} }
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
    $self->{launch}->write_conf($text, $file);
    $self->{conf_text} = $text;
    $self->{conf_workers} = $workers;
    return $file;
}

sub conf_text { $_[0]{conf_text} }

# ($?, output) of nginx with this prefix and @args ("-t", "-s reload"):
# KvAware::Launch::run_nginx ("-e stderr", sanitizer report files).
sub run_nginx {
    my ($self, @args) = @_;
    return $self->{launch}->run_nginx(@args);
}

# ($ok, $output) of "nginx -t".
sub test_config {
    my ($self) = @_;
    croak "conf() was not called" unless $self->{conf_text};
    my ($rc, $out) = $self->run_nginx('-t');
    return ($rc == 0, $out);
}



# ---------------------------------------------------------------------------
# nginx lifecycle: KvAware::Launch, plus one assertion each

# Starts nginx; emits one assertion ("nginx started") unless quiet => 1.
# Returns true when the master and all workers are up.
sub start_nginx {
    my ($self, %o) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    croak "conf() was not called" unless $self->{conf_text};
    croak "nginx already running" if $self->nginx_pid;
    my ($ok, $err) = $self->{launch}->start_nginx(
                         workers => $self->{conf_workers});
    return $self->_outcome($ok, $err, $o{name} // 'nginx started', %o);
}

# "nginx -s reload", then waits (10 s) until every old worker is gone and
# the new ones run.  One assertion unless quiet => 1; returns success.
sub reload {
    my ($self, %o) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    croak "nginx is not running" unless $self->nginx_pid;
    my ($ok, $err) = $self->{launch}->reload(
                         workers => $self->{conf_workers},
                         keep_old => $o{keep_old});
    return $self->_outcome($ok, $err, $o{name} // 'nginx reloaded', %o);
}

sub _outcome {
    my ($self, $ok, $err, $name, %o) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    $self->{last_error} = $err unless $ok;
    unless ($o{quiet}) {
        Test::More::ok($ok, $name);
        Test::More::diag($err) unless $ok;
    }
    return $ok ? 1 : 0;
}

# Graceful quit (5 s), then SIGKILL to the master and its workers.
sub stop_nginx  { $_[0]{launch}->stop_nginx }
sub nginx_pid   { $_[0]{launch}->nginx_pid }
sub worker_pids { $_[0]{launch}->worker_pids }

# Why the last start_nginx/reload failed (for quiet => 1 callers).
sub last_error { $_[0]{last_error} }


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

    $b->{pid} = $self->{launch}->spawn("backend-$b->{name}",
        [$^X, $BACKEND_PL, '--port', $b->{port}, '--name', $b->{name},
         '--mode', $b->{mode}],
        ready => sub { KvAware::Launch::port_open($b->{port}) },
        what => "backend $b->{name} on port $b->{port}");
    return $b->{pid};
}

sub backend_stop {
    my ($self, $i) = @_;
    my $b = $self->_backend($i);
    delete $b->{pid} or return;
    $self->{launch}->stop("backend-$b->{name}");
}

sub redis_start {
    my ($self) = @_;
    return $self->{redis_pid} if $self->{redis_pid};
    return $self->{redis_pid} =
        $self->{launch}->start_redis($self->{redis_port});
}

sub redis_stop {
    my ($self) = @_;
    delete $self->{redis_pid} or return;
    $self->{launch}->stop('redis');
}

# Output of "redis-cli -p PORT @args", trailing newline removed.
sub redis_cli {
    my ($self, @args) = @_;
    my (undef, $out) = $self->{launch}->run_cmd(
        [$REDIS_CLI, '-h', '127.0.0.1', '-p', $self->{redis_port}, @args]);
    chomp $out;
    return $out;
}

1;
