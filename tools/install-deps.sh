#!/usr/bin/env bash
# Installs the Debian packages named on the command line that are missing.
# Works as root without sudo, and as a user with sudo.
set -euo pipefail

# what installed packages provide counts as installed: NodeSource's nodejs
# provides (and conflicts with) npm, and asking apt for npm would fail
provided=" $(dpkg-query -W -f='${db:Status-Abbrev} ${Provides}\n' 2>/dev/null \
             | awk '$1 == "ii" { $1 = ""; print }' \
             | sed -e 's/([^)]*)//g' | tr ', ' '\n\n' | sort -u \
             | tr '\n' ' ') "

missing=()
for pkg in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null \
            | grep -q "install ok installed" \
            && [[ "$provided" != *" $pkg "* ]]; then
        missing+=("$pkg")
    fi
done

[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}"

if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
else
    echo "need root or sudo to install: ${missing[*]}" >&2
    exit 1
fi

"${as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
