#!/usr/bin/env python3
"""Checks that an actor exported with a checkpoint (<step dir>/actor/huggingface) loads in Hugging
Face transformers as is, holds the checkpoint's weights (its float32 state rounded to bf16,
exactly), and runs.

    check_actor_export.py EXPORT_DIR STATE_FILE
"""
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def main(export_dir, state_file):
    model = AutoModelForCausalLM.from_pretrained(export_dir, dtype="auto").eval()
    assert model.dtype == torch.bfloat16, f"loaded as {model.dtype}"
    state = load_file(state_file)
    compared = 0
    for name, parameter in model.named_parameters():
        if name not in state:
            continue
        expected = state[name].to(torch.bfloat16)
        assert torch.equal(parameter.detach().to(expected.dtype), expected), name
        compared += 1
    assert compared == len(list(model.parameters())), (compared, len(list(model.parameters())))
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    ids = tokenizer("Say hello.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert torch.isfinite(logits).all()
    print(json.dumps({"parameters": compared, "logits": list(logits.shape)}))


if __name__ == "__main__":
    main(*sys.argv[1:])
