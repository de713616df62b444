#!/usr/bin/env python3
"""The GSM8K models (Qwen2.5-Coder 0.5B and 1.5B Instruct, Q4_K_M GGUF) as deploy/fetch_models.sh
converts them, against transformers' own GGUF loader of the same file:

- tokens: the converted tokenizer.json (transformers), transformers' GGUF tokenizer and
  `rlhfd-infer tokenize` give the same ids on every text of TEXTS (54);
- log-probs: each text's next-token log-probabilities from the converted directory in
  transformers (fp32, and bf16: max and mean abs difference) against transformers' GGUF loader
  (fp32), and from
  `rlhfd-infer logprobs` (fp32) on the first few texts; fp32 within TOLERANCE.

Prints the figures as JSON (docs/real-model.md quotes them). Exits 77 (skipped) where the models
are not fetched or transformers/gguf are missing.

    tests/integration/gguf_parity.py RLHFD_INFER [MODEL_CACHE] [--logprob-texts N] [--infer-texts N]
        [--models qwen2.5-coder-0.5b,qwen2.5-coder-1.5b]
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys

TOLERANCE = 1e-3  # fp32 on CPU; the measured figures are far smaller (docs/real-model.md).
MODELS = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
GSM8K = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
    "How much did she earn?",
    "Betty is saving money for a new wallet which costs $100. Betty has only half of the money she "
    "needs. Her parents decided to give her $15 for that purpose, and her grandparents twice as "
    "much as her parents. How much more money does Betty need to buy the wallet?",
    "James writes a 3-page letter to 2 different friends twice a week.  How many pages does he "
    "write a year?",
    "Albert is wondering how much pizza he can eat in one day. He buys 2 large pizzas and 2 small "
    "pizzas. A large pizza has 16 slices and a small pizza has 8 slices.",
]
TEXTS = GSM8K + [
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
    "altogether in April and May.\n#### 72",
    "The answer is \\boxed{72}.",
    "Let's think step by step. 12 * 50 / 60 = 10, so she earned $10.",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 17 + 25?"
    "<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>assistant\n17 + 25 = 42. The answer is \\boxed{42}.<|im_end|>\n<|endoftext|>",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < 10; ++i) {\n\tsum += values[i];\n}",
    "import numpy as np\nx = np.arange(12).reshape(3, 4)\nprint(x.T @ x)",
    "SELECT name, COUNT(*) FROM orders WHERE total > 100.50 GROUP BY name;",
    "    leading spaces and trailing spaces    ",
    "tabs\tand\tnewlines\n\n\nand\r\nwindows line ends",
    "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1e-9 1,000,000",
    "ünïcödé façade naïve café Ångström",
    "日本語のテキストと中文文本。",
    "Emoji: 🙂🚀🔥 and combined 👩‍💻",
    "Русский текст и ελληνικά γράμματα.",
    "العربية والعبرية עברית",
    "I'm sure you'll see it's what they'd've done; we're here.",
    "CAPITALS AND lower case MiXeD",
    "https://example.com/path?query=1&other=two#fragment",
    "email: someone@example.org, phone +1 (555) 010-9999",
    "JSON: {\"a\": [1, 2, 3], \"b\": null, \"c\": true}",
    "Markdown **bold** _italic_ `code` # heading\n- item\n- item",
    "$x^2 + y^2 = z^2$ and \\frac{a}{b} \\cdot \\sqrt{2}",
    "a",
    " ",
    "\n",
    "!!!???...,,,;;;:::",
    "The quick brown fox jumps over the lazy dog.",
    "She had 5 apples, gave away 2, and bought 7 more: 5 - 2 + 7 = 10.",
    "A train travels 60 miles per hour for 2.5 hours. How far does it travel?",
    "If 3 pencils cost $0.75, how much do 12 pencils cost?",
    "The ratio of boys to girls is 3:4 and there are 28 students.",
    "Step 1: 4 * 7 = 28.\nStep 2: 28 / 4 = 7.\nStep 3: 7 * 3 = 21 boys.",
    "x = 5\ny = x ** 2\nassert y == 25, 'bad'",
    "class Point:\n    def __init__(self, x: float, y: float) -> None:\n        self.x, self.y = x, y",
    "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v.size(); }",
    "fn main() { let s: String = \"héllo\".to_string(); println!(\"{s}\"); }",
    "<div class=\"box\">Hello &amp; welcome</div>",
    "Total: 1,234.56 USD (≈ 1 100 €), 15% off → 1,049.38",
    "Temperature rose from -3°C to 12°C, a change of 15 degrees.",
    "1/2 + 1/3 = 5/6; 0.5 + 0.333... = 0.8333...",
    "She read 20% of a 250-page book on Monday and 30% of the rest on Tuesday.",
    "Q: How many legs do 3 spiders and 4 ants have?\nA: 3*8 + 4*6 = 24 + 24 = 48.",
    "The year 2024 had 366 days; 366 // 7 = 52 weeks and 2 days.",
    "Write a function that returns the n-th prime number.",
    "Translate to French: The cat sits on the mat.",
    "Le chat est assis sur le tapis, n'est-ce pas ? Ça va très bien.",
    "   \n   \n\t\t",
]


def run_json(args):
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def next_token_logprobs(model, ids):
    import torch
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    log_probs = torch.log_softmax(logits, dim=-1)
    return [log_probs[i - 1, ids[i]].item() for i in range(1, len(ids))]


def check_model(name, infer, cache, logprob_texts, infer_texts):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model_dir, gguf_name = os.path.join(cache, name), f"{name}.Q4_K_M.gguf"
    result = {"model": name, "texts": len(TEXTS)}
    converted = AutoTokenizer.from_pretrained(model_dir)
    from_gguf = AutoTokenizer.from_pretrained(cache, gguf_file=gguf_name)
    ids = []
    equal = 0
    for text in TEXTS:
        ours = converted(text, add_special_tokens=False)["input_ids"]
        theirs = from_gguf(text, add_special_tokens=False)["input_ids"]
        assert ours == theirs, (name, text, ours, theirs)
        assert converted.decode(ours) == text, (name, text, converted.decode(ours))
        if infer:
            native = run_json([infer, "tokenize", f"--model={model_dir}", f"--text={text}"])["ids"]
            assert native == ours, (name, text, native, ours)
        equal += 1
        ids.append(ours)
    result["tokens_equal"] = f"{equal}/{len(TEXTS)}"
    result["rlhfd_infer_tokens_checked"] = bool(infer)

    # Log-probs: texts of at least two tokens, the model loaded one at a time (memory).
    scored = [i for i in range(len(TEXTS)) if len(ids[i]) >= 2][:logprob_texts]
    reference = AutoModelForCausalLM.from_pretrained(cache, gguf_file=gguf_name, dtype=torch.float32).eval()
    expected = [next_token_logprobs(reference, ids[i]) for i in scored]
    del reference
    worst, mean = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        key = "fp32" if dtype == torch.float32 else "bf16"
        diffs = [abs(a - b) for n, i in enumerate(scored)
                 for a, b in zip(next_token_logprobs(model, ids[i]), expected[n])]
        worst[key], mean[key] = max(diffs), sum(diffs) / len(diffs)
        del model
    assert worst["fp32"] <= TOLERANCE, (name, worst)
    result["logprob_texts"] = len(scored)
    result["logprob_tokens"] = sum(len(e) for e in expected)
    result["max_abs_logprob_diff_converted_fp32_vs_gguf_loader"] = worst["fp32"]
    result["max_abs_logprob_diff_converted_bf16_vs_gguf_loader"] = worst["bf16"]
    result["mean_abs_logprob_diff_converted_fp32_vs_gguf_loader"] = mean["fp32"]
    result["mean_abs_logprob_diff_converted_bf16_vs_gguf_loader"] = mean["bf16"]
    if infer and infer_texts:
        native_worst, tokens = 0.0, 0
        for n, i in enumerate(scored[:infer_texts]):
            # Without --prompt, rlhfd-infer logprobs scores every token after the first.
            out = run_json([infer, "logprobs", f"--model={model_dir}", f"--text={TEXTS[i]}"])
            got = [t["id"] for t in out["tokens"]]
            assert got == ids[i][1:], (name, TEXTS[i], got, ids[i][1:])
            for token, want in zip(out["tokens"], expected[n]):
                native_worst = max(native_worst, abs(token["logprob"] - want))
            tokens += len(got)
        assert native_worst <= TOLERANCE, (name, native_worst)
        result["rlhfd_infer_logprob_texts"] = min(infer_texts, len(scored))
        result["rlhfd_infer_logprob_tokens"] = tokens
        result["max_abs_logprob_diff_rlhfd_infer_fp32_vs_gguf_loader"] = native_worst
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("infer", help="build/worker/rlhfd-infer ('' to leave it out)")
    parser.add_argument("cache", nargs="?", help="deploy/fetch_models.sh's cache (default: "
                        "RLHFD_MODEL_CACHE or ~/.cache/rlhfd/models)",
                        default=os.environ.get("RLHFD_MODEL_CACHE",
                                               os.path.expanduser("~/.cache/rlhfd/models")))
    parser.add_argument("--logprob-texts", type=int, default=8, help="texts scored, per model")
    parser.add_argument("--infer-texts", type=int, default=2, help="of those, scored by rlhfd-infer")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    if importlib.util.find_spec("gguf") is None or importlib.util.find_spec("transformers") is None:
        print("gguf_parity: gguf or transformers is not installed (deploy/setup.sh): skipped")
        sys.exit(77)
    models = [m for m in args.models.split(",")
              if os.path.isfile(os.path.join(args.cache, m, "model.safetensors"))]
    if not models:
        print(f"gguf_parity: no converted model under {args.cache} (deploy/fetch_models.sh): skipped")
        sys.exit(77)
    import torch
    torch.set_num_threads(1)
    for name in models:
        print(json.dumps(check_model(name, args.infer, args.cache, args.logprob_texts,
                                     args.infer_texts)), flush=True)


if __name__ == "__main__":
    main()
