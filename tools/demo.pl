#!/usr/bin/perl
#
# make demo: nginx with kv_aware in front of four simulated model servers
# (build/kvsim, vLLM-like KV caches publishing their events on Redis), a
# few multi-turn conversations sent through it, and for each request the
# server it went to, why, the prompt blocks that server held, the tokens
# the server found cached, and the time to first token.  Then the same
# requests through plain round-robin, for contrast.  All on 127.0.0.1.

use strict;
use warnings;

use File::Basename qw(dirname);
use File::Spec;
use IO::Socket::INET;
use JSON::PP;
use Time::HiRes qw(sleep time);

# nginx, redis-server and kvsim start and stop as in the tests
use lib File::Spec->rel2abs(dirname(__FILE__) . '/../t/lib');
use KvAware::Launch qw(free_ports free_run);

my $root   = File::Spec->rel2abs($ENV{KV_AWARE_ROOT} || '.');
my $module = "$root/build/ngx_http_kv_aware_module.so";
my $kvsim  = "$root/build/kvsim";

-f $module or die "build the module first (make module)\n";
-x $kvsim or die "build the simulator first (make tools)\n";

# a temporary prefix; everything started in it is stopped at exit
my $launch = KvAware::Launch->new(template => 'kv-aware-demo-XXXX');
my $prefix = $launch->prefix;

# kvsim's servers sit on consecutive ports: four free in a row
my $base = free_run(4);
my ($redis, $port) = free_ports(2);

$launch->start_redis($redis);

# time scale 1: step times are those of the GPU the simulator models
sub start_kvsim {
    $launch->start_kvsim($base, 4, { binary => $kvsim }, '--time-scale', 1,
                         '--num-blocks', 4802, '--redis', "127.0.0.1:$redis",
                         '--quiet');
}
start_kvsim();

my $servers = join '', map { "        server 127.0.0.1:$_;\n" }
                       $base .. $base + 3;
my $user = KvAware::Launch::user_directive();

$launch->write_conf(<<"CONF");
load_module $module;
$user
worker_processes 2;
error_log $prefix/logs/error.log notice;
pid $prefix/logs/nginx.pid;
events { worker_connections 256; }
http {
    access_log off;
    client_body_buffer_size 1m;
    client_body_temp_path $prefix/body;
    proxy_temp_path $prefix/proxy;
    upstream kv {
        kv_aware;
        kv_aware_events redis=127.0.0.1:$redis;
$servers    }
    upstream rr {
$servers    }
    server {
        listen 127.0.0.1:$port;
        proxy_http_version 1.1;
        proxy_buffering off;
        add_header X-KV-Blocks \$kv_aware_blocks;
        add_header X-KV-Matched \$kv_aware_matched;
        add_header X-KV-Reason \$kv_aware_reason;
        location /kv/ { proxy_pass http://kv/; }
        location /rr/ { proxy_pass http://rr/; }
        location = /status { kv_aware_status; }
    }
}
CONF

my ($started, $why) = $launch->start_nginx;
$started or die "nginx did not start\n$why\n";

# as "nginx -s stop" did: no graceful wait for the streams
END { $launch->stop_all(signal => 'TERM') if $launch }

# one streaming request; returns the response headers, the first chunk's
# kvsim section, the usage, and the time to the first token
sub chat {
    my ($path, $body) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                  Timeout => 30) or die $!;
    my $t0 = time;
    print $s "POST $path HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n"
             . "Content-Type: application/json\r\n"
             . "Content-Length: " . length($body) . "\r\n\r\n$body";
    my ($raw, $ttft) = ('', undef);
    while (sysread($s, my $buf, 65536)) {
        $raw .= $buf;
        $ttft //= time - $t0 if $raw =~ /"content"/;
    }
    my ($head) = $raw =~ /^(.*?)\r\n\r\n/s;
    my @pairs = ($head // '') =~ /^([\w-]+):[ \t]*(.*?)\r?$/mg;
    my %h;
    while (my ($name, $value) = splice @pairs, 0, 2) {
        $h{ lc $name } = $value;
    }
    my ($first) = $raw =~ /"kvsim":(\{[^}]*\})/;
    my ($usage) = $raw =~ /"usage":(\{.*?\}\})/;
    return (\%h, $first ? decode_json($first) : {},
            $usage ? decode_json($usage) : {}, $ttft // 0);
}

# Four users with their own long system prompts (about 2,500 tokens each);
# each conversation grows a turn at a time, as chat clients resend it all.
my @users = qw(alice bob carol dave);
my %role = (
    alice => 'a meticulous contract lawyer who cites clauses',
    bob   => 'a senior SRE who answers with commands first',
    carol => 'a patient maths tutor who checks every step',
    dave  => 'a rail travel agent who prefers night trains',
);
my @questions = ('Where do I start?', 'Why is that?', 'And then?',
                 'Summarise, please.');
my $json = JSON::PP->new->canonical;

sub requests {
    my (@reqs, %history);
    for my $u (@users) {
        my $sys = "You are $role{$u}. " . join(' ', map {
            sprintf 'rule%04d keep answers exact and brief.', $_ } 1 .. 250);
        $history{$u} = [ { role => 'system', content => $sys } ];
    }
    for my $turn (0 .. $#questions) {
        for my $u (@users) {
            push @{ $history{$u} },
                 { role => 'user', content => "$questions[$turn] ($u)" };
            push @reqs, [ $u, $turn + 1,
                          $json->encode({ model => 'kvsim', stream => JSON::PP::true,
                                          max_tokens => 8,
                                          stream_options => { include_usage => JSON::PP::true },
                                          messages => $history{$u} }) ];
            push @{ $history{$u} }, { role => 'assistant',
                                      content => "Answer $turn to $u." };
        }
    }
    return @reqs;
}

my @reqs = requests();
my %summary;

for my $method ('kv', 'rr') {
    printf "\n%s\n", $method eq 'kv'
        ? "kv_aware with KV events: each conversation stays where its "
          . "prefix is cached"
        : "round-robin, the same conversations, fresh caches: prefixes "
          . "land anywhere";
    printf "%-6s %4s  %-16s %-9s %6s %7s %7s %7s %8s\n", 'user', 'turn',
           'server', 'reason', 'blocks', 'matched', 'prompt', 'cached',
           'TTFT ms';

    for my $r (@reqs) {
        my ($u, $turn, $body) = @$r;
        my ($h, $k, $usage, $ttft) = chat("/$method/v1/chat/completions",
                                          $body);
        my $cached = $usage->{prompt_tokens_details}{cached_tokens} // 0;
        printf "%-6s %4d  %-16s %-9s %6s %7s %7s %7s %8.0f\n", $u, $turn,
               $k->{server} // '?', $h->{'x-kv-reason'} // '-',
               $h->{'x-kv-blocks'} // '-', $h->{'x-kv-matched'} // '-',
               $usage->{prompt_tokens} // '?', $cached, $ttft * 1000;
        $summary{$method}{ttft} += $ttft;
        $summary{$method}{cached} += $cached;
        $summary{$method}{prompt} += $usage->{prompt_tokens} // 0;
        $summary{$method}{n}++;
    }

    # the second pass must not find the first pass's caches
    if ($method eq 'kv') {
        # restart the simulator with empty caches for a fair contrast
        $launch->stop('kvsim');
        start_kvsim();
    }
}

print "\nsummary\n";
for my $m ('kv', 'rr') {
    my $s = $summary{$m};
    printf "  %-12s mean TTFT %6.0f ms, prompt tokens served from cache %3.0f%%\n",
           $m eq 'kv' ? 'kv_aware' : 'round-robin',
           1000 * $s->{ttft} / $s->{n}, 100 * $s->{cached} / ($s->{prompt} || 1);
}

print "\nnginx says (kv_aware_status, trimmed):\n";
my $st = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die $!;
print $st "GET /status HTTP/1.0\r\n\r\n";
my $raw = join '', <$st>;
$raw =~ s/^.*?\r\n\r\n//s;
my $up = decode_json($raw)->{upstreams}{kv};
printf "  redis %s, %d event messages, %d block hashes applied\n",
       $up->{redis}{state}, $up->{events}{messages}, $up->{events}{hashes};
printf "  %-16s %-8s %6s %8s %8s\n", 'server', 'state', 'routed', 'blocks',
       'matched';
printf "  %-16s %-8s %6d %8d %8d\n", @{$_}{qw(name state routed blocks matched)}
    for @{ $up->{servers} };
