#!/usr/bin/env bash
# prove, with its output (stderr too) kept in a log: when a test fails, the
# diagnostics of the failed checks are printed again after the run, then
# prove's summary.  Run side by side, a test's diagnostics scroll by among
# the others' and CI shows only the tail: without this, a failure that
# happens only under CI's load says which check failed but not why.
#
#   tools/prove-stage.sh LOG PROVE-ARGUMENTS...
set -uo pipefail

log=$1
shift

prove "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

if [ "$rc" -ne 0 ]; then
    echo
    echo "== the failed checks and what they printed (from $log)"
    grep -E -A16 '^[[:space:]]*#[[:space:]]+Failed test' "$log" | head -300
    echo
    echo "== prove's summary, again"
    sed -n '/^Test Summary Report/,$p' "$log"
fi
exit "$rc"
