#!/usr/bin/env python3
"""A run's curves as a PNG, from its JSONL logger's file (trainer.loggers: [jsonl]): the mean
training reward per step and each validation score (val-core/..., and each
roles.reward.val_rules rule's val/score/<rule>/mean) at the steps that validated.

    python3 tests/bench/plot_metrics.py <state_dir>/logs/<job>/metrics.jsonl OUT.png [TITLE]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    rows = [json.loads(line) for line in open(sys.argv[1])]
    train = [(r["step"], r["data"]["critic/score/mean"]) for r in rows if "critic/score/mean" in r["data"]]
    validation = {}
    for r in rows:
        for key, value in r["data"].items():
            if key.startswith("val-core/") or (key.startswith("val/score/") and key.count("/") == 3):
                validation.setdefault(key, []).append((r["step"], value))
    figure, axis = plt.subplots(figsize=(7, 4), dpi=110)
    axis.plot(*zip(*train), color="#9bb7e0", linewidth=1, label="critic/score/mean (training batch)")
    if len(train) >= 5:
        window = 5
        smooth = [(train[i][0], sum(v for _, v in train[i - window + 1:i + 1]) / window)
                  for i in range(window - 1, len(train))]
        axis.plot(*zip(*smooth), color="#2a5caa", linewidth=2, label="the same, mean of 5 steps")
    colors = ["#c0392b", "#27ae60", "#8e44ad", "#d35400"]
    for (key, points), color in zip(validation.items(), colors * len(validation)):
        axis.plot(*zip(*points), marker="o", color=color, linewidth=2, label=f"{key} (greedy)")
    axis.set_xlabel("step")
    axis.set_ylabel("reward")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="upper left")
    if len(sys.argv) > 3:
        axis.set_title(sys.argv[3], fontsize=10)
    figure.tight_layout()
    figure.savefig(sys.argv[2])
    print(json.dumps({"png": sys.argv[2], "steps": len(train),
                      "validation": {k: v for k, v in validation.items()}}))


if __name__ == "__main__":
    main()
