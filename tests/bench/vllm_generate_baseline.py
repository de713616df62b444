#!/usr/bin/env python3
"""vLLM's side of the generation benchmark (tests/bench/generate_vs_vllm.sh): the same shape as
rollout_bench's preset (its config.json, written by `rollout_bench --write_hf_config DIR`), random
weights (`load_format="dummy"`), B prompts of P random tokens, N new tokens each (ignore_eos,
temperature 1), the best of --repeat timed runs after a warm-up. vLLM at its defaults for the GPU
otherwise (its V2 runner, FlashAttention, CUDA graphs, torch.compile), prefix caching off. A
measuring stick only.
Prints one JSON line per batch size.

    python3 tests/bench/vllm_generate_baseline.py --config_dir DIR --batch 64 256 \\
        --prompt_len 256 --new_tokens 256

vLLM detokenises every sampled id, so DIR also gets a word-level tokenizer.json with an entry
for every id of the vocabulary (../shared/gpu-anchors/README.md).
"""
import argparse
import json
import os
import time


def write_tokenizer(config_dir, vocab_size):
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}}
    with open(os.path.join(config_dir, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    with open(os.path.join(config_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0"}, f)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config_dir", required=True)
    parser.add_argument("--batch", type=int, nargs="+", default=[256])
    parser.add_argument("--prompt_len", type=int, default=256)
    parser.add_argument("--new_tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gpu_memory_utilization", type=float, default=0.9,
                        help="vLLM's default")
    args = parser.parse_args()
    with open(os.path.join(args.config_dir, "config.json")) as f:
        config = json.load(f)
    write_tokenizer(args.config_dir, config["vocab_size"])

    import numpy as np
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.config_dir, load_format="dummy", dtype="bfloat16", seed=0,
              max_model_len=args.prompt_len + args.new_tokens,
              max_num_seqs=max(args.batch), gpu_memory_utilization=args.gpu_memory_utilization,
              # The timed runs repeat the warm-up's prompts: cached prefixes would skip their
              # prefill, which rlhfd's engine does every time.
              enable_prefix_caching=False)
    sampling = SamplingParams(temperature=1.0, max_tokens=args.new_tokens,
                              min_tokens=args.new_tokens, ignore_eos=True)
    rng = np.random.default_rng(0)
    for batch in args.batch:
        prompts = [TokensPrompt(prompt_token_ids=rng.integers(0, config["vocab_size"],
                                                              args.prompt_len).tolist())
                   for _ in range(batch)]
        # Warm-up at this batch size (vLLM captured its graphs at start), at most 256 tokens: a
        # long run's full-length warm-up would only double its time.
        warmup = SamplingParams(temperature=1.0, max_tokens=min(args.new_tokens, 256),
                                min_tokens=min(args.new_tokens, 256), ignore_eos=True)
        llm.generate(prompts, warmup, use_tqdm=False)
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            outputs = llm.generate(prompts, sampling, use_tqdm=False)
            best = min(best, time.perf_counter() - start)
        generated = sum(len(o.outputs[0].token_ids) for o in outputs)
        print(json.dumps({
            "bench": "vllm_generate", "vllm": vllm.__version__,
            "model": os.path.basename(os.path.normpath(args.config_dir)), "batch": batch,
            "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
            "generated_tokens": generated, "seconds": best,
            "tokens_per_second": generated / best}), flush=True)


if __name__ == "__main__":
    main()
