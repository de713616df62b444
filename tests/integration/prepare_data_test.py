#!/usr/bin/env python3
"""deploy/prepare_data.py's reasoning-gym command, run as a user runs it.

    prepare_data_test.py REPO_ROOT

reasoning-gym makes problem i of a dataset from the seed plus i, so sets made with nearby seeds
share problems: this checks that --exclude leaves every prompt of the training set out of the
test set (and says how many it dropped), that a space too small for a held-out set is an error
naming --exclude, that an unreadable, malformed or binary --exclude file is an error naming it, and that
the rows are verl-style chat rows; and that the parquet command converts verl's rows. Exit 77 (skipped) where reasoning-gym is not installed.
"""
import json
import os
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
    try:
        import reasoning_gym  # noqa: F401
    except ImportError:
        print("reasoning-gym is not installed: skipped")
        return 77
    failures = []

    def check(condition, what):
        if not condition:
            failures.append(what)
            print("FAILED:", what)

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
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
