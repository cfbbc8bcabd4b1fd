"""The EAGLE-3 draft head in PyTorch, as the EAGLE-3 paper and vLLM's `llama_eagle3.py` run
it (reference: ../shared/reference/speculative-and-mla.md, section 1), with the
training-time test: several draft steps unrolled, each on the head's own previous output.

Row t of a sequence x pairs the target's features at position t with token x[t+1]. Draft
step i (0-based) of row t holds token x[t+1+i] at position t+i, takes as its feature the
fused target states (step 0) or its own previous `pre` (later steps), and attends to the
step-0 keys of rows 0..t and to its own keys of steps 1..i at row t. That is exactly what a
serving engine computes when the target's prefix ends at row t and the head drafts i
tokens past it, so one unrolled pass scores every row as a drafting start.
"""

import json
import math

import torch
import torch.nn.functional as F
from torch import nn


class RmsNorm(nn.Module):
    """x / rms(x) * weight, in float32."""

    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, positions, theta):
    """Llama's rotary embedding (rotate-half) of x [B, T, heads, d] at positions [T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float64) / d))
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).float()[None, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1).float()[None, :, None, :]
    half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + half * sin


def target_rope_theta(config):
    """The target's rotary base: `rope_theta`, or (transformers 5) `rope_parameters`'s."""
    params = config.get("rope_parameters") or {}
    return config.get("rope_theta") or params.get("rope_theta") or 10000.0


class Eagle3Head(nn.Module):
    """fc over the target's low, middle and high states; one decoder layer over
    [embedding; feature]; a final norm and an lm_head over the draft vocabulary."""

    def __init__(self, target_config, aux_layers, draft_vocab, embed, rope_theta=None):
        super().__init__()
        c = target_config
        self.h = h = c["hidden_size"]
        self.nh = c["num_attention_heads"]
        self.nkv = c["num_key_value_heads"]
        self.hd = c.get("head_dim") or h // self.nh
        self.inter = c["intermediate_size"]
        self.eps = c.get("rms_norm_eps", 1e-5)
        self.theta = rope_theta or target_rope_theta(c)
        self.target_config = c
        self.aux_layers = list(aux_layers)
        self.fc = nn.Linear(len(aux_layers) * h, h, bias=False)
        self.input_layernorm = RmsNorm(h, self.eps)
        self.hidden_norm = RmsNorm(h, self.eps)
        self.q_proj = nn.Linear(2 * h, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(2 * h, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(2 * h, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        self.post_attention_layernorm = RmsNorm(h, self.eps)
        self.gate_proj = nn.Linear(h, self.inter, bias=False)
        self.up_proj = nn.Linear(h, self.inter, bias=False)
        self.down_proj = nn.Linear(self.inter, h, bias=False)
        self.norm = RmsNorm(h, self.eps)
        self.lm_head = nn.Linear(h, len(draft_vocab), bias=False)
        # The target's embedding table, shared and frozen (not part of the checkpoint).
        self.register_buffer("embed", embed.detach().float(), persistent=False)
        self.register_buffer("draft_ids", torch.tensor(draft_vocab, dtype=torch.long),
                             persistent=False)

    def step(self, tokens, g, positions, keys, values, residual=None):
        """One draft step over rows [B, T]: tokens, features g [B, T, H]; appends its keys
        and values to `keys`/`values` (step 0's first) and returns (pre, logits)."""
        b, t, _ = g.shape
        e = self.embed[tokens]
        u = torch.cat([self.input_layernorm(e), self.hidden_norm(g)], -1)
        q = rope(self.q_proj(u).view(b, t, self.nh, self.hd), positions, self.theta)
        k = rope(self.k_proj(u).view(b, t, self.nkv, self.hd), positions, self.theta)
        v = self.v_proj(u).view(b, t, self.nkv, self.hd)
        keys.append(k)
        values.append(v)
        o = self.attend(q, keys, values).reshape(b, t, self.nh * self.hd)
        h1 = (g if residual is None else residual) + self.o_proj(o)
        n = self.post_attention_layernorm(h1)
        h2 = h1 + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n))
        return h2, self.lm_head(self.norm(h2))

    def attend(self, q, keys, values):
        """Causal attention to step 0's keys plus the diagonal of every later step's."""
        group = self.nh // self.nkv
        scale = 1.0 / math.sqrt(self.hd)
        rep = lambda x: x.repeat_interleave(group, dim=2)  # noqa: E731 (kv head j // group)
        k0, v0 = rep(keys[0]), rep(values[0])
        t = q.shape[1]
        s0 = torch.einsum("bthd,bshd->bhts", q, k0) * scale
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        s0 = s0.masked_fill(~causal, float("-inf"))
        diag = [(q * rep(k)).sum(-1).transpose(1, 2)[..., None] * scale for k in keys[1:]]
        p = torch.softmax(torch.cat([s0] + diag, -1), -1)
        o = torch.einsum("bhts,bshd->bthd", p[..., :t], v0)
        for j, v in enumerate(values[1:]):
            o = o + p[..., t + j].transpose(1, 2)[..., None] * rep(v)
        return o

    def unroll(self, ids, aux, steps):
        """Draft-vocabulary logits of `steps` unrolled steps over every row of ids [B, T]
        with aux [B, T, n·H] (the target's states at each position): a list whose entry i
        holds [B, T, V_d] (row t: the draft for token t+2+i)."""
        b, t = ids.shape
        g = self.fc(aux)
        keys, values, out = [], [], []
        base = torch.arange(t, device=ids.device)
        for i in range(steps):
            tokens = F.pad(ids[:, 1 + i:], (0, 1 + i))
            g, logits = self.step(tokens, g, base + i, keys, values)
            out.append(logits)
        return out

    def state_dict_eagle3(self):
        """The published EAGLE-3 tensor names (SafeAILab, SpecForge), bf16, plus d2t/t2d."""
        out = {k: v.detach().to(torch.bfloat16).contiguous().cpu()
               for k, v in self.named_eagle3_params()}
        ids = self.draft_ids.cpu()
        out["d2t"] = (ids - torch.arange(len(ids))).to(torch.int64)
        t2d = torch.zeros(self.embed.shape[0], dtype=torch.bool)
        t2d[ids] = True
        out["t2d"] = t2d
        return out

    def load_eagle3(self, tensors):
        """Loads tensors named as `state_dict_eagle3` writes them (floats as they are)."""
        own = dict(self.named_eagle3_params())
        for name, p in own.items():
            p.data.copy_(tensors[name].float().to(p.device))
        ids = torch.arange(len(tensors["d2t"])) + tensors["d2t"]
        self.draft_ids = ids.to(self.draft_ids.device)

    def named_eagle3_params(self):
        """(published name, parameter) of every weight the checkpoint holds."""
        names = {
            "fc.weight": self.fc, "norm.weight": self.norm, "lm_head.weight": self.lm_head,
            "midlayer.input_layernorm.weight": self.input_layernorm,
            "midlayer.hidden_norm.weight": self.hidden_norm,
            "midlayer.self_attn.q_proj.weight": self.q_proj,
            "midlayer.self_attn.k_proj.weight": self.k_proj,
            "midlayer.self_attn.v_proj.weight": self.v_proj,
            "midlayer.self_attn.o_proj.weight": self.o_proj,
            "midlayer.post_attention_layernorm.weight": self.post_attention_layernorm,
            "midlayer.mlp.gate_proj.weight": self.gate_proj,
            "midlayer.mlp.up_proj.weight": self.up_proj,
            "midlayer.mlp.down_proj.weight": self.down_proj,
        }
        return [(k, m.weight) for k, m in names.items()]

    def config_eagle3(self):
        """config.json in the published EAGLE-3 format."""
        c = self.target_config
        return {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": self.h,
            "intermediate_size": self.inter,
            "num_attention_heads": self.nh,
            "num_key_value_heads": self.nkv,
            "head_dim": self.hd,
            "num_hidden_layers": 1,
            "rms_norm_eps": self.eps,
            "rope_theta": self.theta,
            "max_position_embeddings": c.get("max_position_embeddings", 2048),
            "vocab_size": c["vocab_size"],
            "draft_vocab_size": len(self.draft_ids),
            "target_hidden_size": self.h,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": self.aux_layers,
                             "use_aux_hidden_state": True},
        }


def save(head, out_dir, max_shard_bytes=15 * 2**20):
    """Writes config.json and safetensors (sharded with an index past max_shard_bytes)."""
    import os
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    tensors = head.state_dict_eagle3()
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(head.config_eagle3(), f, indent=2)
        f.write("\n")
    shards, cur, size = [], {}, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if cur and size + n > max_shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = t
        size += n
    shards.append(cur)
    if len(shards) == 1:
        save_file(shards[0], os.path.join(out_dir, "model.safetensors"))
        return
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(out_dir, fname))
        for name, t in shard.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")


def load_tensors(head_dir):
    """Every tensor of a head directory (one file or an index of shards)."""
    import os
    from safetensors.torch import load_file

    index = os.path.join(head_dir, "model.safetensors.index.json")
    if not os.path.exists(index):
        return load_file(os.path.join(head_dir, "model.safetensors"))
    with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for name in files:
        out.update(load_file(os.path.join(head_dir, name)))
    return out
