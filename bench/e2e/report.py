#!/usr/bin/python3
"""Markdown tables and the plot's data from kvload's JSON (bench/e2e).

report.py WORKDIR RESULTSDIR [WORKLOAD...]: (only the workloads named, when
some are) reads WORKDIR/<workload>/<policy>.json and
.meta.json (written by run.sh), writes RESULTSDIR/e2e-<policy>.md,
RESULTSDIR/e2e-summary.md, RESULTSDIR/e2e-all.csv and WORKDIR/ttft-p90.dat;
for the trace workload (WORKDIR/trace/) RESULTSDIR/e2e-trace.md and
e2e-trace.csv instead (report_trace.py), for llm-d's (WORKDIR/llm-d/)
RESULTSDIR/e2e-llm-d.md (report_llmd.py), for the agents workload
(WORKDIR/agents/, agents-shared/) RESULTSDIR/e2e-agents.md and
e2e-agents.csv (report_agents.py). Standard library only.
"""

import json
import math
import os
import sys

import report_agents
import report_llmd
import report_trace

POLICIES = ["round_robin", "least_conn", "random_two", "hash_prefix",
            "kv_aware", "kv_aware_events", "kv_aware_bridge",
            "kv_aware_ttft"]
TITLES = {
    "round_robin": "round-robin",
    "least_conn": "least_conn",
    "random_two": "random two least_conn",
    "hash_prefix": "hash $kv_prefix_key consistent",
    "kv_aware": "kv_aware (learned, no events)",
    "kv_aware_events": "kv_aware + KV events",
    "kv_aware_bridge": "kv_aware + engine events via kvbridge (tokens)",
    "kv_aware_ttft": "kv_aware cost=ttft (learned, no events)",
}
WORKLOADS = ["shared-prefix", "multi-turn", "no-sharing", "agent"]


def load(work):
    runs = {}
    for wl in WORKLOADS:
        for pol in POLICIES:
            base = os.path.join(work, wl, pol)
            if not os.path.exists(base + ".json"):
                continue
            with open(base + ".json") as f:
                run = json.load(f)
            meta = {}
            if os.path.exists(base + ".meta.json"):
                with open(base + ".meta.json") as f:
                    meta = json.load(f)
            runs[(wl, pol)] = (run, meta)
    return runs


def fmt(x, digits=2):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if abs(x) >= 100:
        return "%.0f" % x
    if abs(x) >= 10:
        return "%.1f" % x
    return "%.*f" % (digits, x)


def ttft(st, key):
    return st[key] if st["completed"] else float("nan")


def totals(run):
    st = run["stages"]
    out = {k: sum(s[k] for s in st) for k in
           ("sent", "completed", "errors", "dropped", "prompt_tokens",
            "cached_tokens", "output_tokens")}
    out["hit_rate"] = (out["cached_tokens"] / out["prompt_tokens"]
                       if out["prompt_tokens"] else 0.0)
    return out


def stage_table(run):
    rows = ["| QPS | sent | ok | err | drop | TTFT p50 | p90 | p99 | "
            "ITL p50 | e2e p50 | gen tok/s | hit rate | wait queue | "
            "busiest backend |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            "---:|---:|"]
    for s in run["stages"]:
        be = s.get("backends", {})
        share = (max(be.values()) / sum(be.values())) if be else 0.0
        rows.append("| %g | %d | %d | %d | %d | %s | %s | %s | %s | %s | "
                    "%s | %.1f%% | %s | %.0f%% |" % (
                        s["qps"], s["sent"], s["completed"], s["errors"],
                        s["dropped"], fmt(ttft(s, "ttft_p50")),
                        fmt(ttft(s, "ttft_p90")), fmt(ttft(s, "ttft_p99")),
                        fmt(s["itl_p50"] * 1000, 1) + " ms",
                        fmt(s["e2e_p50"], 1), fmt(s["gen_tok_s"]),
                        100 * s["hit_rate"], fmt(s["queue_waiting_mean"], 1),
                        100 * share))
    return rows


def cpu_line(meta):
    if not meta:
        return ""
    return ("wall %.0f s; CPU (share of one core over the run): nginx "
            "%.1f%%, kvsim %.1f%%, kvload %.1f%%; nginx %.0f µs CPU per "
            "request (routing + proxying ~%d SSE chunks); compressed "
            "minimum step %.2f ms" % (
                meta["wall_s"], meta["nginx_cpu_pct"], meta["kvsim_cpu_pct"],
                meta["kvload_cpu_pct"], meta["nginx_us_per_req"],
                meta["output_tokens"], 10.0 / meta["time_scale"]))


def config_line(run):
    run = run["config"]
    wl = run["workload"]
    if wl == "shared-prefix":
        shape = "%d groups x %d prompts, %d + %d tokens in" % (
            run["groups"], run["prompts-per-group"], run["system-tokens"],
            run["question-tokens"])
    elif wl == "multi-turn":
        shape = ("%d conversations x %d turns, %d system + %d per user "
                 "turn" % (run["groups"], run["turns"], run["system-tokens"],
                           run["question-tokens"]))
    elif wl == "agent":
        shape = ("%d agent conversations x %d turns, %d shared system + %d "
                 "task, then %d + %d a turn, think %g ms" % (
                     run["groups"], run["turns"], run["system-tokens"],
                     run["question-tokens"], run["output-tokens"],
                     run["tool-tokens"], run["think-ms"]))
        return "%s: %s, time scale %g, seed %d" % (
            wl, shape, run["time-scale"], run["seed"])
    else:
        shape = "unique prompts of %d tokens" % (
            run["system-tokens"] + run["question-tokens"])
    bound = []
    if run["stage-requests"]:
        bound.append("%d requests" % run["stage-requests"])
    bound.append("%g s" % run["stage-seconds"])
    return ("%s: %s, %d out, stages of at most %s (uncompressed), time "
            "scale %g, seed %d" % (wl, shape, run["output-tokens"],
                                   " / ".join(bound), run["time-scale"],
                                   run["seed"]))


def kv_status(work):
    rows = []
    for wl in WORKLOADS:
        for pol in ("kv_aware", "kv_aware_events", "kv_aware_bridge"):
            path = os.path.join(work, wl, pol + ".status.json")
            try:
                with open(path) as f:
                    ups = list(json.load(f)["upstreams"].values())[0]
            except (OSError, ValueError, KeyError, IndexError):
                continue
            servers = ups.get("servers", [])
            blocks = sum(s.get("blocks", 0) for s in servers)
            matched = sum(s.get("matched", 0) for s in servers)
            fresh = sum(1 for s in servers if s.get("state") == "fresh")
            rows.append("| %s | %s | %d | %d | %d | %s | %s | %.1f%% |" % (
                wl, TITLES[pol], ups.get("requests", 0),
                ups.get("fallbacks", 0),
                ups.get("events", {}).get("messages", 0),
                ups.get("redis", {}).get("state", "–"),
                "%d/%d" % (fresh, len(servers)) if "redis" in ups else "–",
                100.0 * matched / blocks if blocks else 0.0))
    return rows


def agent_table(runs, pols, first):
    rows = ["## agent", "", config_line(first) + ".", "",
            "| policy | later turns on their first server | busiest server "
            "/ mean (conversations) | hit rate | first turns | later turns "
            "| TTFT p50 | p90 | err |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in pols:
        run = runs[("agent", p)][0]
        ag, st = run.get("agent", {}), run["stages"][0]
        rows.append("| %s | %.1f%% | %.2f | %.1f%% | %.1f%% | %.1f%% | %s | "
                    "%s | %d |" % (
                        TITLES[p], 100 * ag.get("later_home_share", 0),
                        ag.get("busiest_share", 0), 100 * st["hit_rate"],
                        100 * ag.get("first_turn_hit_rate", 0),
                        100 * ag.get("later_turn_hit_rate", 0),
                        fmt(ttft(st, "ttft_p50")), fmt(ttft(st, "ttft_p90")),
                        st["errors"]))
    return rows + [""]


def main():
    work, results, only = sys.argv[1], sys.argv[2], set(sys.argv[3:])
    runs = {k: v for k, v in load(work).items() if not only or k[0] in only}
    traced = False
    if not only or "trace" in only:
        traced = report_trace.report(work, results, POLICIES, TITLES)
    if not only or "llm-d" in only:
        traced |= report_llmd.report(work, results, POLICIES, TITLES)
    if not only or "agents" in only:
        traced |= report_agents.report(work, results, POLICIES, TITLES)
    if not runs and not traced:
        sys.exit("report.py: no results under %s" % work)
    if not runs:
        return
    os.makedirs(results, exist_ok=True)

    for pol in POLICIES:
        mine = [(wl, runs[(wl, pol)]) for wl in WORKLOADS if (wl, pol) in runs]
        if not mine:
            continue
        out = ["# %s" % TITLES[pol], ""]
        for wl, (run, meta) in mine:
            out += ["## %s" % wl, "", config_line(run) + ".", ""]
            if meta:
                out += [cpu_line(meta) + ".", ""]
            out += stage_table(run) + [""]
        with open(os.path.join(results, "e2e-%s.md" % pol), "w") as f:
            f.write("\n".join(out))

    summary = ["# End-to-end: nginx policies in front of kvsim", "",
               "Generated by `bench/e2e/run.sh`; see `bench/README.md` "
               "for the method. All times and rates are uncompressed "
               "(measured x time scale): they read as GPU seconds.", ""]
    for wl in WORKLOADS:
        pols = [p for p in POLICIES if (wl, p) in runs]
        if not pols:
            continue
        first = runs[(wl, pols[0])][0]
        if wl == "agent":
            summary += agent_table(runs, pols, first)
            continue
        qps = [s["qps"] for s in first["stages"]]
        summary += ["## %s" % wl, "", config_line(first) + ".", "",
                    "TTFT p90 (s) per offered QPS, then totals over all "
                    "stages and the top stage's throughput.", ""]
        head = ("| policy | " + " | ".join("%g" % q for q in qps) +
                " | hit rate | gen tok/s @%g | wait queue @%g | err+drop |"
                % (qps[-1], qps[-1]))
        summary += [head, "|---" + "|---:" * (len(qps) + 4) + "|"]
        for p in pols:
            run, meta = runs[(wl, p)]
            st = run["stages"]
            tot = totals(run)
            cells = [fmt(ttft(s, "ttft_p90")) for s in st]
            cells += [""] * (len(qps) - len(cells))
            summary.append("| %s | %s | %.1f%% | %s | %s | %d |" % (
                TITLES[p], " | ".join(cells), 100 * tot["hit_rate"],
                fmt(st[-1]["gen_tok_s"]), fmt(st[-1]["queue_waiting_mean"], 1),
                tot["errors"] + tot["dropped"]))
        summary += ["", "| policy | wall | nginx CPU | nginx µs/req | "
                    "kvsim CPU | kvload CPU |",
                    "|---|---:|---:|---:|---:|---:|"]
        for p in pols:
            meta = runs[(wl, p)][1]
            if meta:
                summary.append("| %s | %.0f s | %.1f%% | %.0f | %.1f%% | "
                               "%.1f%% |" % (
                                   TITLES[p], meta["wall_s"],
                                   meta["nginx_cpu_pct"],
                                   meta["nginx_us_per_req"],
                                   meta["kvsim_cpu_pct"],
                                   meta["kvload_cpu_pct"]))
        summary.append("")
        scale = first["config"]["time-scale"]
        summary += ["The compressed minimum step of kvsim is %.2f ms (10 ms / "
                    "%g); nginx's CPU per request above includes proxying "
                    "every streamed token." % (10.0 / scale, scale), ""]

    status = kv_status(work)
    if status:
        summary += ["## kv_aware from the inside", "",
                    "From `kv_aware_status` at the end of each run: "
                    "requests routed, fallbacks to load-only routing, KV "
                    "event messages applied, Redis link, and the share of "
                    "requested prompt blocks the chosen server was known to "
                    "hold.", "",
                    "| workload | policy | requests | fallbacks | events | "
                    "redis | servers fresh | matched/requested blocks |",
                    "|---|---|---:|---:|---:|---|---:|---:|"] + status + [""]

    skipped = os.path.join(work, "skipped.txt")
    if os.path.exists(skipped):
        with open(skipped) as f:
            notes = [l.strip() for l in f if l.strip()]
        if notes:
            summary += ["## Skipped", ""] + ["* " + n for n in notes] + [""]

    with open(os.path.join(results, "e2e-summary.md"), "w") as f:
        f.write("\n".join(summary))

    with open(os.path.join(results, "e2e-all.csv"), "w") as f:
        header = None
        for wl in WORKLOADS:
            for p in POLICIES:
                path = os.path.join(work, wl, p + ".csv")
                if not os.path.exists(path):
                    continue
                with open(path) as c:
                    lines = c.read().splitlines()
                if header is None:
                    header = lines[0]
                    f.write(header + "\n")
                f.write("\n".join(lines[1:]) + "\n")

    pols = [p for p in POLICIES if ("shared-prefix", p) in runs]
    if pols:
        stages = [runs[("shared-prefix", p)][0]["stages"] for p in pols]
        with open(os.path.join(work, "ttft-p90.dat"), "w") as f:
            f.write("qps " + " ".join('"%s"' % TITLES[p] for p in pols) + "\n")
            for i, s in enumerate(stages[0]):
                vals = []
                for st in stages:
                    v = ttft(st[i], "ttft_p90") if i < len(st) else float("nan")
                    vals.append("NaN" if math.isnan(v) or v <= 0 else "%g" % v)
                f.write("%g %s\n" % (s["qps"], " ".join(vals)))
        print(len(pols) + 1)


if __name__ == "__main__":
    main()
