#!/usr/bin/env python3
"""Builds the EAGLE-3 head's prompt sets from their independent sources: the prompts the
target wrote itself (self_prompts.py), the registry collections' training prompts
(prompt_collections.py --use train), plain completions cut from the documents of those
prompts, and a smaller share of the templated prompts (build_prompts.py); the
evaluation set comes from the collections kept for evaluation alone (--use eval), which
no training source draws on.

    tools/eagle3/build_sets.py --out DIR --self SELF.jsonl --collections TRAIN.jsonl[.gz]
        --unseen EVAL.jsonl[.gz] [--templated prompts/train.jsonl] [--templated-count 2000]
        [--per-collection 2000] [--completions 1500] [--heldback 60] [--seed 0]

Writes DIR/train.jsonl (every training prompt but the held-back ones), DIR/heldback.jsonl
(--heldback prompts of each training source, never trained on: the held-back slice the
closing numbers put beside the unseen set), DIR/unseen.jsonl (the evaluation collections)
and DIR/sources.json (prompts per source and category, with each collection's package and
licence). Every item keeps its "source". Items are in the prompt format generate.py reads.
Standard library only.
"""

import argparse
import collections
import gzip
import json
import os
import random
import re

SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def read_jsonl(path):
    """The items of a JSON-lines file, gzipped or not."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def collection_name(item):
    """The collection an item came from: its id's prefix (`squad-00012` is `squad`)."""
    return item["id"].rsplit("-", 1)[0]


def completion_from(item, max_chars):
    """A plain-completion prompt cut from an item's document (the text before its final
    question), ending at a sentence boundary within max_chars; None without a document."""
    first = item["turns"][0]
    if "\n\n" not in first:
        return None
    document = first.rsplit("\n\n", 1)[0].strip()
    if len(document) < 200:
        return None
    cut = document[:max_chars]
    ends = [m.start() for m in SENTENCE_END.finditer(cut)]
    if ends:
        cut = cut[: ends[-1]]
    return cut.strip() + " "


def build(args):
    """The sets: {name: [items]} and the counts for sources.json."""
    rng = random.Random(args.seed)
    sources = collections.OrderedDict()

    own = read_jsonl(args.self_prompts)
    for item in own:
        item.setdefault("source", "self")
    sources["self"] = own

    by_collection = collections.defaultdict(list)
    for item in read_jsonl(args.collections):
        by_collection[collection_name(item)].append(item)
    documents = []
    for name in sorted(by_collection):
        items = by_collection[name]
        rng.shuffle(items)
        sources[name] = items[: args.per_collection]
        # Completions are cut from documents of trained prompts, never held-back ones.
        documents.extend(sources[name][args.heldback :])

    completions = []
    rng.shuffle(documents)
    for item in documents:
        if len(completions) == args.completions:
            break
        text = completion_from(item, args.completion_chars)
        if text:
            completions.append({"id": f"doc-{item['id']}", "kind": "completion",
                                "category": "completion", "prompt": text,
                                "source": item.get("source", "")})
    sources["documents"] = completions

    if args.templated and args.templated_count > 0:
        templated = read_jsonl(args.templated)
        rng.shuffle(templated)
        for item in templated:
            item.setdefault("source", "templated (build_prompts.py)")
        sources["templated"] = templated[: args.templated_count]

    train, heldback = [], []
    for name, items in sources.items():
        heldback.extend(items[: args.heldback])
        train.extend(items[args.heldback :])
    rng.shuffle(train)
    unseen = read_jsonl(args.unseen)
    seen_first = {first_turn(i) for i in train + heldback}
    overlap = [i["id"] for i in unseen if first_turn(i) in seen_first]
    if overlap:
        raise SystemExit(f"evaluation prompts also in the training sources: {overlap[:5]}")
    counts = {
        "train": len(train),
        "heldback": len(heldback),
        "unseen": len(unseen),
        "per_source": {name: len(items) for name, items in sources.items()},
        "unseen_per_collection": dict(collections.Counter(collection_name(i) for i in unseen)),
        "categories": dict(collections.Counter(i.get("category", "") for i in train)),
        "licences": sorted({i["source"] for i in train + unseen if "==" in i.get("source", "")}),
    }
    return {"train": train, "heldback": heldback, "unseen": unseen}, counts


def first_turn(item):
    """An item's first message, case and spacing folded, for the overlap check."""
    text = item["turns"][0] if item.get("turns") else item.get("prompt", "")
    return " ".join(text.lower().split())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--self", dest="self_prompts", required=True)
    p.add_argument("--collections", required=True, help="prompt_collections.py --use train")
    p.add_argument("--unseen", required=True, help="prompt_collections.py --use eval")
    p.add_argument("--templated", help="build_prompts.py's training prompts")
    p.add_argument("--templated-count", type=int, default=2000)
    p.add_argument("--per-collection", type=int, default=2000)
    p.add_argument("--completions", type=int, default=1500)
    p.add_argument("--completion-chars", type=int, default=1200)
    p.add_argument("--heldback", type=int, default=60, help="prompts held back a source")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    sets, counts = build(args)
    os.makedirs(args.out, exist_ok=True)
    for name, items in sets.items():
        with open(os.path.join(args.out, f"{name}.jsonl"), "w") as f:
            for item in items:
                f.write(json.dumps(item) + "\n")
    with open(os.path.join(args.out, "sources.json"), "w") as f:
        json.dump(counts, f, indent=1)
    print(json.dumps({k: counts[k] for k in ("train", "heldback", "unseen", "per_source")}))


if __name__ == "__main__":
    main()
