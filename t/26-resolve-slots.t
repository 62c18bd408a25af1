# Servers that come and go by DNS (nginx 1.27.3 and later) when the zone's
# 1,024 slots (ranks) are all taken: a newcomer takes a slot freed in the
# same change, and routing goes back to kv_aware at once, without waiting
# for DNS to change again (t/25-resolve.t has the machinery).
#
#   * a.test: 100 addresses of data_parallel=16, 64 of them get their 16
#     slots (1,024); then 3, one of which had none: the three are listed,
#     a prompt sticks to one server by affinity, the routed reasons count,
#     nothing goes by round-robin;
#   * b.test: 8 servers of data_parallel=128 (1,024 ranks); DNS replaces
#     one: the newcomer's 128 ranks are listed and a prompt sticks to one
#     rank.
#
# Deterministic: one worker, nothing in flight when DNS changes.  Skipped
# before 1.27.3 (no "resolve" in open-source upstreams).

use strict;
use warnings;

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use KvAware::Launch qw(free_ports wait_until);
use Test::KvAware ();
use Test::KvAware::Events qw(prompt show);

my $v = `${\ KvAware::Launch::nginx_binary()} -v 2>&1` // '';
my ($maj, $min, $pat) = $v =~ m{nginx/(\d+)\.(\d+)\.(\d+)};
plan skip_all => "nginx $maj.$min.$pat has no \"server ... resolve\""
    . " in open-source upstreams (1.27.3 and later)"
    unless defined $pat && sprintf('%03d%03d%03d', $maj, $min, $pat)
                           ge '001027003';
plan skip_all => 'Net::DNS is not installed (libnet-dns-perl)'
    unless eval { require Net::DNS::Nameserver; 1 };

my $env = Test::KvAware->new(backends => 0, workers => 1,
                             log_level => 'info');
my $l = $env->launch;
my ($port, $dns) = free_ports(2);
my $zone = $env->prefix . '/dns.zone';

my @A = map { "127.0.1.$_" } 1 .. 100;
my @B = map { "127.0.2.$_" } 1 .. 9;
my %dns = (a => [@A], b => [@B[0 .. 7]]);

sub answer {
    KvAware::Launch::write_file("$zone.tmp", join '',
        map { my $n = $_; map { "$n.test $_\n" } @{ $dns{$n} } }
        sort keys %dns);
    rename "$zone.tmp", $zone or die "$zone: $!";
}

my %spawned;
sub backend {
    my ($addr) = @_;
    return if $spawned{$addr}++;
    $l->spawn("backend-$addr",
        [$^X, 't/lib/backend.pl', '--port', $port, '--name', $addr,
         '--addr', $addr],
        ready => sub { KvAware::Launch::port_open($port, $addr) },
        what => "backend on $addr:$port");
}

answer();
$l->spawn('dns', [$^X, 't/lib/dns.pl', '--port', $dns, '--zone', $zone],
          what => "dns on 127.0.0.1:$dns", ready => sub { sleep 0.3; 1 });
backend($_) for @B;

$env->conf(http_config => <<"EOF", config => <<'EOF');
    resolver 127.0.0.1:$dns valid=1s ipv6=off;
    resolver_timeout 2s;

    upstream llm_a {
        zone llm_a 1m;
        kv_aware block_size=64 data_parallel=16;
        server a.test:$port resolve max_fails=0;
    }

    upstream llm_b {
        zone llm_b 256k;
        kv_aware block_size=64 data_parallel=128;
        server b.test:$port resolve max_fails=0;
    }
EOF
        location /a/ {
            proxy_pass http://llm_a;
            add_header X-KV-Reason $kv_aware_reason always;
        }
        location /b/ {
            proxy_pass http://llm_b;
            proxy_set_header X-data-parallel-rank $kv_aware_dp_rank;
            add_header X-KV-Reason $kv_aware_reason always;
        }
        location = /kv_status {
            kv_aware_status;
        }
EOF
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

sub upstream {
    my ($u) = @_;
    my $r = $env->request(GET => '/kv_status');
    return $r->{json} ? $r->{json}{upstreams}{"llm_$u"} : undef;
}

# the servers listed (ranks of one server once), by address
sub names {
    my ($u) = @_;
    my $st = upstream($u) or return '';
    my %n = map { ($_->{name} =~ /^([\d.]+):/)[0] => 1 } @{ $st->{servers} };
    return join ' ', sort keys %n;
}

sub ranks { my $st = upstream($_[0]); $st ? scalar @{ $st->{servers} } : 0 }

sub routed {
    my ($u) = @_;
    my $st = upstream($u) or return 0;
    my $n = 0;
    $n += $_ for values %{ $st->{routed} };
    return $n;
}

sub ask {
    my ($u, $body) = @_;
    my $r = $env->request(POST => "/$u/v1/chat/completions", $body,
                          { 'Content-Type' => 'application/json' });
    return {
        status  => $r->{status},
        backend => $r->{headers}{'x-backend'} // '-',
        rank    => $r->{headers}{'x-backend-rank'} // '-',
        reason  => $r->{headers}{'x-kv-reason'} // '-',
    };
}

# the same prompt $n times: one backend (and rank), by affinity after the
# first, and the routed reasons count them
sub sticks {
    my ($u, $what, $n) = @_;
    my $before = routed($u);
    my @r = map { ask($u, prompt("$u-sticky", 8)) } 1 .. $n;
    is(scalar(grep { $_->{status} != 200 } @r), 0, "$what: answered")
        or diag join "\n", map { show($_) } @r;
    my %where = map { ("$_->{backend}#$_->{rank}" => 1) } @r;
    is(scalar keys %where, 1, "$what: one backend"
                              . ($u eq 'b' ? ' and rank' : ''))
        or diag join "\n", map { show($_) } @r;
    is(join(' ', map { $_->{reason} } @r[1 .. $#r]),
       join(' ', ('affinity') x ($n - 1)), "$what: by affinity");
    is(routed($u) - $before, $n, "$what: the routed reasons count them");
}

subtest '100 addresses to 3, one of which had no slot' => sub {
    ok(wait_until(15, sub { ranks('a') == 1024 }),
       '100 addresses of 16 ranks: 64 have their slots') or diag ranks('a');
    my %slot = map { $_ => 1 } split ' ', names('a');
    my @with = grep { $slot{$_} } @A;
    my @without = grep { !$slot{$_} } @A;
    is(scalar @without, 36, '36 have none');
    return unless @with >= 2 && @without;

    my @three = ($with[0], $with[1], $without[0]);
    backend($_) for @three;
    $dns{a} = [@three];
    answer();
    ok(wait_until(10, sub { names('a') eq join ' ', sort @three }),
       'the three are listed') or diag names('a');
    sticks('a', 'a prompt', 4);
    unlike($env->error_log, qr/llm_a.*round-robin/,
           'nothing went by round-robin');
};

subtest 'data_parallel=128: DNS replaces one of 8 servers' => sub {
    ok(wait_until(10, sub { ranks('b') == 1024 }), '8 servers, 1,024 ranks')
        or diag names('b');
    sticks('b', 'before', 3);

    $dns{b} = [@B[0 .. 6], $B[8]];
    answer();
    ok(wait_until(10, sub { names('b') eq join ' ', sort @{ $dns{b} } }),
       "$B[7] replaced by $B[8]") or diag names('b');
    is(ranks('b'), 1024, '  with its 128 ranks');
    like($env->error_log, qr/upstream "llm_b" lost 128 servers \(ranks\)/,
         'the log says the ranks were lost');

    # the newcomer is routed to: distinct prompts spread by load
    my %hit;
    for my $i (1 .. 256) {
        my $r = ask('b', prompt("spread-$i", 2));
        $hit{$r->{backend}}++;
        last if $hit{$B[8]};
    }
    ok($hit{$B[8]}, 'new prompts reach the newcomer') or diag explain \%hit;
    sticks('b', 'after', 3);
    unlike($env->error_log, qr/llm_b.*round-robin/,
           'nothing went by round-robin');
};

unlike($env->error_log, qr/\[(?:alert|emerg|crit)\]/, 'no alert');

done_testing;
