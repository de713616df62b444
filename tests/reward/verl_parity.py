#!/usr/bin/env python3
"""rlhfd's gsm8k and math reward rules against verl's own code, on generated responses.

verl's verl/utils/reward_score/gsm8k.py and math_reward.py are loaded from the installed verl
package (deploy/setup.sh installs it without dependencies) by file path, so nothing else of verl
is imported. Responses are drawn from the pieces those functions react to (markers, digits,
separators, LaTeX commands, braces, multi-byte characters) and run long enough to cross gsm8k's
300-character clip; half the ground truths are the answer verl extracts, so both outcomes occur.

    verl_parity.py SCORE_ROWS_BINARY [--cases N] [--seed S]

Exits 0 when every score equals verl's, 1 listing mismatches, 77 (skipped) without verl.
"""
import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys


def load_verl_module(name):
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "utils", "reward_score", name + ".py")
    if not os.path.exists(path):
        return None
    module_spec = importlib.util.spec_from_file_location("verl_reward_" + name, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


GSM8K_PIECES = ["#### ", "####", "#", "-", "1", "2", "72", "300", ",", ".", "$", " ", "\n", "x",
                "\u00e9", "\u4e2d", "answer", "1,000", "-0.5"]
MATH_PIECES = ["\\boxed{", "\\boxed ", "\\boxed", "\\fbox{", "}", "{", "$", "\\frac", "\\dfrac",
               "\\tfrac", "\\sqrt", "1", "2", "12", "0", "0.5", ".", " ", "=", "x", "k", "/", "-",
               "\\left(", "\\right)", "^\\circ", "^{\\circ}", "\\%", "%", "\\text{ ", "cm",
               "\\!", "\\\\", "\\$", "\n", "\u00e9", ",", "a", "b", "3"]


def draw(rng, pieces, longest):
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, longest)))


def cases(rng, count, gsm8k, math):
    rows = []
    for _ in range(count):
        kind = rng.choice(["gsm8k", "gsm8k_flexible", "math"])
        if kind.startswith("gsm8k"):
            response = draw(rng, GSM8K_PIECES, rng.choice([8, 40, 400]))
            method = "flexible" if kind == "gsm8k_flexible" else "strict"
            extracted = gsm8k.extract_solution(response, method=method)
            truth = extracted if extracted is not None and rng.random() < 0.5 else draw(rng, GSM8K_PIECES[4:12], 3)
            expected = gsm8k.compute_score(response, truth, method=method)
        else:
            response = draw(rng, MATH_PIECES, rng.choice([6, 20, 60]))
            boxed = math.last_boxed_only_string(response)
            truth = draw(rng, MATH_PIECES, 6)
            if boxed is not None and rng.random() < 0.5:
                try:
                    truth = math.remove_boxed(boxed)
                except Exception:
                    pass
                if rng.random() < 0.5:
                    truth = truth + rng.choice([" ", "\\!", "\n", ""])  # equal after normalising
            expected = math.compute_score(response, truth)
        rows.append({"rule": kind, "response": response, "ground_truth": truth,
                     "expected": float(expected)})
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("score_rows")
    parser.add_argument("--cases", type=int, default=30000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    gsm8k, math = load_verl_module("gsm8k"), load_verl_module("math_reward")
    if gsm8k is None or math is None:
        print("verl is not installed (deploy/setup.sh installs it): skipped")
        return 77
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):  # math_reward prints what it catches
        rows = cases(random.Random(args.seed), args.cases, gsm8k, math)
    text = "".join(json.dumps({k: v for k, v in row.items() if k != "expected"}) + "\n" for row in rows)
    result = subprocess.run([args.score_rows], input=text.encode(), capture_output=True, check=True)
    outputs = [json.loads(line) for line in result.stdout.decode().splitlines()]
    assert len(outputs) == len(rows), (len(outputs), len(rows))
    mismatches = [(row, out) for row, out in zip(rows, outputs) if out.get("score") != row["expected"]]
    counts = {}
    for row in rows:
        key = (row["rule"], row["expected"])
        counts[key] = counts.get(key, 0) + 1
    print(f"{len(rows)} cases against verl {gsm8k.__name__} / {math.__name__}; scores seen: "
          + ", ".join(f"{rule}={score}: {n}" for (rule, score), n in sorted(counts.items())))
    for row, out in mismatches[:20]:
        print(f"MISMATCH {row['rule']}: response={row['response']!r} truth={row['ground_truth']!r} "
              f"verl={row['expected']} rlhfd={out}")
    print(f"{len(mismatches)} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
