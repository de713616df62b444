#!/usr/bin/env python3
"""References for tests/gpu/hf_greedy_gpu_test: transformers' greedy generate in bf16 on the GPU,
for the committed fixture models (head dims 16 and 32: the engine's module path) and for two
models shaped for the fused decode path (head dims 64 and 128), made here with a fixed seed.
Writes one JSON file listing, per model, each prompt's greedy tokens with the bf16 log-probability
of every chosen token, and the float32 model's log-probabilities of the same tokens and its
top 5 at each step: the truth both bf16 computations are measured against, which also tells a
bf16 near-tie from an error.

    python tests/gpu/make_hf_bf16_greedy.py --out /tmp/hf_bf16_greedy.json --models /tmp/hf-models
"""
import argparse
import json
import os

import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "models")
FIXTURE_MODELS = ["tiny-llama", "tiny-llama3-rope", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"]
MAX_NEW_TOKENS = 32


def make_fused_shaped(out_dir):
    """Qwen2-like (q/k/v bias, head dim 64, 7 query heads per key/value head) and Qwen3-like
    (q/k RMSNorm, head dim 128) random models, the shapes the fused bf16 decoder serves."""
    shapes = {
        "gpu-qwen2-hd64": Qwen2Config(vocab_size=2048, hidden_size=448, intermediate_size=1024,
                                      num_hidden_layers=3, num_attention_heads=7,
                                      num_key_value_heads=1, max_position_embeddings=1024,
                                      tie_word_embeddings=True, initializer_range=0.08),
        "gpu-qwen3-hd128": Qwen3Config(vocab_size=2048, hidden_size=512, intermediate_size=1024,
                                       num_hidden_layers=3, num_attention_heads=8,
                                       num_key_value_heads=2, head_dim=128,
                                       max_position_embeddings=1024, tie_word_embeddings=False,
                                       initializer_range=0.08),
    }
    dirs = []
    for name, config in shapes.items():
        torch.manual_seed(sum(map(ord, name)))
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.add_(torch.randn_like(p) * 0.1)
        path = os.path.join(out_dir, name)
        model.save_pretrained(path, safe_serialization=True)
        dirs.append(path)
    return dirs


def prompts_for(path, vocab):
    golden = os.path.join(path, "generate_golden.json")
    if os.path.exists(golden):
        with open(golden) as f:
            return [case["prompt"] for case in json.load(f)["cases"]]
    g = torch.Generator().manual_seed(17)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 12, 33, 60)]


def greedy(path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    exact = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    cases = []
    for prompt in prompts_for(path, model.config.vocab_size):
        ids = torch.tensor([prompt], device="cuda")
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=MAX_NEW_TOKENS, pad_token_id=0,
                                 output_scores=True, return_dict_in_generate=True)
        tokens = out.sequences[0, len(prompt):].tolist()
        with torch.no_grad():
            exact_lp = torch.log_softmax(exact(out.sequences).logits[0].double(), -1)
        logprobs, logprobs_fp32, top_fp32 = [], [], []
        for step, token in enumerate(tokens):
            logprobs.append(torch.log_softmax(out.scores[step][0].float(), -1)[token].item())
            row = exact_lp[len(prompt) - 1 + step]
            logprobs_fp32.append(row[token].item())
            values, indices = row.topk(5)
            top_fp32.append([[i, v] for i, v in zip(indices.tolist(), values.tolist())])
        cases.append({"prompt": prompt, "output": tokens, "logprobs": logprobs,
                      "logprobs_fp32": logprobs_fp32, "top5_fp32": top_fp32})
    return {"model": path, "cases": cases}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", required=True, help="where the fused-shaped models go")
    args = parser.parse_args()
    os.makedirs(args.models, exist_ok=True)
    paths = [os.path.abspath(os.path.join(FIXTURES, name)) for name in FIXTURE_MODELS]
    paths += make_fused_shaped(args.models)
    result = {"transformers_greedy_bf16": [greedy(path) for path in paths],
              "max_new_tokens": MAX_NEW_TOKENS, "device": torch.cuda.get_device_name(0)}
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(f"wrote {args.out}: {len(paths)} models")


if __name__ == "__main__":
    main()
