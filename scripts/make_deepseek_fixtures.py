#!/usr/bin/env python3
"""Logits fixtures for the DeepSeek family, made by Hugging Face transformers' own models.

Tiny random configurations of DeepseekV2ForCausalLM (MLA without q_lora_rank, YaRN,
group-limited softmax routing, a dense first layer), DeepseekV3ForCausalLM (MLA with
q_lora_rank, sigmoid scoring with e_score_correction_bias and noaux_tc group selection,
norm_topk_prob, routed_scaling_factor) and Qwen3MoeForCausalLM (softmax top-k experts,
grouped-query attention with q/k norms) are built by transformers, their weights
re-randomized at a scale that makes every path matter (routing gates, biases and norms
included), rounded to float32 and saved as a Hugging Face folder (config.json,
model.safetensors). Each model then runs a fixed 24-token prompt in float64 on the CPU
(eager attention, no cache), and the script records the logits at every position and the
hidden state after every layer.

Peregrine's tests load the same folders and compare their forwards with these numbers;
CI reads the committed files, this script runs where transformers is (the GPU machine has
it; no GPU is needed). Usage:

    python3 scripts/make_deepseek_fixtures.py tests/fixtures/deepseek

writes <name>/config.json and <name>/model.safetensors for each model and
deepseek_fixtures.json with every model's prompt, logits (`[position][token]`) and hidden
states (`[embeddings, after layer 1, ..., after the last layer and the final norm]`, as
transformers' `output_hidden_states` gives them). The committed files were made with
transformers 5.17.0 and torch 2.11.0 (recorded in the JSON), which write the rotary
settings as `rope_parameters` (published checkpoints say `rope_scaling`) and Qwen3-MoE's
expert count as `num_local_experts` (published: `num_experts`); experts are saved one
tensor per expert, as the published checkpoints are.
"""

import json
import os
import sys

import torch
import transformers

PROMPT_LEN = 24
VOCAB = 320


def yarn(factor, original, mscale, mscale_all_dim):
    return {
        "type": "yarn",
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": original,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": mscale,
        "mscale_all_dim": mscale_all_dim,
    }


COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    rope_theta=10000.0,
    bos_token_id=1,
    eos_token_id=2,
    attention_bias=False,
)

MLA = dict(
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
    n_routed_experts=8,
    n_shared_experts=1,
    moe_intermediate_size=24,
    first_k_dense_replace=1,
    moe_layer_freq=1,
    n_group=4,
    topk_group=2,
)


def configs():
    """(name, config) for each model this transformers has."""
    out = []
    if hasattr(transformers, "DeepseekV2Config"):
        out.append((
            "deepseek_v2",
            transformers.DeepseekV2Config(
                **COMMON,
                **MLA,
                q_lora_rank=None,
                num_experts_per_tok=3,
                topk_method="group_limited_greedy",
                norm_topk_prob=False,
                routed_scaling_factor=1.5,
                rope_scaling=yarn(4.0, 64, 0.707, 0.707),
            ),
        ))
    if hasattr(transformers, "DeepseekV3Config"):
        out.append((
            "deepseek_v3",
            transformers.DeepseekV3Config(
                **COMMON,
                **MLA,
                q_lora_rank=48,
                num_experts_per_tok=2,
                topk_method="noaux_tc",
                norm_topk_prob=True,
                routed_scaling_factor=2.5,
                rope_scaling=yarn(4.0, 64, 1.0, 1.0),
                rope_interleave=True,
                num_nextn_predict_layers=1,
            ),
        ))
    if hasattr(transformers, "Qwen3MoeConfig"):
        q = dict(COMMON)
        q.update(rope_theta=1000000.0)
        out.append((
            "qwen3_moe",
            transformers.Qwen3MoeConfig(
                **q,
                num_key_value_heads=2,
                head_dim=16,
                moe_intermediate_size=24,
                num_experts=8,
                num_experts_per_tok=2,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[0],
            ),
        ))
    return out


def randomize(model, generator):
    """Every parameter and buffer drawn afresh: norms near 1, the rest N(0, 0.1)."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    with torch.no_grad():
        for name, t in named:
            if not t.is_floating_point() or "rotary_emb" in name:
                continue
            noise = torch.randn(t.shape, generator=generator, dtype=torch.float64)
            if name.endswith("norm.weight") or "layernorm" in name:
                t.copy_(1.0 + 0.1 * noise)
            elif "e_score_correction_bias" in name:
                t.copy_(0.05 * noise)
            else:
                t.copy_(0.1 * noise)


def main():
    out_dir = sys.argv[1]
    fixtures = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "models": {},
    }
    for i, (name, config) in enumerate(configs()):
        config._attn_implementation = "eager"
        # transformers 5 runs experts through grouped matrix products by default, which
        # take no float64; the plain loop over experts does.
        config._experts_implementation = "eager"
        torch.manual_seed(100 + i)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.eval()
        randomize(model, torch.Generator().manual_seed(200 + i))
        folder = os.path.join(out_dir, name)
        # save_pretrained writes the checkpoint format (one tensor per expert, as the
        # published checkpoints are), not the fused experts transformers 5 holds.
        model.save_pretrained(folder, safe_serialization=True)
        for extra in os.listdir(folder):
            if extra not in ("config.json", "model.safetensors"):
                os.remove(os.path.join(folder, extra))
        # The reference is what loads from those files.
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager"
        )
        model.config._experts_implementation = "eager"
        model.eval()
        state = model.state_dict()
        prompt = torch.randint(3, VOCAB, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(300 + i))
        model.double()
        with torch.no_grad():
            result = model(prompt, use_cache=False, output_hidden_states=True)
        fixtures["models"][name] = {
            "architecture": type(model).__name__,
            "prompt_ids": prompt[0].tolist(),
            "logits": [[float(f"{v:.9g}") for v in row] for row in result.logits[0].tolist()],
            "hidden_states": [
                [[float(f"{v:.9g}") for v in row] for row in h[0].tolist()]
                for h in result.hidden_states
            ],
        }
        print(f"{name}: {type(model).__name__}, {sum(t.numel() for t in state.values())} values, "
              f"logits {tuple(result.logits.shape)}, max |logit| {result.logits.abs().max():.3f}")
    with open(os.path.join(out_dir, "deepseek_fixtures.json"), "w") as f:
        json.dump(fixtures, f)


if __name__ == "__main__":
    main()
