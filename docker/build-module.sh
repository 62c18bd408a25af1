#!/usr/bin/env bash
# Builds ngx_http_kv_aware_module.so for one nginx and proves that nginx
# loads it: the steps of the Dockerfiles, run by them and by t/71.
#
#   docker/build-module.sh debian OUT [--nginx BIN]
#       against Debian's nginx-dev (/usr/share/nginx/src) with Debian's own
#       configure arguments (its conf_flags): the .so that Debian's
#       /usr/sbin/nginx loads, next to Debian's other modules (Lua, ...)
#   docker/build-module.sh nginx-org TARBALL OUT [--nginx BIN]
#       from nginx.org's source of the same version as the nginx that will
#       load it (the official nginx image: nginx:VERSION), configured
#       --with-compat as that image's nginx is; only the module is built
#
# OUT gets ngx_http_kv_aware_module.so and runtime-packages (the Debian
# packages of the libraries it links, for a slim image to install).  The
# build itself goes to OUT/build/.  Last step: BIN (default
# /usr/sbin/nginx) runs "nginx -t" on a configuration that loads the
# module with load_module and uses kv_aware; the versions must agree.
# Idempotent: nothing is rebuilt while the sources and arguments are
# unchanged.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
so=ngx_http_kv_aware_module.so

usage() {
    sed -n '4,12p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

flavour=${1:-}
shift || usage
case $flavour in
debian)    [ $# -ge 1 ] || usage; out=$1; shift ;;
nginx-org) [ $# -ge 2 ] || usage; tarball=$1; out=$2; shift 2 ;;
*)         usage ;;
esac

nginx=/usr/sbin/nginx
while [ $# -gt 0 ]; do
    case $1 in
    --nginx) nginx=${2:?--nginx needs a path}; shift 2 ;;
    *)       usage ;;
    esac
done

mkdir -p "$out/build"
out=$(cd "$out" && pwd)
work=$out/build
log=$work/build.log

fail() {
    echo "build-module.sh: $*" >&2
    [ -f "$log" ] && tail -25 "$log" >&2
    exit 1
}

# what the build depends on: any change redoes it
stamp() {
    { echo "$flavour $*"
      cd "$repo" && sha1sum config src/*.[ch] src/core/*; } \
        | sha1sum | cut -c1-40
}

case $flavour in
debian)
    src=/usr/share/nginx/src
    [ -f "$src/conf_flags" ] \
        || fail "no $src/conf_flags (Debian: apt-get install nginx-dev)"
    sum=$(stamp "$(cat "$src/conf_flags" "$src/configure" | sha1sum)")
    if [ "$(cat "$work/.built" 2>/dev/null)" != "$sum" ]; then
        echo "building the module against Debian's nginx-dev ($log)" >&2
        # Debian's arguments, so that the signature is its nginx's; run
        # from the tree, which Debian ships without a top Makefile, and
        # which nothing here writes into
        (cd "$src" && . ./conf_flags \
            && ./configure "${NGX_CONF_FLAGS[@]}" \
                   --add-dynamic-module="$repo" --builddir="$work" \
            && make -f "$work/Makefile" modules) > "$log" 2>&1 \
            || fail "the build failed"
        echo "$sum" > "$work/.built"
    fi
    ;;

nginx-org)
    [ -f "$tarball" ] || fail "no $tarball"
    sum=$(stamp "$(sha1sum < "$tarball")")
    tree=$work/nginx
    if [ "$(cat "$work/.built" 2>/dev/null)" != "$sum" ]; then
        echo "building the module from $(basename "$tarball") ($log)" >&2
        rm -rf "$tree"
        mkdir -p "$tree"
        tar xzf "$tarball" -C "$tree" --strip-components=1
        # --with-compat is what makes a module loadable into an nginx of
        # the same version configured otherwise (the image's many
        # --with-* options); nothing else needs to match
        (cd "$tree" && auto/configure --with-compat \
                           --add-dynamic-module="$repo" \
            && make modules) > "$log" 2>&1 \
            || fail "the build failed"
        cp "$tree/objs/$so" "$work/$so"
        echo "$sum" > "$work/.built"
    fi
    ;;
esac

cp "$work/$so" "$out/$so.tmp"
mv "$out/$so.tmp" "$out/$so"

# the Debian packages of the libraries it links, for the image to install
bash "$repo/docker/runtime-packages.sh" "$out/$so" > "$out/runtime-packages"

# nginx -t: the module loads (version and signature agree) and its
# directive reads; everything in a scratch prefix
t=$(mktemp -d "${TMPDIR:-/tmp}/kv-aware-check-XXXXXX")
trap 'rm -rf "$t"' EXIT
mkdir -p "$t/logs"
cat > "$t/nginx.conf" <<EOF
load_module $out/$so;
pid $t/logs/nginx.pid;
error_log $t/logs/error.log;
events {}
http {
    access_log off;
    upstream llm {
        kv_aware;
        server 127.0.0.1:8001;
        server 127.0.0.1:8002;
    }
    server {
        listen 127.0.0.1:8080;
        location /v1/ { proxy_pass http://llm; }
    }
}
EOF

"$nginx" -p "$t" -c "$t/nginx.conf" -e "$t/logs/error.log" -t 2>&1 \
    || { echo "build-module.sh: $nginx does not load $out/$so" >&2
         "$nginx" -v >&2 || true
         exit 1; }
echo "$out/$so"
