#!/usr/bin/env bash
# Builds an nginx release from vendor/nginx/ with this module as a
# dynamic module, for the tests that run against current nginx.
#
#   tools/build-nginx.sh [--asan] VERSION      e.g. 1.30.4
#
# Tree and objects: build/nginx-VERSION[-asan]/ (objs/nginx, objs/*.so);
# nginx's prefix: the same directory's prefix/ (never used by the tests,
# which pass -p).  Idempotent: nothing is redone when a stamp of the
# tarball, the configure arguments and the module's sources is unchanged;
# a changed module source only recompiles (nginx's Makefile knows the
# dependencies), changed arguments or config reconfigure.
#
# --asan: clang with -fsanitize=address,undefined and NGX_DEBUG_PALLOC, so
# that every pool allocation is its own malloc and ASan sees overflows of
# pool memory (in a normal build they land silently in the next object of
# the same pool block).
#
# The tarball must match its SHA-256 in vendor/nginx/SHA256SUMS, checked
# before anything is unpacked; NGINX_VENDOR=DIR reads it from DIR instead
# (the sums stay the repository's).
#
# Prints two lines, NGINX=<binary> and MODULE=<.so>; the build's output
# goes to its build.log.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
vendor=${NGINX_VENDOR:-$repo/vendor/nginx}
sums=$repo/vendor/nginx/SHA256SUMS

variant=
if [ "${1:-}" = --asan ]; then
    variant=-asan
    shift
fi
ver=${1:?usage: $0 [--asan] VERSION}
tarball=$vendor/nginx-$ver.tar.gz
[ -f "$tarball" ] || { echo "$0: no $tarball" >&2; exit 1; }

# the pinned SHA-256: a tarball that differs (truncated, another release,
# tampered with) is never unpacked
want=$(awk -v f="nginx-$ver.tar.gz" '$2 == f || $2 == "*" f { print $1 }' \
           "$sums")
[ -n "$want" ] \
    || { echo "$0: nginx-$ver.tar.gz is not in $sums" >&2; exit 1; }
have=$(sha256sum < "$tarball" | cut -d' ' -f1)
if [ "$have" != "$want" ]; then
    echo "$0: SHA-256 mismatch for $tarball:" >&2
    echo "    expected $want ($sums)" >&2
    echo "    got      $have" >&2
    exit 1
fi

dir=$repo/build/nginx-$ver$variant
args=(--prefix="$dir/prefix" --with-compat --with-debug
      --with-http_v2_module --add-dynamic-module="$repo")
if [ -n "$variant" ]; then
    san=-fsanitize=address,undefined
    # NGX_HAVE_NONALIGNED=0: nginx's deliberate unaligned loads and stores
    # (HTTP/2 frames, the request parser, MD5) take their portable path,
    # so that UBSan's alignment check is left on for everything else.
    # The ignorelist: see the file.
    cc_opt="-O1 -fno-omit-frame-pointer $san"
    cc_opt+=" -fsanitize-ignorelist=$repo/tools/asan-ignorelist.txt"
    cc_opt+=" -DNGX_DEBUG_PALLOC=1 -DNGX_HAVE_NONALIGNED=0"
    args+=(--with-cc=clang --with-cc-opt="$cc_opt" --with-ld-opt="$san")
fi

# what the build depends on: a change in any of these redoes some of it
conf_stamp=$( { echo "$have"
                sha1sum "$repo/config" "$repo/tools/asan-ignorelist.txt"
                printf '%s\n' "${args[@]}"; } | sha1sum | cut -c1-40)
src_stamp=$( { echo "$conf_stamp"; cd "$repo" && sha1sum src/*.[ch] src/core/*; } \
             | sha1sum | cut -c1-40)

report() {
    echo "NGINX=$dir/objs/nginx"
    echo "MODULE=$dir/objs/ngx_http_kv_aware_module.so"
}

if [ "$(cat "$dir/.built" 2>/dev/null)" = "$src_stamp" ] \
        && [ -x "$dir/objs/nginx" ]; then
    report
    exit 0
fi

log=$dir.build.log
if [ "$(cat "$dir/.configured" 2>/dev/null)" != "$conf_stamp" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    tar xzf "$tarball" -C "$dir" --strip-components=1
    echo "configuring nginx $ver$variant (log: $log)" >&2
    (cd "$dir" && auto/configure "${args[@]}") > "$log" 2>&1 \
        || { tail -30 "$log" >&2; exit 1; }
    echo "$conf_stamp" > "$dir/.configured"
fi

echo "building nginx $ver$variant (log: $log)" >&2
(cd "$dir" && make -j2) >> "$log" 2>&1 || { tail -30 "$log" >&2; exit 1; }
echo "$src_stamp" > "$dir/.built"
report
