#!/usr/bin/env python3
"""The pd benchmark's report (bench/e2e/pd.sh): per arm and stage, TTFT,
token gaps (ITL), tokens/s; per arm, what kvsim computed and moved and
what nginx split; issue 20's goals with their ratios from this run.

    report_pd.py WORK RESULT.md "the command"

WORK holds WORKLOAD/ARM.{json,metrics,access.log,status.json} and
cost.md, setup.txt and notes.txt; RESULT.md is written.
"""

import json
import os
import re
import sys
from collections import defaultdict

ARMS = [
    ("agg_kv", "aggregated, kv_aware + events (8 servers)"),
    ("pd_kv", "disaggregated, kv_aware + events on both pools (4 + 4)"),
    ("pd_rr", "disaggregated, round-robin on both pools (4 + 4)"),
    ("pd_vllm", "pd_kv with mode=vllm: nginx runs both legs"),
]
WORKLOADS = ["shared-prefix", "agent", "sessions"]


def metrics(path):
    """Sums of kvsim's counters over a pool's servers: {(pool, name): v}."""
    out = defaultdict(float)
    if not os.path.exists(path):
        return out
    for line in open(path):
        f = line.split()
        if len(f) < 3 or f[1].startswith("#"):
            continue
        out[(f[0], f[1].split("{")[0])] += float(f[-1])
    return out


def pool_sum(m, name):
    return sum(v for (pool, n), v in m.items() if n == name)


def computed(m):
    return (pool_sum(m, "vllm:prefix_cache_queries_total")
            - pool_sum(m, "vllm:prefix_cache_hits_total"))


def windows(base, n):
    """Per stage: (prefill tokens computed, KV bytes moved) between the
    counters pd.sh read at the stage's start and end (the last stage: to
    the run's end, its drain included); None where a reading is missing."""
    out, prev = [], defaultdict(float)
    for i in range(1, n + 1):
        path = base + (".metrics.%d" % i if i < n else ".metrics")
        if not os.path.exists(path):
            out.append(None)
            prev = None
            continue
        cur = metrics(path)
        if prev is None:
            out.append(None)
        else:
            out.append((computed(cur) - computed(prev),
                        cur[("decode", "kvsim_pd_bytes_pulled_total")]
                        - prev[("decode", "kvsim_pd_bytes_pulled_total")]))
        prev = cur
    return out


def access(path):
    """The access log's request lines (the status page's left out)."""
    rows = []
    if not os.path.exists(path):
        return rows
    for line in open(path):
        f = line.split()
        if len(f) < 5 or not f[2].startswith("/v1/"):
            continue
        kv = dict(x.split("=", 1) for x in f[4:] if "=" in x)
        kv["status"], kv["upstream"] = f[1], f[3]
        rows.append(kv)
    return rows


def held_decision(rows):
    """Agent conversations: a turn whose decode server served the turn
    before holds all of its prompt but that turn's new tokens (under
    min_uncached: no split needed).  Of those turns, how many nginx served
    without a split; and how many turns went elsewhere."""
    last = {}
    held = kept = 0
    for r in rows:                       # logged as they end: per
        conv = r.get("conv", "-")        # conversation, in turn order
        if conv == "-":
            continue
        if last.get(conv) == r["upstream"]:
            held += 1
            kept += r.get("pd") != "split"
        last[conv] = r["upstream"]
    return held, kept


def load(work, wl, arm):
    base = os.path.join(work, wl, arm)
    if not os.path.exists(base + ".json"):
        return None
    run = json.load(open(base + ".json"))
    stages = [s for s in run["stages"] if not s.get("warmup")]
    m = metrics(base + ".metrics")
    rows = access(base + ".access.log")
    splits = sum(1 for r in rows if r.get("pd") == "split")
    dec = defaultdict(int)
    for r in rows:
        dec[r.get("pd", "-")] += 1
    return {
        "stages": stages,
        "windows": windows(base, len(stages)),
        "computed": pool_sum(m, "vllm:prefix_cache_queries_total")
        - pool_sum(m, "vllm:prefix_cache_hits_total"),
        "computed_prefill": m[("prefill", "vllm:prefix_cache_queries_total")]
        - m[("prefill", "vllm:prefix_cache_hits_total")],
        "prompt": m[("decode", "vllm:prompt_tokens_total")],
        "bytes": m[("decode", "kvsim_pd_bytes_pulled_total")],
        "blocks": m[("decode", "kvsim_pd_blocks_pulled_total")],
        "pulls": m[("decode", "kvsim_pd_pulls_total")],
        "fallbacks": m[("decode", "kvsim_pd_fallbacks_total")],
        "evictions": m[("decode", "kvsim_cache_evictions_total")],
        "lag_max": max((v for (p, n), v in m.items()
                        if n == "kvsim_step_lag_max_ms"), default=0.0),
        "requests": len(rows),
        "splits": splits,
        "decisions": dict(dec),
        "held": held_decision(rows),
        "alerts": os.path.getsize(base + ".alerts")
        if os.path.exists(base + ".alerts") else 0,
    }


def ratio(a, b):
    return a / b if b else float("nan")


def verdict(ok):
    return "met" if ok else "NOT met"


def main():
    work, result, cmd = sys.argv[1], sys.argv[2], sys.argv[3]
    setup = open(os.path.join(work, "setup.txt")).read().split()
    scale, min_unc, n, npf, ndc, blocks, bt, bw, tb = setup
    out = []
    w = out.append
    w("# pd: disaggregated prefill/decode (issue 20)\n")
    la = os.path.join(work, "loadavg")
    la = (open(la) if os.path.exists(la) else open("/proc/loadavg")) \
        .read().split()[:3]
    # a machine busy with more than this run (two cores: the run itself
    # keeps about one and a half busy) stretches kvsim's steps
    loaded = float(la[1]) > 2.5
    w("%s (load average %s over the last 1, 5 and 15 minutes at the run's "
      "end): latencies and "
      "rates are kvsim's simulated ones, compressed %sx; a loaded machine "
      "stretches kvsim's steps (step lag below) and so every arm's "
      "figures, not their mechanism.%s\n"
      % ("**Run on a loaded machine, shared with other builds and tests**"
         if loaded else "Run on a 2-core machine running nothing else",
         " / ".join(la), scale,
         "  Rerun idle for figures to quote." if loaded else ""))
    w("Command: `%s`%s.\n" % (cmd, "" if " -" in cmd
                                 else " (the default run)"))
    w("Setup: %s kvsim servers of %s blocks x %s tokens; aggregated: all %s "
      "`--role both`; disaggregated: %s `--role prefill` + %s `--role decode "
      "--sidecar` (the same 8 simulated GPUs, one a server; pd_vllm's "
      "decode servers without `--sidecar`); KV pulled at %s "
      "GB/s, %s bytes a token; `kv_aware_prefill prefill mode=header "
      "min_uncached=%s` (pd_vllm: `mode=vllm`); time scale %s.  Figures "
      "are uncompressed (simulated seconds).  ITL: gaps between "
      "consecutive tokens (kvload's gap_p50, gap_p99; a p50 of 0: most "
      "tokens arrive in the same read as the one before, kvsim's steps "
      "being 3.3 ms real at scale 3 and a loaded machine batching them), "
      "and the "
      "median of each request's mean gap (request ITL).  Prefill tokens "
      "computed: kvsim's prompt tokens less prefix-cache hits, both "
      "pools; KV moved: the decode pool's `kvsim_pd_bytes_pulled_total`; "
      "per stage, between the servers' counters read at the stage's "
      "start and end in real time (a request's work counts in the stage "
      "it ran in; the last stage runs to the run's end), and over the "
      "whole run.\n"
      % (n, blocks, bt, n, npf, ndc, bw, tb, min_unc, scale))
    w("Agentic workloads: kvload's `agent` (24 conversations x 8 turns, "
      "a 1,000-token shared system prompt, 2,000-token tasks, each turn "
      "+100 tokens out +800 tool tokens) and, with `--workloads "
      "sessions`, the recorded Claude Code sessions (../shared/traces/"
      "claude_code_sessions.tar.gz; kvload --workload sessions at "
      "bench-e2e's --quick sizes: 24 sessions of their first 10 "
      "requests, sub-agents included, 12 open at once).\n")

    res = {}
    for wl in WORKLOADS:
        for arm, _ in ARMS:
            r = load(work, wl, arm)
            if r:
                res[(wl, arm)] = r

    for wl in WORKLOADS:
        if not any((wl, a) in res for a, _ in ARMS):
            continue
        w("## %s\n" % wl)
        w("| arm | QPS | sent | ok | err | TTFT p50 s | TTFT p90 s "
          "| ITL p50 ms | ITL p99 ms | request ITL p50 ms | tokens/s "
          "| hit | prefill tokens computed | KV moved GB |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for arm, _ in ARMS:
            r = res.get((wl, arm))
            if not r:
                continue
            for s, win in zip(r["stages"], r["windows"]):
                w("| %s | %s | %d | %d | %d | %.3f | %.3f | %.1f | %.1f "
                  "| %s | %.0f | %.3f | %s | %s |" % (
                      arm, ("%g" % s["qps"]) if s["qps"] else "closed",
                      s["sent"], s["completed"], s["errors"],
                      s["ttft_p50"], s["ttft_p90"],
                      1e3 * s.get("gap_p50", float("nan")),
                      1e3 * s.get("gap_p99", float("nan")),
                      ("%.1f" % (1e3 * s["itl_p50"])) if s["itl_p50"]
                      else "-", s["gen_tok_s"], s["hit_rate"],
                      "%.3g" % win[0] if win else "-",
                      "%.1f" % (win[1] / 1e9) if win else "-"))
        w("")
        w("| arm | requests | split | decisions ($kv_aware_pd) "
          "| prefill tokens computed | of which prefill pool "
          "| KV moved GB | blocks pulled | pulls | sidecar fallbacks "
          "| decode evictions | step lag max ms |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for arm, _ in ARMS:
            r = res.get((wl, arm))
            if not r:
                continue
            dec = ", ".join("%s %d" % kv for kv in sorted(
                r["decisions"].items())) if arm in ("pd_kv", "pd_vllm") else \
                ("all split" if arm == "pd_rr" else "-")
            w("| %s | %d | %.1f%% | %s | %.3g | %.3g | %.1f | %d | %d | %d "
              "| %d | %.0f |" % (
                  arm, r["requests"],
                  100.0 * ratio(r["splits"], r["requests"]), dec,
                  r["computed"], r["computed_prefill"], r["bytes"] / 1e9,
                  r["blocks"], r["pulls"], r["fallbacks"], r["evictions"],
                  r["lag_max"]))
        w("")

    # the goals, at the top stage of shared-prefix (the agent run's one)
    w("## Goals (issue 20), from this run\n")
    w("| goal | workload | measured | ratio | bound | |")
    w("|---|---|---|---|---|---|")
    for wl in WORKLOADS:
        kv, rr, ag = (res.get((wl, a)) for a in ("pd_kv", "pd_rr", "agg_kv"))
        if kv and rr:
            a, b = kv["stages"][-1], rr["stages"][-1]
            q = ratio(a["ttft_p90"], b["ttft_p90"])
            w("| disagg kv_aware / disagg round-robin, TTFT p90, top stage "
              "| %s | %.3f s / %.3f s | %.3f | <= 0.3 | %s |"
              % (wl, a["ttft_p90"], b["ttft_p90"], q, verdict(q <= 0.3)))
            if kv["windows"][-1] and rr["windows"][-1] \
                    and len(kv["stages"]) > 1:
                a, b = kv["windows"][-1][1], rr["windows"][-1][1]
                q = ratio(a, b)
                w("| disagg kv_aware / disagg round-robin, KV moved, top "
                  "stage (its start to the run's end) | %s | %.1f GB / "
                  "%.1f GB | %.3f | <= 0.5 | %s |"
                  % (wl, a / 1e9, b / 1e9, q, verdict(q <= 0.5)))
            q = ratio(kv["bytes"], rr["bytes"])
            w("| disagg kv_aware / disagg round-robin, KV moved (whole run) "
              "| %s | %.1f GB / %.1f GB | %.3f | <= 0.5 | %s |"
              % (wl, kv["bytes"] / 1e9, rr["bytes"] / 1e9, q,
                 verdict(q <= 0.5)))
        if kv and ag:
            a, b = kv["stages"][-1], ag["stages"][-1]
            q = ratio(a["gap_p99"], b["gap_p99"])
            w("| disagg kv_aware / aggregated kv_aware, ITL p99, top stage "
              "| %s | %.1f ms / %.1f ms | %.3f | <= 0.5 | %s |"
              % (wl, 1e3 * a["gap_p99"], 1e3 * b["gap_p99"], q,
                 verdict(q <= 0.5)))
            q = ratio(a["gen_tok_s"], b["gen_tok_s"])
            w("| disagg kv_aware / aggregated kv_aware, tokens/s, top stage "
              "| %s | %.0f / %.0f | %.3f | >= 0.95 | %s |"
              % (wl, a["gen_tok_s"], b["gen_tok_s"], q, verdict(q >= 0.95)))
        if kv and wl == "agent":
            held, kept = kv["held"]
            if held and kv["evictions"]:
                w("| requests whose decode server holds their prefix served "
                  "without a split | %s | n/a: the decode servers evicted "
                  "%d blocks | | >= 0.9 | |" % (wl, kv["evictions"]))
            elif held:
                q = ratio(kept, held)
                w("| requests whose decode server holds their prefix served "
                  "without a split | %s | %d of %d | %.3f | >= 0.9 | %s |"
                  % (wl, kept, held, q, verdict(q >= 0.9)))
    w("")
    w("The decision's goal: a request \"whose prefix the decode server "
      "holds\" is an agent turn sent to the decode server that served its "
      "conversation's turn before (nginx's access log: `$upstream_addr`, "
      "the conversation from the body); that server holds every block of "
      "the turn before's prompt (decode evictions above: 0 means none was "
      "lost), so only the turn's new ~900 tokens are uncached, under "
      "min_uncached.  In shared-prefix every question (1,200 tokens) is "
      "uncached on any server, so every request there is rightly split.\n")

    cost = os.path.join(work, "cost.md")
    if os.path.exists(cost) and os.path.getsize(cost):
        w("## nginx's cost of a split request (bench/pd_cost.sh)\n")
        w(open(cost).read())
    notes = os.path.join(work, "notes.txt")
    if os.path.exists(notes) and os.path.getsize(notes):
        w("## Notes\n")
        w("".join("* " + x for x in open(notes)))
    alerts = sum(r["alerts"] for r in res.values())
    w("nginx [alert]/[crit]/[emerg] lines in the arms' error logs: %d.\n"
      % alerts)
    open(result, "w").write("\n".join(out))
    print(open(result).read())


if __name__ == "__main__":
    main()
