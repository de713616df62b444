#!/usr/bin/env python3
"""Sums GPU kernel time by kernel name in a Chrome trace from `train_bench --profile` and prints
the top entries per step: where a training step's GPU time goes.

    python3 tests/bench/summarize_trace.py trace.json [steps=2] [top=25]
"""
import collections
import json
import sys


def main(path, steps=2, top=25):
    events = json.load(open(path))["traceEvents"]
    totals = collections.Counter()
    counts = collections.Counter()
    for event in events:
        if event.get("cat") == "kernel":
            name = event["name"][:110]
            totals[name] += event.get("dur", 0)
            counts[name] += 1
    all_us = sum(totals.values())
    print(f"GPU kernel time per step: {all_us / steps / 1e3:.1f} ms")
    for name, us in totals.most_common(int(top)):
        print(f"{us / steps / 1e3:8.2f} ms {100 * us / all_us:5.1f}% x{counts[name] // steps:<5} {name}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
