#!/usr/bin/env python3
"""trainer.mode sft's rows against transformers' chat template, from verl's multi-turn SFT layout.

Random conversations as verl's MultiTurnSFTDataset reads them (messages with OpenAI tool_calls on
assistant turns, content null beside them, arguments as objects or as JSON text; the row's tool
schemas under `tools`, as a list or as JSON text; user and tool turns between assistant turns; a
system turn or none; reasoning as a <think> block in the content or as reasoning_content; the
row's own enable_thinking, true, false or null) are written as JSONL and as Parquet (pyarrow). encode_conversations reads
each file with the controller's reader and encodes each row with the worker's code (the prompt
with the row's tools, the target turns with their mask). The reference is transformers'
apply_chat_template with the model's own template on the same rows (the Parquet rows as pyarrow
reads them back, nulls and key order included, as verl's pandas reader hands them over):
- the prompt: the template's text for the turns before the first assistant turn with the
  generation prompt, and its token ids;
- the prompt and target ids together: the ids of the conversation as a multi-turn rollout lays
  it out (reference(): each assistant turn as the template renders it when it is the last
  message, the user and tool turns between as it renders them up to the next generation
  prompt, each piece tokenized on its own), which for Qwen2.5's template is the whole
  conversation's text but its last newline;
- the mask: 1 exactly on each assistant turn's tokens after its generation prompt, through its
  <|im_end|>. verl's per-message tokenization also trains on the newline after <|im_end|>,
  which a rollout never generates; this test holds rlhfd to the span.
Arguments given as JSON text are rendered as the object they hold where the template would quote
the text (Qwen2.5's: no model is trained to write that), so that reference gets the object;
Qwen3's template prints the text as it is, and gets it. The models: tiny-qwen2-tools (Qwen2.5's
template), tokenizers/qwen3-thinking (Qwen3's), tokenizers/qwen3-thinking-2507 (Qwen3-Thinking-2507's:
Qwen3's, its generation prompt opening the <think> block), tokenizers/llama31-style (Llama
3.1-Instruct's: the system turn of the knowledge cutoff and the date, no tool format, so its rows
have no tools), and the real Qwen2.5-Coder where it was fetched.

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
                  os.path.join(ROOT, "tests", "fixtures", "tokenizers", "qwen3-thinking"),
                  os.path.join(ROOT, "tests", "fixtures", "tokenizers", "qwen3-thinking-2507"),
                  os.path.join(ROOT, "tests", "fixtures", "tokenizers", "llama31-style"),
                  os.path.join(ROOT, "models", "qwen2.5-coder-0.5b-instruct")]

WORDS = ["Compute", "the", "sum", "naïve", "数学", "😀", "x", "<b>", "#### 7", "quotes \"here\"",
         "back\\slash", "tab\there", "line\nbreak", "{\"json\": 1}", "</tool_call>",
         "\u3000ideographic\u00a0spaces\u2003"]
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


def reasoned(rng, message, thinking):
    """An assistant message with reasoning some of the time: a <think> block before the content,
    or reasoning_content. Rarely when thinking is off, which leaves no room for it (Qwen3's
    template: rlhfd refuses the row)."""
    if thinking is False and rng.random() < 0.9:
        return message
    roll = rng.random()
    if roll < 0.3:
        think = rng.choice(["", "\n"]) + text(rng) + rng.choice(["", "\n"])
        message["content"] = f"<think>{think}</think>" + rng.choice(["\n\n", ""]) + (message["content"] or "")
    elif roll < 0.5:
        message["reasoning_content"] = rng.choice(["", text(rng)])
    return message


def conversation(rng, as_text, with_tools=True):
    """A row; without tools (templates with no tool format: Llama 3's) no calls, tool turns or
    schemas."""
    tools = [tool_schema(rng, name) for name in rng.sample(["python", "search", "calc"], rng.randint(1, 2))]
    # The row's own thinking switch (data.enable_thinking_key), which Qwen3's template reads.
    thinking = rng.choice([None, None, True, False])
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": text(rng)})
    messages.append({"role": "user", "content": text(rng, 8)})
    for _ in range(rng.randint(0, 2)):
        if with_tools and rng.random() < 0.7:
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
            messages.append(reasoned(rng, {"role": "assistant", "content": content, "tool_calls": calls},
                                     thinking))
            messages += [{"role": "tool", "content": rng.choice(["42", "", text(rng), "a\n\nb"])}
                         for _ in calls]
        else:
            messages.append(reasoned(rng, {"role": "assistant", "content": text(rng)}, thinking))
            messages.append({"role": "user", "content": text(rng)})
    messages.append(reasoned(rng, {"role": "assistant", "content": text(rng)}, thinking))
    row = {"messages": messages, "enable_thinking": thinking}
    if with_tools:
        row["tools"] = json.dumps(tools) if as_text and rng.random() < 0.3 else tools
    return row


def as_reference(row, tokenizer):
    """The row as the template is given it: tools as objects; arguments given as JSON text as
    objects too, unless the template prints text as it is (Qwen3's)."""
    row = copy.deepcopy(row)
    tools = row.get("tools")
    tools = json.loads(tools) if isinstance(tools, str) else tools or None
    text_as_given = "arguments is string" in tokenizer.chat_template
    for message in row["messages"]:
        if message.get("reasoning_content") is None:
            message.pop("reasoning_content", None)  # a Parquet row's null field: none
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            if isinstance(function["arguments"], str) and not text_as_given:
                function["arguments"] = json.loads(function["arguments"])
    return row["messages"], tools, row.get("enable_thinking")


def reference(tokenizer, messages, tools, thinking):
    """The row as a multi-turn rollout lays it out: the prompt with the generation prompt, then
    each assistant turn as the template renders it when it is the last message (after its
    generation prompt, through its end token), and between turns what the template renders after
    an assistant turn's end token up to the next generation prompt. For Qwen2.5's template this
    is the whole conversation's text; Qwen3's renders an answer that is not the last one without
    its <think> block, which a rollout does generate. None where the turn cannot follow its
    generation prompt (reasoning while thinking is off): rlhfd refuses the row."""
    options = {} if thinking is None else {"enable_thinking": thinking}

    def render(turns, generation):
        return tokenizer.apply_chat_template(turns, tools=tools, add_generation_prompt=generation,
                                             tokenize=False, **options)

    def ids(text):
        return tokenizer.encode(text, add_special_tokens=False)

    # The token that ends a turn, and what the template writes after it.
    chatml = "<|im_start|>" in tokenizer.chat_template
    end, after_end = ("<|im_end|>", "\n") if chatml else ("<|eot_id|>", "")
    answers = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    prompt = render(messages[:answers[0]], True)
    pieces = [(prompt, 0)]
    for k, i in enumerate(answers):
        generation_prompt, as_last = render(messages[:i], True), render(messages[:i + 1], False)
        if not as_last.startswith(generation_prompt):
            return None
        assert as_last.endswith(end + after_end), repr(as_last[-40:])
        pieces.append((as_last[len(generation_prompt):len(as_last) - len(after_end)], 1))
        if k + 1 < len(answers):
            after = render(messages[:answers[k + 1]], True)
            ends = as_last.count(end)
            at = -1
            for _ in range(ends):
                at = after.index(end, at + 1)
            pieces.append((after[at + len(end):], 0))
    # Each piece's own ids, as a rollout has them: a prompt's ids are fixed before its turn is
    # generated. Tokenizing the whole text can merge across a piece's edge: Qwen3-Thinking-2507's
    # generation prompt ends in "<think>\n" and an answer without reasoning starts "\n</think>",
    # which the whole text tokenizes as one "\n\n".
    all_ids, mask = [], []
    for piece, trained in pieces:
        piece_ids = ids(piece)
        all_ids += piece_ids
        mask += [trained] * len(piece_ids)
    first = len(ids(prompt))
    return {"prompt": prompt, "prompt_ids": all_ids[:first], "target_ids": all_ids[first:],
            "mask": mask[first:]}


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
    failures = refusals = 0
    for index, (row, ours) in enumerate(zip(rows, outputs)):
        expected = (single_turn_reference(tokenizer, row) if single_turn
                    else reference(tokenizer, *as_reference(row, tokenizer)))
        if expected is None:  # reasoning while thinking is off: refused, saying so
            refused = "while enable_thinking is false" in ours.get("error", "")
            expected = ours if refused else {"error": "reasoning while enable_thinking is false"}
            refusals += refused
        if ours != expected:
            failures += 1
            if failures <= 3:
                print(f"MISMATCH {path} row {index + 1}:\n row: {json.dumps(row, ensure_ascii=False)}")
                for key in expected:
                    if ours.get(key) != expected[key]:
                        print(f" {key}:\n  ours:     {ours.get(key, ours.get('error'))!r}\n"
                              f"  expected: {expected[key]!r}")
    if refusals:
        print(f"{os.path.basename(path)}: {refusals} rows refused as expected (reasoning while "
              "enable_thinking is false)")
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
        # Rows with tools for the templates with Qwen's tool format, rows without for the others.
        row_sets = {}
        for with_tools in (True, False):
            jsonl_rows = [conversation(rng, True, with_tools) for _ in range(args.cases)]
            parquet_rows = [conversation(rng, False, with_tools) for _ in range(args.cases)]
            name = "train" if with_tools else "train-no-tools"
            jsonl = os.path.join(scratch, name + ".jsonl")
            with open(jsonl, "w") as f:
                for row in jsonl_rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
            parquet = os.path.join(scratch, name + ".parquet")
            pq.write_table(pa.Table.from_pylist(parquet_rows), parquet)
            # What a reader of the file gets: every struct field, in the schema's order, null
            # where a row has none.
            row_sets[with_tools] = [(jsonl, jsonl_rows), (parquet, pq.read_table(parquet).to_pylist())]
        # Some answers hold a <think> block, which the response keeps as written.
        single_rows = [{"extra_info": {"question": text(rng, 8),
                                       "answer": rng.choice(["", f"<think>\n{text(rng)}\n</think>\n\n"]) +
                                       text(rng, 12)}}
                       for _ in range(args.cases)]
        single = os.path.join(scratch, "single.jsonl")
        with open(single, "w") as f:
            for row in single_rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        for model in models:
            tokenizer = AutoTokenizer.from_pretrained(model)
            conversations = row_sets["<tool_response>" in tokenizer.chat_template]
            files = conversations[:1]
            # The Parquet reader is a plugin the build has where pyarrow's C++ library was found.
            if os.environ.get("RLHFD_PARQUET_PLUGIN"):
                files.append(conversations[1])
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
