#!/usr/bin/env bash
# Runs libFuzzer targets built as build/fuzz/fuzz_<name>, each for SECONDS,
# over build/fuzz/corpus-<name>/: the seeds of fuzz/corpus/<name>/ copied
# in, and what earlier runs found kept, so the repository's corpus stays
# as committed.  fuzz/fuzz_<name>.dict is passed as a dictionary if there.
#
#   fuzz/run.sh SECONDS NAME...
#
# One line a target (execs, CPU seconds, crashes=0/1, corpus size before
# and after), then "N passed, N failed"; exits 1 if any target crashed.
# A crash leaves its input in build/fuzz/<name>-crash-* (or -timeout-,
# -oom-, -leak-) and the log in
# build/fuzz/<name>.log.
set -uo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 SECONDS NAME..." >&2
    exit 2
fi

secs=$1
shift

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/build/fuzz
passed=0
failed=0

for name in "$@"; do
    bin=$out/fuzz_$name
    corpus=$out/corpus-$name
    log=$out/$name.log

    if [ ! -x "$bin" ]; then
        echo "fuzz $name: not built ($bin), crashes=1"
        failed=$((failed + 1))
        continue
    fi

    mkdir -p "$corpus"

    # seeds are small and few: refresh them, keep what was found
    if [ -d "$root/fuzz/corpus/$name" ]; then
        cp -n "$root/fuzz/corpus/$name"/* "$corpus"/ 2>/dev/null
    fi

    dict=()
    if [ -f "$root/fuzz/fuzz_$name.dict" ]; then
        dict=(-dict="$root/fuzz/fuzz_$name.dict")
    fi

    before=$(find "$corpus" -type f | wc -l)

    # bash's time keyword reports the child's CPU, not just the wall
    TIMEFORMAT='%R %U %S'
    cpu=$( { time "$bin" -max_total_time="$secs" -timeout=10 \
                 -print_final_stats=1 "${dict[@]}" \
                 -artifact_prefix="$out/$name-" \
                 "$corpus" > "$log" 2>&1 ; echo "rc $?" >> "$log" ; } \
           2>&1 )
    rc=$(sed -n 's/^rc \([0-9]*\)$/\1/p' "$log" | tail -1)

    after=$(find "$corpus" -type f | wc -l)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    wall=$(awk '{ printf "%.1f", $1 }' <<< "$cpu")
    cpu=$(awk '{ printf "%.1f", $2 + $3 }' <<< "$cpu")

    if [ "$rc" = 0 ]; then
        crashes=0
        passed=$((passed + 1))
    else
        crashes=1
        failed=$((failed + 1))
    fi

    echo "fuzz $name: ${execs:-0} execs, ${wall} s, cpu ${cpu} s," \
         "crashes=$crashes, corpus $before -> $after files"

    if [ "$crashes" = 1 ]; then
        grep -m 1 -E '^==[0-9]+==ERROR|runtime error|^SUMMARY' "$log" \
            | sed 's/^/#   /'
        ls "$out/$name"-{crash,timeout,oom,leak}-* 2>/dev/null \
            | sed 's/^/#   input: /'
        echo "#   log: $log"
    fi
done

echo "$passed passed, $failed failed"

[ "$failed" -eq 0 ]
