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

use File::Spec;
use File::Temp qw(tempdir);
use IO::Socket::INET;
use JSON::PP;
use Time::HiRes qw(sleep time);

my $root   = File::Spec->rel2abs($ENV{KV_AWARE_ROOT} || '.');
my $module = "$root/build/ngx_http_kv_aware_module.so";
my $kvsim  = "$root/build/kvsim";
my $prefix = tempdir('kv-aware-demo-XXXX', TMPDIR => 1, CLEANUP => 1);
my (@pids, $nginx_up);

-f $module or die "build the module first (make module)\n";
-x $kvsim or die "build the simulator first (make tools)\n";

sub free_port {
    my $s = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1',
                                  LocalPort => 0, ReuseAddr => 1) or die $!;
    my $p = $s->sockport;
    close $s;
    return $p;
}

sub wait_port {
    my ($port) = @_;
    for (1 .. 100) {
        return if IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                        Timeout => 0.2);
        sleep 0.05;
    }
    die "nothing listens on 127.0.0.1:$port\n";
}

sub spawn {
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>>', "$prefix/logs/spawned.log";
        open STDERR, '>&', \*STDOUT;
        exec @_;
        exit 127;
    }
    push @pids, $pid;
}

mkdir "$prefix/logs";

# kvsim's servers sit on consecutive ports: find four free in a row
my ($base, $redis, $port);
for (1 .. 50) {
    $base = 20000 + int(rand(30000));
    last unless grep { IO::Socket::INET->new(PeerAddr => "127.0.0.1:$_",
                                             Timeout => 0.1) }
                     $base .. $base + 3;
}
$redis = free_port();
$port  = free_port();

spawn('redis-server', '--bind', '127.0.0.1', '--port', $redis, '--save', '',
      '--appendonly', 'no', '--dir', $prefix);
wait_port($redis);

# time scale 1: step times are those of the GPU the simulator models
spawn($kvsim, '--servers', 4, '--base-port', $base, '--time-scale', 1,
      '--num-blocks', 4802, '--redis', "127.0.0.1:$redis", '--quiet');
wait_port($_) for $base .. $base + 3;

my $servers = join '', map { "        server 127.0.0.1:$_;\n" }
                       $base .. $base + 3;
my $user = $> == 0 ? 'user root;' : '';

open my $fh, '>', "$prefix/nginx.conf" or die $!;
print $fh <<"CONF";
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
close $fh;

system('nginx', '-p', $prefix, '-c', "$prefix/nginx.conf") == 0
    or die "nginx did not start\n";
$nginx_up = 1;
wait_port($port);

END {
    if ($nginx_up) {
        open my $quiet, '>&', \*STDERR;
        open STDERR, '>', '/dev/null';
        system('nginx', '-p', $prefix, '-c', "$prefix/nginx.conf", '-s',
               'stop');
        open STDERR, '>&', $quiet;
    }
    kill 'TERM', @pids if @pids;
    waitpid($_, 0) for @pids;
}

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
        kill 'TERM', $pids[1];
        waitpid($pids[1], 0);
        spawn($kvsim, '--servers', 4, '--base-port', $base, '--time-scale',
              1, '--num-blocks', 4802, '--redis', "127.0.0.1:$redis",
              '--quiet');
        wait_port($_) for $base .. $base + 3;
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
