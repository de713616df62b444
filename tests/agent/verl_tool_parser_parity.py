#!/usr/bin/env python3
"""rlhfd's hermes tool-call parser (worker/agent/tool_calls.h) against verl's own
HermesToolParser (verl/experimental/agent_loop/tool_parser.py, loaded from the installed verl
package unchanged; importing verl whole needs ray, so its package __init__ is skipped and two
helpers from ray-bound modules are stood in for: the tracing decorator and the event loop).

Random responses are built from fragments a model writes: prose, newlines, non-ASCII text, the
two tags (balanced, stray, nested, unclosed), valid calls, and malformed ones (truncated JSON,
arrays, missing keys, a number for a name). For each, the content and the calls (name, and the
arguments as JSON) must be equal, and the malformed count must equal verl's blocks minus its
calls (verl drops those blocks; rlhfd keeps them aside).

    verl_tool_parser_parity.py PARSE_TOOL_CALLS_BINARY [--cases N] [--seed S]

Exits 77 (skipped) where verl, regex or pydantic is not installed.
"""
import argparse
import asyncio
import importlib.util
import json
import os
import random
import subprocess
import sys
import types

FRAGMENTS = [
    "Let me think. ", "The answer is 42.\n", "#### 17", "\n\n", "héllo wörld 😀 ", "数学 ",
    "<tool_call>", "</tool_call>", "<tool_call>\n", "\n</tool_call>",
    '{"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}',
    '{"name": "calc", "arguments": {"expression": "1+1", "precision": 3}}',
    '{"arguments": {"x": [1, 2, {"y": null}]}, "name": "search"}',
    '{"name": "unicode", "arguments": {"q": "naïve 😀"}}',
    '{"name": "s", "arguments": "a string"}',
    '{"name": "x", "arguments": {',            # truncated
    '[1, 2, 3]',                                # not an object
    '{"name": "only"}',                         # no arguments
    '{"name": 7, "arguments": {}}',             # a number for a name
    'not json at all',
    '{"name": "a", "arguments": {}} trailing',
]


def load_verl_parser():
    try:
        spec = importlib.util.find_spec("verl")
        import pydantic  # noqa: F401
        import regex  # noqa: F401
    except ImportError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = spec.submodule_search_locations[0]
    path = f"{root}/experimental/agent_loop/tool_parser.py"
    # verl's package __init__ imports ray: the packages are entered without running it, so that
    # the parser's own imports (verl.tools.schemas) load from the installed files.
    for name, folder in (("verl", root), ("verl.utils", f"{root}/utils")):
        package = types.ModuleType(name)
        package.__path__ = [folder]
        sys.modules[name] = package
    # Two helpers the parser imports from modules that need ray: tracing (off) and the running
    # event loop.
    trace = types.ModuleType("verl.utils.rollout_trace")
    trace.rollout_trace_op = lambda function: function
    sys.modules["verl.utils.rollout_trace"] = trace
    ray_utils = types.ModuleType("verl.utils.ray_utils")
    ray_utils.get_event_loop = asyncio.get_running_loop
    sys.modules["verl.utils.ray_utils"] = ray_utils
    os.environ["VERL_LOGGING_LEVEL"] = "CRITICAL"  # each dropped block is logged as an error
    module_spec = importlib.util.spec_from_file_location("verl_tool_parser", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.HermesToolParser


class TextTokenizer:
    """verl's parser decodes ids; here an id is the index of a text."""

    def __init__(self, texts):
        self.texts = texts

    def decode(self, ids):
        return self.texts[ids[0]]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    hermes = load_verl_parser()
    if hermes is None:
        print("verl_tool_parser_parity: verl (with regex, pydantic) is not installed: skipped")
        sys.exit(77)
    rng = random.Random(args.seed)
    bodies = [f for f in FRAGMENTS if f.startswith(("{", "[", "not"))]

    def fragment():
        # Half the time a whole block, with or without newlines inside the tags.
        if rng.random() < 0.5:
            pad = rng.choice(["", "\n"])
            return f"<tool_call>{pad}{rng.choice(bodies)}{pad}</tool_call>"
        return rng.choice(FRAGMENTS)

    texts = ["".join(fragment() for _ in range(rng.randint(0, 10))) for _ in range(args.cases)]
    verl = hermes(TextTokenizer(texts))
    ours = subprocess.run([args.binary], input="".join(json.dumps({"text": t}) + "\n" for t in texts),
                          capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(ours) == len(texts), (len(ours), len(texts))
    with_calls = with_malformed = 0
    for index, (text, line) in enumerate(zip(texts, ours)):
        content, calls = asyncio.run(verl.extract_tool_calls([index]))
        mine = json.loads(line)
        expected_calls = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in calls]
        blocks = len(verl.tool_call_regex.findall(text)) if (
            "<tool_call>" in text and "</tool_call>" in text) else 0
        problems = []
        if mine["content"] != content:
            problems.append(f"content {mine['content']!r} != verl {content!r}")
        if mine["calls"] != expected_calls:
            problems.append(f"calls {mine['calls']} != verl {expected_calls}")
        if mine["malformed"] != blocks - len(calls):
            problems.append(f"malformed {mine['malformed']} != verl's dropped {blocks - len(calls)}")
        if problems:
            print(json.dumps({"case": index, "text": text, "problems": problems}, ensure_ascii=False))
            sys.exit(1)
        with_calls += bool(calls)
        with_malformed += mine["malformed"] > 0
    print(json.dumps({"cases": len(texts), "with_calls": with_calls,
                      "with_malformed": with_malformed, "differences": 0}))


if __name__ == "__main__":
    main()
