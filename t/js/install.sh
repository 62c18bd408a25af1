#!/usr/bin/env bash
# Installs the JavaScript test clients (t/js/package-lock.json: the
# official OpenAI SDK, pinned) into DEST/node_modules, by default
# build/js/, so that nothing lands in the source tree.
#
#   t/js/install.sh [DEST]
#
# Idempotent: nothing is done while DEST holds the install of this very
# lock file.  Only the first install needs the npm registry; npm's cache
# (~/.npm) serves a later one without it (--prefer-offline).  Prints the
# node_modules folder, for NODE_PATH.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dest=${1:-$here/../../build/js}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

command -v npm >/dev/null 2>&1 \
    || { echo "$0: npm not found (Debian: apt-get install npm)" >&2; exit 1; }

stamp=$(cat "$here/package.json" "$here/package-lock.json" | sha1sum \
        | cut -c1-40)

if [ "$(cat "$dest/.installed" 2>/dev/null)" != "$stamp" ] \
        || [ ! -d "$dest/node_modules/openai" ]; then
    cp "$here/package.json" "$here/package-lock.json" "$dest/"
    rm -f "$dest/.installed"
    (cd "$dest" && npm ci --prefer-offline --no-audit --no-fund \
         --loglevel=error) >&2 \
        || { echo "$0: npm ci failed in $dest" >&2; exit 1; }
    echo "$stamp" > "$dest/.installed"
fi

echo "$dest/node_modules"
