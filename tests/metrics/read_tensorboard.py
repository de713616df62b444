#!/usr/bin/env python3
"""Reads a TensorBoard log directory with tensorboard's own EventAccumulator and prints its
scalars as JSON: {"tag": [[step, value], ...]}, non-finite values as rlhfd's JSON spells them
("NaN", "Infinity", "-Infinity"; docs/metrics.md). With --text, its text summaries (the text
plugin's tags) instead: {"tag": [[step, [text, ...]], ...]}. Exit 77 (skipped) without the
tensorboard package.

    read_tensorboard.py [--text] DIR
"""
import json
import math
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util
except ImportError:
    print("tensorboard is not installed", file=sys.stderr)
    sys.exit(77)

text = sys.argv[1] == "--text"
accumulator = EventAccumulator(sys.argv[-1], size_guidance={"scalars": 0, "tensors": 0})
accumulator.Reload()


def value(v):
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def strings(tensor_proto):
    array = tensor_util.make_ndarray(tensor_proto)
    return [item.decode("utf-8") for item in array.reshape(-1).tolist()]


if text:
    try:
        tags = accumulator.PluginTagToContent("text")
    except KeyError:  # no text summaries
        tags = {}
    out = {tag: [[event.step, strings(event.tensor_proto)] for event in accumulator.Tensors(tag)]
           for tag in tags}
else:
    out = {tag: [[event.step, value(event.value)] for event in accumulator.Scalars(tag)]
           for tag in accumulator.Tags()["scalars"]}
print(json.dumps(out, sort_keys=True, allow_nan=False))
