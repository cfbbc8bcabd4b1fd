#!/usr/bin/env python3
"""Writes a random EAGLE-3 head for a target model, in the published format (config.json
with draft_vocab_size, safetensors with `midlayer.*` tensors in bf16, int64 `d2t`), so that
the whole eagle3 path (loading, the target's aux hidden states, drafting, graphs) can run
against a real target where no trained head is at hand. Its drafts are random: it measures
the path's cost, not a speedup.

    scripts/random_eagle3_head.py TARGET_DIR OUT_DIR [--draft-vocab N] [--seed S]

Standard library only (the GPU machine has no numpy).
"""

import argparse
import json
import math
import os
import random
import struct


def bf16_bytes(values):
    """Little-endian bf16 of each float (round to nearest even)."""
    out = bytearray()
    for v in values:
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        bits += 0x7FFF + ((bits >> 16) & 1)
        out += struct.pack("<H", (bits >> 16) & 0xFFFF)
    return bytes(out)


def uniform(rng, n, fan_in):
    a = 1.0 / math.sqrt(fan_in)
    return [rng.uniform(-a, a) for _ in range(n)]


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, bytes)."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target")
    p.add_argument("out")
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    with open(os.path.join(a.target, "config.json")) as f:
        t = json.load(f)
    rng = random.Random(a.seed)
    h, inter = t["hidden_size"], t["intermediate_size"]
    heads, kv_heads = t["num_attention_heads"], t["num_key_value_heads"]
    d = t.get("head_dim", h // heads)
    vocab, layers = t["vocab_size"], t["num_hidden_layers"]
    aux = [2, layers // 2, layers - 3]
    dv = min(a.draft_vocab, vocab)
    tensors = {}

    def add(name, shape, fan_in=None):
        n = math.prod(shape)
        values = uniform(rng, n, fan_in) if fan_in else [rng.uniform(0.8, 1.2) for _ in range(n)]
        tensors[name] = ("BF16", shape, bf16_bytes(values))

    add("fc.weight", [h, len(aux) * h], len(aux) * h)
    for norm in ["input_layernorm", "hidden_norm", "post_attention_layernorm"]:
        add(f"midlayer.{norm}.weight", [h])
    add("midlayer.self_attn.q_proj.weight", [heads * d, 2 * h], 2 * h)
    add("midlayer.self_attn.k_proj.weight", [kv_heads * d, 2 * h], 2 * h)
    add("midlayer.self_attn.v_proj.weight", [kv_heads * d, 2 * h], 2 * h)
    add("midlayer.self_attn.o_proj.weight", [h, heads * d], heads * d)
    add("midlayer.mlp.gate_proj.weight", [inter, h], h)
    add("midlayer.mlp.up_proj.weight", [inter, h], h)
    add("midlayer.mlp.down_proj.weight", [h, inter], inter)
    add("norm.weight", [h])
    add("lm_head.weight", [dv, h], h)
    used = sorted(rng.sample(range(vocab), dv))
    d2t = [tid - i for i, tid in enumerate(used)]
    tensors["d2t"] = ("I64", [dv], struct.pack(f"<{dv}q", *d2t))
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "model.safetensors"), tensors)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": d,
        "num_hidden_layers": 1,
        "rms_norm_eps": t.get("rms_norm_eps", 1e-5),
        "rope_theta": t.get("rope_theta", 10000.0),
        "max_position_embeddings": t.get("max_position_embeddings", 2048),
        "vocab_size": vocab,
        "draft_vocab_size": dv,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True},
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"wrote {a.out}: hidden {h}, draft vocabulary {dv}, aux layers {aux}")


if __name__ == "__main__":
    main()
