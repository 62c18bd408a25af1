package Test::KvAware::Blocks;

# Test::Nginx-style block runner, exported by Test::KvAware as run_blocks.
#
# run_blocks(no_module => 1) reads __DATA__ blocks ("=== TEST n: name")
# with sections main_config, http_config, config, backends, backend_modes,
# workers, redis, log_level, no_module, request, more_headers, repeat,
# error_code, response_body, response_body_like, response_headers ("Name:
# value", "!Name" = absent), response_headers_like, error_log,
# no_error_log (substring or qr/.../ per line), must_die, wait, SKIP, ONLY.
# "--- name: value" is the one-line form; "--- name eval" evaluates the
# section as Perl (an array ref gives one value per request of an
# array-ref request).  request and response_body lose only their single
# trailing newline; the other sections are trimmed; blank lines before the
# next "===" are dropped.  Each block gets its own Test::KvAware.

use strict;
use warnings;

use Carp qw(croak);
use Test::More ();
use Time::HiRes qw(sleep);

use KvAware::Launch qw(module_path);
use Test::KvAware::Logs qw(log_matches);

our @EXPORT_OK = qw(run_blocks parse_blocks);
use Exporter qw(import);

sub _tail { KvAware::Launch::tail(@_) }

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
            if (!$no_module && !Test::KvAware::module_available()) {
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
