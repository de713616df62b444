#!/usr/bin/env python3
"""Writes training data as rlhfd reads it (JSONL, one prompt per line; docs/data.md).

    # Math problems generated offline by reasoning-gym (pip install reasoning-gym), in GSM8K's
    # shape: a chat prompt asking for the final answer after "####", the answer as ground truth.
    python deploy/prepare_data.py reasoning-gym basic_arithmetic data/arith/train.jsonl \\
        --size 2000 --seed 1
    python deploy/prepare_data.py reasoning-gym basic_arithmetic data/arith/test.jsonl \\
        --size 200 --seed 100000 --exclude data/arith/train.jsonl   # held out

    # reasoning-gym makes problem i from the seed plus i: seed 2 is seed 1 shifted by one
    # problem. A test set wants a far seed and --exclude (which drops the training set's prompts
    # and says how many).

    # verl's parquet files (pyarrow, in .venv), row by row, keys kept.
    python deploy/prepare_data.py parquet ~/data/gsm8k/train.parquet data/gsm8k/train.jsonl

Each row: {"prompt": [{"role": "user", "content": ...}], "ground_truth": "...",
"data_source": "...", "extra_info": {...}}; verl's rows keep their reward_model.ground_truth,
which rlhfd reads too.
"""
import argparse
import base64
import json
import os
import sys

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
NUMBER_INSTRUCTION = "Answer with the number only."


def write_rows(rows, out_path):
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    count = 0
    with open(out_path, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    print(f"wrote {count} rows to {out_path}")


def prompt_key(row):
    return json.dumps(row.get("prompt"), sort_keys=True, ensure_ascii=False)


def excluded_prompts(paths):
    """The prompts of existing JSONL files, for a held-out set that shares none of them."""
    keys = set()
    for path in paths:
        try:
            with open(path, encoding="utf-8") as rows:
                for number, line in enumerate(rows, 1):
                    if not line.strip():
                        continue
                    try:
                        keys.add(prompt_key(json.loads(line)))
                    except (json.JSONDecodeError, AttributeError):
                        sys.exit(f"--exclude {path}: line {number} is not a JSON object")
        except OSError as error:
            sys.exit(f"--exclude {path}: {error.strerror}")
        except UnicodeDecodeError:
            sys.exit(f"--exclude {path}: not UTF-8 text (a JSONL file is)")
    return keys


def from_reasoning_gym(args):
    try:
        import reasoning_gym
    except ImportError:
        sys.exit("reasoning-gym is not installed: pip install reasoning-gym")
    options = {}
    for item in args.option:
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)  # numbers, booleans, lists
        except json.JSONDecodeError:
            options[key] = value
        if isinstance(options[key], list):
            options[key] = tuple(options[key])
    try:
        dataset = reasoning_gym.create_dataset(args.dataset, size=args.size, seed=args.seed, **options)
    except TypeError as error:
        sys.exit(f"reasoning-gym {args.dataset}: {error} (--option takes its config's fields)")
    source = args.data_source or f"reasoning_gym/{args.dataset}"
    exclude = excluded_prompts(args.exclude)
    rows, dropped = [], 0
    for index, item in enumerate(dataset):
        content = {"gsm8k": f"{item['question']} {GSM8K_INSTRUCTION}",
                   "number": f"{item['question']} {NUMBER_INSTRUCTION}",
                   "plain": item["question"]}[args.style]
        row = {
            "prompt": [{"role": "user", "content": content}],
            "ground_truth": str(item["answer"]),
            "data_source": source,
            "extra_info": {"index": index, "dataset": args.dataset},
        }
        if prompt_key(row) in exclude:
            dropped += 1
            continue
        rows.append(row)
    if args.exclude:
        # Small problem spaces (one-digit sums) repeat across seeds; say so rather than hide it.
        print(f"dropped {dropped} of {args.size} problems whose prompt is in --exclude")
    if exclude and not rows:
        sys.exit("every generated problem is in --exclude: the dataset's space is too small for a "
                 "held-out set; widen its options (e.g. max_digits)")
    write_rows(rows, args.out)


def plain(value):
    """A parquet cell (as pyarrow's to_pylist gives it) as a JSON value: bytes as base64 text,
    dates, times and decimals as their text."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        # A map column reads as a list of (key, value) pairs.
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return {str(k): plain(v) for k, v in value}
        return [plain(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def from_parquet(args):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        sys.exit("pyarrow is not installed: pip install pyarrow (deploy/setup.sh installs it in "
                 ".venv)")
    parquet = pq.ParquetFile(os.path.expanduser(args.input))

    def rows():
        # A row group at a time: the whole file is never held as Python objects.
        for group in range(parquet.num_row_groups):
            for row in parquet.read_row_group(group).to_pylist():
                yield {k: plain(v) for k, v in row.items()}

    write_rows(rows(), args.out)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    gym = commands.add_parser("reasoning-gym", help="generate problems with reasoning-gym")
    gym.add_argument("dataset", help="a reasoning-gym dataset, e.g. basic_arithmetic, gsm_symbolic")
    gym.add_argument("out", help="JSONL file to write")
    gym.add_argument("--size", type=int, default=1000)
    gym.add_argument("--seed", type=int, default=1)
    gym.add_argument("--data-source", default="", help="default reasoning_gym/<dataset>")
    gym.add_argument("--style", choices=["gsm8k", "number", "plain"], default="gsm8k",
                     help='gsm8k: ask for the final answer after "####" (the gsm8k reward rule); '
                          'number: ask for the number alone (the arithmetic rule)')
    gym.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                     help="a field of the dataset's config, e.g. max_terms=2 or operators='[\"+\"]'")
    gym.add_argument("--exclude", action="append", default=[], metavar="JSONL",
                     help="leave out problems whose prompt is in this file (e.g. the training set)")
    gym.set_defaults(run=from_reasoning_gym)
    parquet = commands.add_parser("parquet", help="convert a verl parquet file to JSONL")
    parquet.add_argument("input")
    parquet.add_argument("out")
    parquet.set_defaults(run=from_parquet)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
