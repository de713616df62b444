#!/usr/bin/env python3
"""Converts a Llama, Qwen2 or Qwen3 GGUF file (llama.cpp's format; F32, F16, BF16 and the
quantized types gguf.quants dequantizes: Q4_0 ... Q8_0, Q2_K ... Q6_K) into a Hugging Face model
directory that rlhfd and transformers load: config.json from the GGUF's keys, model.safetensors
(dequantized, fp32 or bf16; the LM head tied when the file has no output tensor of its own or it
equals the embedding), tokenizer.json rebuilt from the GGUF's byte-level BPE vocabulary and merges
with the split regex its pre-tokenizer name stands for, tokenizer_config.json with the GGUF's chat
template and special tokens, generation_config.json.

    python3 deploy/convert_gguf.py MODEL.gguf OUT_DIR [--dtype fp32|bf16] [--sha256 HEX]

--sha256 checks the file first (deploy/fetch_models.sh passes the pinned digest). Needs numpy,
gguf, safetensors, torch and tokenizers (not transformers). A bad file (truncated, an unknown
tensor type or architecture, a wrong digest) exits 1 with a message naming the file and what is
wrong. tests/integration/gguf_convert_test.py checks the conversion against transformers' own
GGUF loader (from_pretrained(dir, gguf_file=...)).
"""
import argparse
import hashlib
import json
import os
import sys

# The regex each llama.cpp pre-tokenizer name stands for (llama.cpp's llm_tokenizer_bpe), as the
# models' own tokenizer.json writes it: a Split before a ByteLevel without its own regex. None:
# the GPT-2 regex of a plain ByteLevel pre-tokenizer (what transformers builds for these names).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_SPLITS = {"qwen2": QWEN2_SPLIT, "llama-bpe": LLAMA3_SPLIT, "gpt2": None,
                        "default": None, "smollm": None}
# GGUF architecture -> (Hugging Face architecture, model_type).
ARCHITECTURES = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2"),
                 "qwen3": ("Qwen3ForCausalLM", "qwen3")}
# GGUF tensor name (after blk.N.) -> Hugging Face name (after model.layers.N.).
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight",
                  "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
# gguf's TokenType: CONTROL and USER_DEFINED tokens are added tokens, matched before the BPE.
TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4


class BadGguf(Exception):
    """An expected problem with the input file: reported in one line, without a traceback."""


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def open_gguf(path):
    import gguf
    try:
        return gguf.GGUFReader(path)
    except Exception as error:  # The reader raises ValueError, KeyError, IndexError or numpy's.
        size = os.path.getsize(path)
        raise BadGguf(f"{path} ({size} bytes) is not a readable GGUF file: {error} "
                      "(truncated or damaged? check its size and sha256)") from None


class Fields:
    """The GGUF's key-value pairs, read by name with the file named in every error."""

    def __init__(self, reader, path):
        self.reader, self.path = reader, path

    def get(self, key, default=KeyError):
        field = self.reader.get_field(key)
        if field is None:
            if default is KeyError:
                raise BadGguf(f"{self.path}: the key '{key}' is missing")
            return default
        return field.contents()


def check_tensor_types(reader, path):
    import gguf
    from gguf.quants import _type_traits
    plain = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16,
             gguf.GGMLQuantizationType.BF16}
    for tensor in reader.tensors:
        if tensor.tensor_type not in plain and tensor.tensor_type not in _type_traits:
            raise BadGguf(f"{path}: tensor {tensor.name} has type {tensor.tensor_type.name}, "
                          "which gguf.quants cannot dequantize")


def dequantized(tensor):
    """The tensor as float32 in Hugging Face's layout (GGUF lists dimensions innermost first)."""
    import numpy as np
    from gguf.quants import dequantize
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    return np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)


def unpermute(weights, heads):
    """Undoes llama.cpp's convert_hf_to_gguf permute of Llama's q/k rows (it interleaves each
    head's two rotary halves for llama.cpp's rotation; Hugging Face rotates halves)."""
    rows = weights.shape[0]
    return (weights.reshape(heads, rows // heads // 2, 2, *weights.shape[1:]).swapaxes(1, 2)
            .reshape(weights.shape))


def float32_decimal(value):
    import numpy as np
    return float(str(np.float32(value)))


def build_config(fields, arch, vocab_size, tied, dtype):
    g = lambda key, default=KeyError: fields.get(f"{arch}.{key}", default)
    hidden = int(g("embedding_length"))
    heads = int(g("attention.head_count"))
    head_dim = int(g("attention.key_length", hidden // heads))
    scaling = g("rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise BadGguf(f"{fields.path}: rope scaling '{scaling}' is not supported (none)")
    hf_arch, model_type = ARCHITECTURES[arch]
    config = {
        "architectures": [hf_arch], "model_type": model_type,
        "vocab_size": vocab_size, "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(g("attention.head_count_kv", heads)), "head_dim": head_dim,
        "hidden_act": "silu", "max_position_embeddings": int(g("context_length")),
        # GGUF stores these as float32: written as the shortest decimal of that float32.
        "rms_norm_eps": float32_decimal(g("attention.layer_norm_rms_epsilon")),
        "rope_theta": float32_decimal(g("rope.freq_base", 10000.0)),
        "tie_word_embeddings": tied, "torch_dtype": "bfloat16" if dtype == "bf16" else "float32",
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
    }
    bos = fields.get("tokenizer.ggml.bos_token_id", None)
    eos = fields.get("tokenizer.ggml.eos_token_id", None)
    if bos is not None:
        config["bos_token_id"] = int(bos)
    if eos is not None:
        config["eos_token_id"] = int(eos)
    try:  # Without it transformers 5 takes a local config for a pre-5.0 Mistral one and warns.
        from importlib.metadata import version
        config["transformers_version"] = version("transformers")
    except Exception:
        pass
    if arch == "llama":
        config.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    if arch in ("qwen2", "qwen3"):
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=config["num_hidden_layers"])
    if arch == "qwen3":
        config["attention_bias"] = False
    return config


def convert_weights(reader, fields, arch, dtype):
    """The state dict (torch tensors) and whether the head is tied."""
    import numpy as np
    import torch
    heads = int(fields.get(f"{arch}.attention.head_count"))
    kv_heads = int(fields.get(f"{arch}.attention.head_count_kv", heads))
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    state, output = {}, None
    for tensor in reader.tensors:
        name = tensor.name
        if name.startswith("blk."):
            _, layer, rest = name.split(".", 2)
            if rest not in LAYER_TENSORS:
                raise BadGguf(f"{fields.path}: tensor {name} is not one a {arch} model has")
            hf_name = f"model.layers.{int(layer)}.{LAYER_TENSORS[rest]}"
        elif name in GLOBAL_TENSORS:
            hf_name = GLOBAL_TENSORS[name]
        elif name == "rope_freqs.weight":
            raise BadGguf(f"{fields.path}: rope_freqs (Llama 3.1 rope scaling) is not supported")
        else:
            raise BadGguf(f"{fields.path}: tensor {name} is not one a {arch} model has")
        weights = dequantized(tensor)
        if arch == "llama" and rest_is(name, "attn_q.weight"):
            weights = unpermute(weights, heads)
        elif arch == "llama" and rest_is(name, "attn_k.weight"):
            weights = unpermute(weights, kv_heads)
        if hf_name == "lm_head.weight":
            output = weights
            continue
        state[hf_name] = torch.from_numpy(weights).to(torch_dtype)
    if "model.embed_tokens.weight" not in state:
        raise BadGguf(f"{fields.path}: the tensor token_embd.weight is missing")
    tied = output is None or np.array_equal(output, state["model.embed_tokens.weight"].float().numpy())
    if not tied:
        state["lm_head.weight"] = torch.from_numpy(output).to(torch_dtype)
    return state, tied


def rest_is(name, suffix):
    return name.startswith("blk.") and name.split(".", 2)[2] == suffix


def build_tokenizer(fields):
    """tokenizer.json (as a tokenizers.Tokenizer) and tokenizer_config.json's fields."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, Regex
    model = fields.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise BadGguf(f"{fields.path}: tokenizer.ggml.model '{model}' is not supported "
                      "(gpt2: byte-level BPE)")
    pre = fields.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZER_SPLITS:
        raise BadGguf(f"{fields.path}: tokenizer.ggml.pre '{pre}' is not supported "
                      f"({', '.join(sorted(PRE_TOKENIZER_SPLITS))})")
    tokens = list(fields.get("tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges")]
    types = list(fields.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    split = PRE_TOKENIZER_SPLITS[pre]
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    added = [AddedToken(tokens[i], special=types[i] == TOKEN_CONTROL, normalized=False)
             for i in range(len(tokens)) if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]
    tokenizer.add_tokens(added)
    name = lambda key: (tokens[int(fields.get(key))] if fields.get(key, None) is not None else None)
    bos, eos = name("tokenizer.ggml.bos_token_id"), name("tokenizer.ggml.eos_token_id")
    add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", False))
    if add_bos and bos is not None:
        bos_id = vocab[bos]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)])
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "model_max_length": 131072, "add_bos_token": add_bos, "add_eos_token": False,
              "bos_token": bos, "eos_token": eos,
              "pad_token": name("tokenizer.ggml.padding_token_id"),
              "unk_token": name("tokenizer.ggml.unknown_token_id")}
    template = fields.get("tokenizer.chat_template", None)
    if template is not None:
        config["chat_template"] = template
    return tokenizer, {k: v for k, v in config.items() if v is not None}


def convert(path, out, dtype="fp32", sha256=None):
    if not os.path.isfile(path):
        raise BadGguf(f"{path} is not a file")
    if sha256:
        actual = sha256_of(path)
        if actual != sha256.lower():
            raise BadGguf(f"{path}: sha256 is {actual}, expected {sha256.lower()} "
                          "(a wrong or incomplete download: delete it and fetch again)")
    reader = open_gguf(path)
    fields = Fields(reader, path)
    arch = fields.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise BadGguf(f"{path}: architecture '{arch}' is not supported ({', '.join(ARCHITECTURES)})")
    check_tensor_types(reader, path)
    tokenizer, tokenizer_config = build_tokenizer(fields)
    state, tied = convert_weights(reader, fields, arch, dtype)
    vocab_size = state["model.embed_tokens.weight"].shape[0]
    if tokenizer.get_vocab_size(with_added_tokens=True) > vocab_size:
        raise BadGguf(f"{path}: {tokenizer.get_vocab_size()} tokens but an embedding of {vocab_size} rows")
    config = build_config(fields, arch, vocab_size, tied, dtype)
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2)
    tokenizer.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, indent=2, ensure_ascii=False)
    return {"model": out, "from": path, "architecture": config["architectures"][0], "dtype": dtype,
            "tie_word_embeddings": tied, "parameters": sum(t.numel() for t in state.values()),
            "tensor_types": sorted({t.tensor_type.name for t in reader.tensors})}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", help="the GGUF file")
    parser.add_argument("out", help="the Hugging Face directory to write")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="weights in model.safetensors (default fp32)")
    parser.add_argument("--sha256", help="the file's expected sha256 (hex); checked before reading")
    args = parser.parse_args()
    try:
        print(json.dumps(convert(os.path.abspath(args.gguf), args.out, args.dtype, args.sha256)))
    except BadGguf as error:
        print(f"convert_gguf: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
