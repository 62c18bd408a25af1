#!/usr/bin/python3
"""The two hit-rate bounds of a trace window (bench/e2e, trace workload).

trace_bounds.py TRACE --pool-tokens N [--start S] [--seconds D]
                [--count C] [--block-tokens B] [--json OUT]

For the requests kvload replays with the same window (--trace-start,
--trace-seconds, --trace-count), the prefix hit rate of

  unlimited  one cache that never evicts: a leading block seen before hits
  lru        one LRU cache of N tokens, all servers' KV pools together
             (servers x blocks x block tokens): what placement can approach
             with finite caches, since no placement over the same memory
             holds more than one shared LRU of it does, bar luck

in prompt tokens, as kvsim counts them (cached_tokens / prompt_tokens):
a request's leading 512-token blocks that are cached, the last (partial)
block only in whole B-token blocks, at most input_length - 1 tokens. A
request's blocks enter the cache when it arrives, its first block the most
recently used; the LRU evicts whole 512-token blocks, each weighing the
B-token blocks it fills. Block-count rates (the trace README's 36.6%) are
given too. Standard library only.
"""

import argparse
import collections
import json
import sys

TRACE_BLOCK = 512


def window(path, start, seconds, count):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
                t = r["timestamp"] / 1000.0
                ids = r["hash_ids"]
                n_in = int(r["input_length"])
            except (ValueError, KeyError, TypeError):
                continue
            if t < start:
                continue
            if seconds > 0 and t >= start + seconds:
                break
            out.append((n_in, ids))
            if count and len(out) >= count:
                break
    return out


def block_tokens(n_in, k, nids, b):
    """cacheable tokens of the k-th 512-token block"""
    if k < nids - 1:
        return TRACE_BLOCK
    last = n_in - TRACE_BLOCK * (nids - 1)
    return (max(0, min(last, TRACE_BLOCK)) // b) * b


def bounds(reqs, pool_tokens, b):
    seen = set()
    lru = collections.OrderedDict()     # id -> weight in b-token blocks
    cap = pool_tokens // b
    used = 0
    res = {"requests": len(reqs), "prompt_tokens": 0, "blocks": 0,
           "unlimited_tokens": 0, "lru_tokens": 0,
           "unlimited_blocks": 0, "lru_blocks": 0}
    for n_in, ids in reqs:
        res["prompt_tokens"] += n_in
        res["blocks"] += len(ids)
        hit_u = hit_l = 0
        tok_u = tok_l = 0
        alive_u = alive_l = True
        for k, h in enumerate(ids):
            w = block_tokens(n_in, k, len(ids), b)
            alive_u = alive_u and h in seen
            alive_l = alive_l and h in lru
            if alive_u:
                hit_u += 1
                tok_u += w
            if alive_l:
                hit_l += 1
                tok_l += w
            if not (alive_u or alive_l):
                break
        res["unlimited_blocks"] += hit_u
        res["lru_blocks"] += hit_l
        res["unlimited_tokens"] += min(tok_u, n_in - 1)
        res["lru_tokens"] += min(tok_l, n_in - 1)
        # the request's blocks go in tail first: its head the most recent
        for k in range(len(ids) - 1, -1, -1):
            h = ids[k]
            seen.add(h)
            w = max(1, block_tokens(n_in, k, len(ids), b) // b)
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = w
            used += w
            while used > cap and lru:
                _, old = lru.popitem(last=False)
                used -= old
    pt = res["prompt_tokens"] or 1
    nb = res["blocks"] or 1
    res.update({
        "pool_tokens": pool_tokens,
        "unlimited": res["unlimited_tokens"] / pt,
        "lru": res["lru_tokens"] / pt,
        "unlimited_by_blocks": res["unlimited_blocks"] / nb,
        "lru_by_blocks": res["lru_blocks"] / nb,
    })
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--pool-tokens", type=int, required=True)
    ap.add_argument("--start", type=float, default=0.0)
    ap.add_argument("--seconds", type=float, default=0.0)
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--block-tokens", type=int, default=64)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.pool_tokens < 1 or a.block_tokens < 1:
        sys.exit("trace_bounds.py: --pool-tokens and --block-tokens >= 1")
    reqs = window(a.trace, a.start, a.seconds, a.count)
    if not reqs:
        sys.exit("trace_bounds.py: no request in the window")
    res = bounds(reqs, a.pool_tokens, a.block_tokens)
    res["window"] = {"start": a.start, "seconds": a.seconds,
                     "count": a.count}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print("%d requests: hit rate bound %.1f%% unlimited, %.1f%% LRU of %d "
          "tokens (by blocks: %.1f%%, %.1f%%)" % (
              res["requests"], 100 * res["unlimited"], 100 * res["lru"],
              a.pool_tokens, 100 * res["unlimited_by_blocks"],
              100 * res["lru_by_blocks"]))


if __name__ == "__main__":
    main()
