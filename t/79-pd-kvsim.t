# kv_aware integration: disaggregated serving end to end against engines
# that do the handshake (kvsim's roles), not echo backends.  nginx in
# mode=header names the prefill server in x-prefiller-host-port; the
# decode kvsim, as llm-d's sidecar would, runs leg 1 against that prefill
# kvsim, pulls the blocks it lacks and decodes.  What a user would notice:
#
#   * a long new prompt is split: the prefill server nginx named computed
#     it (its prefill legs count), the decode server pulled the blocks,
#     and the answer says the prompt came from cache;
#   * the same prefix again is served on the decode server that now holds
#     it, without a prefill leg; a short prompt too;
#   * a streamed answer through a split route arrives whole;
#   * the prefill servers gone: nginx, which does not see leg 1 in this
#     mode, may still name one; the decode server then serves the request
#     alone and the client gets its answer all the same.

use strict;
use warnings;

use JSON::PP ();
use Test::More;

use Test::KvAware qw(skip_unless_module free_run);

my $KVSIM = $ENV{KVSIM_BINARY} || 'build/kvsim';
my $BS    = 64;

skip_unless_module();
plan skip_all => "$KVSIM not built (make tools)" unless -x $KVSIM;

my $json = JSON::PP->new->utf8->canonical;
my $env  = Test::KvAware->new(backends => 0, log_level => 'info');

# two prefill servers and two decode servers, each pool one kvsim process
my $pbase = free_run(2);
my $dbase = free_run(2);
my @PREFILL = map { "127.0.0.1:$_" } $pbase, $pbase + 1;
my @DECODE  = map { "127.0.0.1:$_" } $dbase, $dbase + 1;

my @common = ('--time-scale', 20, '--redis', 'off', '--quiet',
              '--block-tokens', $BS);
ok(eval { $env->launch->start_kvsim($pbase, 2,
              { binary => $KVSIM, name => 'kvsim-prefill' },
              @common, '--role', 'prefill') }, 'prefill kvsim listens')
    or BAIL_OUT($@);
ok(eval { $env->launch->start_kvsim($dbase, 2,
              { binary => $KVSIM, name => 'kvsim-decode' },
              @common, '--role', 'decode', '--sidecar') },
   'decode kvsim (sidecar) listens')
    or BAIL_OUT($@);

$env->conf(http_config => "
    client_body_buffer_size 1m;
    upstream decode {
        kv_aware block_size=$BS;
" . join('', map { "        server $_ max_fails=0;\n" } @DECODE) . "    }
    upstream prefill {
        kv_aware block_size=$BS;
" . join('', map { "        server $_ max_fails=0;\n" } @PREFILL) . "    }",
           config => '
        location /v1/ {
            kv_aware_prefill prefill mode=header min_uncached=256;
            proxy_set_header x-prefiller-host-port $kv_aware_prefill_addr;
            proxy_buffering off;
            proxy_pass http://decode;
            add_header X-PD $kv_aware_pd always;
            add_header X-Prefill $kv_aware_prefill_addr always;
        }');
$env->start_nginx or BAIL_OUT('nginx did not start: ' . $env->last_error);

# about 1,500 pseudo-tokens of system prompt, no escaping needed
sub system_prompt {
    my ($tag) = @_;
    return join ' ', map { sprintf '%s%04d', $tag, $_ } 1 .. 1200;
}

sub body {
    my ($sys, $question, %o) = @_;
    return $json->encode({ model => 'kvsim', max_tokens => 4, %o,
                           messages => [
                               ($sys ? { role => 'system',
                                         content => $sys } : ()),
                               { role => 'user', content => $question } ] });
}

sub ask {
    my ($body) = @_;
    my $r = $env->request(POST => '/v1/chat/completions', $body,
                          { 'Content-Type' => 'application/json' },
                          timeout => 20);
    my $k = ($r->{json} || {})->{kvsim} || {};
    return {
        status  => $r->{status} // 0,
        pd      => $r->{headers}{'x-pd'} // '-',
        named   => $r->{headers}{'x-prefill'} // '',
        decode  => $k->{server} // '?',
        mode    => ($k->{pd} || {})->{mode} // 'aggregated',
        from    => ($k->{pd} || {})->{prefill} // '',
        pulled  => ($k->{pd} || {})->{pulled_blocks} // 0,
        fallback => ($k->{pd} || {})->{fallback},
        cached  => (($r->{json} || {})->{usage} || {})
                       ->{prompt_tokens_details}{cached_tokens} // -1,
        prompt  => (($r->{json} || {})->{usage} || {})->{prompt_tokens} // 0,
        body    => $r->{body},
        error   => $r->{error},
    };
}

# a counter of kvsim's /metrics, summed over a pool's servers
sub pool_metric {
    my ($pool, $name) = @_;
    my $sum = 0;
    for my $addr (@$pool) {
        my ($port) = $addr =~ /:(\d+)$/;
        my $r = $env->request(GET => '/metrics', undef, {}, port => $port);
        $sum += $1 while $r->{body} =~ /^\Q$name\E(?:\{[^}]*\})? (\d+)/mg;
    }
    return $sum;
}

sub show { join ' ', map { "$_=" . ($_[0]{$_} // 'null') }
                     qw(status pd named decode mode from pulled cached) }

my %is_prefill = map { $_ => 1 } @PREFILL;

# --- 1. a long new prompt: split, leg 1 on the server nginx named ---------

my $sys_a = system_prompt('alpha');
my $a1 = ask(body($sys_a, 'first question'));
is($a1->{status}, 200, 'split request: 200') or diag show($a1), $a1->{body};
is($a1->{pd}, 'split', 'nginx split it') or diag show($a1);
ok($is_prefill{ $a1->{named} }, "a prefill server named ($a1->{named})");
is($a1->{mode}, 'sidecar', 'the decode server ran the legs as a sidecar')
    or diag show($a1);
is($a1->{from}, $a1->{named},
   'leg 1 went to the prefill server nginx chose');
cmp_ok($a1->{pulled}, '>=', 20, 'the decode server pulled the prompt\'s '
       . "blocks ($a1->{pulled})");
cmp_ok($a1->{cached}, '>=', $a1->{pulled} * $BS,
       'usage: the pulled tokens count as cached') or diag show($a1);
is(pool_metric(\@PREFILL, 'kvsim_pd_prefill_legs_total'), 1,
   'one prefill leg computed, on the prefill pool');

# --- 2. the same prefix again: aggregated on the decode server holding it --

my $a2 = ask(body($sys_a, 'second question'));
is($a2->{status}, 200, 'second request: 200');
is($a2->{pd}, 'aggregated:cached', 'the decode server holds it: not split')
    or diag show($a2);
is($a2->{named}, '', 'no prefill server named');
is($a2->{decode}, $a1->{decode}, 'same decode server');
is($a2->{mode}, 'aggregated', 'served by the decode server alone');
cmp_ok($a2->{cached}, '>=', 1400, "prefix from its cache ($a2->{cached})");
is(pool_metric(\@PREFILL, 'kvsim_pd_prefill_legs_total'), 1,
   'no second prefill leg');

# --- 3. a short prompt -------------------------------------------------------

my $s = ask(body(undef, 'hi there'));
is($s->{status}, 200, 'short prompt: 200');
is($s->{pd}, 'aggregated:short', 'short: not split') or diag show($s);
is($s->{mode}, 'aggregated', 'served on the decode server alone');

# --- 4. another new prefix: split again --------------------------------------

my $b1 = ask(body(system_prompt('bravo'), 'first question'));
is($b1->{pd}, 'split', 'a second new prefix: split') or diag show($b1);
is($b1->{mode}, 'sidecar', '... through the sidecar');
is(pool_metric(\@PREFILL, 'kvsim_pd_prefill_legs_total'), 2,
   'two prefill legs in all');
cmp_ok(pool_metric(\@DECODE, 'kvsim_pd_blocks_pulled_total'), '>=',
       $a1->{pulled} + $b1->{pulled}, 'the decode pool counted its pulls');

# --- 5. streaming through a split route --------------------------------------

my $r = $env->request(POST => '/v1/chat/completions',
                      body(system_prompt('charlie'), 'stream it',
                           stream => JSON::PP::true, max_tokens => 8),
                      { 'Content-Type' => 'application/json' },
                      timeout => 20);
is($r->{status}, 200, 'streamed split request: 200');
is($r->{headers}{'x-pd'}, 'split', '... split');
like($r->{headers}{'content-type'} // '', qr{text/event-stream},
     '... as an event stream');
my @chunks = $r->{body} =~ /^data: (\{.*\})\s*$/mg;
cmp_ok(scalar @chunks, '>=', 8, 'every token arrived (' . @chunks
       . ' chunks)');
like($r->{body}, qr/^data: \[DONE\]\s*$/m, 'the stream ends with [DONE]');

# --- 6. the prefill pool gone: the client is served all the same -------------

my $fb0 = pool_metric(\@DECODE, 'kvsim_pd_fallbacks_total');
$env->launch->stop('kvsim-prefill');
my $d1 = ask(body(system_prompt('delta'), 'prefill is gone'));
is($d1->{status}, 200, 'prefill servers down: 200 all the same')
    or diag show($d1), $d1->{body};
is($d1->{pd}, 'split', 'nginx, not seeing leg 1 in header mode, split it')
    or diag show($d1);
ok(defined $d1->{fallback}, 'the decode server fell back to serving it '
   . 'alone (' . ($d1->{fallback} // 'none') . ')');
cmp_ok($d1->{prompt}, '>', 1400, 'the whole prompt was computed');
is(pool_metric(\@DECODE, 'kvsim_pd_fallbacks_total'), $fb0 + 1,
   'the decode pool counted the fallback');

$env->stop_nginx;
$env->check_logs_clean('pd kvsim');

done_testing();
