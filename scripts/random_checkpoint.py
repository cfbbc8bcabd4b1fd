#!/usr/bin/env python3
"""Writes a Llama checkpoint of a config.json's shapes with random bf16 weights, in the
Hugging Face layout `serve` loads (config.json, model.safetensors, and the tokenizer files
copied from another model's directory), so that the engine can serve a shape whose real
weights are not at hand (`scripts/gpu_run.sh serve1b`: the Llama-3.2-1B shape with
SmolLM2's tokenizer, whose ids all lie within the shape's vocabulary). Its tokens are
noise: it measures the serving path's speed, not its output.

    scripts/random_checkpoint.py CONFIG.json TOKENIZER_DIR OUT_DIR [--seed S]

Uses PyTorch and safetensors (the GPU machine has both), on the GPU when there is one.
"""

import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file


def main():
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("tokenizer_dir")
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    with open(a.config) as f:
        c = json.load(f)
    h, inter, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    d = c.get("head_dim", h // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(a.seed)

    def matrix(rows, cols):
        w = torch.randn(rows, cols, generator=gen, device=device) * 0.02
        return w.to(torch.bfloat16).cpu()

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    tensors = {"model.embed_tokens.weight": matrix(c["vocab_size"], h), "model.norm.weight": ones(h)}
    if not c.get("tie_word_embeddings", False):
        tensors["lm_head.weight"] = matrix(c["vocab_size"], h)
    for i in range(layers):
        pre = f"model.layers.{i}."
        tensors.update(
            {
                pre + "input_layernorm.weight": ones(h),
                pre + "post_attention_layernorm.weight": ones(h),
                pre + "self_attn.q_proj.weight": matrix(q, h),
                pre + "self_attn.k_proj.weight": matrix(kv, h),
                pre + "self_attn.v_proj.weight": matrix(kv, h),
                pre + "self_attn.o_proj.weight": matrix(h, q),
                pre + "mlp.gate_proj.weight": matrix(inter, h),
                pre + "mlp.up_proj.weight": matrix(inter, h),
                pre + "mlp.down_proj.weight": matrix(h, inter),
            }
        )
    os.makedirs(a.out_dir, exist_ok=True)
    save_file(tensors, os.path.join(a.out_dir, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(a.config, os.path.join(a.out_dir, "config.json"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(a.tokenizer_dir, name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(a.out_dir, name))
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    print(f"wrote {a.out_dir}: {len(tensors)} tensors, {size / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
