#!/usr/bin/env python3
"""Draw a deterministic, stratified sample of JSONSchemaBench schemas.

Usage:
    python3 scripts/structured/sample_schemas.py BENCH_CHECKOUT \
        [--out target/structured-eval/schemas.jsonl] [--test-ids FILE] [--seed S]

BENCH_CHECKOUT is a checkout of github.com/guidance-ai/jsonschemabench (its
`data/<Subset>/<id>.json` files), or a directory that has those subset folders
directly. Reads the git commit of the checkout where it can, and writes one JSON
object per line: {"id", "subset", "schema"} (id is "<Subset>---<file stem>", the
spelling the benchmark's own tools use).

Which schemas: per subset, the files are ordered by sha256(seed + "/" + subset +
"/" + stem) and the first QUOTA[subset] are taken. The quotas (300 in all) weigh the
subsets by difficulty rather than by size, so the small but hard subsets
(Github_ultra, WashingtonPost, JsonSchemaStore) are not drowned by the large easy
ones (Github_easy, Glaiveai2K); see README.md beside this file.

--test-ids FILE restricts the draw to the benchmark's TEST split: a file of
unique ids (one a line, "Subset---stem" or "stem", as in the `unique_id` column of
the Hugging Face parquet files epfl-dlab/JSONSchemaBench/<Subset>/test-*.parquet).
The GitHub repository itself carries no split, so without the file the draw is
over all of data/.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys

# Subset -> how many schemas to draw. 300 in all.
QUOTA = {
    "Glaiveai2K": 30,       # function-call argument objects: flat, easy, very common in practice
    "Github_trivial": 20,   # tiny schemas
    "Github_easy": 35,
    "Github_medium": 40,
    "Github_hard": 40,      # refs, anyOf/oneOf, patterns, nested definitions
    "Github_ultra": 25,     # the hardest GitHub schemas (large, recursive)
    "Kubernetes": 30,       # big, deep, many optional fields, int-or-string
    "Snowplow": 25,         # min/max bounds, formats, enums, additionalProperties:false
    "WashingtonPost": 20,   # large content-API schemas with many refs
    "JsonSchemaStore": 35,  # real tool configs: patternProperties, if/then, $defs
}


def git_commit(path):
    try:
        out = subprocess.run(
            ["git", "-C", path, "rev-parse", "HEAD"],
            capture_output=True, text=True, check=True,
        )
        return out.stdout.strip()
    except Exception:  # noqa: BLE001 - not a git checkout: fine
        return None


def data_dir(checkout):
    sub = os.path.join(checkout, "data")
    return sub if os.path.isdir(os.path.join(sub, "Github_easy")) else checkout


def read_test_ids(path):
    ids = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.endswith(".json"):
                line = line[: -len(".json")]
            ids.add(line)
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkout", help="path of a jsonschemabench checkout (or its data/ folder)")
    ap.add_argument("--out", default="target/structured-eval/schemas.jsonl")
    ap.add_argument("--seed", default="peregrine-structured-v1")
    ap.add_argument("--test-ids", help="file of unique ids of the TEST split to restrict the draw to")
    args = ap.parse_args()

    root = data_dir(args.checkout)
    test_ids = read_test_ids(args.test_ids) if args.test_ids else None
    rows = []
    counts = {}
    for subset, quota in QUOTA.items():
        folder = os.path.join(root, subset)
        if not os.path.isdir(folder):
            sys.exit(f"missing subset folder {folder}")
        stems = sorted(n[: -len(".json")] for n in os.listdir(folder) if n.endswith(".json"))
        if test_ids is not None:
            stems = [s for s in stems if f"{subset}---{s}" in test_ids or s in test_ids]
        keyed = sorted(
            stems,
            key=lambda s: hashlib.sha256(f"{args.seed}/{subset}/{s}".encode()).hexdigest(),
        )
        taken = 0
        for stem in keyed:
            if taken == quota:
                break
            with open(os.path.join(folder, stem + ".json"), encoding="utf-8") as f:
                try:
                    schema = json.load(f)
                except json.JSONDecodeError:
                    continue  # never seen in the benchmark, but a broken file is not a schema
            if not isinstance(schema, (dict, bool)):
                continue
            rows.append({"id": f"{subset}---{stem}", "subset": subset, "schema": schema})
            taken += 1
        counts[subset] = (taken, len(stems))

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=False) + "\n")

    commit = git_commit(args.checkout)
    print(f"benchmark: {args.checkout} commit {commit or 'unknown'}; "
          f"split: {'test (from ' + args.test_ids + ')' if test_ids is not None else 'all of data/ (no split file given)'}")
    for subset, (taken, total) in counts.items():
        print(f"  {subset:16s} {taken:4d} of {total}")
    print(f"wrote {len(rows)} schemas to {args.out}")


if __name__ == "__main__":
    main()
