#!/usr/bin/env python3
"""Inputs of the one-GPU GRPO benchmark (tests/bench/grpo_vs_trl.sh), shared by rlhfd and TRL:
a random-initialised model of the Qwen2.5-0.5B shape (the shape of worker/bench/model_presets.h,
saved as safetensors; --shape 7b for Qwen2.5-7B's, --lora_rank for a LoRA actor, --critic for
PPO with a critic) with the fixture tokenizer (its ids are a subset of the model's, so the
model's samples decode, most to nothing), prompts of exactly P tokens, and the rlhfd job config.
Random weights almost never sample EOS, so every response runs to N tokens in both systems.

    python3 tests/bench/make_grpo_bench.py --out DIR --prompts 64 --n 8 --prompt_len 256 \
        --response_len 256
"""
import argparse
import json
import os
import random
import shutil

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "models", "tiny-qwen2")


# Qwen2.5's shapes (their config.json files); 7B is untied, as the real one is.
SHAPES = {
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
}


def qwen25_config(shape):
    return Qwen2Config(**SHAPES[shape], max_position_embeddings=32768, rope_theta=1000000.0,
                       eos_token_id=511)


def save_random_model(shape, model_dir):
    """The 0.5B in float32 (TRL loads it too); the 7B in bf16 made on the GPU, 15 GB instead of 30
    and seconds instead of minutes of CPU initialisation (only rlhfd's LoRA actor loads it)."""
    torch.manual_seed(0)
    if shape == "0.5b":
        model = AutoModelForCausalLM.from_config(qwen25_config(shape), dtype=torch.float32)
    else:
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = AutoModelForCausalLM.from_config(qwen25_config(shape), dtype=torch.bfloat16)
    model.save_pretrained(model_dir, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(os.path.join(FIXTURE, name), model_dir)


def prompt_of(tokenizer, length, rng):
    """Text that the tokenizer encodes to exactly `length` ids (no special tokens)."""
    words = []
    while True:
        words.append("".join(rng.choice("abcdefghij") for _ in range(3)))
        ids = tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]
        if len(ids) >= length:
            text = tokenizer.decode(ids[:length])
            if len(tokenizer(text, add_special_tokens=False)["input_ids"]) == length:
                return text
            words = words[:-1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt_len", type=int, default=256)
    parser.add_argument("--response_len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--micro_batch", type=int, default=16, help="sequences per forward/backward")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b", help="Qwen2.5 model shape")
    parser.add_argument("--lora_rank", type=int, default=0, help="LoRA actor (all-linear) when > 0")
    parser.add_argument("--lora_alpha", type=int, default=0, help="default: twice the rank")
    parser.add_argument("--critic", action="store_true",
                        help="PPO: GAE advantages from a critic (value head on the same weights), "
                             "colocated with the actor")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model_dir = os.path.join(args.out, "model" if args.shape == "0.5b" else f"model-{args.shape}")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        save_random_model(args.shape, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(1)
    data = os.path.join(args.out, f"prompts_{args.prompts}x{args.prompt_len}.jsonl")
    with open(data, "w") as f:
        for _ in range(args.prompts):
            f.write(json.dumps({"prompt": prompt_of(tokenizer, args.prompt_len, rng), "ground_truth": "x",
                                "data_source": "exact_match"}) + "\n")
    name = f"grpo-{args.prompts}x{args.n}-p{args.prompt_len}-n{args.response_len}"
    if args.shape != "0.5b":
        name += f"-{args.shape}"
    estimator, critic = "grpo", ""
    if args.critic:
        name = "ppo" + name[len("grpo"):]
        estimator = "gae"
        critic = (f"  critic: {{train: {{ppo_mini_batch_size: {args.prompts}, "
                  f"ppo_micro_batch_size_per_gpu: {args.micro_batch}, lr: 1.0e-5}}}}\n")
    lora = ""
    if args.lora_rank > 0:
        name += f"-lora{args.lora_rank}"
        lora = (f", lora_rank: {args.lora_rank}, lora_alpha: {args.lora_alpha or 2 * args.lora_rank},"
                " target_modules: [all-linear]")
    config = f"""# {name}: the TRL anchor's setup (tests/bench/grpo_vs_trl.sh)
name: {name}
model: {{path: {os.path.abspath(model_dir)}, dtype: bf16{lora}}}
data:
  train_files: [{os.path.abspath(data)}]
  max_prompt_length: {args.prompt_len}
  max_response_length: {args.response_len}
  train_batch_size: {args.prompts}
algorithm:
  adv_estimator: {estimator}
  kl: {{mode: loss, coef: 0.001, estimator: low_var_kl}}
roles:
  actor:
    gpus: 1
    train: {{ppo_mini_batch_size: {args.prompts}, ppo_micro_batch_size_per_gpu: {args.micro_batch}, lr: 1.0e-6}}
    rollout: {{n: {args.n}, temperature: 1.0, max_num_seqs: {args.prompts * args.n},
              log_prob_micro_batch_size_per_gpu: {2 * args.micro_batch}}}
  reference: {{log_prob_micro_batch_size_per_gpu: {2 * args.micro_batch}}}
{critic}  reward: {{rule: exact_match}}
placement: colocated
trainer: {{total_steps: {args.steps}, save_every: -1, val_every: -1, loggers: [console, jsonl], device: cuda}}
"""
    with open(os.path.join(args.out, f"{name}.yaml"), "w") as f:
        f.write(config)
    print(json.dumps({"model": model_dir, "data": data, "config": os.path.join(args.out, f"{name}.yaml")}))


if __name__ == "__main__":
    main()
