#!/usr/bin/env python3
"""PEFT's side of the LoRA tests (tests/unit/lora_test.cc): what rlhfd's adapters are held to.

    peft_reference.py make MODEL_DIR OUT_DIR [RANK ALPHA RSLORA TARGETS]
        A PEFT adapter over MODEL_DIR with random A and B (seeded; B non-zero, unlike PEFT's init,
        so the adapter changes the model), saved with save_pretrained in OUT_DIR/adapter; and
        OUT_DIR/reference.safetensors: input ids and mask (one row left-padded), the log-prob of
        each next token with the adapter and with it disabled, the gradients of a weighted sum
        of the log-probs with respect to every adapter tensor (PEFT's names), and the weights of
        merge_and_unload().
    peft_reference.py logprobs MODEL_DIR ADAPTER_DIR REFERENCE
        Loads an adapter directory (one rlhfd wrote) with PeftModel.from_pretrained and prints, as
        JSON, the largest difference of its log-probs from REFERENCE's "rlhfd_log_probs".
    peft_reference.py logprobs MODEL_DIR - REFERENCE
        The same for a model directory alone (rlhfd's merged export), in transformers.
    peft_reference.py export BASE_DIR ADAPTER_DIR MERGED_DIR
        A trained job's two exports: the PEFT adapter over its base, and the merged model (bf16),
        on the same random rows; prints, as JSON, their log-probs' relative difference and the
        norm of the adapter's lora_B (zero at initialisation, so above zero once trained).
"""
import json
import os
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def next_token_log_probs(model, ids, mask):
    # Positions count a row's real tokens, as verl's (and rlhfd's) are for left-padded rows.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
    # 0 where the token or the position predicting it is padding.
    return log_probs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1) * mask[:, 1:] * mask[:, :-1]


def inputs(vocab):
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab, (3, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    ids[1, :4] = 0
    return ids, mask


def make(model_dir, out_dir, rank="4", alpha="8", rslora="0", targets="all-linear"):
    torch.manual_seed(11)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    config = LoraConfig(r=int(rank), lora_alpha=float(alpha), use_rslora=rslora == "1",
                        target_modules=targets if targets == "all-linear" else targets.split(","),
                        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    model.eval()
    model.save_pretrained(os.path.join(out_dir, "adapter"))
    ids, mask = inputs(base.config.vocab_size)
    weights = torch.linspace(-1.0, 1.0, ids.shape[1] - 1).expand(ids.shape[0], -1)
    log_probs = next_token_log_probs(model, ids, mask)
    (log_probs * weights).sum().backward()
    tensors = {"input_ids": ids, "attention_mask": mask, "log_probs": log_probs.detach(),
               "loss_weights": weights.contiguous()}
    for name, p in model.named_parameters():
        if p.grad is not None:
            tensors["grad." + name.replace(".default", "")] = p.grad.detach().clone()
    with torch.no_grad(), model.disable_adapter():
        tensors["base_log_probs"] = next_token_log_probs(model, ids, mask)
    merged = model.merge_and_unload()
    for name, p in merged.state_dict().items():
        tensors["merged." + name] = p.detach().clone()
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(out_dir, "reference.safetensors"))
    print(json.dumps({"adapter_tensors": sum(k.startswith("grad.") for k in tensors)}))


def logprobs(model_dir, adapter_dir, reference):
    ref = load_file(reference)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model = base if adapter_dir == "-" else PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        log_probs = next_token_log_probs(model, ref["input_ids"], ref["attention_mask"])
    print(json.dumps({"max_abs_diff": (log_probs - ref["rlhfd_log_probs"]).abs().max().item()}))


def export(base_dir, adapter_dir, merged_dir):
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    adapted = PeftModel.from_pretrained(base, adapter_dir).eval()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype="auto").eval()
    assert merged.dtype == torch.bfloat16, merged.dtype
    merged = merged.float()
    ids, mask = inputs(base.config.vocab_size)
    with torch.no_grad():
        ours = next_token_log_probs(adapted, ids, mask)
        theirs = next_token_log_probs(merged, ids, mask)
    b_norm = sum(p.detach().pow(2).sum() for n, p in adapted.named_parameters() if "lora_B" in n)
    print(json.dumps({"relative_error": ((ours - theirs).norm() / ours.norm()).item(),
                      "lora_b_norm": b_norm.sqrt().item()}))


if __name__ == "__main__":
    {"make": make, "logprobs": logprobs, "export": export}[sys.argv[1]](*sys.argv[2:])
