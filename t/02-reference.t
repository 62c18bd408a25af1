# docs/reference.md against the code, both ways: a directive, a parameter,
# a variable, a status field or a metric the code has and the docs do not
# fails here, and so does one the docs still describe that the code no
# longer has.
#
# Read from the sources (no build needed): the directives of every
# ngx_command_t table in src/*.c, their contexts from the flags; the
# parameters and defaults of every ngx_http_kv_aware_param_t table (the
# table ngx_http_kv_aware_events_params is kv_aware_events'); the
# variables of every ngx_http_variable_t table ("kv_aware_ranking_", a
# prefix, is documented as $kv_aware_ranking_NAME).
#
# Read from a running nginx (skipped without the module or redis-server):
# the JSON status page's fields and the Prometheus page's metric families,
# with every optional part switched on (events, share=on, data_parallel,
# a load report, ?check, a keys=tokens upstream).

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use Test::More;

use Test::KvAware ();
use Test::KvAware::Events qw(
    $LOCATIONS addr upstream_conf wait_status publisher
);

my $root = abs_path(dirname(__FILE__) . '/..');

sub slurp {
    my ($file) = @_;
    open my $fh, '<', $file or die "$file: $!";
    local $/;
    return scalar <$fh>;
}

# the text of section "## $name" (or "### $name") of a markdown file
sub section {
    my ($text, $level, $name) = @_;
    my $h = '#' x $level;
    my ($s) = $text =~ /^$h \Q$name\E\n(.*?)(?=^#{1,$level} |\z)/ms;
    return $s;
}

# first-column `names` of the tables of a text
sub first_column {
    my ($text) = @_;
    my %n;
    for my $cell (($text // '') =~ /^\|([^|\n]*)\|/mg) {
        $n{$_} = 1 for $cell =~ /`([^`\s]+)`/g;
    }
    return \%n;
}

# both ways: what the code has that the docs lack, and the other way
sub same_set {
    my ($what, $code, $docs) = @_;
    my @undoc = sort grep { !$docs->{$_} } keys %$code;
    my @gone = sort grep { !$code->{$_} } keys %$docs;
    ok(!@undoc, "every $what in the code is documented ("
                . scalar(keys %$code) . ')')
        or diag("$what not in the docs: @undoc");
    ok(!@gone, "every $what documented is in the code")
        or diag("$what documented but not in the code: @gone");
}

my $ref = slurp("$root/docs/reference.md");

# ---- the code

my (%directive, %context, %param, %default, %variable);
my %ctx_of = (NGX_HTTP_MAIN_CONF => 'http', NGX_HTTP_SRV_CONF => 'server',
              NGX_HTTP_LOC_CONF => 'location',
              NGX_HTTP_UPS_CONF => 'upstream');

for my $file (sort glob "$root/src/*.c") {
    my $c = slurp($file);
    $c =~ s{/\*.*?\*/}{}gs;

    while ($c =~ /\bngx_command_t\s+\w+\[\]\s*=\s*\{(.*?)ngx_null_command/gs) {
        my $table = $1;
        while ($table =~ /\{\s*ngx_string\("([^"]+)"\)\s*,\s*([^,]+),/g) {
            my ($name, $flags) = ($1, $2);
            $directive{$name} = 1;
            $context{$name} = join ' ', sort map { $ctx_of{$_} // () }
                                        split /\s*\|\s*/, $flags;
        }
    }

    while ($c =~ /\bngx_http_kv_aware_param_t\s+(\w+)\[\]\s*=\s*\{(.*?)
                  ngx_http_kv_aware_null_param/gsx)
    {
        my ($table, $body) = ($1, $2);
        (my $dir = $table) =~ s/^ngx_http_//;
        $dir =~ s/_params$//;
        while ($body =~ /\{\s*ngx_string\("([^"]+)"\)(.*?)\}/gs) {
            my ($name, $rest) = ($1, $2);
            $param{$dir}{$name} = 1;
            $default{$dir}{$name} = $1 if $rest =~ /,\s*"([^"]*)"\s*$/;
        }
    }

    while ($c =~ /\bngx_http_variable_t\s+\w+\[\]\s*=\s*\{(.*?)
                  ngx_http_null_variable/gsx)
    {
        for my $name ($1 =~ /ngx_string\("([^"]+)"\)/g) {
            $variable{$name =~ /_$/ ? "${name}NAME" : $name} = 1;
        }
    }
}

ok(keys %directive, 'directives found in src/*.c')
    or BAIL_OUT('no ngx_command_t table in src/*.c');
ok(keys %variable, 'variables found in src/*.c');
for my $dir (sort keys %param) {
    ok($directive{$dir}, "parameter table of $dir: a directive of that name")
        or diag("a parameter table ngx_http_${dir}_params, no directive"
                . " \"$dir\": name the table after its directive");
}

# ---- the reference

my $directives = section($ref, 2, 'Directives');
ok(defined $directives, 'docs/reference.md has "## Directives"');

my (%doc_directive, %doc_context, %doc_param, %doc_text);
for my $part (split /^(?=### )/m, $directives // '') {
    my ($name) = $part =~ /^### (\S+)\n/ or next;
    $doc_directive{$name} = 1;
    $doc_text{$name} = $part;

    my ($syntax, $def, $ctx) = $part =~
        /^ {4}Syntax:(.*?)^ {4}Default:([^\n]*)\n {4}Context:([^\n]*)\n/ms;
    ok(defined $syntax, "$name: Syntax, Default, Context as on nginx.org")
        or next;
    like($syntax, qr/^\s*\Q$name\E\s/, "$name: its syntax names it");
    $doc_param{$name}{$_} = 1 for $syntax =~ /\b([a-z_]+)=/g;
    $doc_context{$name} = join ' ', sort grep {
        $ctx =~ /\b$_\b/
    } qw(http server location upstream);
}

same_set('directive', \%directive, \%doc_directive);

for my $dir (sort keys %directive) {
    next unless $doc_directive{$dir};
    is($doc_context{$dir}, $context{$dir}, "$dir: Context as in the code");
    same_set("parameter of $dir", $param{$dir} // {}, $doc_param{$dir} // {});

    # each default as `name=value` in the text, as the code has it
    for my $p (sort keys %{ $default{$dir} // {} }) {
        my $v = $default{$dir}{$p};
        like($doc_text{$dir}, qr/`\Q$p=$v\E`/,
             "$dir: ${p}'s default, $v, as in the code");
    }
}

my $vars = section($ref, 2, 'Embedded variables');
ok(defined $vars, 'docs/reference.md has "## Embedded variables"');
my %doc_variable = map { $_ => 1 } ($vars // '') =~ /^`\$(\w+)`$/mg;
same_set('variable', \%variable, \%doc_variable);

# ---- a running nginx: status fields, metrics

subtest 'a running nginx: status fields and metrics' => sub {
    plan skip_all => 'the module is not built'
        unless Test::KvAware::module_available();
    plan skip_all => 'redis-server is not installed'
        unless grep { -x "$_/redis-server" } split /:/, $ENV{PATH};

    my $env = Test::KvAware->new(backends => 2, redis => 1,
                                 log_level => 'notice');
    my $http = upstream_conf(n => 2, kv_aware => 'data_parallel=2',
                             events => 'share=on heartbeat=60s') . <<'EOF';
    upstream tok {
        kv_aware keys=tokens;
        server $TEST_NGINX_BACKEND_1;
    }
EOF
    $env->conf(http_config => $http, config => $LOCATIONS);
    $env->start_nginx or BAIL_OUT('nginx did not start');
    ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }),
       'subscribed');

    # a load report makes a server's "load" and the engine gauges appear
    my $pub = publisher($env);
    $pub->event(addr($env, 1), rank => 0, events => [],
                load => { waiting => 1, running => 2, kv_usage => 0.5 });

    my %field;
    my $walk;
    $walk = sub {
        my ($v, $path) = @_;
        if (ref $v eq 'HASH') {
            $walk->($v->{$_}, $path eq '' ? $_ : "$path.$_") for keys %$v;
        } elsif (ref $v eq 'ARRAY') {
            $walk->($_, "$path\[]") for @$v;
        } else {
            $field{$path} = 1;
        }
    };
    my $r = $env->request(GET => '/kv_status?check');
    $walk->($_, '') for values %{ $r->{json}{upstreams} // {} };
    ok(keys %field, 'the status page has fields');

    my $fields = section($ref, 2, 'Status fields');
    same_set('status field', \%field, first_column($fields));

    $r = $env->request(GET => '/kv_status?format=prometheus');
    my %metric = map { $_ => 1 } $r->{body} =~ /^# TYPE (\S+) /mg;
    my $obs = slurp("$root/docs/observability.md");
    my $doc_metric = first_column(section($obs, 2, 'Prometheus'));
    delete $doc_metric->{$_} for grep { !/^kv_aware_/ } keys %$doc_metric;
    same_set('metric (docs/observability.md)', \%metric, $doc_metric);

    $env->stop_nginx;
    $env->check_logs_clean('reference');
};

done_testing();
