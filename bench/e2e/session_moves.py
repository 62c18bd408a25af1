#!/usr/bin/python3
"""Where a sessions replay lost its reusable blocks (bench/e2e, agents).

session_moves.py SESSIONS DIR [--shared-prefix] [--policy P] [-v]
                 [--min-lost N]

SESSIONS is the archive kvload replayed, DIR the workload's result
directory (build/bench-e2e/agents or agents-shared), P the policy
(kv_aware).  Needs a run with BENCH_ACCESS_LOG=1, whose access log
(build/bench-e2e/nginx-P/logs/access.log) gives each request's server,
$kv_aware_reason, matched blocks and the tokens kvsim found cached.

Each request of DIR/P.sessions.tsv is joined with its access log line
(the same session's requests in the order they were sent, by the start
time the log implies), and its reusable blocks (its leading blocks any
earlier request of the run had: session_bounds.py's unlimited cache)
are set beside what kvsim found cached.  Printed: per reason and per
where the request went (new: its thread's first; home: the server of
its thread's previous request; moved: another), the requests and the
reusable blocks not found; with -v, each request that lost more than
--min-lost blocks (default 50), with the server its thread left.
Standard library only; session_bounds.py beside it.
"""

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import session_bounds  # noqa: E402

BLOCK = session_bounds.BLOCK


def threads_of(session):
    """each request's (thread kind, thread number), in kvload's order"""
    threads, reqs = [], []
    session_bounds._thread(session["requests"], 0.0, "main",
                           session.get("system_tokens", 0)
                           + session.get("tool_tokens", 0), threads, reqs)
    reqs.sort(key=lambda r: (r[0], r[1]))
    return [(threads[r[2]][0], r[2]) for r in reqs]


def access_rows(path):
    """{session: [(start, server, reason, matched, cached blocks)]}"""
    rows = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) < 8 or "/" not in p[4] or p[4].startswith("-"):
                continue
            try:
                matched = int(p[4].split("/")[0])
                cached = int(p[5]) // BLOCK
                start = float(p[0]) - float(p[7])
            except ValueError:
                continue
            rows[p[1]].append((start, p[2], p[3], matched, cached))
    for r in rows.values():
        r.sort()
    return rows


def load_run(prog, sessions_path, d, policy, shared_prefix):
    """(sent, found, flat, rows) of a run: the requests of
    DIR/POLICY.sessions.tsv as (session, index) in the order sent, the
    sessions, each one's requests as session_bounds.flatten() makes them,
    and access_rows() of the policy's access log; exits when either is
    missing"""
    sent = []
    tsv = os.path.join(d, policy + ".sessions.tsv")
    if os.path.exists(tsv):
        with open(tsv) as f:
            for line in f:
                p = line.rstrip("\n").split("\t")
                if len(p) == 3:
                    sent.append((p[0], int(p[1])))
    log = os.path.join(os.path.dirname(os.path.abspath(d)),
                       "nginx-" + policy, "logs", "access.log")
    if not sent or not os.path.exists(log):
        sys.exit("%s: no requests in %s, or no %s (a run with "
                 "BENCH_ACCESS_LOG=1)" % (prog, tsv, log))
    found = session_bounds.sessions(sessions_path, {s for s, _ in sent})
    missing = {s for s, _ in sent} - set(found)
    if missing:
        sys.exit("%s: sessions not found in %s: %s" % (
            prog, sessions_path, " ".join(sorted(missing)[:5])))
    flat = {s: session_bounds.flatten(found[s], shared_prefix)
            for s in found}
    return sent, found, flat, access_rows(log)


def started(sent, flat, rows):
    """[(start, session, nth request, server, matched, block keys)] of the
    requests the access log has, in the order they started"""
    reqs, nth = [], collections.Counter()
    for s, i in sent:
        k = nth[s]
        nth[s] += 1
        if k < len(rows[s]):
            start, server, _, matched, _ = rows[s][k]
            reqs.append((start, s, k, server, matched, flat[s][i][1]))
    reqs.sort(key=lambda r: r[0])
    return reqs


def pool_held(reqs, blocks):
    """[(server before, blocks held)] for each of started()'s requests:
    the server the session's request before went to (None for its first)
    and the leading blocks of its prompt that server held when it was
    sent, from a model of each server's pool: an LRU of BLOCKS blocks, a
    request's blocks made the most recent tail first (vLLM's block pool,
    and kvsim's, free a finished request's blocks tail first), in the
    order requests started.  An estimate: a request's blocks stay held
    until it ends."""
    pools = collections.defaultdict(collections.OrderedDict)
    last, out = {}, []
    for _, s, _, server, _, keys in reqs:
        prev = last.get(s)
        out.append((prev, 0 if prev is None else pool_prefix(pools[prev],
                                                             keys)))
        last[s] = server
        pool_add(pools[server], keys, blocks)
    return out


def pool_prefix(pool, keys):
    """the leading blocks of keys that pool holds"""
    n = 0
    for key in keys:
        if key not in pool:
            break
        n += 1
    return n


def pool_add(pool, keys, blocks, value=True):
    """a request's blocks into pool (an OrderedDict, least recent
    first) the most recent, tail first as a server's pool frees them,
    each with value; then the least recent out past BLOCKS"""
    for key in reversed(keys):
        pool[key] = value
        pool.move_to_end(key)
    while len(pool) > blocks:
        pool.popitem(last=False)


def held_by_left(sent, flat, rows, blocks):
    """{(session, nth request): leading blocks of its prompt that the
    server of the session's request before held when it was sent}, by
    pool_held()'s model"""
    reqs = started(sent, flat, rows)
    return {(r[1], r[2]): h[1] for r, h in zip(reqs, pool_held(reqs,
                                                                blocks))}


def run_parser(doc):
    """the arguments that name a run: SESSIONS DIR [--policy]
    [--shared-prefix]"""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("sessions")
    ap.add_argument("dir")
    ap.add_argument("--policy", default="kv_aware")
    ap.add_argument("--shared-prefix", action="store_true")
    return ap


def main():
    ap = run_parser(__doc__)
    ap.add_argument("--min-lost", type=int, default=50)
    ap.add_argument("-v", action="store_true")
    ap.add_argument("--blocks", type=int, default=1600,
                    help="each server's pool, in blocks (for -v)")
    a = ap.parse_args()

    sent, found, flat, rows = load_run("session_moves.py", a.sessions,
                                       a.dir, a.policy, a.shared_prefix)
    kinds = {s: threads_of(found[s]) for s in found}

    held = held_by_left(sent, flat, rows, a.blocks)
    seen, nth, last = set(), collections.Counter(), {}
    count, lost = collections.Counter(), collections.Counter()
    for s, i in sent:
        _, keys = flat[s][i]
        reusable = 0
        for k in keys:
            if k not in seen:
                break
            reusable += 1
        seen.update(keys)
        k = nth[s]
        nth[s] += 1
        if k >= len(rows[s]):
            continue
        start, server, reason, matched, cached = rows[s][k]
        kind, thread = kinds[s][i]
        prev = last.get((s, thread))
        where = "new" if prev is None else ("home" if prev == server
                                            else "moved")
        last[(s, thread)] = server
        count[(reason, where)] += 1
        miss = max(0, reusable - cached)
        lost[(reason, where)] += miss
        if a.v and miss > a.min_lost:
            print("%s %-18s %-28s %-5s matched %5d cached %5d reusable "
                  "%5d/%-5d at %s, left %s%s" % (
                      s, kind, reason, where, matched, cached, reusable,
                      len(keys), server, prev or "-",
                      " (held about %d)" % held[(s, k)]
                      if where == "moved" else ""))
    print("%-30s %-6s %9s %14s" % ("reason", "where", "requests",
                                   "blocks lost"))
    for key, n in sorted(count.items(), key=lambda x: -lost[x[0]]):
        print("%-30s %-6s %9d %14d" % (key[0], key[1], n, lost[key]))
    print("reusable blocks not found cached: %d" % sum(lost.values()))


if __name__ == "__main__":
    main()
