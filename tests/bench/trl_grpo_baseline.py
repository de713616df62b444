#!/usr/bin/env python3
"""The TRL side of the one-GPU GRPO benchmark (tests/bench/grpo_vs_trl.sh): TRL's GRPOTrainer
with transformers' generate on the model and prompts of make_grpo_bench.py, as a TRL user runs
it (TRL's defaults: bf16, gradient checkpointing, loss_type dapo), shaped like the rlhfd job:
one optimizer step per RL step over prompts x n completions, generated in one batch
(steps_per_generation = gradient_accumulation_steps), KL loss beta 0.001 against a reference
model. Prints one JSON line: seconds per step (each step after the first), tokens/s, peak memory.

    python3 tests/bench/trl_grpo_baseline.py --model DIR/model --data DIR/prompts_64x256.jsonl \
        --n 8 --response_len 256 --micro_batch 16 --steps 4

With --verl_rows, --data is a verl-shaped JSONL (deploy/prepare_data.py: chat `prompt`,
reward_model.ground_truth; TRL applies the model's chat template) scored by GSM8K's strict
"#### N" (verl's gsm8k; a measuring stick's copy, not rlhfd's); --prompts_per_step takes that
many rows per RL step and --mini_batch_prompts splits them into optimizer steps as
ppo_mini_batch_size does (one TRL step each: the seconds reported are per RL step, i.e. per
generation round).
"""
import argparse
import json
import os
import re
import time

import torch
from datasets import load_dataset
from transformers import (AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast,
                          TrainerCallback)
from trl import GRPOConfig, GRPOTrainer


class StepTimes(TrainerCallback):
    def __init__(self):
        self.ends = []
        self.start = None

    def on_train_begin(self, args, state, control, **kwargs):
        torch.cuda.synchronize()
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        torch.cuda.synchronize()
        self.ends.append(time.perf_counter())
        # As it goes, so that a run cut short by its call's time limit still shows its steps.
        print(f"trl: optimizer step {len(self.ends)} done at {self.ends[-1] - self.start:.1f} s",
              flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--response_len", type=int, default=256)
    parser.add_argument("--micro_batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default="/tmp/trl-grpo")
    parser.add_argument("--gradient_checkpointing", type=int, default=1,
                        help="TRL's GRPO default is 1; 0 trades memory for speed")
    parser.add_argument("--verl_rows", action="store_true",
                        help="--data holds verl rows (chat prompt, reward_model.ground_truth)")
    parser.add_argument("--prompts_per_step", type=int, default=0,
                        help="rows per RL step (default: all of --data)")
    parser.add_argument("--mini_batch_prompts", type=int, default=0,
                        help="rows per optimizer step (default: the RL step's)")
    parser.add_argument("--vllm", action="store_true",
                        help="generate with vLLM colocated (vllm_mode colocate, "
                             "vllm_gpu_memory_utilization 0.3) instead of transformers' generate")
    args = parser.parse_args()
    dataset = load_dataset("json", data_files=args.data, split="train")
    if args.verl_rows:
        dataset = dataset.map(lambda row: {"ground_truth": row["reward_model"]["ground_truth"]},
                              remove_columns=[c for c in dataset.column_names if c != "prompt"])
    prompts = args.prompts_per_step or len(dataset)
    mini_batch = args.mini_batch_prompts or prompts
    updates = prompts // mini_batch  # optimizer steps per generation round
    accumulation = mini_batch * args.n // args.micro_batch
    if args.verl_rows:
        # transformers 5 ignores tokenizer_class for a qwen2 config: the converted tokenizer.json.
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(args.model, "tokenizer.json"))
        with open(os.path.join(args.model, "tokenizer_config.json")) as f:
            settings = json.load(f)
        tokenizer.chat_template = settings.get("chat_template")
        tokenizer.eos_token = settings.get("eos_token")
        tokenizer.pad_token = settings.get("pad_token") or tokenizer.eos_token
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    # float32 weights under TRL's default bf16 mixed precision, as rlhfd keeps float32 masters.
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = GRPOConfig(
        output_dir=args.out, per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=accumulation, steps_per_generation=accumulation * updates,
        num_generations=args.n, max_completion_length=args.response_len, beta=0.001,
        learning_rate=1e-6, temperature=1.0, max_steps=args.steps * updates, logging_steps=1,
        report_to=[],
        save_strategy="no", use_vllm=args.vllm, vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3, seed=0, dataloader_num_workers=0,
        gradient_checkpointing=bool(args.gradient_checkpointing))

    def exact(completions, ground_truth, **kwargs):
        return [float(c.strip() == g) for c, g in zip(completions, ground_truth)]

    def gsm8k_strict(completions, ground_truth, **kwargs):
        scores = []
        for completion, truth in zip(completions, ground_truth):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            found = re.findall(r"#### (\-?[0-9\.\,]+)", text[-300:])
            answer = found[-1].replace(",", "").replace("$", "") if found else None
            scores.append(float(answer == truth))
        return scores

    reward = gsm8k_strict if args.verl_rows else exact

    times = StepTimes()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[times])
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    ends = times.ends[updates - 1::updates]  # the end of each generation round's last update
    steps = [b - a for a, b in zip([times.start] + ends[:-1], ends)]
    measured = steps[1:] if len(steps) > 1 else steps
    seconds = sum(measured) / len(measured)
    history = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    mean_length = sum(h["completions/mean_length"] for h in history) / max(1, len(history))
    def prompt_length(prompt):
        if isinstance(prompt, list):
            return len(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                     return_dict=False))
        return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])

    shown = dataset.select(range(min(prompts, len(dataset))))
    prompt_tokens = sum(prompt_length(p) for p in shown["prompt"]) * prompts / len(shown)
    completions = prompts * args.n
    tokens = prompt_tokens * args.n + completions * mean_length
    print(json.dumps({
        "bench": "trl_grpo_step", "trl": __import__("trl").__version__, "vllm": args.vllm,
        "prompts": prompts, "n": args.n,
        "response_len": args.response_len, "micro_batch": args.micro_batch,
        "gradient_checkpointing": bool(args.gradient_checkpointing),
        "gradient_accumulation_steps": accumulation, "updates_per_step": updates,
        "steps": len(steps),
        "seconds_per_step": seconds, "step_seconds": steps, "mean_response_length": mean_length,
        "tokens_per_s": tokens / seconds,
        "peak_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_memory_reserved_gib": torch.cuda.max_memory_reserved() / 2**30}))


if __name__ == "__main__":
    main()
