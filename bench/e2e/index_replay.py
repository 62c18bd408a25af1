#!/usr/bin/python3
"""What nginx's index believed each server held, replayed (bench/e2e, agents).

index_replay.py SESSIONS DIR [--shared-prefix] [--policy P] [--blocks N]
                [--ttl MS] [--phase MS] [--replay PATH] [-v]

SESSIONS and DIR as for session_moves.py: the archive kvload replayed
and the workload's result directory of a run with BENCH_ACCESS_LOG=1 of
a kv_aware policy in learned mode (no KV events: kv_aware, not
kv_aware_events).  The requests the access log has are fed, in the
order they started, to build/bench_index_replay (PATH, or
$INDEX_REPLAY), which runs them through the core index as nginx did:
looked up, then learned at the server nginx chose, with a learned budget
of N blocks (default 1600, the bench's kvsim pool and learned_tokens).
What the budget keeps depends on the 16 ms tick each block was stamped
in, and where nginx's ticks (its monotonic clock) begin in the log's
wall-clock milliseconds is unknown: each phase (0 to 15 ms) is tried and
the one that reproduces the most matches is kept (the middle one of a
tie), unless --phase sets it.

Printed: the requests whose lookup at the chosen server gave the blocks
nginx logged as matched (all of them when the replay is faithful: the
same core, the same order, nearly the same ticks), and, at the server of
the session's request before, where the index held more than 10 blocks
fewer than session_moves.py's pool model (an LRU of N blocks a server)
says the server held (forgot: the session may leave a cache it could
reuse) or more than 10 more (trusted: it may stay for a cache gone).
With -v, each such request, and the servers by slot.  Standard library
only; session_moves.py and session_bounds.py beside it.
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import session_moves  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def stream(reqs, held):
    """the tool's input, one line a request, and the servers by slot"""
    slots, ids, lines = {}, {}, []
    for (start, s, _, server, matched, keys), (prev, n) in zip(reqs, held):
        slot = slots.setdefault(server, len(slots))
        home = -1 if prev is None else slots[prev]
        # dense keys, the same block the same key, above 0
        kid = [ids.setdefault(k, len(ids) + 1) for k in keys]
        lines.append("%d %d %d %d %d %s %d %s\n" % (
            int(start * 1000), slot, home, n, matched, s, len(kid),
            " ".join(map(str, kid))))
    return "".join(lines), sorted(slots, key=slots.get)


def replay(cmd, text):
    """the tool's output lines, fed text"""
    p = subprocess.run(cmd, input=text, stdout=subprocess.PIPE,
                       universal_newlines=True)
    if p.returncode != 0:
        sys.exit("index_replay.py: %s failed (%d)" % (cmd[0], p.returncode))
    return p.stdout.splitlines()


def main():
    ap = session_moves.run_parser(__doc__)
    ap.add_argument("--blocks", type=int, default=1600,
                    help="each server's pool and learned budget, in blocks")
    ap.add_argument("--ttl", type=int, default=600000,
                    help="learned_ttl, in ms (default nginx's 10m)")
    ap.add_argument("--phase", type=int, choices=range(16),
                    help="ms added before the 16 ms ticks (default: "
                    "the most faithful)")
    ap.add_argument("--replay", default=os.environ.get(
        "INDEX_REPLAY", os.path.join(ROOT, "build", "bench_index_replay")),
        help="the replay tool (make index-replay)")
    ap.add_argument("-v", action="store_true")
    a = ap.parse_args()
    if a.blocks < 1:
        sys.exit("index_replay.py: --blocks >= 1")
    if not os.access(a.replay, os.X_OK):
        sys.exit("index_replay.py: no %s (make index-replay, or "
                 "--replay)" % a.replay)

    sent, _, flat, rows = session_moves.load_run(
        "index_replay.py", a.sessions, a.dir, a.policy, a.shared_prefix)
    reqs = session_moves.started(sent, flat, rows)
    text, servers = stream(reqs, session_moves.pool_held(reqs, a.blocks))
    longest = max([len(r[5]) for r in reqs] + [1])

    cmd = [a.replay, "--budget", str(a.blocks), "--ttl", str(a.ttl),
           "--max-blocks", str(longest)]
    phase = a.phase
    if phase is None:
        faithful = [int(line.split()[1])
                    for ph in range(16)
                    for line in replay(cmd + ["-q", "--phase", str(ph)],
                                       text)
                    if line.startswith("faithful ")]
        best = [ph for ph in range(16) if faithful[ph] == max(faithful)]
        phase = best[len(best) // 2]
        print("tick phase %d ms: %d faithful in %d of the 16 phases "
              "(each: %s)" % (phase, max(faithful), len(best),
                              " ".join(map(str, faithful))))
    out = replay(cmd + ["--phase", str(phase)], text)
    if a.v:
        print("slots: " + " ".join("%d=%s" % x for x in enumerate(servers)))
        for line in out:
            if line.startswith("req ") and (" forgot " in line
                                            or " trusted " in line
                                            or " DIFFERS " in line):
                print(line)
    for line in out:
        if not line.startswith("req "):
            print(line)


if __name__ == "__main__":
    main()
