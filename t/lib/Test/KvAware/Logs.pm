package Test::KvAware::Logs;

# nginx's logs and sanitizer reports: methods of a Test::KvAware object
# (which inherits them), and log_matches().
#
#   $env->error_log([$offset]), error_log_offset, access_log,
#        wait_for_log($pattern, $timeout, $offset), check_logs_clean($name)
#   $env->sanitizer_reports         # reports not yet seen, as text

use strict;
use warnings;

use Test::More ();

use KvAware::Launch qw(slurp wait_until);

use Exporter qw(import);
our @EXPORT_OK = qw(log_matches);

# The sanitizer reports not yet seen, as text: each one fails one check.
# A sanitizer build writes them to PREFIX/logs/sanitizer.PID (see
# KvAware::Launch::run_nginx).
sub sanitizer_reports {
    my ($self) = @_;
    my @new;
    for my $f (sort glob "$self->{prefix}/logs/sanitizer.*") {
        next if $self->{san_seen}{$f}++;
        my @l = split /\n/, slurp($f) // '';     # what, where, then who
        push @new, join "\n", "$f:", @l[0 .. ($#l < 39 ? $#l : 39)];
    }
    return @new;
}

sub error_log_offset { (-s "$_[0]{prefix}/logs/error.log") || 0 }

# Whole error log, or what was appended after error_log_offset() said $from.
sub error_log {
    my ($self, $from) = @_;
    my $t = slurp("$self->{prefix}/logs/error.log") // '';
    return $from ? substr($t, $from <= length $t ? $from : length $t) : $t;
}

sub access_log { slurp("$_[0]{prefix}/logs/access.log") // '' }

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


1;
