#!/usr/bin/python3
"""The two hit-rate bounds of a sessions replay (bench/e2e, agents workload).

session_bounds.py SESSIONS LOG --pool-blocks N [--shared-prefix]
                  [--json OUT]

SESSIONS is the archive (.tar.gz) or the directory of session files that
kvload replayed (--workload sessions), LOG what its --sessions-log wrote:
one line a request sent, "session<TAB>index<TAB>seconds", in the order
sent.  For exactly those requests, in that order, the prefix hit rate of

  unlimited  one cache that never evicts: a leading block seen before hits
  lru        one LRU cache of N blocks of 64 tokens, all servers' KV pools
             together (servers x --num-blocks): what placement can
             approach with finite caches, since no placement over the same
             memory holds more than one shared LRU of it does, bar luck

in prompt tokens, as kvsim counts them (cached_tokens / prompt_tokens): a
request's leading full 64-token blocks that are cached, at most its
tokens in - 1.  A block is (session, hash id), as kvload makes its text;
with --shared-prefix (kvload --sessions-shared-prefix 1) a thread's
leading blocks within its system + tool tokens that its thread's first
request has too are (kind of thread, position), the same in every
session.  A request's blocks enter the cache when it is sent, its first
block the most recently used.  Requests are rebuilt as kvload does: the
main agent's and every sub-agent's requests merged in time order (ties:
the file's order), a sub-agent's times from its entry's.  Standard
library only.
"""

import argparse
import collections
import json
import os
import sys
import tarfile

BLOCK = 64


def _thread(reqs, t0, kind, prefix, threads, out):
    """a thread's requests (and its sub-agents'), in the file's order"""
    th = len(threads)
    threads.append((kind, prefix // BLOCK if 0 < prefix < 0x7fffffff else 0))
    for r in reqs:
        typ = r.get("type", "")
        if typ == "subagent":
            _thread(r["requests"], t0 + r["t"],
                    "sub:" + r.get("subagent_type", "subagent"),
                    r.get("system_tokens", 0) + r.get("tool_tokens", 0),
                    threads, out)
            continue
        ids = r["hash_ids"]
        n_in = int(r["in"])
        out.append((t0 + r["t"], len(out), th, n_in,
                    ids[:min(len(ids), n_in // BLOCK)]))


def flatten(session, shared_prefix):
    """[(tokens in, block keys)] in kvload's order"""
    threads, reqs = [], []
    _thread(session["requests"], 0.0, "main",
            session.get("system_tokens", 0) + session.get("tool_tokens", 0),
            threads, reqs)
    reqs.sort(key=lambda r: (r[0], r[1]))
    first = {}
    for r in reqs:
        first.setdefault(r[2], r[4])
    sid = session["id"]
    out = []
    for _, _, th, n_in, ids in reqs:
        kind, prefix = threads[th]
        shared = 0
        if shared_prefix:
            f = first[th]
            while (shared < len(ids) and shared < prefix and shared < len(f)
                   and ids[shared] == f[shared]):
                shared += 1
        keys = [("S", kind, k) if k < shared else (sid, h)
                for k, h in enumerate(ids)]
        out.append((n_in, keys))
    return out


def sessions(path, wanted):
    """{id: session} for the ids wanted, from an archive or a directory"""
    found = {}
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.endswith(".json"))
        # a file named after its session first, else every file
        for pick in (lambda n: n[:-5] in wanted, lambda n: True):
            for n in names:
                if len(found) == len(wanted) or not pick(n):
                    continue
                with open(os.path.join(path, n)) as f:
                    s = json.load(f)
                if s.get("id") in wanted:
                    found[s["id"]] = s
        return found
    with tarfile.open(path, "r:gz") as tar:
        for m in tar:
            if len(found) == len(wanted):
                break
            name = os.path.basename(m.name)
            if not m.isfile() or name[:-5] not in wanted:
                continue
            s = json.load(tar.extractfile(m))
            if s.get("id") in wanted:
                found[s["id"]] = s
    return found


def bounds(reqs, cap_blocks):
    seen = set()
    lru = collections.OrderedDict()
    res = {"requests": len(reqs), "prompt_tokens": 0, "blocks": 0,
           "unlimited_tokens": 0, "lru_tokens": 0,
           "unlimited_blocks": 0, "lru_blocks": 0}
    for n_in, keys in reqs:
        res["prompt_tokens"] += n_in
        res["blocks"] += len(keys)
        hit_u = hit_l = 0
        for h in keys:
            if h not in seen:
                break
            hit_u += 1
        for h in keys[:hit_u]:
            if h not in lru:
                break
            hit_l += 1
        res["unlimited_blocks"] += hit_u
        res["lru_blocks"] += hit_l
        res["unlimited_tokens"] += min(hit_u * BLOCK, n_in - 1)
        res["lru_tokens"] += min(hit_l * BLOCK, n_in - 1)
        # in tail first: the request's head the most recently used
        for h in reversed(keys):
            seen.add(h)
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = True
        while len(lru) > cap_blocks:
            lru.popitem(last=False)
    pt = res["prompt_tokens"] or 1
    nb = res["blocks"] or 1
    res.update({
        "pool_blocks": cap_blocks,
        "unlimited": res["unlimited_tokens"] / pt,
        "lru": res["lru_tokens"] / pt,
        "unlimited_by_blocks": res["unlimited_blocks"] / nb,
        "lru_by_blocks": res["lru_blocks"] / nb,
    })
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sessions")
    ap.add_argument("log")
    ap.add_argument("--pool-blocks", type=int, required=True)
    ap.add_argument("--shared-prefix", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.pool_blocks < 1:
        sys.exit("session_bounds.py: --pool-blocks >= 1")
    sent = []
    with open(a.log) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 3:
                sent.append((parts[0], int(parts[1])))
    if not sent:
        sys.exit("session_bounds.py: no request in %s" % a.log)
    found = sessions(a.sessions, {s for s, _ in sent})
    missing = {s for s, _ in sent} - set(found)
    if missing:
        sys.exit("session_bounds.py: sessions not found: %s"
                 % " ".join(sorted(missing)[:5]))
    flat = {s: flatten(found[s], a.shared_prefix) for s in found}
    reqs = [flat[s][i] for s, i in sent]
    del flat, found
    res = bounds(reqs, a.pool_blocks)
    res.update({"sessions": len({s for s, _ in sent}),
                "shared_prefix": a.shared_prefix})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print("%d requests of %d sessions: hit rate bound %.1f%% unlimited, "
          "%.1f%% LRU of %d blocks (by blocks: %.1f%%, %.1f%%)" % (
              res["requests"], res["sessions"], 100 * res["unlimited"],
              100 * res["lru"], a.pool_blocks,
              100 * res["unlimited_by_blocks"], 100 * res["lru_by_blocks"]))


if __name__ == "__main__":
    main()
