#!/usr/bin/env python3
"""Sums GPU kernel time by kernel name in a Chrome trace from `train_bench --profile` or
`rollout_bench --profile` and prints the top entries per step: where a step's GPU time goes, and
how busy the GPU was between the first and the last kernel.

    python3 tests/bench/summarize_trace.py trace.json [steps=2] [top=25]
"""
import collections
import json
import sys


def main(path, steps=2, top=25):
    events = json.load(open(path))["traceEvents"]
    totals = collections.Counter()
    counts = collections.Counter()
    intervals = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") == "kernel")
    busy, end = 0.0, float("-inf")
    for start, stop in intervals:  # Union of kernel intervals.
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    for event in events:
        if event.get("cat") == "kernel":
            name = event["name"][:110]
            totals[name] += event.get("dur", 0)
            counts[name] += 1
    all_us = sum(totals.values())
    span = intervals[-1][1] - intervals[0][0] if intervals else 0
    print(f"GPU kernel time per step: {all_us / steps / 1e3:.3f} ms; GPU busy {100 * busy / max(span, 1):.1f}% "
          f"of the {span / 1e3:.1f} ms from first to last kernel")
    for name, us in totals.most_common(int(top)):
        print(f"{us / steps / 1e3:8.2f} ms {100 * us / all_us:5.1f}% x{counts[name] // steps:<5} {name}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
