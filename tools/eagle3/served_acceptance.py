#!/usr/bin/env python3
"""Acceptance of an EAGLE-3 head as a running Peregrine server measures it: sends the
prompts of recorded answers (their token ids, so the prompts are exactly those recorded)
greedily, reads the speculation counters of /metrics before and after, and writes the
answers it was served, so that evaluate.py can score the head offline on the very same
token sequences.

    tools/eagle3/served_acceptance.py --url http://127.0.0.1:8000 --data heldout.jsonl
        --out served.jsonl [--max-tokens 256] [--concurrency 8]

Per-position acceptance is accepted drafts at that position over verifications with
drafts (vLLM's definition, what /metrics gives); tokens per verification forward is
(accepted + verifications) / verifications. Standard library only.
"""

import argparse
import concurrent.futures
import json
import re
import urllib.request

from generate import post

DRAFTS = "peregrine:spec_decode_num_drafts_total"
DRAFT_TOKENS = "peregrine:spec_decode_num_draft_tokens_total"
ACCEPTED = "peregrine:spec_decode_num_accepted_tokens_total"
PER_POS = "peregrine:spec_decode_num_accepted_tokens_per_pos_total"


def scrape(url):
    """The speculation counters: (drafts, draft tokens, accepted, {position: accepted})."""
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    value = lambda name: sum(float(m) for m in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))  # noqa: E731
    pos = {int(p): float(v) for p, v in re.findall(rf'^{re.escape(PER_POS)}{{[^}}]*position="(\d+)"[^}}]*}} (\S+)$', text, re.M)}
    return value(DRAFTS), value(DRAFT_TOKENS), value(ACCEPTED), pos


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=8)
    a = p.parse_args()
    with open(a.data) as f:
        records = [r for r in map(json.loads, f) if r["variant"] == "greedy"]
    before = scrape(a.url)

    def run(r):
        body = {"model": a.model, "prompt": r["prompt_ids"], "max_tokens": a.max_tokens,
                "temperature": 0.0, "return_token_ids": True}
        c = post(a.url + "/v1/completions", body)["choices"][0]
        return {"id": r["id"], "variant": "greedy", "turn": r["turn"], "prompt_ids": r["prompt_ids"],
                "output_ids": c["token_ids"], "finish_reason": c["finish_reason"]}

    with concurrent.futures.ThreadPoolExecutor(a.concurrency) as pool:
        served = list(pool.map(run, records))
    after = scrape(a.url)
    with open(a.out, "w") as f:
        for r in served:
            f.write(json.dumps(r) + "\n")
    drafts = after[0] - before[0]
    accepted = after[2] - before[2]
    k = max(after[3]) + 1 if after[3] else 0
    per_pos = [(after[3].get(i, 0) - before[3].get(i, 0)) / max(drafts, 1) for i in range(k)]
    same = sum(s["output_ids"] == r["output_ids"] for s, r in zip(served, records))
    print(json.dumps({
        "records": len(served), "verifications": int(drafts),
        "draft_tokens": int(after[1] - before[1]), "accepted": int(accepted),
        "per_position": [round(x, 4) for x in per_pos],
        "tokens_per_forward": round((accepted + drafts) / max(drafts, 1), 4),
        "same_as_recorded": same,
    }))


if __name__ == "__main__":
    main()
