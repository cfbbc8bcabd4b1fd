"""The target model and the answer records the head learns from, shared by training and
evaluation."""

import json

import torch


def load_records(path, variants=None):
    """Records of generate.py (prompt_ids, output_ids, ...), of the given variants."""
    out = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if variants is None or r["variant"] in variants:
                out.append(r)
    return out


def load_target(target_dir, device):
    """The target through Hugging Face transformers, float32, for its hidden states."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(target_dir, torch_dtype=torch.float32)
    return model.to(device).eval().requires_grad_(False)


def default_aux_layers(num_layers):
    """EAGLE-3's (2, L/2, L-3)."""
    return [2, num_layers // 2, num_layers - 3]


@torch.no_grad()
def target_features(model, ids, aux_layers):
    """The inputs of the aux layers concatenated, [B, T, n·H], and the logits [B, T, V]
    of ids [B, T] (right-padded: causal attention keeps padding out of real rows)."""
    out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    aux = torch.cat([out.hidden_states[i] for i in aux_layers], -1).float()
    return aux, out.logits.float()


def batches(records, tokens_per_batch, max_len, pad_id=0):
    """Records as (ids [B, T], lengths [B], prompt_lens [B]) batches of similar length,
    at most tokens_per_batch padded tokens each; sequences cut at max_len."""
    seqs = []
    for r in records:
        ids = (r["prompt_ids"] + r["output_ids"])[:max_len]
        if len(r["output_ids"]) > 0 and len(r["prompt_ids"]) < len(ids):
            seqs.append((ids, len(r["prompt_ids"])))
    seqs.sort(key=lambda s: len(s[0]))
    out, cur = [], []
    for s in seqs:
        if cur and (len(cur) + 1) * len(s[0]) > tokens_per_batch:
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    result = []
    for group in out:
        t = max(len(ids) for ids, _ in group)
        ids = torch.full((len(group), t), pad_id, dtype=torch.long)
        for i, (s, _) in enumerate(group):
            ids[i, : len(s)] = torch.tensor(s)
        lengths = torch.tensor([len(s) for s, _ in group])
        prompts = torch.tensor([p for _, p in group])
        result.append((ids, lengths, prompts))
    return result
