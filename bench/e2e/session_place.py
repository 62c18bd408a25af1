#!/usr/bin/python3
"""What placing sessions on servers can reach (bench/e2e, agents).

session_place.py SESSIONS DIR [--shared-prefix] [--policy P]
                 [--blocks N] [--tries N] [--rules]

SESSIONS, DIR and P as for session_moves.py; needs a run with
BENCH_ACCESS_LOG=1 (the order requests started, the server each went to).
Each server is modelled as session_moves.py does (an LRU of N blocks,
1600 by default, a request's blocks made recent tail first), and the
run's requests are replayed in the order they started through:

* the pooled LRU of all the servers' blocks (the bound the agents table
  prints, here counted in blocks);
* the servers the run chose (so that the model can be set beside the
  hit rate kvsim measured);
* foresight: each session placed, at its first request, on the server
  whose sessions not yet ended have the least final context in all, and
  never moved.  It knows each session's largest prompt and its end in
  advance, which no router does: a reference for what placement could
  reach, not a bound (moving sessions may do better);
* the best of --tries (default 30) such placements with noise (seed 1);
* the run's first placement of each session, never moved.

With --rules, the same requests in 8 orders, each session's clock
shifted by up to 0.5 s (its own requests keep their order), each scored
against its own pooled-LRU bound: foresight, and online placement rules
(what a router can know).  A session's later request goes to the server
that holds the most of it when that is at least half (as affinity_min),
else (and a session's first request) where fill plus misses is least;
fill being the blocks a server stored (all, or fading over 1.5 to
20 s), the last prompts of the sessions it served within 10 s, or, once
its pool is full, the age of its LRU's oldest block (the age decides,
misses break near ties).  Each rule also with a move
rule: the session's server, having lost part of what it held of the
session's request before, weighs that loss twice more.  Standard library
only.
"""

import collections
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import session_bounds  # noqa: E402
import session_moves  # noqa: E402


def replay(reqs, servers, choose, blocks, tau=None):
    """share of blocks found, and moves, placing each of reqs [(t,
    session, keys)] by choose(model, i, t, session, keys, matched); the
    blocks each server stored fade over tau seconds (None: never)"""
    pools = {v: collections.OrderedDict() for v in servers}
    model = {"pools": pools, "home": {}, "last": {}, "fill": {},
             "seen": {v: {} for v in servers}, "tau": tau,
             "blocks": blocks}
    hit = total = moves = 0
    for i, (t, s, keys) in enumerate(reqs):
        matched = {v: session_moves.pool_prefix(pools[v], keys)
                   for v in servers}
        v = choose(model, i, t, s, keys, matched)
        home = model["home"].get(s)
        moves += home is not None and v != home
        model["home"][s] = v
        model["last"][s] = keys
        hit += matched[v]
        total += len(keys)
        f = model["fill"].get(v)
        model["fill"][v] = [faded(f, t, tau) + len(keys) - matched[v], t]
        for w in servers:
            model["seen"][w].pop(s, None)
        model["seen"][v][s] = (t, len(keys))
        session_moves.pool_add(pools[v], keys, blocks, t)
    return hit / (total or 1), moves


def pooled(reqs, blocks):
    """the hit rate (of the blocks) of one LRU of BLOCKS blocks"""
    return session_bounds.bounds(
        [(len(k) * session_bounds.BLOCK, k) for _, _, k in reqs],
        blocks)["lru_by_blocks"]


def foresight(reqs, servers, noise=0.0, rng=None):
    """choose() of the foresight placement"""
    last, size, where = {}, collections.Counter(), {}
    for i, (_, s, keys) in enumerate(reqs):
        last[s] = i
        size[s] = max(size[s], len(keys))

    def choose(model, i, t, s, keys, matched):
        if s not in where:
            live = dict.fromkeys(servers, 0)
            for o, v in where.items():
                if last[o] >= i:
                    live[v] += size[o]
            where[s] = min(servers, key=lambda v: live[v]
                           + (rng.random() * noise if rng else 0))
        return where[s]
    return choose


def faded(f, t, tau):
    if f is None:
        return 0.0
    if tau is None:
        return f[0]
    return max(0.0, f[0] * (1 - (t - f[1]) / tau))


def online(fill, lost_turns):
    """choose() of an online rule: stay by affinity, else by fill"""
    def choose(model, i, t, s, keys, matched):
        n = len(keys)
        home = model["home"].get(s)
        best = max(matched, key=lambda v: matched[v])
        away = None
        if home is not None and matched[best] >= 0.5 * n:
            cost = {v: n - matched[v] for v in matched}
            if lost_turns:
                # what its server held of the session's request before
                # and of this one, and lost since
                prev, held = model["last"][s], 0
                while held < min(len(prev), n) and prev[held] == keys[held]:
                    held += 1
                cost[home] += lost_turns * max(0, held - matched[home])
            pick = min(cost, key=lambda v: (cost[v], v != home))
            if not lost_turns or pick == home or matched[pick] >= 0.5 * n:
                return pick
            # sent away by its loss to a server holding little: moves
            away = home
        return min((v for v in matched if v != away),
                   key=lambda v: fill(model, v, t) + n - matched[v])
    return choose


def rules():
    """[(name, fill(model, server, t), tau of the stored blocks)]"""
    def stored(m, v, t):
        return faded(m["fill"].get(v), t, m["tau"])

    def live(m, v, t):
        return sum(n for (at, n) in m["seen"][v].values() if t - at <= 10)

    def oldest(m, v, t):
        # a pool not full yet first, the least filled; then the oldest
        # tail, its age (s) before the misses (blocks), which break ties
        pool = m["pools"][v]
        if len(pool) < m["blocks"]:
            return len(pool)
        return 1e9 - 1e6 * (t - next(iter(pool.values())))

    out = [("fill, all stored", stored, None)]
    out += [("fill fading over %g s" % tau, stored, tau)
            for tau in (20, 10, 5, 3, 1.5)]
    out += [("live sessions' prompts", live, None),
            ("oldest LRU block", oldest, None)]
    return out


def main():
    ap = session_moves.run_parser(__doc__)
    ap.add_argument("--blocks", type=int, default=1600)
    ap.add_argument("--tries", type=int, default=30)
    ap.add_argument("--rules", action="store_true")
    a = ap.parse_args()
    if a.blocks < 1 or a.tries < 0:
        sys.exit("session_place.py: --blocks >= 1, --tries >= 0")
    sent, _, flat, rows = session_moves.load_run(
        "session_place.py", a.sessions, a.dir, a.policy, a.shared_prefix)
    started = session_moves.started(sent, flat, rows)
    reqs = [(r[0], r[1], r[5]) for r in started]
    chosen = [r[3] for r in started]
    servers = sorted(set(chosen))
    bound = pooled(reqs, a.blocks * len(servers))

    def line(what, hit, moves):
        print("%-44s %5.1f%%  %.3f of the bound  %3d moves"
              % (what, 100 * hit, hit / bound, moves))

    print("%d requests, %d servers x %d blocks; pooled LRU %.1f%% of the "
          "blocks" % (len(reqs), len(servers), a.blocks, 100 * bound))
    line("the run's servers (the model)", *replay(
        reqs, servers, lambda m, i, *_: chosen[i], a.blocks))
    line("foresight", *replay(reqs, servers, foresight(reqs, servers),
                              a.blocks))
    rng = random.Random(1)
    best = max((replay(reqs, servers, foresight(reqs, servers, 300, rng),
                       a.blocks) for _ in range(a.tries)), default=None)
    if best:
        line("foresight, best of %d with noise" % a.tries, *best)
    first = {}
    line("the run's first servers, never moved", *replay(
        reqs, servers,
        lambda m, i, t, s, *_: first.setdefault(s, chosen[i]), a.blocks))

    if not a.rules:
        return
    print("8 arrivals jittered: mean (min-max) of each one's bound")
    arrivals = []
    for seed in range(8):
        rng = random.Random(seed)
        off = {s: rng.uniform(-0.5, 0.5) for s in sorted({r[1] for r in reqs})}
        # one offset a session: its own requests keep their order (a
        # stable sort keeps those sent at one instant as they were)
        j = sorted(((t + off[s], s, keys) for t, s, keys in reqs),
                   key=lambda r: r[0])
        arrivals.append((j, pooled(j, a.blocks * len(servers))))

    def spread(what, place, tau=None):
        r = [replay(j, servers, place(j), a.blocks, tau)[0] / b
             for j, b in arrivals]
        print("  %-44s %.3f (%.3f-%.3f)" % (what, sum(r) / len(r), min(r),
                                            max(r)))

    spread("foresight", lambda j: foresight(j, servers))
    for name, fill, tau in rules():
        for turns in (0, 2):
            spread("%s, %s" % (name, "moves" if turns else "stays"),
                   lambda j: online(fill, turns), tau)


if __name__ == "__main__":
    main()
