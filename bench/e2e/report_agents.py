"""The agents workload's report (bench/e2e/report.py calls it).

Reads WORKDIR/agents/ and WORKDIR/agents-shared/ (run.sh: per policy
<policy>.json, .meta.json, .bounds.json, and setup.txt), writes
RESULTSDIR/e2e-agents.md and e2e-agents.csv: per variant and policy the
hit rate beside the two bounds of that run's own requests, TTFT
p50/p90/p99, the busiest server's requests over the mean, a session's
share of its requests on its most used server, kvsim's step lag, and
issue 21's goals. Standard library only.
"""

import os

from report_trace import load_json

VARIANTS = [("agents", "sessions apart: each shares nothing"),
            ("agents-shared", "sessions sharing their first system + tool "
                              "tokens (an assumption)")]


def _variant(work, wl, title, policies, titles, csv):
    d = os.path.join(work, wl)
    runs = {}
    for pol in policies:
        run = load_json(os.path.join(d, pol + ".json"))
        if run and run.get("stages"):
            runs[pol] = run
    if not runs:
        return []
    try:
        with open(os.path.join(d, "setup.txt")) as f:
            setup = f.read().split()
    except OSError:
        setup = []
    (servers, blocks, btok, scale, nsess, live, rate, reqs, idle,
     maxtok, skip) = (setup + [""] * 11)[:11]
    md = ["## %s" % title, "",
          "%s sessions (from the %sth selected), at most %s live, arriving "
          "at %s/s; each its first %s requests, pauses over %s s shortened, "
          "prompts under %s tokens; %s kvsim servers x %s blocks of %s "
          "tokens; time scale %s. Times uncompressed." % (
              nsess, skip, live, rate, reqs, idle, maxtok, servers, blocks,
              btok, scale), "",
          "| policy | requests | hit rate | LRU bound | / LRU | unlimited | "
          "TTFT p50 | p90 | p99 | busiest / mean | session on its server | "
          "open / context | err | step lag max / mean (ms) | wall |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
          "---:|---:|"]
    rows = {}
    for pol in policies:
        run = runs.get(pol)
        if run is None:
            continue
        st = run["stages"][0]
        ss = run.get("sessions", {})
        b = load_json(os.path.join(d, pol + ".bounds.json")) or {}
        meta = load_json(os.path.join(d, pol + ".meta.json")) or {}
        hit = (st["cached_tokens"] / st["prompt_tokens"]
               if st["prompt_tokens"] else 0.0)
        lru = b.get("lru", 0.0)
        r = {"hit": hit, "lru": lru, "p90": st["ttft_p90"],
             "p99": st["ttft_p99"], "busiest": ss.get("busiest_share", 0.0),
             "home": ss.get("session_top_share_mean", 0.0)}
        rows[pol] = r
        lag = ("%.1f / %.2f" % (meta["step_lag_max_ms"],
                                meta["step_lag_mean_ms"])
               if "step_lag_max_ms" in meta else "–")
        try:
            pools = int(servers) * int(blocks) * int(btok)
        except ValueError:
            pools = 0
        ctx = ss.get("live_context_tokens_mean", 0.0)
        md.append("| %s | %d | %.1f%% | %.1f%% | %.2f | %.1f%% | %.2f | "
                  "%.2f | %.2f | %.2f | %.1f%% | %.1f / %.1fx | %d | %s | "
                  "%s |" % (
                      titles[pol], st["completed"], 100 * hit, 100 * lru,
                      hit / lru if lru else 0.0,
                      100 * b.get("unlimited", 0.0), st["ttft_p50"],
                      st["ttft_p90"], st["ttft_p99"], r["busiest"],
                      100 * r["home"], ss.get("live_mean", 0.0),
                      ctx / pools if pools else 0.0,
                      st["errors"] + st["dropped"], lag,
                      "%.0f s" % meta["wall_s"] if meta else "–"))
        csv.append("%s,%s,%d,%.4f,%.4f,%.4f,%.3f,%.3f,%.3f,%.3f,%.4f,%d"
                   % (wl, pol, st["completed"], hit, lru,
                      b.get("unlimited", 0.0), st["ttft_p50"],
                      st["ttft_p90"], st["ttft_p99"], r["busiest"],
                      r["home"], st["errors"] + st["dropped"]))
    md += ["", "Bounds: of the requests each run sent, in its order "
           "(`session_bounds.py`): LRU, one LRU cache of all servers' "
           "pools together; unlimited, one cache that never evicts. "
           "Busiest / mean: the busiest server's requests over the mean "
           "of %s servers. Session on its server: the mean over sessions "
           "of the share of its requests on the server that served most "
           "of them. Open / context: the time means of the sessions open "
           "and of their contexts (each one's last prompt) over the "
           "servers' pools together." % servers, ""]
    md += _goals(rows)
    return md


def _goals(rows):
    ev, le = rows.get("kv_aware_events"), rows.get("kv_aware")
    if ev is None or le is None:
        return []

    def mark(ok, txt):
        return ("met" if ok else "missed") + " (" + txt + ")"

    def ratio(a, b):
        return a / b if b else 0.0

    out = ["Issue 21's goals:", "",
           "| goal | |", "|---|---|",
           "| hit rate >= 0.97 of the LRU bound without events | %s |" % mark(
               le["hit"] >= 0.97 * le["lru"],
               "%.3f" % ratio(le["hit"], le["lru"])),
           "| hit rate >= 0.99 of the LRU bound with events | %s |" % mark(
               ev["hit"] >= 0.99 * ev["lru"],
               "%.3f" % ratio(ev["hit"], ev["lru"])),
           "| TTFT p90 without events <= 1.5x with | %s |" % mark(
               le["p90"] <= 1.5 * ev["p90"],
               "%.2fx" % ratio(le["p90"], ev["p90"])),
           "| TTFT p99 without events <= 1.2x with | %s |" % mark(
               le["p99"] <= 1.2 * ev["p99"],
               "%.2fx" % ratio(le["p99"], ev["p99"]))]
    for pol, r in (("without events", le), ("with events", ev)):
        out.append("| busiest server <= 1.3x the mean, %s | %s |" % (
            pol, mark(r["busiest"] <= 1.3, "%.2fx" % r["busiest"])))
    return out + [""]


def report(work, results, policies, titles):
    """True when there was an agents run to report"""
    md = ["# End-to-end: recorded agentic coding sessions", "",
          "Generated by `bench/e2e/run.sh --workloads agents`; method in "
          "`bench/README.md`. Sessions: Claude Code sessions with "
          "sub-agents (`claude_code_sessions.tar.gz`, from "
          "callanjfox/kv-cache-tester, Apache 2.0), replayed by kvload "
          "(`--workload sessions`), each on its own clock.", ""]
    csv = ["variant,policy,requests,hit_rate,bound_lru,bound_unlimited,"
           "ttft_p50,ttft_p90,ttft_p99,busiest_share,session_top_share,"
           "errors"]
    body = []
    for wl, title in VARIANTS:
        body += _variant(work, wl, title, policies, titles, csv)
    if not body:
        return False
    os.makedirs(results, exist_ok=True)
    with open(os.path.join(results, "e2e-agents.md"), "w") as f:
        f.write("\n".join(md + body))
    with open(os.path.join(results, "e2e-agents.csv"), "w") as f:
        f.write("\n".join(csv) + "\n")
    return True
