#!/usr/bin/env bash
# The Debian packages that hold the shared libraries FILEs link, one a
# line: what a slim image must install to run what a build stage built.
#
#   docker/runtime-packages.sh FILE...
set -euo pipefail

for f in "$@"; do
    ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
done | sort -u | while read -r lib; do
    # ldd may name /lib/..., which merged /usr installs list as /usr/lib/...
    for p in "$lib" "/usr$lib" "$(readlink -f "$lib")"; do
        if dpkg -S "$p" 2>/dev/null; then
            break
        fi
    done
done | cut -d: -f1 | sort -u
