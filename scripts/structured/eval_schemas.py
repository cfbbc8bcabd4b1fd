#!/usr/bin/env python3
"""Send one schema-constrained chat request per schema to an OpenAI-compatible server
and check what comes back.

Usage:
    python3 scripts/structured/eval_schemas.py --url http://127.0.0.1:8123 \
        --model smollm2-135m --schemas target/structured-eval/schemas.jsonl \
        --out target/structured-eval/results-peregrine.jsonl [--concurrency 4] \
        [--max-tokens 512] [--field openai|llamacpp] [--resume] [--limit N]

Each line of --schemas is {"id", "subset", "schema"} (see sample_schemas.py). The
request is the same for every server: a system message, a user message naming the
schema's title/description where it has them, temperature 0, max_tokens, and the
schema itself either as OpenAI's response_format
    {"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}
(--field openai, the default) or as llama.cpp's top-level "json_schema" field
(--field llamacpp).

Per schema it records: HTTP status (4xx = the server refused/could not compile the
schema; 5xx = error; 0 = no HTTP answer: connection refused or reset, timeout),
finish_reason, whether the content parses as JSON, whether it validates against the
schema (jsonschema, the draft the schema's $schema names, 2020-12 when none;
`format` as an annotation, which is what the drafts from 2019-09 on prescribe) and,
separately, whether it also passes jsonschema's format checks; latency; completion
tokens. Writes a JSONL (one result per schema) and prints a summary.

Needs Python 3.11, `jsonschema` and `requests`.
"""

import argparse
import concurrent.futures as cf
import json
import os
import re
import sys
import threading
import time

import jsonschema
import requests
from jsonschema import validators

SYSTEM = "You are a helpful assistant. You answer with a single JSON object and nothing else."


def prompt_for(schema):
    """The user message: the same for every server; states title/description if any."""
    parts = ["Produce a JSON object that conforms to the JSON schema given as the response format."]
    if isinstance(schema, dict):
        title = schema.get("title")
        desc = schema.get("description")
        if isinstance(title, str) and title.strip():
            parts.append(f"Title: {title.strip()[:200]}")
        if isinstance(desc, str) and desc.strip():
            parts.append(f"Description: {desc.strip()[:600]}")
    parts.append("Fill it with realistic example values.")
    return "\n".join(parts)


def schema_name(sid):
    name = re.sub(r"[^A-Za-z0-9_-]", "_", sid)[:64]
    return name or "schema"


_SUB_MAPS = ("properties", "patternProperties", "definitions", "$defs", "dependentSchemas")
_SUB_ONE = ("items", "additionalItems", "contains", "propertyNames", "not", "if", "then", "else",
            "additionalProperties", "unevaluatedProperties", "unevaluatedItems")
_SUB_LISTS = ("anyOf", "oneOf", "prefixItems")


def close_objects(schema, in_all_of=False):
    """A copy of schema where each object subschema that lists `properties` and says
    nothing about other keys gets `additionalProperties: false` (what llama.cpp's
    converter assumes, and what OpenAI's strict mode requires). Members of an allOf,
    and schemas that have an allOf or a $ref beside their properties, are left open.
    Only for the --close-objects what-if: outputs are still checked against the
    original schema."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUB_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: close_objects(v) for k, v in out[key].items()}
    for key in _SUB_ONE:
        if isinstance(out.get(key), dict):
            out[key] = close_objects(out[key])
        elif key == "items" and isinstance(out.get(key), list):
            out[key] = [close_objects(v) for v in out[key]]
    for key in _SUB_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [close_objects(v) for v in out[key]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [close_objects(v, in_all_of=True) for v in out["allOf"]]
    if (
        isinstance(out.get("properties"), dict)
        and not in_all_of
        and not any(k in out for k in ("additionalProperties", "patternProperties",
                                        "unevaluatedProperties", "allOf", "$ref"))
    ):
        out["additionalProperties"] = False
    return out


def build_body(row, args):
    schema = row["schema"]
    if args.close_objects:
        schema = close_objects(schema)
    body = {
        "model": args.model,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": prompt_for(schema)},
        ],
        "temperature": 0,
        "max_tokens": args.max_tokens,
    }
    if args.field == "openai":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": schema_name(row["id"]), "schema": schema, "strict": True},
        }
    else:
        body["json_schema"] = schema
    return body


_format_checker = jsonschema.FormatChecker()


def check(schema, text):
    """(parses, valid, valid_with_formats, error) for the produced text."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError) as err:
        return False, False, False, f"json: {err}"[:300]
    try:
        cls = validators.validator_for(schema, default=validators.Draft202012Validator)
        errors = sorted(cls(schema).iter_errors(value), key=lambda e: list(e.path))
        valid = not errors
        err = None if valid else f"schema: {errors[0].message[:200]} at {list(errors[0].absolute_path)[:8]}"
        valid_fmt = valid
        if valid:
            fmt_errors = list(cls(schema, format_checker=_format_checker).iter_errors(value))
            valid_fmt = not fmt_errors
            if fmt_errors:
                err = f"format: {fmt_errors[0].message[:200]}"
        return True, valid, valid_fmt, err
    except Exception as ex:  # noqa: BLE001 - unresolvable $ref, a Python-incompatible regex...
        return True, None, None, f"validator: {type(ex).__name__}: {str(ex)[:200]}"


def run_one(row, args, session):
    body = build_body(row, args)
    rec = {"id": row["id"], "subset": row["subset"]}
    t0 = time.monotonic()
    try:
        resp = session.post(args.url.rstrip("/") + "/v1/chat/completions", json=body, timeout=args.timeout)
        rec["status"] = resp.status_code
        text = resp.text
    except requests.RequestException as ex:
        rec["status"] = 0
        rec["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
        rec["latency_s"] = round(time.monotonic() - t0, 3)
        return rec
    rec["latency_s"] = round(time.monotonic() - t0, 3)
    if resp.status_code != 200:
        rec["error"] = text[:500]
        return rec
    try:
        data = json.loads(text)
        choice = data["choices"][0]
        content = choice["message"].get("content")
        rec["finish_reason"] = choice.get("finish_reason")
        rec["completion_tokens"] = (data.get("usage") or {}).get("completion_tokens")
    except (ValueError, KeyError, IndexError, TypeError) as ex:
        rec["error"] = f"bad response: {type(ex).__name__}: {text[:300]}"
        return rec
    rec["content"] = content
    parses, valid, valid_fmt, err = check(row["schema"], content)
    rec["parses"] = parses
    rec["valid"] = valid
    rec["valid_formats"] = valid_fmt
    if err:
        rec["check_error"] = err
    return rec


def pct(a, b):
    return f"{a}/{b} ({100.0 * a / b:.1f}%)" if b else f"{a}/0"


def summarize(results, wall_s, label):
    n = len(results)
    ok = [r for r in results if r.get("status") == 200]
    c4xx = [r for r in results if 400 <= r.get("status", 0) < 500]
    c5xx = [r for r in results if r.get("status", 0) >= 500]
    c0 = [r for r in results if r.get("status") == 0]
    parses = [r for r in ok if r.get("parses")]
    valid = [r for r in ok if r.get("valid") is True]
    valid_fmt = [r for r in ok if r.get("valid_formats") is True]
    unchecked = [r for r in ok if r.get("parses") and r.get("valid") is None]
    stop = [r for r in ok if r.get("finish_reason") == "stop"]
    length = [r for r in ok if r.get("finish_reason") == "length"]
    stop_bad = [r for r in stop if not r.get("parses") or r.get("valid") is False]
    stop_bad_fmt = [r for r in stop if r.get("parses") and r.get("valid") is True and r.get("valid_formats") is False]
    toks = sum(r.get("completion_tokens") or 0 for r in ok)
    lat = sorted(r["latency_s"] for r in ok)
    lines = [
        f"== {label}: {n} schemas in {wall_s:.1f} s",
        f"compiled (HTTP 200):            {pct(len(ok), n)}",
        f"refused (4xx):                  {len(c4xx)}",
        f"errors (5xx):                   {len(c5xx)}",
        f"no HTTP answer (conn/timeout):  {len(c0)}",
        f"of compiled, parse as JSON:     {pct(len(parses), len(ok))}",
        f"of compiled, validate:          {pct(len(valid), len(ok))}"
        + (f"  ({len(unchecked)} could not be checked by jsonschema)" if unchecked else ""),
        f"of compiled, validate+formats:  {pct(len(valid_fmt), len(ok))}",
        f"finish stop / length:           {len(stop)} / {len(length)}",
        f"finish=stop but violate schema: {len(stop_bad)}" + (f"  {[r['id'] for r in stop_bad][:10]}" if stop_bad else ""),
        f"finish=stop, valid, bad format: {len(stop_bad_fmt)}" + (f"  {[r['id'] for r in stop_bad_fmt][:10]}" if stop_bad_fmt else ""),
        f"completion tokens:              {toks} ({toks / wall_s:.1f} tok/s overall, {len(results) / wall_s:.3f} req/s)",
    ]
    if lat:
        lines.append(
            f"latency (200s) p50/p90/max:     {lat[len(lat) // 2]:.2f} / {lat[int(len(lat) * 0.9)]:.2f} / {lat[-1]:.2f} s"
        )
    subsets = sorted({r["subset"] for r in results})
    lines.append("per subset: n, compiled, valid, 5xx")
    for s in subsets:
        rs = [r for r in results if r["subset"] == s]
        lines.append(
            f"  {s:16s} {len(rs):4d} {sum(r.get('status') == 200 for r in rs):4d} "
            f"{sum(r.get('valid') is True for r in rs):4d} {sum(r.get('status', 0) >= 500 for r in rs):4d}"
        )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--schemas", default="target/structured-eval/schemas.jsonl")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--field", choices=["openai", "llamacpp"], default="openai")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--ids", help="comma-separated ids to run (default: all)")
    ap.add_argument("--resume", action="store_true", help="skip ids already in --out (append)")
    ap.add_argument("--label", default=None)
    ap.add_argument("--close-objects", action="store_true",
                    help="what-if: send each schema with additionalProperties:false added to objects "
                         "that list properties and say nothing else (outputs still checked against "
                         "the original schema)")
    args = ap.parse_args()

    rows = [json.loads(l) for l in open(args.schemas, encoding="utf-8") if l.strip()]
    if args.ids:
        want = set(args.ids.split(","))
        rows = [r for r in rows if r["id"] in want]
    if args.limit:
        rows = rows[: args.limit]
    done = {}
    if args.resume and os.path.exists(args.out):
        for l in open(args.out, encoding="utf-8"):
            if l.strip():
                r = json.loads(l)
                done[r["id"]] = r
    todo = [r for r in rows if r["id"] not in done]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    out = open(args.out, "a" if args.resume else "w", encoding="utf-8")
    lock = threading.Lock()
    results = [done[r["id"]] for r in rows if r["id"] in done]
    local = threading.local()

    def session():
        if not hasattr(local, "s"):
            local.s = requests.Session()
        return local.s

    def task(row):
        return run_one(row, args, session())

    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        futs = {pool.submit(task, r): r for r in todo}
        for i, fut in enumerate(cf.as_completed(futs), 1):
            rec = fut.result()
            with lock:
                results.append(rec)
                out.write(json.dumps(rec, ensure_ascii=False) + "\n")
                out.flush()
            mark = {True: "ok", False: "INVALID", None: "-"}.get(rec.get("valid"))
            print(
                f"[{i}/{len(todo)}] {rec['id']} status={rec.get('status')} "
                f"finish={rec.get('finish_reason')} {mark} {rec.get('latency_s')}s",
                file=sys.stderr, flush=True,
            )
    wall = time.monotonic() - t0
    out.close()
    print(summarize(results, max(wall, 1e-9), args.label or args.url))


if __name__ == "__main__":
    main()
