# Servers that come and go without a reload (nginx 1.27.3 and later):
# "zone" and "server NAME resolve" in a kv_aware upstream, the name's
# addresses served by a DNS server the test starts (t/lib/dns.pl) and
# rewrites while nginx runs.
#
#   * a resolved server gets a slot of its own and affinity works;
#   * a new address gets a slot and starts fresh: new prompts reach it;
#   * an address gone from DNS is gone from the status page, and what it
#     held is forgotten: its prompt goes elsewhere by load, not to the
#     server that took its slot; back in DNS, it starts fresh;
#   * no request fails or is altered meanwhile.
#
# Before 1.27.3 nginx has no "resolve" in open-source upstreams: skipped
# there (the same configuration without "zone" is t/10's).

use strict;
use warnings;

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use KvAware::Launch qw(free_ports wait_until);
use Test::KvAware ();
use Test::KvAware::Events qw($LOCATIONS prompt chat show);

my $v = `${\ KvAware::Launch::nginx_binary()} -v 2>&1` // '';
my ($maj, $min, $pat) = $v =~ m{nginx/(\d+)\.(\d+)\.(\d+)};
plan skip_all => "nginx $maj.$min.$pat has no \"server ... resolve\""
    . " in open-source upstreams (1.27.3 and later)"
    unless defined $pat && sprintf('%03d%03d%03d', $maj, $min, $pat)
                           ge '001027003';
plan skip_all => 'Net::DNS is not installed (libnet-dns-perl)'
    unless eval { require Net::DNS::Nameserver; 1 };

my $env = Test::KvAware->new(backends => 0, workers => 2,
                             log_level => 'info');
my $l = $env->launch;
my ($port, $dns) = free_ports(2);
my $zone = $env->prefix . '/dns.zone';

# three servers on one port, at three loopback addresses
my %addr = (b1 => '127.0.0.2', b2 => '127.0.0.3', b3 => '127.0.0.4');
for my $b (sort keys %addr) {
    $l->spawn("backend-$b",
        [$^X, 't/lib/backend.pl', '--port', $port, '--name', $b,
         '--addr', $addr{$b}],
        ready => sub { KvAware::Launch::port_open($port, $addr{$b}) },
        what => "backend $b on $addr{$b}:$port");
}

sub answer {
    my (@b) = @_;
    KvAware::Launch::write_file("$zone.tmp",
        join '', map { "llm.test $addr{$_}\n" } @b);
    rename "$zone.tmp", $zone or die "$zone: $!";
}

answer(qw(b1 b2));
$l->spawn('dns', [$^X, 't/lib/dns.pl', '--port', $dns, '--zone', $zone],
          what => "dns on 127.0.0.1:$dns", ready => sub { sleep 0.3; 1 });

$env->conf(http_config => <<"EOF", config => $LOCATIONS);
    upstream llm {
        zone llm 256k;
        kv_aware block_size=64;
        resolver 127.0.0.1:$dns valid=1s ipv6=off;
        resolver_timeout 2s;
        server llm.test:$port resolve max_fails=0;
    }
EOF
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

sub servers {
    my $r = $env->request(GET => '/kv_status');
    my $u = $r->{json} ? $r->{json}{upstreams}{llm} : undef;
    return { map { $_->{name} => $_ } @{ $u ? $u->{servers} : [] } };
}

sub names { join ' ', sort keys %{ servers() } }

sub want { join ' ', sort map { "$addr{$_}:$port" } @_ }

ok(wait_until(10, sub { names() eq want(qw(b1 b2)) }),
   'the two addresses of llm.test are two servers')
    or diag names();

my @failed;

sub ask {
    my ($p) = @_;
    my $r = chat($env, $p);
    push @failed, show($r) if $r->{status} != 200;
    return $r;
}

my $P = prompt('resolve-alpha', 8);
my $home = ask($P)->{backend};
my $again = ask($P);
is($again->{backend}, $home, 'a prompt returns to its server');
is($again->{reason}, 'affinity', '  by affinity');

subtest 'a new address gets a slot and starts fresh' => sub {
    answer(qw(b1 b2 b3));
    ok(wait_until(10, sub { names() eq want(qw(b1 b2 b3)) }),
       'three servers now') or diag names();
    my $s = servers()->{"$addr{b3}:$port"};
    is($s->{entries}{learned} + $s->{entries}{event}, 0,
       'the newcomer holds nothing');

    # distinct prompts, held open, go where the load is lowest
    my $hold = $env->prefix . '/release';
    my @pids;
    for my $i (1 .. 3) {
        my $pid = fork // die "fork: $!";
        if ($pid == 0) {
            chat($env, prompt("spread-$i", 4), quiet => 1,
                 headers => { 'X-Hold' => $hold });
            exit 0;
        }
        push @pids, $pid;
        sleep 0.3;
    }
    ok(wait_until(5, sub { servers()->{"$addr{b3}:$port"}{in_flight} > 0 }),
       'new prompts reach the newcomer');
    KvAware::Launch::write_file($hold, '');
    waitpid $_, 0 for @pids;
};

subtest 'an address gone from DNS is forgotten' => sub {
    my @left = grep { $_ ne $home } qw(b1 b2 b3);
    answer(@left);
    ok(wait_until(10, sub { names() eq want(@left) }),
       "$home is gone from the status page") or diag names();
    my $r = ask($P);
    isnt($r->{backend}, $home, 'its prompt goes elsewhere');
    is($r->{reason}, 'load', '  by load: nobody inherited what it held');
    is($r->{matched}, 0, '  nothing matched');
    like($env->error_log, qr/upstream "llm" lost 1 servers/,
         'the log says so');

    answer(qw(b1 b2 b3));
    ok(wait_until(10, sub { names() eq want(qw(b1 b2 b3)) }),
       "$home is back") or diag names();
    my $s = servers()->{"$addr{$home}:$port"};
    is($s->{entries}{learned}, 0, '  and starts fresh');
};

subtest 'nothing failed, nothing altered' => sub {
    is(scalar @failed, 0, 'every request answered 200')
        or diag join "\n", @failed;
    my $body = prompt('whole', 6);
    my $r = $env->request(POST => '/v1/chat/completions', $body,
                          { 'Content-Type' => 'application/json' });
    is($r->{json}{len}, length $body, 'a body arrives whole');
    unlike($env->error_log, qr/\[(?:alert|emerg|crit)\]/, 'no alert');
};

done_testing;
