# kv_aware precise mode: a hash flood from the events channel.  A
# publisher picks the hash values it sends; when the bucket was the key's
# low bits, 65,536 hashes equal in their low 20 bits made one chain of
# 65,536 entries, and taking in that one message (each insert walking the
# chain) kept the worker busy for seconds while requests waited.  Buckets
# are now keyed by a per-zone secret and chains are capped, so the message
# costs what any other does.

use strict;
use warnings;

use Test::More;
use File::Temp ();
use Time::HiRes qw(time sleep);

use Test::KvAware ();
use Test::KvAware::Events qw(
    $JSON $CHANNEL $LOCATIONS preflight block_hashes prompt chat addr
    upstream_conf status server_status wait_status publisher stored
);

preflight();

my $env = Test::KvAware->new(backends => 3, redis => 1, workers => 1,
                             log_level => 'info');
my @A = map { addr($env, $_) } 1 .. 3;

# caps raised so that one message may carry the whole flood
$env->conf(http_config => upstream_conf(kv_aware => 'index_size=32m',
               events => 'max_message=4m max_hashes=65536'),
           config => $LOCATIONS);
$env->start_nginx or BAIL_OUT('nginx did not start');
ok(wait_status($env, 5, sub { $_[0]{redis}{state} eq 'up' }), 'subscribed');

my $pub = publisher($env);

# a prefix server 2 holds, to route while the flood is taken in
my $P = prompt('during-hash-flood', 8);
$pub->event($A[1], events => [stored(block_hashes($P))]);
my $r = chat($env, $P);
is("$r->{backend} $r->{reason}", 'b2 affinity', 'routed by the event');

# 65,536 distinct hashes, all ending in the same 20 bits
my @h = map { sprintf '%011x%05x', $_ * 7919 + 1, 0xabcde } 1 .. 65536;
my $msg = $JSON->encode({ v => 1, server => $A[0], seq => 1,
                          events => [stored(@h)] });
cmp_ok(length $msg, '<', 4 << 20, 'within max_message');

my $before = status($env);
my $t0 = time;
$pub->cmd(PUBLISH => $CHANNEL, $msg);

# requests while nginx takes the message in: none may wait for it
my ($slowest, $bad) = (0, 0);
for (1 .. 20) {
    my $t = time;
    my $c = chat($env, $P);
    $t = time - $t;
    $slowest = $t if $t > $slowest;
    $bad++ unless $c->{status} == 200 && $c->{backend} eq 'b2';
    sleep 0.02;
}
is($bad, 0, 'every request meanwhile routed by affinity');
cmp_ok($slowest * 1000, '<', 500,
       sprintf 'the slowest request meanwhile took %.0f ms',
       $slowest * 1000);

my $st = wait_status($env, 10, sub {
    $_[0]{events}{hashes} >= $before->{events}{hashes} + 65536 });
my $took = time - $t0;
ok($st, 'the message was applied');
cmp_ok($took, '<', 3, sprintf 'within %.2f s of its publication', $took);
cmp_ok($st->{index}{used}, '>=', $before->{index}{used} + 65536,
       "the index holds them all ($st->{index}{used} entries)");
is($st->{events}{rejected}{too_big}, 0, 'nothing refused as too big');

# what the flood was for: lookups of such hashes stay cheap
$t0 = time;
$pub->event($A[0], events => [stored(@h[0 .. 999])]);
$r = chat($env, $P);
cmp_ok(time - $t0, '<', 1, 'another message of them and a request: fast');
is($r->{backend}, 'b2', 'routing unchanged');

# The prompt side: a client cannot pick hashes, but it can search for
# block texts whose hashes end in chosen bits (2^20 tries a block), and
# each such block then walked the planted chain.  40 of them must cost
# what 40 blocks do.  (This part does not tell the old code apart: a chain
# planted by one message lies in consecutive entries, which the CPU
# prefetches, and 40 walks of it took 7 ms; chains grown over time are
# scattered, and there a walk of 41k entries took 22 ms.)
my $body = collider_body(40, 0xabcde);
my @bh = block_hashes($body);
my $hits = grep { (hex(substr $_, -5)) == 0xabcde } @bh;
cmp_ok($hits, '>=', 40, "a prompt with $hits blocks in the planted bucket");

my ($slow, $fail) = (0, 0);
for my $i (1 .. 3) {
    $t0 = time;
    $r = chat($env, $body);
    my $t = time - $t0;
    $slow = $t if $t > $slow;
    $fail++ unless $r->{status} == 200 && $r->{blocks} == @bh;
}
is($fail, 0, 'routed, all blocks counted');
cmp_ok($slow * 1000, '<', 300,
       sprintf 'the slowest of 3 took %.0f ms', $slow * 1000);

$env->stop_nginx;
$env->check_logs_clean('hash flood');


# A chat body of $n blocks past its start whose hashes all end in the 20
# bits $low, found by a small C search against the module's own hashing.
sub collider_body {
    my ($n, $low) = @_;
    my $dir = File::Temp::tempdir('kvacoll-XXXXXX', TMPDIR => 1,
                                  CLEANUP => 1);
    open my $fh, '>', "$dir/coll.c" or die;
    print {$fh} <<'C';
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "kva_hash.h"
#include "kva_prompt.h"

/* argv: block_size nblocks low20; prints the system text */
int
main(int argc, char **argv)
{
    char          body[65536], text[32768], blk[128];
    size_t        bs, n, i, len, off, k;
    uint8_t       out[65536];
    uint64_t      h, m, low, nonce;
    kva_prompt_t  p;

    bs = strtoul(argv[1], NULL, 10);
    n = strtoul(argv[2], NULL, 10);
    low = strtoull(argv[3], NULL, 0);

    /* where the system text starts in the hashed bytes */
    memset(text, 'q', bs * 2);
    text[bs * 2] = '\0';
    len = snprintf(body, sizeof(body), "{\"model\":\"m\",\"messages\":["
                   "{\"role\":\"system\",\"content\":\"%s\"}]}", text);
    if (kva_prompt_extract((uint8_t *) body, len, out, sizeof(out), &p)
        != KVA_PROMPT_OK)
    {
        return 1;
    }
    off = (uint8_t *) memmem(p.out, p.out_len, text, bs * 2) - p.out;

    /* pad to the next block boundary, then search block after block */
    k = (bs - off % bs) % bs;
    memset(text, 'p', k);
    memcpy(out, p.out, off);
    memcpy(out + off, text, k);
    /* the text key space: the chain from its seed, the model folded in */
    m = kva_hash_seed(KVA_KEYSPACE_TEXT, p.model, p.model_len);
    h = KVA_KEYSPACE_TEXT;
    if (off + k >= bs) {
        uint64_t  hs[64];
        size_t    nb = kva_hash_blocks(KVA_KEYSPACE_TEXT, out, off + k,
                                       bs, hs, 64);
        h = hs[nb - 1];
    }

    for (i = 0; i < n; i++) {
        for (nonce = 0; ; nonce++) {
            snprintf(blk, sizeof(blk), "block %03zu nonce %016llx ", i,
                     (unsigned long long) nonce);
            memset(blk + strlen(blk), 'z', bs - strlen(blk));
            if ((kva_hash_fold(XXH3_64bits_withSeed(blk, bs, h), m)
                 & 0xfffff) == low)
            {
                break;
            }
        }
        h = XXH3_64bits_withSeed(blk, bs, h);
        memcpy(text + k, blk, bs);
        k += bs;
    }

    fwrite(text, 1, k, stdout);
    return 0;
}
C
    close $fh;
    my $out = qx{make -s --no-print-directory \$PWD/build/libkva.a 2>&1 &&
                 gcc -O2 -Isrc/core -o $dir/coll $dir/coll.c build/libkva.a \\
                     -lxxhash 2>&1};
    die "cannot build the collision search:\n$out" if $?;
    my $text = qx{$dir/coll $Test::KvAware::Events::BS $n $low};
    die 'collision search failed' if $? || !length $text;
    return $JSON->encode({ model => 'm', messages => [
        { role => 'system', content => $text } ] });
}

done_testing;
