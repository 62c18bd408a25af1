# End to end through nginx: kvsim servers behind kv_aware and behind
# round-robin.  What users see in usage.prompt_tokens_details: under
# kv_aware a repeated prefix is computed once and found cached after, a
# growing conversation finds more cached each turn; under round-robin
# every server computes the same prefix once.

use strict;
use warnings;

use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);

use Test::KvAware qw(skip_unless_module wait_until free_run);

my $KVSIM   = $ENV{KVSIM_BINARY} || 'build/kvsim';
my $SERVERS = 3;

skip_unless_module();
plan skip_all => "$KVSIM not built (make tools)" unless -x $KVSIM;


my $base = free_run($SERVERS);
my $env  = Test::KvAware->new(backends => 0);

# in the harness's prefix (logs/kvsim.log), stopped with the rest
ok(eval { $env->launch->start_kvsim($base, $SERVERS, { binary => $KVSIM },
              '--time-scale', 50, '--redis', 'off', '--quiet') },
   'kvsim listens') or diag $@;

my $servers = join "\n", map { "server 127.0.0.1:$_;" }
                         $base .. $base + $SERVERS - 1;

$env->conf(http_config => "
    client_body_buffer_size 1m;
    upstream kv { kv_aware; $servers }
    upstream rr { $servers }",
           config => '
    location /kv/ { proxy_pass http://kv/; }
    location /rr/ { proxy_pass http://rr/; }');
$env->start_nginx or BAIL_OUT('nginx did not start');

my $json = JSON::PP->new->canonical;

# a system prompt of about 1,500 pseudo-tokens, text that needs no escaping
sub system_prompt {
    my ($tag) = @_;
    return join ' ', map { sprintf '%s%04d', $tag, $_ } 1 .. 1200;
}

sub ask {
    my ($path, $messages) = @_;
    my $r = $env->request(POST => "/$path/v1/chat/completions",
                          $json->encode({ model => 'kvsim',
                                          max_tokens => 1,
                                          messages => $messages }),
                          { 'Content-Type' => 'application/json' });
    is($r->{status}, 200, "$path: 200") or diag($r->{body});
    return { server => $r->{json}{kvsim}{server} // '?',
             cached => $r->{json}{usage}{prompt_tokens_details}
                                {cached_tokens} // -1,
             prompt => $r->{json}{usage}{prompt_tokens} // 0 };
}

# the same prefix six times, a new question each time
for my $path ('kv', 'rr') {
    my $sys = system_prompt($path);
    my @r = map {
        ask($path, [ { role => 'system', content => $sys },
                     { role => 'user', content => "question $_" } ])
    } 1 .. 6;

    my $misses = grep { $_->{cached} == 0 } @r;
    my %where = map { $_->{server} => 1 } @r;

    if ($path eq 'kv') {
        is($misses, 1, 'kv_aware: the prefix is computed once');
        is(scalar keys %where, 1, 'kv_aware: all six on one server');
        ok((grep { $_->{cached} >= 1400 } @r[1 .. 5]) == 5,
           'kv_aware: later requests find the system prompt cached')
            or diag(join ' ', map { $_->{cached} } @r);
    } else {
        is($misses, $SERVERS,
           'round-robin: every server computes the prefix once');
        is(scalar keys %where, $SERVERS, 'round-robin: all servers used');
    }
}

# a conversation growing a turn at a time: more cached every turn
my @history = ({ role => 'system', content => system_prompt('conv') });
my ($last, $grows, $server, $moved) = (-1, 0, undef, 0);

for my $turn (1 .. 5) {
    push @history, { role => 'user',
                     content => "turn $turn: " . ('more words ' x 40) };
    my $r = ask('kv', \@history);
    $grows++ if $r->{cached} > $last;
    $moved++ if defined $server && $server ne $r->{server};
    ($last, $server) = ($r->{cached}, $r->{server});
    push @history, { role => 'assistant', content => "answer $turn" };
}

is($grows, 5, 'kv_aware: cached tokens grow every turn');
is($moved, 0, 'kv_aware: the conversation stays on its server');

$env->stop_nginx;
$env->check_logs_clean('kvsim behind nginx');

done_testing;
