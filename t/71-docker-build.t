# The Docker images' build, without Docker: docker/build-module.sh, the
# script the Dockerfiles run, builds the module for the nginx under test
# and ends with that nginx's "nginx -t" loading it.  Under Debian's nginx
# (make test-debian) the "debian" build, against nginx-dev with Debian's
# configure arguments, as docker/Dockerfile does; under an nginx built
# from vendor/nginx/ (make test-nginx) the "nginx-org" build from the
# same tarball, configured --with-compat alone, as docker/Dockerfile.nginx
# does for the official image, whose nginx is configured otherwise: the
# nginx under test is (--with-debug, --with-http_v2_module), so a module
# it loads shows that --with-compat is what matters.  Then the module
# routes in that nginx, the compose set-up's nginx.conf passes nginx -t,
# and the Dockerfiles copy files that exist.

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Temp qw(tempdir);
use Test::More;

use Test::KvAware qw(skip_unless_module);
use KvAware::Launch qw(slurp);

my $root   = abs_path('.');
my $NGINX  = KvAware::Launch::nginx_binary();
my $vendor = $ENV{NGINX_VENDOR} || "$root/vendor/nginx";

my $V = `$NGINX -V 2>&1`;
plan skip_all => "no nginx at $NGINX" unless $V =~ m{nginx/(\d+\.\d+\.\d+)};
my $version = $1;

# the sanitizer stage: its nginx is not what an image runs
plan skip_all => 'nginx built with sanitizers: the image builds are '
               . 'checked against the plain builds'
    if $V =~ /-fsanitize/;

my ($flavour, @args);
if ($V =~ m{--modules-path=/usr/lib/nginx/modules} && $NGINX =~ m{^/usr/}) {
    plan skip_all => 'no /usr/share/nginx/src (Debian: nginx-dev)'
        unless -f '/usr/share/nginx/src/conf_flags';
    $flavour = 'debian';
} else {
    my $tarball = "$vendor/nginx-$version.tar.gz";
    plan skip_all => "no $tarball for the nginx under test ($NGINX)"
        unless -f $tarball;
    $flavour = 'nginx-org';
    @args = ($tarball);
}

# niced: the suite runs this compile beside tests that wait on the clock
my $out = "$root/build/docker/$flavour";
my $log = `nice -n 10 bash docker/build-module.sh $flavour @args '$out' \\
               --nginx '$NGINX' 2>&1`;
is($?, 0, "build-module.sh $flavour for nginx $version") or diag($log);
like($log, qr/test is successful/, "nginx $version -t with load_module")
    or diag($log);

my $so = "$out/ngx_http_kv_aware_module.so";
ok(-f $so, 'the .so is there');

my @pkgs = split /\n/, slurp("$out/runtime-packages") // '';
for my $lib (qw(libhiredis libjansson libxxhash)) {
    ok((grep { /^$lib/ } @pkgs), "runtime-packages names $lib")
        or diag("runtime-packages: @pkgs");
}

# another nginx version refuses it: the check above is a real one
if ($flavour eq 'nginx-org' && -x '/usr/sbin/nginx') {
    my $d = tempdir(CLEANUP => 1);
    mkdir "$d/logs";
    open my $fh, '>', "$d/nginx.conf" or die $!;
    print {$fh} "load_module $so;\nevents {}\n";
    close $fh;
    my $msg = `/usr/sbin/nginx -p $d -c $d/nginx.conf \\
                   -e $d/logs/error.log -t 2>&1`;
    isnt($?, 0, "Debian's nginx refuses the $version module");
    like($msg, qr/is not binary compatible|version \d+ instead of \d+/,
         '... naming the mismatch') or diag($msg);
}

# Debian's other modules load beside it: Lua (libnginx-mod-http-lua)
my @lua = grep { -f } map { "/usr/lib/nginx/modules/$_" }
                        qw(ndk_http_module.so ngx_http_lua_module.so);
if ($flavour eq 'debian' && @lua == 2) {
    my $d = tempdir(CLEANUP => 1);
    mkdir "$d/logs";
    open my $fh, '>', "$d/nginx.conf" or die $!;
    print {$fh} join('', map { "load_module $_;\n" } @lua, $so),
        "events {}\nhttp { upstream u { kv_aware; server 127.0.0.1:1; }\n",
        "server { listen 127.0.0.1:1; location / {\n",
        "access_by_lua_block { ngx.req.read_body() }\n",
        "proxy_pass http://u; } } }\n";
    close $fh;
    my $msg = `$NGINX -p $d -c $d/nginx.conf -e $d/logs/error.log -t 2>&1`;
    is($?, 0, "it loads next to Debian's Lua module") or diag($msg);
}

# the module as built routes in that nginx: a prompt sent twice goes
# where it went the first time, and says why
{
    local $ENV{KV_AWARE_MODULE} = $so;
    my $env = Test::KvAware->new(backends => 3);
    my $ups = join ' ', map { "server \$TEST_NGINX_BACKEND_$_;" } 1 .. 3;
    $env->conf(http_config => "upstream llm { kv_aware; $ups }",
               config => '
        location /v1/ {
            proxy_pass http://llm;
            add_header X-KV-Reason $kv_aware_reason always;
        }');
    $env->start_nginx or BAIL_OUT('nginx did not start with ' . $so);
    my $body = '{"model":"m","messages":[{"role":"system","content":"'
             . join(' ', map { "rule$_" } 1 .. 400) . '"}]}';
    my @r = map {
        $env->request(POST => '/v1/chat/completions', $body,
                      { 'Content-Type' => 'application/json' })
    } 1 .. 2;
    is($r[1]{headers}{'x-backend'}, $r[0]{headers}{'x-backend'},
       'the same prompt, the same server');
    is($r[1]{headers}{'x-kv-reason'}, 'affinity', 'by affinity');
    $env->stop_nginx;
    $env->check_logs_clean("the $flavour build in nginx $version");
}

# docker/nginx.conf, compose's: passes nginx -t with this module, and
# kvbridge.conf's engines are its upstream's servers (names must match)
{
    my $d = tempdir(CLEANUP => 1);
    mkdir "$d/logs";
    my $conf = slurp('docker/nginx.conf');
    $conf =~ s{^load_module \S+;}{load_module $so;\npid $d/logs/nginx.pid;}m;
    $conf =~ s{(access_log|error_log) /dev/std\w+}{$1 $d/logs/$1}g;
    open my $fh, '>', "$d/nginx.conf" or die $!;
    print {$fh} $conf;
    close $fh;
    my $msg = `$NGINX -p $d -c $d/nginx.conf -e $d/logs/error.log -t 2>&1`;
    is($?, 0, 'docker/nginx.conf passes nginx -t') or diag($msg);

    my ($llm) = $conf =~ /upstream llm \{(.*?)\}/s;
    my @servers = sort $llm =~ /^\s*server (\S+);/mg;
    my $bridge = slurp('docker/kvbridge.conf') // '';
    my @engines = sort $bridge =~ /^engine (\S+)/mg;
    ok(@servers >= 2, 'compose: ' . @servers . ' servers');
    is_deeply(\@engines, \@servers, 'kvbridge.conf: an engine a server');
    my $compose = slurp('docker/compose.yaml');
    for my $svc (qw(redis kvsim kvbridge nginx)) {
        like($compose, qr/^  $svc:$/m, "compose.yaml runs $svc");
    }
}

# what each Dockerfile copies from the repository exists
for my $df (glob 'docker/Dockerfile*') {
    my $text = slurp($df);
    $text =~ s/\\\n/ /g;
    my @src = map { my @w = split q{ }; @w[0 .. $#w - 1] }
              grep { !/--from=/ } $text =~ /^COPY\s+(.*)$/mg;
    ok(@src, "$df copies files");
    my @gone = grep { !-e } @src;
    ok(!@gone, "$df: what it copies exists") or diag("missing: @gone");
}

done_testing;
