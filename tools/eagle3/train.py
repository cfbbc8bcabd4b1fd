#!/usr/bin/env python3
"""Trains an EAGLE-3 head for a target model on the target's own answers (generate.py),
with the training-time test: `--steps` draft steps unrolled on the head's own states, step
i weighted 0.8^i, each step's loss the cross-entropy against the target's distribution
restricted to the draft vocabulary, on answer tokens whose target argmax the draft
vocabulary holds (reference section 1.6).

    tools/eagle3/train.py --target DIR --data answers.jsonl --out HEAD_DIR
        [--heldout heldout_answers.jsonl] [--init HEAD_DIR] [--draft-vocab 8192] [--steps 7]
        [--minutes 7.6] [--lr 3e-4] [--tokens-per-batch 16384] [--device cuda]

The draft vocabulary is the --draft-vocab most frequent tokens of the training answers.
The head's lm_head and final norm start from the target's (its tied LM head rows of the
draft vocabulary and its final norm); the rest starts at random; --init continues from a
trained head instead, keeping its draft vocabulary. The learning rate warms
up over the first 3% of the time budget and decays along a cosine over the rest, so that
the run ends annealed when its minutes are up. The head's steps run under bf16 autocast;
the target's states and the losses are float32. The head is written in the published
EAGLE-3 format, bf16; with --heldout its offline acceptance (evaluate.py) is printed.
"""

import argparse
import collections
import json
import math
import os
import random
import time

import torch
import torch.nn.functional as F

from data import batches, default_aux_layers, load_records, load_target, target_features
from evaluate import acceptance, report
from head import Eagle3Head, load_tensors, save


def draft_vocabulary(records, size):
    """The `size` most frequent answer tokens, ascending, and the share of answer tokens
    they cover (with the shares of a few other sizes, to choose by)."""
    counts = collections.Counter()
    for r in records:
        counts.update(r["output_ids"])
    total = sum(counts.values())
    ranked = [t for t, _ in counts.most_common()]
    cover = {n: sum(counts[t] for t in ranked[:n]) / total for n in sorted({2048, 4096, 8192, 16384, size})}
    return sorted(ranked[:size]), cover, len(ranked)


def step_losses(head, target, ids, lengths, prompts, steps):
    """Per-step loss and teacher-forced top-1 accuracy over a batch."""
    aux, logits = target_features(target, ids, head.aux_layers)
    draft_logits_t = logits[..., head.draft_ids]
    in_vocab = torch.zeros(logits.shape[-1], dtype=torch.bool, device=ids.device)
    in_vocab[head.draft_ids] = True
    t = ids.shape[1]
    rows = torch.arange(t, device=ids.device)[None, :]
    # valid[b, r]: target row r predicts token r+1, an answer token present in the data
    # whose target argmax is in the draft vocabulary.
    valid = (rows + 1 < lengths[:, None]) & (rows + 1 >= prompts[:, None])
    valid &= in_vocab[logits.argmax(-1)]
    target_p = torch.softmax(draft_logits_t, -1)
    target_top = draft_logits_t.argmax(-1)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16):
        outs = head.unroll(ids, aux, steps)
    losses, accs = [], []
    for i, out in enumerate(outs):
        pred = out[:, : t - 1 - i].float()
        tp, top, mask = target_p[:, 1 + i:], target_top[:, 1 + i:], valid[:, 1 + i:]
        n = mask.sum().clamp(min=1)
        ce = -(tp * F.log_softmax(pred, -1)).sum(-1)
        losses.append((ce * mask).sum() / n)
        accs.append(((pred.argmax(-1) == top) & mask).sum().float() / n)
    return losses, accs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--heldout")
    p.add_argument("--init", help="a head directory to continue training (its draft vocabulary kept)")
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--minutes", type=float, default=7.6)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--tokens-per-batch", type=int, default=16384)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=256, help="as generated, for evaluation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    t0 = time.time()
    records = load_records(a.data)
    answer_tokens = sum(len(r["output_ids"]) for r in records)
    vocab, cover, distinct = draft_vocabulary(records, a.draft_vocab)
    theta = None
    if a.init:
        init = load_tensors(a.init)
        vocab = (torch.arange(len(init["d2t"])) + init["d2t"]).tolist()
        with open(os.path.join(a.init, "config.json")) as f:
            theta = json.load(f)["rope_theta"]
    print(f"data: {len(records)} answers, {answer_tokens} answer tokens, "
          f"{sum(len(r['prompt_ids']) for r in records)} prompt tokens, {distinct} distinct "
          "answer tokens; draft vocabulary coverage "
          + ", ".join(f"{n}: {c:.4f}" for n, c in cover.items()), flush=True)
    target = load_target(a.target, a.device)
    cfg = target.config.to_dict()
    aux_layers = default_aux_layers(cfg["num_hidden_layers"])
    embed = target.get_input_embeddings().weight
    head = Eagle3Head(cfg, aux_layers, vocab, embed, rope_theta=theta).to(a.device)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[head.draft_ids])
        head.norm.weight.copy_(target.model.norm.weight)
    if a.init:
        head.load_eagle3(init)
    params = [p for p in head.parameters() if p.requires_grad]
    print(f"head: {sum(p.numel() for p in params)} parameters, aux layers {aux_layers}, "
          f"draft vocabulary {len(vocab)}", flush=True)
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    data = batches(records, a.tokens_per_batch, a.max_len)
    budget = a.minutes * 60
    start, step, epoch = time.time(), 0, 0
    weights = [0.8**i for i in range(a.steps)]
    done = False
    while not done:
        epoch += 1
        random.shuffle(data)
        sums, n = [0.0] * a.steps, 0
        for ids, lengths, prompts in data:
            frac = (time.time() - start) / budget
            if frac >= 1:
                done = True
                break
            warm = 0.03
            scale = frac / warm if frac < warm else 0.1 + 0.45 * (1 + math.cos(math.pi * (frac - warm) / (1 - warm)))
            for g in opt.param_groups:
                g["lr"] = a.lr * scale
            losses, accs = step_losses(head, target, ids.to(a.device), lengths.to(a.device),
                                       prompts.to(a.device), a.steps)
            loss = sum(w * l for w, l in zip(weights, losses))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            step += 1
            for i, acc in enumerate(accs):
                sums[i] += float(acc)
            n += 1
            if step % 100 == 0:
                print(f"step {step} epoch {epoch} {time.time() - start:.0f} s loss {loss.item():.3f} "
                      f"lr {a.lr * scale:.2e} teacher-forced top-1 per step "
                      + " ".join(f"{float(x):.3f}" for x in accs), flush=True)
        if n:
            print(f"epoch {epoch} done at {time.time() - start:.0f} s, {step} steps: mean top-1 "
                  "per step " + " ".join(f"{s / n:.3f}" for s in sums), flush=True)
    train_s = time.time() - start
    # What is served is the bf16 checkpoint: evaluate that.
    with torch.no_grad():
        for prm in head.parameters():
            prm.copy_(prm.to(torch.bfloat16).float())
    save(head, a.out)
    size = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    summary = {"answers": len(records), "answer_tokens": answer_tokens, "epochs": epoch,
               "optimizer_steps": step, "train_seconds": round(train_s, 1),
               "head_bytes": size, "draft_vocab": len(vocab),
               "coverage": round(cover.get(a.draft_vocab, 0.0), 4)}
    if a.heldout:
        held = load_records(a.heldout, {"greedy"})
        ev0 = time.time()
        for k in (3, 5):
            res = report(*acceptance(head.eval(), target, held, k, a.max_tokens, a.device))
            summary[f"heldout_k{k}"] = res
        summary["eval_seconds"] = round(time.time() - ev0, 1)
    summary["total_seconds"] = round(time.time() - t0, 1)
    print(json.dumps(summary), flush=True)
    with open(os.path.join(a.out, "training.json"), "w") as f:
        json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
