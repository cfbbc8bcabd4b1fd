#!/usr/bin/env python3
"""Collects the target's own answers to a prompt set from a running Peregrine server (the
target served as it is served to users), with the token ids it generated, for training and
evaluating an EAGLE-3 head.

    tools/eagle3/generate.py PROMPTS.jsonl OUT.jsonl [--url http://127.0.0.1:8000]
        [--variants greedy,sampled] [--max-tokens 256] [--concurrency 128] [--deadline S]

Each chat item is answered turn by turn (the next turn's conversation holds the target's
previous answer); each completion item once. Each answer becomes one line of OUT:
  {"id", "variant", "turn", "prompt_ids", "output_ids", "finish_reason"}
where prompt_ids are the ids the server built (chat template applied) and output_ids the
ids it generated (`return_token_ids`). `greedy` is temperature 0; `sampled` is temperature
0.7 and `hot` temperature 1.0, both with top_p 0.95 and seeded per item. Items not started by --deadline seconds are skipped.
A turn the server refuses (400: a conversation past the context, say) ends its item with
the turns before it kept; the refusals are counted and the first few printed.
Standard library only.
"""

import argparse
import concurrent.futures
import json
import sys
import threading
import time
import urllib.error
import urllib.request

VARIANTS = {
    "greedy": {"temperature": 0.0},
    "sampled": {"temperature": 0.7, "top_p": 0.95},
    "hot": {"temperature": 1.0, "top_p": 0.95},
}


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Refused(Exception):
    """The server refused a turn with a 400 (a conversation past the context, say): the
    records of the turns before it, and the server's message."""

    def __init__(self, records, message):
        super().__init__(message)
        self.records = records


def answer(args, item, variant, seed):
    """The records of one item under one variant; Refused where the server refuses a turn."""
    params = {"model": args.model, "max_tokens": args.max_tokens, "return_token_ids": True,
              **VARIANTS[variant]}
    if variant != "greedy":
        params["seed"] = seed
    out = []
    if item["kind"] == "completion":
        try:
            r = post(args.url + "/v1/completions", {**params, "prompt": item["prompt"]})
        except urllib.error.HTTPError as e:
            if e.code != 400:
                raise
            raise Refused(out, e.read().decode("utf-8", "replace")[:300]) from None
        c = r["choices"][0]
        out.append(record(item, variant, 0, c["prompt_token_ids"], c))
        return out
    messages = []
    for turn, text in enumerate(item["turns"]):
        messages.append({"role": "user", "content": text})
        try:
            r = post(args.url + "/v1/chat/completions", {**params, "messages": messages})
        except urllib.error.HTTPError as e:
            if e.code != 400:
                raise
            raise Refused(out, e.read().decode("utf-8", "replace")[:300]) from None
        c = r["choices"][0]
        out.append(record(item, variant, turn, r["prompt_token_ids"], c))
        messages.append({"role": "assistant", "content": c["message"]["content"]})
    return out


def record(item, variant, turn, prompt_ids, choice):
    return {"id": item["id"], "variant": variant, "turn": turn, "prompt_ids": prompt_ids,
            "output_ids": choice["token_ids"], "finish_reason": choice["finish_reason"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("prompts")
    p.add_argument("out")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--variants", default="greedy,sampled")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--deadline", type=float, default=1e9)
    p.add_argument("--limit", type=int, default=None, help="the first N items only")
    a = p.parse_args()
    with open(a.prompts) as f:
        items = [json.loads(line) for line in f][: a.limit]
    variants = a.variants.split(",")
    jobs = [(item, v, i) for i, item in enumerate(items) for v in variants]
    start = time.time()
    lock, done, tokens, skipped = threading.Lock(), [0], [0], [0]
    refused = []  # (item id, the server's message) of each refused turn
    with open(a.out, "w") as f:
        def run(job):
            item, v, seed = job
            if time.time() - start > a.deadline:
                with lock:
                    skipped[0] += 1
                return
            try:
                recs = answer(a, item, v, seed)
            except Refused as e:
                recs = e.records
                with lock:
                    refused.append((item["id"], str(e)))
            with lock:
                for r in recs:
                    f.write(json.dumps(r) + "\n")
                    tokens[0] += len(r["output_ids"])
                done[0] += 1
                if done[0] % 500 == 0:
                    el = time.time() - start
                    print(f"{done[0]}/{len(jobs)} answered, {tokens[0]} tokens, {el:.0f} s, "
                          f"{tokens[0] / el:.0f} tokens/s", flush=True)

        with concurrent.futures.ThreadPoolExecutor(a.concurrency) as pool:
            for fut in [pool.submit(run, j) for j in jobs]:
                fut.result()
    el = time.time() - start
    print(f"{a.out}: {done[0]} of {len(jobs)} answered ({skipped[0]} past the deadline, "
          f"{len(refused)} with a turn the server refused), {tokens[0]} output tokens in "
          f"{el:.1f} s ({tokens[0] / max(el, 1e-9):.0f} tokens/s)")
    for item_id, message in refused[:3]:
        print(f"  refused: {item_id}: {message}")
    if done[0] == 0:
        sys.exit("no answers")


if __name__ == "__main__":
    main()
