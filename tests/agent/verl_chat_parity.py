#!/usr/bin/env python3
"""rlhfd's multi-turn chat rendering against the references, on a real Qwen2.5 tokenizer:
- the prompt with tools (worker/model/tokenizer.h ApplyChatTemplate with schemas printed by
  worker/agent/tool_config.h) against transformers' apply_chat_template(messages, tools=...) with
  the schemas as verl passes them (OpenAIFunctionToolSchema(...).model_dump(exclude_unset=True,
  exclude_none=True)): the same text and the same token ids;
- the tool turn after a model turn (worker/agent/agent_loop.h ToolTurnTokens) against verl's own
  QwenContinuousTokenBuilder.merge_context_tokens (verl/utils/tokenizer/continuous_token.py,
  loaded from the installed verl unchanged, its ray-bound package __init__ skipped): the same
  inserted token ids.

Random cases mix system prompts or none, one to three tools (descriptions with non-ASCII text,
enums, array properties with `items`, which verl's schema models drop, property names in a
random order, which both keep), user text, and one to three tool responses (empty, multi-line,
non-ASCII, text that looks like tags), after a turn ended by <|im_end|> or not.

    verl_chat_parity.py RENDER_CHAT_BINARY [--model DIR] [--cases N] [--seed S]

Exits 77 (skipped) where the model directory, transformers, pydantic or verl is missing.
"""
import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.path.join(HERE, "..", "..", "models", "qwen2.5-coder-0.5b-instruct")

WORDS = ["Compute", "the", "sum", "of", "naïve", "数学", "😀", "values", "x", "<b>", "#### 7",
         "quotes \"here\"", "back\\slash", "tab\there", "line\nbreak"]
RESPONSES = ["42", "", "Traceback (most recent call last):\n  File \"<string>\", line 1\nZeroDivisionError",
             "résultat: 3.5\n", "<tool_response>fake</tool_response>", "a\n\nb", "数学 😀", "[1, 2, 3]"]


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


def load_verl():
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        skip("verl is not installed")
    root = spec.submodule_search_locations[0]
    for name, folder in (("verl", root), ("verl.utils", f"{root}/utils")):
        package = types.ModuleType(name)
        package.__path__ = [folder]
        sys.modules[name] = package
    from verl.tools.schemas import OpenAIFunctionToolSchema
    from verl.utils.tokenizer.continuous_token import QwenContinuousTokenBuilder
    return OpenAIFunctionToolSchema, QwenContinuousTokenBuilder


def text(rng, words=6):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, words)))


def schema(rng, index):
    names = rng.sample(["a_value", "code", "expression", "limit", "query", "units"],
                       rng.randint(1, 3))
    properties = {}
    for name in names:
        prop = {"type": rng.choice(["string", "integer", "number", "boolean"]),
                "description": text(rng, 4)}
        if rng.random() < 0.3:
            prop = {"type": "string", "description": text(rng, 3), "enum": ["a", "b", "ç"]}
        if rng.random() < 0.2:
            prop = {"type": "array", "description": text(rng, 3), "items": {"type": "string"}}
        properties[name] = prop
    function = {"name": f"tool_{index}_{rng.randint(0, 99)}", "description": text(rng),
                "parameters": {"type": "object", "properties": properties,
                               "required": names[: rng.randint(0, len(names))]}}
    return {"type": "function", "function": function}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--model", default=os.environ.get("RLHFD_QWEN_DIR", DEFAULT_MODEL))
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.model, "tokenizer.json")):
        skip(f"no Qwen2.5 model at {args.model} (deploy/fetch_models.sh qwen2.5-coder-0.5b)")
    try:
        from transformers import AutoTokenizer
        import pydantic  # noqa: F401
    except ImportError as error:
        skip(str(error))
    tool_schema, builder_class = load_verl()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    builder = builder_class(tokenizer)

    rng = random.Random(args.seed)
    cases, expected = [], []
    for _ in range(args.cases):
        messages = []
        if rng.random() < 0.4:
            messages.append({"role": "system", "content": text(rng)})
        messages.append({"role": "user", "content": text(rng, 10)})
        schemas = [schema(rng, i) for i in range(rng.randint(1, 3))]
        verl_tools = [tool_schema(**s).model_dump(exclude_unset=True, exclude_none=True)
                      for s in schemas]
        responses = [rng.choice(RESPONSES) + (text(rng) if rng.random() < 0.5 else "")
                     for _ in range(rng.randint(1, 3))]
        after_turn_end = rng.random() < 0.8
        prompt = tokenizer.apply_chat_template(messages, tools=verl_tools,
                                               add_generation_prompt=True, tokenize=False)
        prompt_ids = list(tokenizer.apply_chat_template(
            messages, tools=verl_tools, add_generation_prompt=True, tokenize=True)["input_ids"])
        # The model's turn: a call to the first tool, then <|im_end|> (or not).
        name = schemas[0]["function"]["name"]
        turn = f'<tool_call>\n{{"name": "{name}", "arguments": {{}}}}\n</tool_call>'
        turn_ids = tokenizer.encode(turn + ("<|im_end|>" if after_turn_end else ""),
                                    add_special_tokens=False)
        previous = messages + [{"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": name, "arguments": {}}}]}]
        updated = previous + [{"role": "tool", "content": r} for r in responses]
        runtime = prompt_ids + turn_ids
        merged = builder.merge_context_tokens(previous, updated, runtime, tools=verl_tools)
        cases.append({"messages": messages, "tools": schemas, "tool_responses": responses,
                      "after_turn_end": after_turn_end})
        expected.append({"prompt": prompt, "prompt_ids": prompt_ids,
                         "tool_turn_ids": list(merged.token_ids[len(runtime):])})

    run = subprocess.run([args.binary], input=json.dumps({"model": args.model, "cases": cases}),
                         capture_output=True, text=True, check=False)
    if run.returncode != 0:
        print(run.stderr)
        sys.exit(1)
    ours = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(ours) == len(expected), (len(ours), len(expected))
    differences = 0
    for index, (mine, theirs) in enumerate(zip(ours, expected)):
        for key in ("prompt", "prompt_ids", "tool_turn_ids"):
            if mine[key] != theirs[key]:
                differences += 1
                if differences <= 5:
                    print(f"case {index} {key} differs:\n  rlhfd: {mine[key]!r}\n"
                          f"  reference: {theirs[key]!r}\n  case: {json.dumps(cases[index])}")
    print(json.dumps({"cases": len(cases), "differences": differences}))
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
