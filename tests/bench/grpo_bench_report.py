#!/usr/bin/env python3
"""Figures of tests/bench/grpo_vs_trl.sh.

    grpo_bench_report.py rlhfd METRICS_JSONL WALL_S   # one JSON line from a job's metrics
    grpo_bench_report.py table RLHFD_JSON TRL_JSON    # the side-by-side table
"""
import json
import sys


def rlhfd(metrics_path, wall):
    rows = [json.loads(line) for line in open(metrics_path)]
    rows = [r["data"] for r in rows if r["step"] >= 1]
    later = rows[1:] or rows  # the first step compiles and warms up
    keys = sorted({k for r in later for k in r if k.startswith(("timing_s/", "perf/", "response_length/"))})
    mean = {k: sum(r.get(k, 0.0) for r in later) / len(later) for k in keys}
    print(json.dumps({"bench": "rlhfd_grpo_step", "steps": len(rows), "job_wall_s": float(wall),
                      "seconds_per_step": mean["timing_s/step"],
                      "step_seconds": [r["timing_s/step"] for r in rows], "mean": mean}))


def table(ours_text, trl_text):
    ours, trl = json.loads(ours_text), json.loads(trl_text)
    m = ours["mean"]
    row = lambda name, a, b="": print(f"{name:28}{a:>10}{b:>10}")
    row("", "rlhfd", "TRL")
    row("seconds per step", f"{ours['seconds_per_step']:.2f}", f"{trl['seconds_per_step']:.2f}")
    for key in ("gen", "update_weights", "old_log_prob", "ref", "reward", "adv", "update_actor"):
        row(f"  timing_s/{key}", f"{m.get('timing_s/' + key, 0):.2f}")
    row("response length", f"{m['response_length/mean']:.0f}", f"{trl['mean_response_length']:.0f}")
    row("tokens/s", f"{m['perf/throughput']:.0f}", f"{trl['tokens_per_s']:.0f}")
    row("peak allocated GiB", f"{m.get('perf/max_memory_allocated_gb', 0):.1f}",
        f"{trl['peak_memory_allocated_gib']:.1f}")
    row("peak reserved GiB", f"{m.get('perf/max_memory_reserved_gb', 0):.1f}",
        f"{trl['peak_memory_reserved_gib']:.1f}")
    row("MFU (actor update)", f"{m.get('perf/mfu/actor', 0):.3f}")
    row("rlhfd / TRL step time", f"{ours['seconds_per_step'] / trl['seconds_per_step']:.2f}")


if __name__ == "__main__":
    {"rlhfd": rlhfd, "table": table}[sys.argv[1]](*sys.argv[2:])
