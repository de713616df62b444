#!/usr/bin/env python3
"""Reads a TensorBoard log directory with tensorboard's own EventAccumulator and prints its
scalars as JSON: {"tag": [[step, value], ...]}, non-finite values as rlhfd's JSON spells them
("NaN", "Infinity", "-Infinity"; docs/metrics.md). Exit 77 (skipped) without the tensorboard
package.

    read_tensorboard.py DIR
"""
import json
import math
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    print("tensorboard is not installed", file=sys.stderr)
    sys.exit(77)

accumulator = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
accumulator.Reload()


def value(v):
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


scalars = {tag: [[event.step, value(event.value)] for event in accumulator.Scalars(tag)]
           for tag in accumulator.Tags()["scalars"]}
print(json.dumps(scalars, sort_keys=True, allow_nan=False))
