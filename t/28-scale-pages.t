# 1,024 ranks in one upstream (two servers of data_parallel=512), what an
# operator reads and what the events reach (docs/scale.md):
#
#   * the status page in pages: ?server=NAME, ?offset=N, ?limit=N, and
#     servers_total to page on; a bad argument is a 400;
#   * Prometheus past 64 ranks: one series a server, its ranks summed
#     (state: ranks in each state), not 1,024 of each family; ?ranks=all
#     gives them per rank;
#   * events found by (server, rank) through the zone's name table: the
#     highest ranks of either server, an unknown name and a rank the
#     servers lack rejected as unknown_server;
#   * a server removed by a reload receives no events; back again, it
#     does.

use strict;
use warnings;

use Test::More;

use Test::KvAware ();
use Test::KvAware::Events qw(
    preflight block_hashes prompt chat show addr upstream_conf status
    wait_status publisher stored
);

preflight();

my $LOCATIONS = <<'EOF';
        location / {
            proxy_pass http://llm;
            proxy_set_header X-data-parallel-rank $kv_aware_dp_rank;
            add_header X-KV-Reason $kv_aware_reason always;
            add_header X-KV-Blocks $kv_aware_blocks always;
            add_header X-KV-Matched $kv_aware_matched always;
            add_header X-KV-Rank $kv_aware_dp_rank always;
        }
        location = /kv_status {
            kv_aware_status;
        }
EOF

my $env = Test::KvAware->new(backends => 2, redis => 1, workers => 1,
                             log_level => 'info');

sub configure {
    my ($n) = @_;
    $env->conf(http_config => upstream_conf(
                   n => $n, kv_aware => 'data_parallel=512',
                   events => 'heartbeat=60s'),
               config => $LOCATIONS);
}

configure(2);
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }),
   'subscribed to redis');
my $pub = publisher($env);
my @A = map { addr($env, $_) } 1 .. 2;

sub page {
    my ($args) = @_;
    my $r = $env->request(GET => "/kv_status?$args");
    return ($r, $r->{json} ? $r->{json}{upstreams}{llm} : undef);
}

sub rank_row {
    my ($st, $name, $rank) = @_;
    my ($s) = grep { $_->{name} eq $name && $_->{rank} == $rank }
              @{ $st->{servers} || [] };
    return $s;
}

sub rejected { status($env)->{events}{rejected}{$_[0]} // 0 }

subtest 'the status page in pages' => sub {
    my ($r, $st) = page('');
    is(scalar @{ $st->{servers} }, 1024, 'whole: 1,024 rows');
    is($st->{servers_total}, 1024, 'servers_total 1,024');
    my $whole = length $r->{body};

    ($r, $st) = page('offset=1000&limit=10');
    is(scalar @{ $st->{servers} }, 10, 'offset=1000&limit=10: 10 rows');
    is("$st->{servers}[0]{name}#$st->{servers}[0]{rank}", "$A[1]#488",
       'the first is row 1000: server 2, rank 488');
    is($st->{servers_total}, 1024, 'servers_total still 1,024');
    ok(length $r->{body} < $whole / 50,
       'a fraction of the page (' . length($r->{body}) . " of $whole bytes)");

    (my $enc = $A[1]) =~ s/:/%3A/;
    ($r, $st) = page("server=$enc");
    is(scalar @{ $st->{servers} }, 512, 'server=NAME (escaped): 512 rows');
    is((grep { $_->{name} ne $A[1] } @{ $st->{servers} }), 0,
       'all of that server');
    is($st->{servers_total}, 512, 'servers_total counts them');

    ($r, $st) = page("server=$A[0]&offset=500");
    is(join(',', map { $_->{rank} } @{ $st->{servers} }),
       join(',', 500 .. 511), 'server=NAME&offset=500: ranks 500 to 511');

    ($r, $st) = page('server=127.0.0.1:1');
    is(scalar @{ $st->{servers} }, 0, 'an unknown server: no rows');

    ($r, $st) = page('offset=5000');
    is(scalar @{ $st->{servers} }, 0, 'past the end: no rows');

    ($r, $st) = page('offset=1020&limit=99999999999');
    is(scalar @{ $st->{servers} }, 4, 'a huge limit: the rows there are');

    for my $bad ('limit=ten', 'offset=-1', 'ranks=some', 'offset=',
                 'limit=99999999999999999999', 'offset=%31') {
        ($r) = page($bad);
        is($r->{status}, 400, "$bad: 400");
    }
};

subtest 'events to the highest ranks, by the name table' => sub {
    my %H;
    for my $t ([$A[0], 0], [$A[0], 511], [$A[1], 0], [$A[1], 511]) {
        my ($name, $rank) = @$t;
        my $P = prompt("table-$name-$rank", 6);
        $H{"$name#$rank"} = [ block_hashes($P) ];
        is($pub->event($name, rank => $rank,
                       events => [stored(@{ $H{"$name#$rank"} })]), 1,
           "published for $name rank $rank");
    }
    my $st = status($env);
    for my $key (sort keys %H) {
        my ($name, $rank) = split /#/, $key;
        is(rank_row($st, $name, $rank)->{entries}{event},
           scalar @{ $H{$key} }, "$key holds its blocks");
    }
    my $r = chat($env, prompt("table-$A[1]-511", 6));
    is("$r->{backend}/$r->{rank}", 'b2/511', 'its prompt routes there')
        or diag show($r);

    my $before = rejected('unknown_server');
    my @X = block_hashes(prompt('nowhere', 2));
    $pub->event('127.0.0.1:1', rank => 0, events => [stored(@X)]);
    $pub->event($A[0], rank => 512, events => [stored(@X)]);
    is(rejected('unknown_server'), $before + 2,
       'an unknown name and rank 512 (of 0 .. 511): unknown_server');

    $before = rejected('bad_field');
    $pub->event($A[0], rank => 1024, events => [stored(@X)]);
    is(rejected('bad_field'), $before + 1, 'rank 1024: bad_field');
};

subtest 'Prometheus at 1,024 ranks' => sub {
    my $r = $env->request(GET => '/kv_status?format=prometheus');
    my $body = $r->{body};
    my @req = $body =~ /^kv_aware_server_requests_total\{[^}]*\} \d+$/mg;
    is(scalar @req, 2, 'one requests series a server');
    unlike($body, qr/^kv_aware_server_\w+\{[^}]*rank="/m, 'no rank label');
    my %state;
    while ($body =~ /^kv_aware_server_state\{[^}]*server="\Q$A[1]\E",
                     state="(\w+)"\}[ ](\d+)$/mgx) {
        $state{$1} = $2;
    }
    my $sum = 0;
    $sum += $_ for values %state;
    is($sum, 512, 'server 2: its ranks counted by state');
    ok(($state{fresh} // 0) >= 2, 'ranks 0 and 511 fresh');
    like($body, qr/^kv_aware_server_index_entries\{[^}]*server="\Q$A[1]\E",
                   source="event"\}[ ]14$/mx,
         'entries summed over the ranks (7 + 7)');
    ok(length $body < 64 * 1024, 'bounded: ' . length($body) . ' bytes');

    my $all = $env->request(GET => '/kv_status?format=prometheus&ranks=all');
    like($all->{body}, qr/^kv_aware_server_requests_total\{[^}]*
                          server="\Q$A[1]\E",rank="511"\}/mx,
         '?ranks=all: per rank');
    ok(length $all->{body} > 10 * length $body,
       'and ' . length($all->{body}) . ' bytes');
};

subtest 'a server removed by reload receives no events' => sub {
    configure(1);
    $env->reload or return;
    my $st = status($env);
    is(scalar @{ $st->{servers} }, 512, 'one server of 512 ranks');

    my $before = rejected('unknown_server');
    $pub->event($A[1], rank => 5,
                events => [stored(block_hashes(prompt('gone', 2)))]);
    is(rejected('unknown_server'), $before + 1,
       'the removed server: unknown_server');
    my @H = block_hashes(prompt('after-reload', 4));
    $pub->event($A[0], rank => 300, events => [stored(@H)]);
    is(rank_row(status($env), $A[0], 300)->{entries}{event}, scalar @H,
       'the one kept: applied');

    configure(2);
    $env->reload or return;
    $pub->event($A[1], rank => 5, events => [stored(@H)]);
    $st = status($env);
    is(rank_row($st, $A[1], 5)->{entries}{event}, scalar @H,
       'back again: its events apply');
    is($st->{events}{rejected}{unknown_server}, $before + 1,
       'none rejected');
};

$env->stop_nginx;
$env->check_logs_clean('t/28');

done_testing;
