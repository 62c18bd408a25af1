#!/usr/bin/env python3
"""A/B two or more builds of the module on the agents workload.

    python3 bench/e2e/ab.py [--runs 3] [--variant shared] [--full] \\
        before=/tmp/before.so after=/tmp/after.so[:kv_aware_ttft] \\
        [-- run.sh options, e.g. --slow-servers 0,1]

Each arm is NAME=MODULE[:POLICY[:PARAMS]] (policy: one of run.sh's,
default kv_aware; PARAMS: more kv_aware parameters for this arm alone,
added to KV_AWARE_PARAMS, e.g. 'session=$http_x_session_affinity').  The arms run in turn, run after run (a, b, a, b, ...), each a
`bench/e2e/run.sh --workloads agents --quick` of one policy with
KV_AWARE_MODULE set to the arm's build, so that a drift of the machine
falls on all of them alike.  Prints every run's row, then each arm's
median and range of what the issue's goals are stated in.

Why a script: a quick agents run is short (about 30 s) and its figures
move from run to run as much as most changes move them (sessions apart:
0.89 to 0.96 of the LRU bound with one build), so that one run a side
decides nothing; three a side, interleaved, is the least a note should
rest on.  Copy each module out of build/ first: a rebuild in between
would change an arm under the runs.

Everything run.sh reads from the environment passes through
(KV_AWARE_PARAMS, BENCH_ACCESS_LOG, AGENTS_*); --variant sets
AGENTS_VARIANTS.  Writes nothing but run.sh's own build/bench-e2e; each
run's log goes to E2E_AB_LOGS (default build/bench-e2e/ab).
"""

import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# the columns of e2e-agents.md that the goals are stated in
COLUMNS = ["hit rate", "/ LRU", "TTFT p50", "p90", "p99", "busiest / mean",
           "session on its server"]


def parse_arm(text):
    """NAME=MODULE[:POLICY[:PARAMS]] -> (name, absolute module path,
    policy, params)"""
    if "=" not in text:
        raise argparse.ArgumentTypeError(
            "an arm is NAME=MODULE[:POLICY[:PARAMS]], not %r" % text)
    name, rest = text.split("=", 1)
    module, _, rest = rest.partition(":")
    policy, _, params = rest.partition(":")
    module = os.path.abspath(module)
    if not name or not os.path.isfile(module):
        raise argparse.ArgumentTypeError(
            "arm %r: no module at %s" % (text, module))
    return name, module, policy or "kv_aware", params


def number(cell):
    """'84.8%' -> 84.8, '1.64' -> 1.64, anything else -> None"""
    cell = cell.strip().rstrip("%").split(" ")[0]
    try:
        return float(cell)
    except ValueError:
        return None


def read_row(results):
    """the one policy row of e2e-agents.md: {column: value}"""
    header = None
    with open(os.path.join(results, "e2e-agents.md")) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells and cells[0] == "policy":
                header = cells
            elif header and cells[0] and not cells[0].startswith("-"):
                return {h: number(c) for h, c in zip(header, cells)}
    return None


def run_arm(name, module, policy, params, args, extra, logs, r):
    env = dict(os.environ, KV_AWARE_MODULE=module,
               AGENTS_VARIANTS=args.variant)
    if params:
        env["KV_AWARE_PARAMS"] = " ".join(
            p for p in (env.get("KV_AWARE_PARAMS"), params) if p)
    work = env.get("E2E_WORK", os.path.join(ROOT, "build", "bench-e2e"))
    results = env.get("E2E_RESULTS", os.path.join(work, "results"))
    cmd = ["bash", os.path.join(ROOT, "bench/e2e/run.sh"),
           "--workloads", "agents", "--policies", policy]
    cmd += [] if args.full else ["--quick"]
    cmd += extra
    log = os.path.join(logs, "%s-%d.log" % (name, r))
    # the report is looked for where this run writes it, never an old one
    try:
        os.unlink(os.path.join(results, "e2e-agents.md"))
    except FileNotFoundError:
        pass
    # a failed run is tried again once (one failed at the start in a
    # series of ten, and the next identical run went through): one such
    # failure should not throw away the runs made so far
    for attempt in (1, 2):
        with open(log, "w") as out:
            rc = subprocess.call(cmd, cwd=ROOT, env=env, stdout=out,
                                 stderr=subprocess.STDOUT)
        if rc == 0:
            break
        print("ab: %s run %d failed (rc %d, try %d), see %s"
              % (name, r, rc, attempt, log), file=sys.stderr)
    if rc != 0:
        sys.exit("ab: %s run %d failed twice" % (name, r))
    row = read_row(results)
    if row is None:
        sys.exit("ab: %s run %d left no policy row, see %s"
                 % (name, r, log))
    return row


def fmt(v):
    return "-" if v is None else ("%.3g" % v)


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--variant", choices=["apart", "shared"],
                   default="shared")
    p.add_argument("--full", action="store_true",
                   help="default sizes (about 4.5 min a run), not --quick")
    p.add_argument("arms", nargs="+", type=parse_arm)
    args = p.parse_args(argv)
    if args.runs < 1 or args.runs > 20:
        p.error("--runs: 1 to 20")
    names = [name for name, _, _, _ in args.arms]
    if len(set(names)) != len(names):
        p.error("each arm needs a name of its own: %s" % " ".join(names))

    logs = os.environ.get("E2E_AB_LOGS",
                          os.path.join(ROOT, "build", "bench-e2e", "ab"))
    os.makedirs(logs, exist_ok=True)

    print("| arm | run | " + " | ".join(COLUMNS) + " |")
    print("|---|---:|" + "---:|" * len(COLUMNS))
    rows = {name: [] for name, _, _, _ in args.arms}
    for r in range(1, args.runs + 1):
        for name, module, policy, params in args.arms:
            row = run_arm(name, module, policy, params, args, extra, logs,
                          r)
            rows[name].append(row)
            print("| %s | %d | %s |" % (name, r, " | ".join(
                fmt(row.get(c)) for c in COLUMNS)), flush=True)

    print()
    print("median (range) of %d runs, sessions %s:" % (args.runs,
                                                       args.variant))
    print("| arm | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---:|" * len(COLUMNS))
    for name, _, policy, params in args.arms:
        cells = []
        for c in COLUMNS:
            vals = [row[c] for row in rows[name] if row.get(c) is not None]
            cells.append("%s (%s-%s)" % (fmt(statistics.median(vals)),
                                          fmt(min(vals)), fmt(max(vals)))
                         if vals else "-")
        print("| %s %s%s | %s |" % (name, policy,
                                     " " + params if params else "",
                                     " | ".join(cells)))


if __name__ == "__main__":
    main()
