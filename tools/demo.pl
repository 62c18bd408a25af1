#!/usr/bin/perl
#
# make demo: nginx with kv_aware in front of three local model-server
# stand-ins (t/lib/backend.pl), a few conversations sent through it, and
# for each request the server it went to and why.  Then the same requests
# through plain round-robin, for contrast.  Everything on 127.0.0.1.

use strict;
use warnings;

use File::Temp qw(tempdir);
use HTTP::Tiny;
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(WNOHANG);
use Time::HiRes qw(sleep);

my $root   = $ENV{KV_AWARE_ROOT} || '.';
my $module = "$root/build/ngx_http_kv_aware_module.so";
my $prefix = tempdir('kv-aware-demo-XXXX', TMPDIR => 1, CLEANUP => 1);
my @pids;

die "build the module first (make module)\n" unless -f $module;
$module = File::Spec->rel2abs($module) if eval { require File::Spec };

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
        return 1 if IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                          Timeout => 0.2);
        sleep 0.05;
    }
    die "nothing listens on 127.0.0.1:$port\n";
}

my @ports = map { free_port() } 1 .. 3;
my $port  = free_port();

for my $i (0 .. 2) {
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        exec $^X, "$root/t/lib/backend.pl", '--port', $ports[$i],
             '--name', 'gpu' . ($i + 1);
        exit 127;
    }
    push @pids, $pid;
}
wait_port($_) for @ports;

my $servers = join '', map { "        server 127.0.0.1:$_;\n" } @ports;
my $user = $> == 0 ? 'user root;' : '';

mkdir "$prefix/logs";
open my $fh, '>', "$prefix/nginx.conf" or die $!;
print $fh <<"CONF";
load_module $module;
$user
worker_processes 1;
error_log $prefix/logs/error.log info;
pid $prefix/logs/nginx.pid;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path $prefix/body;
    proxy_temp_path $prefix/proxy;
    upstream kv {
        kv_aware block_size=64;
$servers    }
    upstream rr {
$servers    }
    server {
        listen 127.0.0.1:$port;
        add_header X-KV-Blocks \$kv_aware_blocks;
        add_header X-KV-Matched \$kv_aware_matched;
        add_header X-KV-Reason \$kv_aware_reason;
        location /kv/ { proxy_pass http://kv/; }
        location /rr/ { proxy_pass http://rr/; }
    }
}
CONF
close $fh;

system('nginx', '-p', $prefix, '-c', "$prefix/nginx.conf") == 0
    or die "nginx did not start\n";
wait_port($port);

END {
    system('nginx', '-p', $prefix, '-c', "$prefix/nginx.conf", '-s', 'stop')
        if $prefix && -f "$prefix/logs/nginx.pid";
    kill 'TERM', @pids if @pids;
    waitpid($_, 0) for @pids;
}

# Four users with their own system prompts; each conversation grows a turn
# at a time, as chat clients resend the whole history.
my %system = (
    alice => 'You are a meticulous contract lawyer. Cite clauses, quote '
             . 'the text, and flag ambiguity before giving an opinion. ',
    bob   => 'You are a senior SRE. Answer with commands first, then a '
             . 'one-line explanation, and never guess at production state. ',
    carol => 'You are a patient maths tutor. Work step by step, check each '
             . 'step, and end with a question for the student. ',
    dave  => 'You are a travel agent for rail journeys in Europe. Prefer '
             . 'night trains, give times in local time, name the stations. ',
);
my @questions = ('Where do I start?', 'Why is that?', 'And then?',
                 'Can you summarise?');
my $http = HTTP::Tiny->new(timeout => 10);
my $json = JSON::PP->new->canonical;

sub conversation_requests {
    my @reqs;
    my %history = map { $_ => [ { role => 'system',
                                  content => $system{$_} x 3 } ] }
                  keys %system;
    for my $turn (0 .. $#questions) {
        for my $user (sort keys %system) {
            push @{ $history{$user} },
                 { role => 'user', content => "$questions[$turn] ($user)" };
            push @reqs, [ $user, $turn + 1,
                          $json->encode({ model => 'demo-7b',
                                          messages => $history{$user} }) ];
            push @{ $history{$user} },
                 { role => 'assistant', content => "Answer $turn for $user." };
        }
    }
    return @reqs;
}

my @requests = conversation_requests();

for my $method ('kv', 'rr') {
    my %seen;
    printf "\n%s\n", $method eq 'kv'
        ? "kv_aware: each conversation stays where its prefix is cached"
        : "round-robin, the same requests: prefixes land anywhere";
    printf "%-6s %4s  %-5s %7s %8s  %s\n",
           'user', 'turn', 'sent', 'blocks', 'matched', 'reason';

    for my $r (@requests) {
        my ($user, $turn, $body) = @$r;
        my $res = $http->post("http://127.0.0.1:$port/$method/v1/chat/completions",
                              { content => $body,
                                headers => { 'Content-Type' =>
                                             'application/json' } });
        my $server = eval { decode_json($res->{content})->{server} } // '?';
        $seen{$user}{$server}++;
        printf "%-6s %4d  %-5s %7s %8s  %s\n", $user, $turn, $server,
               $res->{headers}{'x-kv-blocks'} // '-',
               $res->{headers}{'x-kv-matched'} // '-',
               $res->{headers}{'x-kv-reason'} // '-';
    }

    for my $user (sort keys %seen) {
        printf "  %s's conversation touched %d server(s)\n", $user,
               scalar keys %{ $seen{$user} };
    }
}

print "\nnginx error log:\n";
open my $log, '<', "$prefix/logs/error.log" or die $!;
print grep { /kv_aware/ } <$log>;
