# kv_aware cost=ttft: a server new to the pool is neither starved nor
# flooded.  Three kvsim servers are learned under load with a prior
# (ttft_rate=) far off their real rate, a fourth joins by a reload: until
# its own rate is learned it is taken at the pool's median, so it gets a
# fair share of the next load and is learned in turn.  With the prior
# instead, it would be costed 20 times the others (starved, never
# learned) or a twentieth (flooded).

use strict;
use warnings;

use JSON::PP;
use Test::More;

use Test::KvAware qw(skip_unless_module free_run);

my $KVSIM  = $ENV{KVSIM_BINARY} || 'build/kvsim';
my $KVLOAD = $ENV{KVLOAD_BINARY} || 'build/kvload';

skip_unless_module();
plan skip_all => "$KVSIM or $KVLOAD not built (make tools)"
    unless -x $KVSIM && -x $KVLOAD;

my $SCALE = 5;
my $json  = JSON::PP->new->canonical;

my $base = free_run(4);
my $env  = Test::KvAware->new(backends => 0, log_level => 'info');

ok(eval { $env->launch->start_kvsim($base, 4, { binary => $KVSIM },
              '--time-scale', $SCALE, '--redis', 'off', '--quiet') },
   'kvsim listens') or diag $@;

my @kvsim = map { "127.0.0.1:$_" } $base .. $base + 3;

sub write_conf {
    my ($prior, @servers) = @_;
    my $pool = join ' ', map { "server $_;" } @servers;
    $env->conf(http_config => "
    client_body_buffer_size 1m;
    upstream kv { kv_aware cost=ttft ttft_rate=$prior; $pool }",
               config => '
        location / { proxy_pass http://kv; proxy_buffering off; }
        location = /kv_status { kv_aware_status; }');
}

sub servers {
    my $r = $env->request(GET => '/kv_status');
    my $st = eval { $json->decode($r->{body}) } || {};
    return { map { $_->{name} => $_ }
             @{ $st->{upstreams}{kv}{servers} || [] } };
}

sub load {
    my ($tag) = @_;
    my $out = $env->prefix . "/kvload-$tag.txt";
    my $rc = system("timeout 60 $KVLOAD --target 127.0.0.1:" . $env->port
                    . " --workload no-sharing --qps-ladder 40:6"
                    . " --time-scale $SCALE --system-tokens 1000"
                    . " --question-tokens 1000 --output-tokens 16"
                    . " --seed $tag --drain-seconds 20 > $out 2>&1");
    is($rc, 0, "kvload ran ($tag)") or diag(`tail -5 $out`);
}

for my $prior (50, 60000) {
    write_conf($prior, @kvsim[0 .. 2]);
    $env->start_nginx or BAIL_OUT('nginx did not start');

    load(1);
    my $s = servers();
    my @rates = sort { $a <=> $b }
                map { $s->{$_}{ttft}{rate} // 0 } @kvsim[0 .. 2];
    ok($rates[0] > 0 && ($rates[1] > 4 * $prior || $rates[1] < $prior / 4),
       "ttft_rate=$prior: the three learned far from the prior "
       . "(median $rates[1])");

    write_conf($prior, @kvsim);
    $env->reload;

    load(2);
    my $t = servers();
    my %got = map { $_ => ($t->{$_}{routed} // 0)
                          - ($s->{$_}{routed} // 0) } @kvsim;
    my $mean = ($got{ $kvsim[0] } + $got{ $kvsim[1] } + $got{ $kvsim[2] })
               / 3;
    my $new = $got{ $kvsim[3] };

    # a quarter to four times the mean: with the prior it would be about
    # a twentieth (starved) or nearly everything (flooded); under ASan on
    # a loaded CI machine its first answers were timed slow and learned
    # at 0.4 times the others' rate, and it took 0.4 of the mean
    ok($mean > 0 && $new > 0.25 * $mean && $new < 4 * $mean,
       "ttft_rate=$prior: the new server takes a fair share "
       . "($new requests against $mean on average)")
        or diag($json->encode($t));
    ok(($t->{ $kvsim[3] }{ttft}{samples} // 0) >= 4,
       "ttft_rate=$prior: and is learned in turn");

    $env->stop_nginx;
}

$env->check_logs_clean('ttft new server');

done_testing;
