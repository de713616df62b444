#!/usr/bin/env python3
"""deploy/convert_gguf.py on tiny GGUF files written here with gguf.GGUFWriter (no download): a
Llama-shaped model (q/k rows permuted as llama.cpp stores them), a Qwen2-shaped one (q/k/v
biases, an untied output tensor) and a Qwen3-shaped one (q_norm/k_norm, head_dim != hidden/heads),
with F32, F16, Q4_0, Q5_0 and Q8_0 tensors and a byte-level BPE trained here. For each, against
transformers' own GGUF loader of the same file: the same token ids on TEXTS and logits within
LOGIT_TOLERANCE (fp32); then rlhfd's loader on the converted directory: `rlhfd-infer tokenize`
gives the same ids and `rlhfd-infer logprobs` every token's log-probability within
LOGPROB_TOLERANCE of transformers. Then bad files: truncated, an unknown tensor type and a wrong
--sha256 exit 1 with a one-line message naming the file, and no traceback. Exits 77 (skipped)
where gguf, tokenizers or transformers is missing.

    tests/integration/gguf_convert_test.py RLHFD_INFER WORK_DIR
"""
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONVERT = os.path.join(REPO, "deploy", "convert_gguf.py")
LOGIT_TOLERANCE = 1e-4
LOGPROB_TOLERANCE = 1e-4
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = ["What is 17 + 25? The answer is 42.", "Natalia sold clips to 48 of her friends in April.",
          "def add(a, b):\n    return a + b\n", "She's here; they'll see what we've done.",
          "ünïcödé café 日本語 🙂", "  spaces\tand\ttabs\n\nnewlines 1234567890"] * 4
TEXTS = ["What is 17 + 25?", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
         "Natalia sold 48/2 = 24 clips in May. 12345 apples", "ünïcödé 日本語 🙂 x",
         "  leading spaces,\ttabs\nand newlines; I'm sure they'd've said so."]


def train_vocab():
    """A byte-level BPE of 320 tokens (256 bytes, merges) and the ChatML specials after it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    saved = json.loads(tokenizer.to_str())
    vocab = sorted(saved["model"]["vocab"].items(), key=lambda item: item[1])
    tokens = [token for token, _ in vocab]
    merges = [m if isinstance(m, str) else " ".join(m) for m in saved["model"]["merges"]]
    return tokens + SPECIALS, [1] * len(tokens) + [3] * len(SPECIALS), merges


def permute(weights, heads):
    """llama.cpp's convert_hf_to_gguf permute of Llama's q/k rows."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def write_gguf(path, arch, pre, seed):
    import gguf
    import numpy as np
    from gguf.quants import quantize
    rng = np.random.default_rng(seed)
    tokens, types, merges = train_vocab()
    vocab, hidden, ffn, layers, heads, kv_heads = len(tokens), 64, 96, 2, 4, 2
    # Qwen3: head_dim (key_length) 128 != hidden / heads; transformers 5.17's GGUF loader does not
    # read key_length but Qwen3Config's default is 128, as in the real Qwen3 models.
    head_dim = 128 if arch == "qwen3" else hidden // heads
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0 if arch == "llama" else 1000000.0)
    if arch == "qwen3":
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                             "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
                             "assistant\n{% endif %}")
    qtypes = [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0,
              gguf.GGMLQuantizationType.Q5_0, gguf.GGMLQuantizationType.F16]

    def add(name, shape, scale=0.2, qtype=gguf.GGMLQuantizationType.F32, offset=0.0):
        data = (rng.standard_normal(shape) * scale + offset).astype(np.float32)
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, data)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, data.astype(np.float16))
        else:
            writer.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)

    add("token_embd.weight", (vocab, hidden), 0.5, gguf.GGMLQuantizationType.Q8_0)
    for layer in range(layers):
        p, q = f"blk.{layer}.", lambda k: qtypes[(layer + k) % len(qtypes)]
        add(p + "attn_norm.weight", (hidden,), 0.1, offset=1.0)
        add(p + "attn_q.weight", (heads * head_dim, hidden), 0.2, q(0))
        add(p + "attn_k.weight", (kv_heads * head_dim, hidden), 0.2, q(1))
        add(p + "attn_v.weight", (kv_heads * head_dim, hidden), 0.2, q(2))
        add(p + "attn_output.weight", (hidden, heads * head_dim), 0.2, q(3))
        if arch == "qwen2":
            add(p + "attn_q.bias", (heads * head_dim,), 0.2)
            add(p + "attn_k.bias", (kv_heads * head_dim,), 0.2)
            add(p + "attn_v.bias", (kv_heads * head_dim,), 0.2)
        if arch == "qwen3":
            add(p + "attn_q_norm.weight", (head_dim,), 0.1, offset=1.0)
            add(p + "attn_k_norm.weight", (head_dim,), 0.1, offset=1.0)
        add(p + "ffn_norm.weight", (hidden,), 0.1, offset=1.0)
        add(p + "ffn_gate.weight", (ffn, hidden), 0.2, q(1))
        add(p + "ffn_up.weight", (ffn, hidden), 0.2, q(2))
        add(p + "ffn_down.weight", (hidden, ffn), 0.2, q(0))
    add("output_norm.weight", (hidden,), 0.1, offset=1.0)
    if arch != "llama":  # Llama tied (no output tensor); the Qwen ones carry their own head.
        add("output.weight", (vocab, hidden), 0.5, gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def run_json(args):
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def check_model(infer, work, arch, pre, seed):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    gguf_path = os.path.join(work, f"tiny-{arch}.gguf")
    model_dir = os.path.join(work, f"tiny-{arch}")
    write_gguf(gguf_path, arch, pre, seed)
    shutil.rmtree(model_dir, ignore_errors=True)
    converted = run_json([sys.executable, CONVERT, gguf_path, model_dir])
    assert converted["tie_word_embeddings"] == (arch == "llama"), converted
    config = json.load(open(os.path.join(model_dir, "config.json")))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    reference_tokenizer = AutoTokenizer.from_pretrained(work, gguf_file=os.path.basename(gguf_path))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    reference = AutoModelForCausalLM.from_pretrained(work, gguf_file=os.path.basename(gguf_path),
                                                     dtype=torch.float32).eval()
    assert type(model) is type(reference), (type(model), type(reference))
    worst_logit = worst_logprob = 0.0
    for text in TEXTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        expected = reference_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == expected, (arch, text, ids, expected)
        assert tokenizer.decode(ids) == text, (arch, text, tokenizer.decode(ids))
        native = run_json([infer, "tokenize", f"--model={model_dir}", f"--text={text}"])["ids"]
        assert native == ids, (arch, text, native, ids)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
            reference_logits = reference(torch.tensor([ids])).logits[0]
        worst_logit = max(worst_logit, (logits - reference_logits).abs().max().item())
        # rlhfd's loader: the log-probabilities of the text's tokens, from rlhfd-infer.
        log_probs = torch.log_softmax(logits.double(), dim=-1)
        # Without --prompt it scores every token after the first.
        out = run_json([infer, "logprobs", f"--model={model_dir}", f"--text={text}"])
        assert [t["id"] for t in out["tokens"]] == ids[1:], (arch, text, out["tokens"], ids)
        for i, token in enumerate(out["tokens"]):
            worst_logprob = max(worst_logprob, abs(token["logprob"] - log_probs[i, ids[i + 1]].item()))
    assert worst_logit <= LOGIT_TOLERANCE, (arch, worst_logit)
    assert worst_logprob <= LOGPROB_TOLERANCE, (arch, worst_logprob)
    return {"arch": arch, "architecture": config["architectures"][0], "texts": len(TEXTS),
            "max_abs_logit_diff_vs_gguf_loader": worst_logit,
            "max_abs_logprob_diff_rlhfd_infer": worst_logprob}


def expect_error(args, *needles):
    done = subprocess.run([sys.executable, CONVERT, *args], capture_output=True, text=True)
    message = done.stderr.strip()
    assert done.returncode == 1, (args, done.returncode, message)
    assert "Traceback" not in message and len(message.splitlines()) == 1, message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def check_bad_files(work):
    good = os.path.join(work, "tiny-qwen2.gguf")
    data = open(good, "rb").read()
    truncated = os.path.join(work, "truncated.gguf")
    with open(truncated, "wb") as f:
        f.write(data[: len(data) * 2 // 3])
    expect_error([truncated, os.path.join(work, "out-truncated")], truncated, "truncated")
    # A tensor type no GGML has: the u32 after the tensor's name, dimension count and dimensions.
    name = b"blk.0.attn_q.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    unknown = bytearray(data)
    struct.pack_into("<I", unknown, at + 4 + 8 * n_dims, 250)
    unknown_path = os.path.join(work, "unknown-type.gguf")
    with open(unknown_path, "wb") as f:
        f.write(unknown)
    expect_error([unknown_path, os.path.join(work, "out-unknown")], unknown_path, "250")
    expect_error([good, os.path.join(work, "out-sha"), "--sha256", "0" * 64], good, "sha256")
    expect_error([os.path.join(work, "missing.gguf"), os.path.join(work, "out-missing")],
                 "missing.gguf", "not a file")
    for out in ("out-truncated", "out-unknown", "out-sha"):
        assert not os.path.exists(os.path.join(work, out, "model.safetensors")), out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    infer, work = sys.argv[1], sys.argv[2]
    for package in ("gguf", "tokenizers", "transformers", "safetensors"):
        if importlib.util.find_spec(package) is None:
            print(f"gguf_convert_test: {package} is not installed (deploy/setup.sh): skipped")
            sys.exit(77)
    import torch
    torch.set_num_threads(1)
    os.makedirs(work, exist_ok=True)
    results = [check_model(infer, work, "llama", "smollm", 1),
               check_model(infer, work, "qwen2", "qwen2", 2),
               check_model(infer, work, "qwen3", "qwen2", 3)]
    check_bad_files(work)
    print(json.dumps({"gguf_convert_test": "ok", "models": results, "bad_files": 4}))


if __name__ == "__main__":
    main()
