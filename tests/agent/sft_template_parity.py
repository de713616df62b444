#!/usr/bin/env python3
"""trainer.mode sft's rows against transformers' chat template, from verl's multi-turn SFT layout.

Random conversations as verl's MultiTurnSFTDataset reads them (messages with OpenAI tool_calls on
assistant turns, content null beside them, arguments as objects or as JSON text; the row's tool
schemas under `tools`, as a list or as JSON text; user and tool turns between assistant turns; a
system turn or none) are written as JSONL and as Parquet (pyarrow). encode_conversations reads
each file with the controller's reader and encodes each row with the worker's code (the prompt
with the row's tools, the target turns with their mask). The reference is transformers'
apply_chat_template with the model's own template on the same rows (the Parquet rows as pyarrow
reads them back, nulls and key order included, as verl's pandas reader hands them over):
- the prompt: the template's text for the turns before the first assistant turn with the
  generation prompt, and its token ids;
- the prompt and target ids together: the ids of the template's text for the whole conversation,
  but its last newline;
- the mask: 1 exactly on each assistant turn's tokens after its generation prompt, through its
  <|im_end|> (the template's text for the turns up to it, with and without the generation
  prompt, gives the span). verl's per-message tokenization also trains on the newline after
  <|im_end|>, which a rollout never generates; this test holds rlhfd to the span.
Arguments given as JSON text are rendered as the object they hold (Qwen3's template prints the
text; Qwen2.5's would quote it, which no model is trained to write), so the reference gets the
object.

Single-turn rows (data.response_key, verl's SFTDataset: the prompt and the response text under
extra_info, as verl's gsm8k SFT example reads them) against that dataset's own rule: the
template's text for the prompt as a user turn with the generation prompt, then the response and
the tokenizer's eos token tokenized on their own, the response's tokens trained on.

    sft_template_parity.py ENCODE_CONVERSATIONS [--model DIR]... [--cases N] [--seed S]

Exits 77 (skipped) without transformers or pyarrow.
"""
import argparse
import copy
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
DEFAULT_MODELS = [os.path.join(ROOT, "tests", "fixtures", "models", "tiny-qwen2-tools"),
                  os.path.join(ROOT, "models", "qwen2.5-coder-0.5b-instruct")]

WORDS = ["Compute", "the", "sum", "naïve", "数学", "😀", "x", "<b>", "#### 7", "quotes \"here\"",
         "back\\slash", "tab\there", "line\nbreak", "{\"json\": 1}", "</tool_call>"]
# Each argument and property name has one type, so that a Parquet column can hold them all.
ARGUMENTS = {"code": "str", "timeout": "int", "verbose": "bool", "scale": "float",
             "files": "list", "a_first": "str", "zeta": "int"}


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


def text(rng, words=5):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, words)))


def value(rng, kind):
    return {"str": lambda: text(rng), "int": lambda: rng.randint(-5, 10 ** 6),
            "bool": lambda: rng.random() < 0.5, "float": lambda: rng.choice([0.5, 1e-06, 2.25, 3.0]),
            "list": lambda: [text(rng, 2) for _ in range(rng.randint(0, 3))]}[kind]()


def names(rng):
    return rng.sample(sorted(ARGUMENTS), rng.randint(1, 3))  # a random order, often unsorted


def tool_schema(rng, name):
    properties = {key: {"type": "string", "description": text(rng, 3)} for key in names(rng)}
    return {"type": "function",
            "function": {"name": name, "description": text(rng),
                         "parameters": {"type": "object", "properties": properties,
                                        "required": [next(iter(properties))]}}}


def conversation(rng, as_text):
    tools = [tool_schema(rng, name) for name in rng.sample(["python", "search", "calc"], rng.randint(1, 2))]
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": text(rng)})
    messages.append({"role": "user", "content": text(rng, 8)})
    for _ in range(rng.randint(0, 2)):
        if rng.random() < 0.7:
            calls = []
            for _ in range(rng.randint(1, 2)):
                arguments = {key: value(rng, ARGUMENTS[key]) for key in names(rng)}
                if as_text and rng.random() < 0.5:
                    arguments = json.dumps(arguments, ensure_ascii=rng.random() < 0.5)
                call = {"name": rng.choice(tools)["function"]["name"], "arguments": arguments}
                # The flat form in JSONL only: a Parquet column of both forms gives each call
                # both fields, and the template would take the null `function`.
                flat = as_text and rng.random() < 0.2
                calls.append(call if flat else {"type": "function", "function": call})
            content = rng.choice([None, "", text(rng)]) if as_text else rng.choice(["", text(rng)])
            messages.append({"role": "assistant", "content": content, "tool_calls": calls})
            messages += [{"role": "tool", "content": rng.choice(["42", "", text(rng), "a\n\nb"])}
                         for _ in calls]
        else:
            messages.append({"role": "assistant", "content": text(rng)})
            messages.append({"role": "user", "content": text(rng)})
    messages.append({"role": "assistant", "content": text(rng)})
    row = {"messages": messages, "tools": tools}
    if as_text and rng.random() < 0.3:
        row["tools"] = json.dumps(tools)
    return row


def as_reference(row):
    """The row as the template is given it: tools and arguments as objects."""
    row = copy.deepcopy(row)
    tools = row.get("tools")
    tools = json.loads(tools) if isinstance(tools, str) else tools
    for message in row["messages"]:
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            if isinstance(function["arguments"], str):
                function["arguments"] = json.loads(function["arguments"])
    return row["messages"], tools


def reference(tokenizer, messages, tools):
    def render(turns, generation):
        return tokenizer.apply_chat_template(turns, tools=tools, add_generation_prompt=generation,
                                             tokenize=False)

    def ids(text):
        return tokenizer.encode(text, add_special_tokens=False)

    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prompt = render(messages[:first], True)
    whole = render(messages, False)
    assert whole.endswith("<|im_end|>\n"), repr(whole[-40:])
    all_ids = ids(whole)[:-1]  # the template's last newline, after the last turn's end token
    mask = [0] * (len(all_ids) - len(ids(prompt)))
    for i in range(first, len(messages)):
        if messages[i]["role"] != "assistant":
            continue
        begin = len(ids(render(messages[:i], True)))
        end = len(ids(render(messages[:i + 1], False))) - 1
        assert ids(render(messages[:i + 1], False))[:end] == all_ids[:end]
        for t in range(begin, end):
            mask[t - len(ids(prompt))] = 1
    return {"prompt": prompt, "prompt_ids": ids(prompt), "target_ids": all_ids[len(ids(prompt)):],
            "mask": mask}


def single_turn_reference(tokenizer, row):
    """verl's SFTDataset.__getitem__: the prompt's chat string, the response with eos."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": row["extra_info"]["question"]}],
                                           add_generation_prompt=True, tokenize=False)
    response = tokenizer.encode(row["extra_info"]["answer"] + tokenizer.eos_token, add_special_tokens=False)
    return {"prompt": prompt, "prompt_ids": tokenizer.encode(prompt, add_special_tokens=False),
            "target_ids": response, "mask": [1] * len(response)}


def compare(binary, model, path, rows, tokenizer, single_turn=False):
    keys = ["extra_info.question", "extra_info.answer"] if single_turn else []
    result = subprocess.run([binary, model, path] + keys, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        sys.exit(f"encode_conversations {path} failed: {result.stderr}")
    outputs = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(outputs) == len(rows), (len(outputs), len(rows))
    failures = 0
    for index, (row, ours) in enumerate(zip(rows, outputs)):
        expected = (single_turn_reference(tokenizer, row) if single_turn
                    else reference(tokenizer, *as_reference(row)))
        if ours != expected:
            failures += 1
            if failures <= 3:
                print(f"MISMATCH {path} row {index + 1}:\n row: {json.dumps(row, ensure_ascii=False)}")
                for key in expected:
                    if ours.get(key) != expected[key]:
                        print(f" {key}:\n  ours:     {ours.get(key, ours.get('error'))!r}\n"
                              f"  expected: {expected[key]!r}")
    return failures


def check_bad_utf8(binary, model, scratch):
    """A Parquet string that is not UTF-8 (pyarrow writes one from raw buffers) is refused,
    naming the file, the row and the column, as pandas refuses it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def turns(user_bytes):
        offsets = pa.array([0, len(user_bytes), len(user_bytes) + 1], type=pa.int32())
        content = pa.StringArray.from_buffers(2, offsets.buffers()[1], pa.py_buffer(user_bytes + b"a"))
        return pa.StructArray.from_arrays([pa.array(["user", "assistant"]), content],
                                          names=["role", "content"])

    values = pa.concat_arrays([turns(b"ok"), turns(b"v\xfe\xff")])
    messages = pa.ListArray.from_arrays(pa.array([0, 2, 4], type=pa.int32()), values)
    path = os.path.join(scratch, "bad_utf8.parquet")
    pq.write_table(pa.table({"messages": messages}), path)
    result = subprocess.run([binary, model, path], capture_output=True, text=True, timeout=120)
    expected = f"{path}:2: column 'messages' holds a string that is not UTF-8"
    if result.returncode != 1 or expected not in result.stderr:
        sys.exit(f"a Parquet string that is not UTF-8: expected exit 1 and {expected!r}, got "
                 f"{result.returncode} {result.stderr!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--model", action="append")
    parser.add_argument("--cases", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
        from transformers import AutoTokenizer
    except ImportError as error:
        skip(f"{error}")
    models = [m for m in (args.model or DEFAULT_MODELS) if os.path.isdir(m)]
    rng = random.Random(args.seed)
    failures = checked = 0
    with tempfile.TemporaryDirectory() as scratch:
        jsonl_rows = [conversation(rng, as_text=True) for _ in range(args.cases)]
        parquet_rows = [conversation(rng, as_text=False) for _ in range(args.cases)]
        jsonl = os.path.join(scratch, "train.jsonl")
        with open(jsonl, "w") as f:
            for row in jsonl_rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        parquet = os.path.join(scratch, "train.parquet")
        pq.write_table(pa.Table.from_pylist(parquet_rows), parquet)
        # What a reader of the file gets: every struct field, in the schema's order, null where a
        # row has none.
        parquet_rows = pq.read_table(parquet).to_pylist()
        single_rows = [{"extra_info": {"question": text(rng, 8), "answer": text(rng, 12)}}
                       for _ in range(args.cases)]
        single = os.path.join(scratch, "single.jsonl")
        with open(single, "w") as f:
            for row in single_rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        for model in models:
            tokenizer = AutoTokenizer.from_pretrained(model)
            files = [(jsonl, jsonl_rows)]
            # The Parquet reader is a plugin the build has where pyarrow's C++ library was found.
            if os.environ.get("RLHFD_PARQUET_PLUGIN"):
                files.append((parquet, parquet_rows))
                check_bad_utf8(args.binary, model, scratch)
            for path, rows in files:
                failures += compare(args.binary, model, path, rows, tokenizer)
                checked += len(rows)
            failures += compare(args.binary, model, single, single_rows, tokenizer, single_turn=True)
            checked += len(single_rows)
            files.append((single, single_rows))
            print(f"{os.path.basename(model)}: {len(files) * args.cases} conversations checked "
                  f"({' and '.join(os.path.basename(path) for path, _ in files)})")
    if failures:
        sys.exit(f"{failures} of {checked} conversations differ from transformers")
    print(f"all {checked} conversations equal transformers' template: prompt text and ids, "
          "target ids, mask")


if __name__ == "__main__":
    main()
