#!/bin/sh
# Quick start on a fresh Debian 12 machine, which may lack make and a
# compiler:  ./run.sh demo   or   ./run.sh test   (any make target works).
set -e
cd "$(dirname "$0")"

if ! command -v make >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
    bash tools/install-deps.sh make build-essential
fi

exec make "${@:-test}"
