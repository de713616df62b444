#!/usr/bin/env python3
"""Sums GPU kernel time by kernel name in a Chrome trace from `train_bench --profile` or
`rollout_bench --profile` and prints the top entries per step: where a step's GPU time goes, and
how busy the GPU was between the first and the last kernel, and where it was idle: the gaps
between kernels longer than 100 µs, summed by what the host was doing over them (the innermost
host operation or runtime call covering most of the gap), and the longest gaps.

    python3 tests/bench/summarize_trace.py trace.json [steps=2] [top=25] [from_kernel]

from_kernel: count only the kernels from the first whose name contains it on (a decode step's
kernels alone: `rollout_bench --profile --max_prefill_tokens=B*P` runs the whole prefill first,
then `DecodeAttentionKernel` marks the first decode step), and print each kernel's time a call.
"""
import collections
import json
import sys


def main(path, steps=2, top=25, from_kernel=None):
    events = json.load(open(path))["traceEvents"]
    if from_kernel:
        start = min(e["ts"] for e in events if e.get("cat") == "kernel" and from_kernel in e["name"])
        events = [e for e in events if e.get("ts", 0) >= start]
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
        print(f"{us / steps / 1e3:8.2f} ms {100 * us / all_us:5.1f}% x{counts[name] // steps:<5} "
              f"{us / counts[name]:7.2f} us/call {name}")
    idle_gaps(events, intervals, steps)


def idle_gaps(events, intervals, steps, shortest_us=100, shown=8):
    """The GPU's idle gaps over `shortest_us`, each put down to the host operation that covers
    most of it (the innermost of equal cover), summed by that operation's name."""
    gaps, end = [], intervals[0][1] if intervals else 0.0
    for start, stop in intervals[1:]:
        if start - end > shortest_us:
            gaps.append((end, start))
        end = max(end, stop)
    host = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"])
        for e in events
        if e.get("cat") in ("cpu_op", "cuda_runtime", "user_annotation") and "dur" in e
    )
    by_cause = collections.Counter()
    listed = []
    for begin, stop in gaps:
        best = ("(no host operation)", 0.0, float("inf"))
        for h_begin, h_end, name in host:
            if h_begin >= stop:
                break
            cover = min(h_end, stop) - max(h_begin, begin)
            # More cover wins; of equal cover, the shorter (innermost) operation.
            if cover > best[1] or (cover == best[1] and cover > 0 and h_end - h_begin < best[2]):
                best = (name[:60], cover, h_end - h_begin)
        by_cause[best[0]] += stop - begin
        listed.append((stop - begin, best[0]))
    total = sum(stop - begin for begin, stop in gaps)
    print(f"GPU idle per step: {total / steps / 1e3:.3f} ms in {len(gaps) / steps:.0f} gaps over "
          f"{shortest_us} µs; by the host operation over them:")
    for name, us in by_cause.most_common(shown):
        print(f"{us / steps / 1e3:8.2f} ms  {name}")
    print("the longest gaps:")
    for us, name in sorted(listed, reverse=True)[:shown]:
        print(f"{us / 1e3:8.2f} ms  {name}")
    # Runtime calls that stall the GPU or wait for it (a cudaMalloc of a new segment: the
    # caching allocator emptied, or grown).
    calls = collections.Counter()
    call_us = collections.Counter()
    for e in events:
        if e.get("cat") == "cuda_runtime" and e.get("name") in (
            "cudaMalloc", "cudaFree", "cudaDeviceSynchronize", "cudaStreamSynchronize"
        ):
            calls[e["name"]] += 1
            call_us[e["name"]] += e.get("dur", 0)
    print("runtime calls per step: " + (", ".join(
        f"{name} x{calls[name] // steps} {call_us[name] / steps / 1e3:.2f} ms" for name in sorted(calls)
    ) or "none of cudaMalloc, cudaFree or synchronize"))


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:4]), *sys.argv[4:5])
