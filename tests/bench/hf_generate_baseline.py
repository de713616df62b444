#!/usr/bin/env python3
"""Baseline for worker/bench/rollout_bench: transformers' generate on the same setup (Qwen2.5-0.5B
shape, random weights, bf16 on the GPU, B prompts of P random tokens, sampling at temperature 1,
every response run to N new tokens). Prints one JSON line.

    python3 tests/bench/hf_generate_baseline.py --batch 256 --prompt_len 256 --new_tokens 256
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM

from hf_train_baseline import qwen25_05b_config  # Same directory: the shared shape.


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt_len", type=int, default=256)
    parser.add_argument("--new_tokens", type=int, default=256)
    args = parser.parse_args()
    config = qwen25_05b_config()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16).cuda().eval()
    b, p, n = args.batch, args.prompt_len, args.new_tokens
    ids = torch.randint(0, config.vocab_size, (b, p), device="cuda")
    mask = torch.ones_like(ids)

    def run(new_tokens):
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
        torch.cuda.synchronize()
        return out

    run(4)  # Warm-up.
    start = time.perf_counter()
    out = run(n)
    seconds = time.perf_counter() - start
    assert out.shape[1] == p + n
    print(json.dumps({"baseline": "transformers generate", "batch": b, "prompt_len": p, "new_tokens": n,
                      "seconds": seconds, "tokens_per_second": b * n / seconds}))


if __name__ == "__main__":
    main()
