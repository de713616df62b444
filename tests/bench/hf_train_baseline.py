#!/usr/bin/env python3
"""Baseline for worker/bench/train_bench --loss=full: the same training step (forward, the
cross-entropy over the full logits, backward, gradient clipping, AdamW) with Hugging Face
transformers and torch.optim.AdamW, float32 weights under bf16 autocast, random ids, same FLOP
formula (6N + 12·L·T·C). Prints one JSON line.

    python3 tests/bench/hf_train_baseline.py --micro_batch 16 --seq_len 1024 --steps 10
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config


def qwen25_05b_config():
    """The Qwen2.5-0.5B shape of worker/bench/model_presets.h (random weights: shape is all that matters)."""
    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       rope_theta=1000000.0, tie_word_embeddings=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--micro_batch", type=int, default=16)
    parser.add_argument("--seq_len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--peak_tflops", type=float, default=791.0)
    args = parser.parse_args()
    config = qwen25_05b_config()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32).cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    params = sum(p.numel() for p in model.parameters())
    b, t = args.micro_batch, args.seq_len

    def step():
        ids = torch.randint(0, config.vocab_size, (b, t + 1), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=ids[:, :t]).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(b * t, -1).float(), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = b * t * args.steps
    flops_per_token = 6 * params + 12 * config.num_hidden_layers * t * config.hidden_size
    tflops = tokens / seconds * flops_per_token / 1e12
    print(json.dumps({"bench": "hf_train_step", "micro_batch": b, "seq_len": t, "params": params,
                      "tokens_per_s": tokens / seconds, "ms_per_step": seconds * 1e3 / args.steps,
                      "tflops": tflops, "mfu": tflops / args.peak_tflops,
                      "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
                      "final_loss": loss.item()}))


if __name__ == "__main__":
    main()
