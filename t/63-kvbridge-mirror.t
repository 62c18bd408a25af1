# kvbridge's mirror against what vLLM really sends (issue 18, defects 9,
# 12, 13, 14): engines published from here as vLLM publishes (a PUB
# socket bound, [topic, seq, msgpack payload], events by name as msgspec
# encodes them, or positional as vLLM before mid 2026), a real kvbridge and
# a real redis-server; the test holds each server's keys as nginx would
# from the channel.
#
#  - a block vLLM holds two copies of (the same 40-token prompt twice,
#    block 2 completed by each request) is not removed when the older
#    copy is evicted by a 48-token prompt, and is when the last goes;
#  - an adapter vLLM names by lora_id alone (vLLM <= 0.10, positional)
#    is not published as the base model;
#  - two engine blocks with one key: removing one keeps the key;
#  - groups 8 and 9 hold a block apart;
#  - an MLA model's blocks (mla_attention) are published; an offload
#    tier's BlockStored by hash alone (token_ids [], block_size 0) holds
#    a block its GPU copy no longer does.
# The paced snapshot (defect 11) is tested in t/unit/test_kvbridge_mirror
# and fuzz_kvb_mirror: it needs the snapshot's position in the mirror's
# array, which a process cannot see.

use strict;
use warnings;

use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use KvAware::Launch qw(free_ports free_run wait_until slurp);
use Test::KvAware::Redis;

my $BRIDGE = KvAware::Launch::kvbridge_binary();
my $KEYS   = 'build/kva_token_keys';
my $MODEL  = 'llama';
my $BT     = 16;                                # tokens a block

plan skip_all => "$BRIDGE not built" unless -x $BRIDGE;
# it runs no nginx: the stage that only changes nginx's build skips it
plan skip_all => 'no nginx in this test (KVA_NGINX_FREE=0)'
    if ($ENV{KVA_NGINX_FREE} // '') eq '0';
plan skip_all => "$KEYS not built (make tools)" unless -x $KEYS;

for my $m (qw(ZMQ::FFI Data::MessagePack)) {
    plan skip_all => "$m missing (make deps)" unless eval "require $m; 1";
}

require ZMQ::FFI::Constants;
ZMQ::FFI::Constants->import(qw(ZMQ_PUB));

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 120;

my $json = JSON::PP->new->utf8->canonical;
my $mp = Data::MessagePack->new->prefer_integer(1);
my $l = KvAware::Launch->new(template => 'kvbridge-mirror-XXXXXX',
                             watchdog => 1, diag => \&diag);

# A: a dense model (full_attention); D: DeepSeek-like (mla_attention)
# with a CPU offload tier.  Their names are addresses nobody listens on.
my ($redis, $pa, $pd) = free_ports(3);
my $zmq = free_run(2);
my %ENGINE = (
    A => { addr => "127.0.0.1:$pa", zmq => $zmq, kind => 'full_attention' },
    D => { addr => "127.0.0.1:$pd", zmq => $zmq + 1,
           kind => 'mla_attention' },
);

$l->start_redis($redis);

my $zctx = ZMQ::FFI->new;
for my $e (values %ENGINE) {
    $e->{pub} = $zctx->socket(ZMQ_PUB());
    $e->{pub}->bind("tcp://127.0.0.1:$e->{zmq}");
    $e->{seq} = 0;
}

my $sub = Test::KvAware::Redis->new($redis)->subscribe('kv_aware:events');
$l->start_kvbridge('--redis', "127.0.0.1:$redis",
    map { ('--engine', "$ENGINE{$_}{addr} model=$MODEL"
                       . " events=tcp://127.0.0.1:$ENGINE{$_}{zmq}") }
    sort keys %ENGINE);

my %held;           # server => { key => 1 }, as nginx would hold it
my %gone;           # server => { key => times removed }
my $marks = 0;

# the SUB sockets join late: marks until each engine's first arrives
for my $e (sort keys %ENGINE) {
    ok(wait_until(10, sub { mark($e, 0.2) }),
       "engine $e: the bridge hears the engine");
}

# --- 14. two copies of a block: the older's eviction keeps it ------------

my @prompt = ids(100, 40);                      # the same prompt twice
my @gen = ids(200, 8);                          # what each request decodes
my @b = keys_of([@prompt, @gen]);               # blocks 0, 1, 2
my @q = ids(300, 48);                           # the 48-token prompt

# request 1: prefill stores blocks 0 and 1; decoding completes block 2
send_events('A', stored([1001, 1002], undef, [@prompt[0 .. 31]]));
send_events('A', stored([1003], 1002, [@prompt[32 .. 39], @gen]));
# request 2: blocks 0 and 1 hit; its own block 2 completes: a copy
send_events('A', stored([1003], 1002, [@prompt[32 .. 39], @gen]));
ok(wait_held('A', \@b), 'the 40-token prompt\'s 3 blocks are held');

# the 48-token prompt evicts the older copy of block 2, stores its own
send_events('A', removed([1003]), stored([1101, 1102, 1103], undef, \@q));
ok(wait_held('A', [keys_of(\@q)]) && mark('A'),
   'the 48-token prompt is stored');
ok(!$gone{addr('A')}{$b[2]} && $held{addr('A')}{$b[2]},
   'block 2\'s older copy evicted, its other copy held: not removed')
    or diag('published removed ' . ($gone{addr('A')}{$b[2]} // 0)
            . ' times');

send_events('A', removed([1003]));
ok(wait_until(10, sub { drain(0.1); !$held{addr('A')}{$b[2]} }),
   'its last copy evicted: removed');
ok($held{addr('A')}{$b[0]} && $held{addr('A')}{$b[1]},
   'blocks 0 and 1 still held');

# --- 9. an adapter known by lora_id alone (vLLM <= 0.10) -----------------

my @lp = ids(400, 32);
my @base = keys_of(\@lp);
# positional, as vLLM sent it: [tag, hashes, parent, tokens, size,
# lora_id, medium]
send_raw('A', $mp->pack([time(), [['BlockStored', [2001, 2002], undef,
                                    \@lp, $BT, 3, 'GPU']]]));
ok(mark('A'), 'then the engine goes on');
ok(!grep({ $held{addr('A')}{$_} } @base),
   'a request to adapter 3 (no lora_name): none of its blocks published '
   . 'as the base model\'s');
send_events('A', stored([2003], 2002, [ids(450, 16)], lora_id => 3));
ok(mark('A') && !grep({ $held{addr('A')}{$_} } @base),
   'nor its child (keyed from the adapter\'s parent)');
send_events('A', stored([2101, 2102], undef, \@lp));
ok(wait_held('A', \@base), 'the base model\'s same prompt is published');
send_events('A', removed([2001, 2002, 2003]));
ok(mark('A') && !grep({ $gone{addr('A')}{$_} } @base),
   'the adapter\'s blocks evicted: the base model\'s stay');

# --- 9. two engine blocks with one key ------------------------------------

my @sp = ids(500, 16);
my ($sk) = keys_of(\@sp);
send_events('A', stored([4001], undef, \@sp));
send_events('A', stored([4002], undef, \@sp));
ok(wait_held('A', [$sk]), 'two engine blocks with one key: held');
send_events('A', removed([4001]));
ok(mark('A') && $held{addr('A')}{$sk} && !$gone{addr('A')}{$sk},
   'one of them evicted: the key is kept');
send_events('A', removed([4002]));
ok(wait_until(10, sub { drain(0.1); !$held{addr('A')}{$sk} }),
   'the other evicted: removed');

# --- 12. groups 8 and 9 hold a block apart --------------------------------

my @gp = ids(600, 16);
my ($gk) = keys_of(\@gp);
send_events('A', stored([5001], undef, \@gp, group_idx => 8),
                 stored([5001], undef, \@gp, group_idx => 9));
ok(wait_held('A', [$gk]), 'a block held by groups 8 and 9');
send_events('A', removed([5001], group_idx => 9));
ok(mark('A') && $held{addr('A')}{$gk},
   'group 9 lets it go, group 8 holds it: not removed');
send_events('A', removed([5001], group_idx => 8));
ok(wait_until(10, sub { drain(0.1); !$held{addr('A')}{$gk} }),
   'group 8 lets it go too: removed');

# --- 13. an MLA model, and an offload tier by hash alone ------------------

my @mp = ids(700, 32);
my @mk = keys_of(\@mp);
send_events('D', stored([3001, 3002], undef, \@mp));
ok(wait_held('D', \@mk), 'kv_cache_spec_kind mla_attention: published');

# vLLM's offloading connector without self_describing_kv_events
send_events('D', untokened([3001, 3002], 'CPU'), untokened([3999], 'CPU'));
send_events('D', removed([3001, 3002]));
ok(mark('D') && !grep({ !$held{addr('D')}{$_} } @mk),
   'evicted from the GPU with a CPU copy named by hash only: still held');
send_events('D', removed([3001, 3002], medium => 'CPU'));
ok(wait_until(10, sub { drain(0.1); !grep { $held{addr('D')}{$_} } @mk }),
   'the CPU copies evicted: removed');
unlike(bridge_log(), qr/malformed/,
       'the tier\'s events without tokens are not malformed');

ok(kill(0, $l->pid('kvbridge')), 'the bridge is still running');

done_testing();


# --- helpers ------------------------------------------------------------

sub addr { $ENGINE{$_[0]}{addr} }

sub bridge_log { slurp($l->prefix . '/logs/kvbridge.log') // '' }

# $n token ids from $base on: every scenario its own
sub ids {
    my ($base, $n) = @_;
    return map { 1000 * $base + $_ } 1 .. $n;
}

sub keys_of {
    my ($ids, $model) = @_;
    my $in = join ' ', @$ids;
    my $out = `echo '$in' | $KEYS $BT '${\ ($model // $MODEL)}'`;
    return split /\n/, $out;
}

# a BlockStored as vLLM's msgspec encodes it (omit_defaults: the fields
# without a default always, the others when set)
sub stored {
    my ($hashes, $parent, $tokens, %o) = @_;
    return { type => 'BlockStored', block_hashes => $hashes,
             parent_block_hash => $parent, token_ids => $tokens,
             block_size => $BT, lora_id => $o{lora_id}, medium => 'GPU',
             lora_name => undef, group_idx => $o{group_idx} // 0,
             kv_cache_spec_kind => $o{kind} // 'KIND' };
}

sub untokened {
    my ($hashes, $medium) = @_;
    return { type => 'BlockStored', block_hashes => $hashes,
             parent_block_hash => undef, token_ids => [], block_size => 0,
             lora_id => undef, medium => $medium, lora_name => undef,
             group_idx => 0 };
}

sub removed {
    my ($hashes, %o) = @_;
    return { type => 'BlockRemoved', block_hashes => $hashes,
             medium => $o{medium} // 'GPU',
             group_idx => $o{group_idx} // 0 };
}

sub send_events {
    my ($e, @events) = @_;
    for my $ev (@events) {
        $ev->{kv_cache_spec_kind} = $ENGINE{$e}{kind}
            if ($ev->{kv_cache_spec_kind} // '') eq 'KIND';
    }
    send_raw($e, $mp->pack({ ts => time(), events => \@events }));
}

sub send_raw {
    my ($e, $payload) = @_;
    $ENGINE{$e}{pub}->send_multipart(['', pack('Q>', $ENGINE{$e}{seq}++),
                                      $payload]);
}

# a base-model block of its own, stored: once nginx holds it, the bridge
# has handled every batch the engine sent before it
sub mark {
    my ($e, $t) = @_;
    my @m = ids(900 + $marks++, $BT);
    my ($k) = keys_of(\@m);
    send_events($e, stored([9_000_000 + $marks], undef, \@m));
    return wait_until($t // 10, sub { drain(0.05); $held{addr($e)}{$k} });
}

# applies what came on the channel for up to $t s
sub drain {
    my ($t) = @_;
    for my $m ($sub->messages($t)) {
        my $msg = eval { $json->decode($m->[1]) } or next;
        my $s = $msg->{server};
        my $snap = $msg->{snapshot} // '';
        $held{$s} = {} if $snap eq 'full' || $snap eq 'begin';
        for my $ev (@{ $msg->{events} // [] }) {
            if ($ev->{type} eq 'cleared') {
                $held{$s} = {};
            } elsif ($ev->{type} eq 'stored') {
                $held{$s}{$_} = 1 for @{ $ev->{hashes} };
            } elsif ($ev->{type} eq 'removed') {
                for (@{ $ev->{hashes} }) {
                    delete $held{$s}{$_};
                    $gone{$s}{$_}++;
                }
            }
        }
    }
    return 1;
}

sub wait_held {
    my ($e, $keys) = @_;
    my $s = addr($e);
    my $ok = wait_until(10, sub {
        drain(0.1);
        !grep { !$held{$s}{$_} } @$keys;
    });
    diag(scalar(grep { !$held{$s}{$_} } @$keys) . ' of ' . scalar(@$keys)
         . " keys missing for $s") unless $ok;
    return $ok;
}
