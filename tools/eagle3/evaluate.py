#!/usr/bin/env python3
"""Offline acceptance of an EAGLE-3 head, measured in PyTorch against the target through
transformers, on the target's own greedy answers to held-out prompts.

    tools/eagle3/evaluate.py --target DIR --head DIR --data heldout_answers.jsonl
        [--k 3] [--max-tokens 256] [--device cuda]

It replays greedy serving exactly: after the prompt, the target's sampled token and its
features at every position so far are known; the head drafts k tokens in a chain; the
drafts are accepted up to the first that differs from the target's own next token; the
next round starts after the accepted tokens and the target's bonus token. A round drafts
min(k, max_tokens - generated - 1) tokens, as Peregrine's scheduler plans them. Prints
per-position acceptance (accepted at position i over rounds, as vLLM's metrics count it,
and over drafts proposed at position i, as Peregrine's log line does) and tokens per
verification forward.
"""

import argparse
import json

import torch

from data import batches, load_records, load_target, target_features
from head import Eagle3Head, load_tensors


@torch.no_grad()
def acceptance(head, target, records, k, max_tokens, device, tokens_per_batch=16384):
    """Counts of proposed and accepted drafts per position, and rounds."""
    proposed, accepted, rounds, emitted = [0] * k, [0] * k, 0, 0
    for ids, lengths, prompts in batches(records, tokens_per_batch, 10**9):
        ids = ids.to(device)
        aux, _ = target_features(target, ids, head.aux_layers)
        outs = head.unroll(ids, aux, k)
        # drafts[b, t, j]: the target id head step j proposes at row t (for token t+2+j).
        drafts = torch.stack([head.draft_ids[o.argmax(-1)] for o in outs], -1).cpu()
        ids = ids.cpu()
        for b in range(ids.shape[0]):
            n_len, p = int(lengths[b]), int(prompts[b])
            m = p  # index of the token just sampled
            while m < n_len - 1:
                generated = m - p + 1
                n = min(k, max_tokens - generated - 1)
                if n <= 0:
                    break
                a = 0
                while a < n and m + 1 + a < n_len and int(drafts[b, m - 1, a]) == int(ids[b, m + 1 + a]):
                    a += 1
                for j in range(n):
                    proposed[j] += 1
                    accepted[j] += int(j < a)
                rounds += 1
                emitted += a + 1
                m += a + 1
    return proposed, accepted, rounds, emitted


def report(proposed, accepted, rounds, emitted):
    """Per-position acceptance as vLLM's metrics count it (accepted at the position over
    rounds), as Peregrine's log line counts it (over drafts proposed at the position), and
    tokens per verification forward."""
    per_pos = [a / max(rounds, 1) for a in accepted]
    of_proposed = [a / max(p, 1) for p, a in zip(proposed, accepted)]
    return {
        "rounds": rounds,
        "per_position": [round(x, 4) for x in per_pos],
        "per_position_of_proposed": [round(x, 4) for x in of_proposed],
        "tokens_per_forward": round(emitted / max(rounds, 1), 4),
        "acceptance": round(sum(accepted) / max(sum(proposed), 1), 4),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--head", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    target = load_target(a.target, a.device)
    with open(f"{a.head}/config.json") as f:
        cfg = json.load(f)
    tensors = load_tensors(a.head)
    vocab = (torch.arange(len(tensors["d2t"])) + tensors["d2t"]).tolist()
    aux = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    head = Eagle3Head(target.config.to_dict(), aux, vocab, target.get_input_embeddings().weight,
                      rope_theta=cfg["rope_theta"])
    head.load_eagle3(tensors)
    head = head.to(a.device).eval()
    records = load_records(a.data, {"greedy"})
    result = report(*acceptance(head, target, records, a.k, a.max_tokens, a.device))
    print(json.dumps({"k": a.k, "records": len(records), **result}))


if __name__ == "__main__":
    main()
