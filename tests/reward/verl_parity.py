#!/usr/bin/env python3
"""rlhfd's rule rewards against verl's own code, on generated responses.

verl's verl/utils/reward_score/gsm8k.py and math_reward.py are loaded from the installed verl
package (deploy/setup.sh installs it without dependencies) by file path, so nothing else of verl
is imported. Responses are drawn from the pieces those functions react to (markers, digits,
separators, LaTeX commands, braces, multi-byte characters) and run long enough to cross gsm8k's
300-character clip; half the ground truths are the answer verl extracts, so both outcomes occur.

The math_dapo and search_r1_qa_em rules are scored under `rule: auto` against verl's
default_compute_score itself (its package loaded with verl's import_utils stubbed, the one thing
of verl it imports), with data sources drawn from the ones it routes to them: the choice of rule
is under test too. Their responses cross math_dapo's 300- and 100-character clips and hold
Minerva "Answer:" lines, boxes, LaTeX shorthand, Search-R1's tags (more than 10 at times),
punctuation, articles, Unicode whitespace, case pairs and digits.

    verl_parity.py SCORE_ROWS_BINARY [--cases N] [--auto-cases N] [--seed S]

Exits 0 when every score equals verl's, 1 listing mismatches, 77 (skipped) without verl.
"""
import argparse
import importlib.util
import json
import os
import random
import re
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


def load_default_compute_score():
    """verl.utils.reward_score.default_compute_score without importing the rest of verl."""
    import types
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    package = os.path.join(root, "utils", "reward_score")
    if not os.path.exists(os.path.join(package, "math_dapo.py")):
        return None
    for name, path in [("verl", root), ("verl.utils", os.path.join(root, "utils"))]:
        stub = types.ModuleType(name)
        stub.__path__ = [path]
        sys.modules[name] = stub
    import_utils = types.ModuleType("verl.utils.import_utils")
    import_utils.deprecated = lambda *args, **kwargs: (lambda function: function)
    sys.modules["verl.utils.import_utils"] = import_utils
    module_spec = importlib.util.spec_from_file_location(
        "verl.utils.reward_score", os.path.join(package, "__init__.py"),
        submodule_search_locations=[package])
    module = importlib.util.module_from_spec(module_spec)
    sys.modules["verl.utils.reward_score"] = module
    module_spec.loader.exec_module(module)
    return module


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


DAPO_SOURCES = ["math_dapo", "math", "math_dapo_reasoning", "aime24", "aime_2025", "aime"]
DAPO_PIECES = ["Answer", "answer", "ANSWER", "An\u017fwer", "Answer:", "Answer: ", ":", " ", "  ",
               "\n", "\t", "\u00a0", "\u3000", "\\boxed{", "}", "{", "$", "=", "\\frac", "frac",
               "\\sqrt", "sqrt", "1", "2", "12", "1,000", ",", ".", "a ", "an ", "\\text{",
               "\\textbf{", "\\overline{", "\\mbox{", "cm", "units", "^\\circ", "^{\\circ}", "\\!",
               ",\\!", "\\$", "\\ ", "\\text{and}", "\u00b2", "\u0663", "\uff11", "x", "\u00e9",
               "\u4e2d", "[INVALID]", "\\ldots", "\"", "{,}", "\\;", "\\text{m}", "\\dots", "ways"]
QA_SOURCES = ["searchR1_nq", "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa",
              "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle"]
QA_PIECES = ["<answer>", "</answer>", "<answer", "answer>", "the", "The", "THE", "a", "A", "an",
             "An", "then", " ", "  ", "\n", "\t", "\u00a0", "\u3000", "\u2028", ".", ",", "!", "'",
             "-", "_", "\u00e9", "\u00c9", "\u0130", "\u00df", "\u1e9e", "\u03a3\u0391", "\u212a",
             "caf\u00e9", "x", "beatles", "Paris", "1", "\u00b2", "\u4e2d", "\u00bf", "\u2014", "a.b",
             "\u00aa", "\u0663"]


def vary_answer(rng, answer):
    """The answer as a target may write it: cased, punctuated or with articles SQuAD drops."""
    return rng.choice([answer, answer.upper(), answer.title(), "The " + answer, answer + ".",
                       " " + answer.replace(" ", "  ") + "\t", "a " + answer + "!"])


def auto_cases(rng, count, compute):
    rows = []
    for k in range(count):
        if k % 2 == 0:
            source = rng.choice(DAPO_SOURCES)
            response = draw(rng, DAPO_PIECES, rng.choice([6, 20, 60, 200]))
            if rng.random() < 0.4:  # no Minerva answer: the box decides
                response = (response.lower().replace("answer", "").replace("an\u017fwer", "")
                            + "\\boxed{" + draw(rng, DAPO_PIECES[13:], 8) + "}"
                            + draw(rng, DAPO_PIECES[13:], rng.choice([2, 40])))
            pred = compute(source, response, "")["pred"]
            truth = draw(rng, DAPO_PIECES, 6)
            if pred is not None and rng.random() < 0.5:
                truth = pred if pred != "[INVALID]" or rng.random() < 0.1 else truth
                if rng.random() < 0.3:  # equal after normalising, for a Minerva answer
                    truth = rng.choice([" ", "an ", "\\$", "x="]) + truth + rng.choice(["", " ", "cm"])
        else:
            source = rng.choice(QA_SOURCES)
            response = draw(rng, QA_PIECES, rng.choice([6, 20, 60]))
            if rng.random() < 0.5:  # one well-formed answer at least
                response = (draw(rng, QA_PIECES, 10) + "<answer>" + draw(rng, QA_PIECES[4:], 6)
                            + "</answer>" + response)
            if rng.random() < 0.15:  # tags enough to be penalised
                response = "<answer></answer>" * rng.randint(9, 12) + response
            matches = re.findall(r"<answer>(.*?)</answer>", response, re.DOTALL)
            targets = [draw(rng, QA_PIECES[4:], 3) for _ in range(rng.randint(0, 3))]
            if matches and rng.random() < 0.5:
                targets.insert(rng.randint(0, len(targets)), vary_answer(rng, matches[-1].strip()))
            truth = {"target": targets if len(targets) != 1 or rng.random() < 0.5 else targets[0]}
        result = compute(source, response, truth)
        expected = result["score"] if isinstance(result, dict) else result
        rows.append({"rule": "auto", "data_source": source, "response": response,
                     "ground_truth": truth, "expected": float(expected)})
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("score_rows")
    parser.add_argument("--cases", type=int, default=30000)
    parser.add_argument("--auto-cases", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    gsm8k, math = load_verl_module("gsm8k"), load_verl_module("math_reward")
    verl_scores = load_default_compute_score()
    if gsm8k is None or math is None or verl_scores is None:
        print("verl is not installed (deploy/setup.sh installs it): skipped")
        return 77
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):  # math_reward prints what it catches
        rows = cases(random.Random(args.seed), args.cases, gsm8k, math)
        rows += auto_cases(random.Random(args.seed), args.auto_cases,
                           verl_scores.default_compute_score)
    text = "".join(json.dumps({k: v for k, v in row.items() if k != "expected"}) + "\n" for row in rows)
    result = subprocess.run([args.score_rows], input=text.encode(), capture_output=True, check=True)
    outputs = [json.loads(line) for line in result.stdout.decode().splitlines()]
    assert len(outputs) == len(rows), (len(outputs), len(rows))
    mismatches = [(row, out) for row, out in zip(rows, outputs) if out.get("score") != row["expected"]]
    counts = {}
    for row in rows:
        key = (row["rule"] if row["rule"] != "auto" else
               "math_dapo" if row["data_source"] in DAPO_SOURCES else "search_r1_qa_em",
               row["expected"])
        counts[key] = counts.get(key, 0) + 1
    print(f"{len(rows)} cases against verl's gsm8k, math_reward and default_compute_score; scores seen: "
          + ", ".join(f"{rule}={score}: {n}" for (rule, score), n in sorted(counts.items())))
    for row, out in mismatches[:20]:
        print(f"MISMATCH {row['rule']} {row.get('data_source', '')}: response={row['response']!r} truth={row['ground_truth']!r} "
              f"verl={row['expected']} rlhfd={out}")
    print(f"{len(mismatches)} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
