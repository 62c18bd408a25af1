# kv_aware_tokenize: a tokenizer's answer past subrequest_output_buffer_size
# would make nginx's in-memory filter fail the subrequest ("too big
# subrequest response") and mark the client's connection in error, which
# ends the client's request; the module's filters keep what fits and
# count the rest as a tokenizer failure.  The request must be answered
# whole and unaltered, keyed by text, both when the answer comes in time
# and when it comes after the timeout, while the response is streaming.
# Real nginx and kvsim (--keyspace tokens, POST /tokenize).

use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use KvAware::Launch qw(free_ports free_run module_path);

plan skip_all => 'module not built' unless -f module_path();
plan skip_all => 'kvsim not built (make tools)'
    unless -x KvAware::Launch::kvsim_binary();

$SIG{ALRM} = sub { die "test timed out\n" };
alarm 60;

my $json = JSON::PP->new->utf8->canonical;
my $http = HTTP::Tiny->new(timeout => 20);
my $l = KvAware::Launch->new(template => "tokenize-errors-XXXXXX",
                             watchdog => 1, diag => \&diag);

my ($port) = free_ports(1);
my $fast = free_run(1);
my $late = free_run(1);

$l->start_kvsim($fast, 1, { name => 'kvsim-fast' },
                qw(--keyspace tokens --redis off --quiet));
$l->start_kvsim($late, 1, { name => 'kvsim-late' },
                qw(--keyspace tokens --redis off --quiet
                   --tokenize-delay-ms 300));

my $prefix = $l->prefix;
$l->write_nginx_conf(workers => 1, http => <<EOF);
    upstream fast {
        kv_aware keys=tokens block_tokens=16;
        server 127.0.0.1:$fast;
    }

    upstream late {
        kv_aware keys=tokens block_tokens=16;
        server 127.0.0.1:$late;
    }

    server {
        listen 127.0.0.1:$port;
        add_header X-KV-Reason \$kv_aware_reason always;

        location /fast/ {
            kv_aware_tokenize /_tok_fast timeout=2s;
            proxy_pass http://fast/;
        }

        location /late/ {
            kv_aware_tokenize /_tok_late timeout=50ms;
            proxy_pass http://late/;
        }

        location = /_tok_fast {
            internal;
            subrequest_output_buffer_size 1k;
            proxy_pass http://127.0.0.1:$fast/tokenize;
        }

        location = /_tok_late {
            internal;
            subrequest_output_buffer_size 1k;
            proxy_pass http://127.0.0.1:$late/tokenize;
        }
    }
EOF
my ($ok, $err) = $l->start_nginx(workers => 1);
ok($ok, 'nginx starts') or BAIL_OUT($err);

# 5,000 pseudo-tokens: an answer of about 35 KB, far past 1k
my $text = join ' ', map { sprintf 'w%03d', $_ % 997 } 1 .. 5000;
my $body = $json->encode({ model => 'kvsim', max_tokens => 40,
                           messages => [{ role => 'user',
                                          content => $text }] });

for my $where (qw(fast late)) {
    my $t0 = time;
    my $r = $http->post("http://127.0.0.1:$port/$where/v1/chat/completions",
                        { content => $body,
                          headers => { 'Content-Type' =>
                                       'application/json' } });
    my $dt = time - $t0;
    my $reply = eval { $json->decode($r->{content}) } // {};

    is($r->{status}, 200, "$where: the request is answered ("
       . ($where eq 'fast' ? 'the answer arrives in time' :
                             'after the timeout, mid-response') . ')')
        or diag("$r->{status} $r->{reason}: " . substr($r->{content}, 0, 200));
    ok(defined $reply->{choices} && $reply->{usage}{prompt_tokens} > 4000,
       "$where: whole, the prompt as sent");
    like($r->{headers}{'x-kv-reason'} // '', qr/tokenize/,
         "$where: the reason says the tokenizer failed: "
         . ($r->{headers}{'x-kv-reason'} // ''));
}

sleep 0.5;                              # the late answer has come and gone
my $log = KvAware::Launch::slurp("$prefix/logs/error.log") // '';
like($log,
     qr/tokenize "\/_tok_fast" answer past subrequest_output_buffer_size/,
     'the answer did outgrow the buffer, and the log says so');
unlike($log, qr/too big subrequest response/,
       'nginx\'s own in-memory filter never saw more than fits');
unlike($log, qr/\[(alert|crit|emerg)\]/, 'nothing worse in the error log');

my $r = $http->post("http://127.0.0.1:$port/fast/v1/chat/completions",
                    { content => $body });
is($r->{status}, 200, 'and nginx goes on serving');

done_testing();
