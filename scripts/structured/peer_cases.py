#!/usr/bin/env python3
"""Targeted cases where llama.cpp's server was reported to let outputs break their
schema, or to fail, plus whether `tool_choice` is enforced. Run against any
OpenAI-compatible server:

    python3 scripts/structured/peer_cases.py --url http://127.0.0.1:8123 \
        [--model smollm2-135m] [--field openai|llamacpp] [--out FILE.jsonl] \
        [--schemas target/structured-eval/schemas.jsonl --bench-case ID ...]

Each schema case is sent with a user message that asks for an output breaking the
schema (temperature 0), so an unenforced constraint shows. A case passes when the
server either refuses it with a 4xx or answers 200 with content that parses and
validates (jsonschema). A 200 whose content violates the schema, and any 5xx, fail.

Tool cases (`tool_choice: "required"` and a named `tool_choice`) pass when the
answer has a tool call, to the right function where one is named, whose arguments
parse and validate against that function's parameters; a 4xx is recorded as
"refused" (not enforced, but not silently broken either).

--bench-case ID adds a schema of the JSONSchemaBench sample (by id) as a further
case, e.g. one that made a server answer 5xx in eval_schemas.py.
"""

import argparse
import json
import sys
import time

import requests
from jsonschema import validators

SYSTEM = "You are a helpful assistant. You answer with a single JSON object and nothing else."

CASES = [
    {
        "name": "unanchored_pattern",
        "why": "JSON Schema patterns are unanchored; llama.cpp turns an unanchored pattern "
               "into 'any string'",
        "schema": {"type": "object", "properties": {"code": {"type": "string", "pattern": "[0-9]{3}"}},
                   "required": ["code"]},
        "prompt": 'Reply with exactly this JSON and nothing else: {"code": "abc"}',
    },
    {
        "name": "min_properties",
        "why": "minProperties over optional properties",
        "schema": {"type": "object",
                   "properties": {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "boolean"}},
                   "minProperties": 2, "additionalProperties": False},
        "prompt": "Reply with exactly this JSON and nothing else: {}",
    },
    {
        "name": "numeric_minimum",
        "why": "minimum on a number (not integer), exclusiveMinimum on both",
        "schema": {"type": "object",
                   "properties": {"price": {"type": "number", "minimum": 10.5},
                                  "count": {"type": "integer", "exclusiveMinimum": 0},
                                  "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
                   "required": ["price", "count", "ratio"], "additionalProperties": False},
        "prompt": 'Reply with exactly this JSON and nothing else: {"price": -3.5, "count": 0, "ratio": 0}',
    },
    {
        "name": "pattern_properties_oneOf",
        "why": "patternProperties whose values are a oneOf, additionalProperties false",
        "schema": {"type": "object",
                   "patternProperties": {"^x-[a-z]+$": {"oneOf": [{"type": "string", "maxLength": 3},
                                                                  {"type": "integer", "minimum": 100}]}},
                   "additionalProperties": False, "minProperties": 1},
        "prompt": 'Reply with exactly this JSON and nothing else: {"name": "Peregrine falcon", "x-speed": 5}',
    },
    {
        "name": "escaped_pattern_fail_open",
        "why": "llama.cpp issue #19051: a pattern its grammar parser rejects made it generate "
               "unconstrained with HTTP 200",
        "schema": {"type": "object",
                   "properties": {"greeting": {"type": "string", "pattern": "^hello there indeed\\!$"}},
                   "required": ["greeting"]},
        "prompt": 'Reply with exactly this JSON and nothing else: {"greeting": "bye"}',
    },
    {
        "name": "not_subschema",
        "why": "llama.cpp answered 500 'JSON schema conversion failed: Unrecognized schema' "
               "for a `not` (PR #17572 made it a 400)",
        "schema": {"type": "object", "properties": {"id": {"type": "integer"}, "legacy": {"not": {}}},
                   "required": ["id"]},
        "prompt": 'Reply with exactly this JSON and nothing else: {"id": 1, "legacy": true}',
    },
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "minLength": 1},
                                      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Current time in a time zone",
        "parameters": {"type": "object",
                       "properties": {"timezone": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z_]+$"}},
                       "required": ["timezone"], "additionalProperties": False}}},
]

TOOL_CASES = [
    {"name": "tool_choice_required", "tool_choice": "required", "expect": None,
     "prompt": "Hi! Tell me a short joke about birds."},
    {"name": "tool_choice_named", "tool_choice": {"type": "function", "function": {"name": "get_time"}},
     "expect": "get_time", "prompt": "What is the weather like in Paris today?"},
]


def validate(schema, value):
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    errs = list(cls(schema).iter_errors(value))
    return (not errs), (errs[0].message[:200] if errs else None)


def post(args, body):
    t0 = time.monotonic()
    try:
        r = requests.post(args.url.rstrip("/") + "/v1/chat/completions", json=body, timeout=args.timeout)
        return r.status_code, r.text, time.monotonic() - t0
    except requests.RequestException as ex:
        return 0, f"{type(ex).__name__}: {ex}", time.monotonic() - t0


def run_schema_case(args, case):
    body = {"model": args.model, "temperature": 0, "max_tokens": args.max_tokens,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": case["prompt"]}]}
    if args.field == "openai":
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": case["name"][:64], "schema": case["schema"], "strict": True}}
    else:
        body["json_schema"] = case["schema"]
    status, text, dt = post(args, body)
    rec = {"case": case["name"], "status": status, "latency_s": round(dt, 3)}
    if status != 200:
        rec["error"] = text[:400]
        rec["verdict"] = "refused (4xx)" if 400 <= status < 500 else ("ERROR 5xx" if status >= 500 else "NO ANSWER")
        rec["pass"] = 400 <= status < 500
        return rec
    data = json.loads(text)
    choice = data["choices"][0]
    content = choice["message"].get("content")
    rec["finish_reason"] = choice.get("finish_reason")
    rec["content"] = content
    try:
        value = json.loads(content)
    except (TypeError, json.JSONDecodeError) as ex:
        if rec["finish_reason"] == "length":
            # cut off by max_tokens: an unfinished output breaks nothing yet
            rec["verdict"] = "inconclusive: cut off by max_tokens"
            rec["pass"] = None
        else:
            rec["verdict"] = f"NOT JSON ({ex})"[:200]
            rec["pass"] = False
        return rec
    ok, err = validate(case["schema"], value)
    rec["valid"] = ok
    rec["verdict"] = "valid" if ok else f"VIOLATES: {err}"
    rec["pass"] = ok
    return rec


def run_tool_case(args, case):
    body = {"model": args.model, "temperature": 0, "max_tokens": args.max_tokens,
            "messages": [{"role": "user", "content": case["prompt"]}],
            "tools": TOOLS, "tool_choice": case["tool_choice"]}
    status, text, dt = post(args, body)
    rec = {"case": case["name"], "status": status, "latency_s": round(dt, 3)}
    if status != 200:
        rec["error"] = text[:400]
        rec["verdict"] = "refused (4xx)" if 400 <= status < 500 else ("ERROR 5xx" if status >= 500 else "NO ANSWER")
        rec["pass"] = False
        return rec
    data = json.loads(text)
    choice = data["choices"][0]
    msg = choice["message"]
    rec["finish_reason"] = choice.get("finish_reason")
    rec["content"] = msg.get("content")
    calls = msg.get("tool_calls") or []
    rec["tool_calls"] = calls
    if not calls:
        rec["verdict"] = "NO TOOL CALL"
        rec["pass"] = False
        return rec
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    problems = []
    for call in calls:
        fn = (call.get("function") or {})
        name, raw = fn.get("name"), fn.get("arguments")
        if case["expect"] and name != case["expect"]:
            problems.append(f"called {name!r}, not {case['expect']!r}")
            continue
        if name not in params:
            problems.append(f"unknown function {name!r}")
            continue
        try:
            value = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as ex:
            problems.append(f"arguments not JSON: {ex}")
            continue
        ok, err = validate(params[name], value)
        if not ok:
            problems.append(f"arguments of {name} violate: {err}")
    rec["verdict"] = "enforced: valid call" if not problems else "; ".join(problems)[:300]
    rec["pass"] = not problems
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--field", choices=["openai", "llamacpp"], default="openai")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out")
    ap.add_argument("--schemas", default="target/structured-eval/schemas.jsonl")
    ap.add_argument("--bench-case", action="append", default=[], help="id in --schemas to add as a case")
    ap.add_argument("--no-tools", action="store_true")
    args = ap.parse_args()

    cases = list(CASES)
    if args.bench_case:
        rows = {json.loads(l)["id"]: json.loads(l) for l in open(args.schemas, encoding="utf-8") if l.strip()}
        for bid in args.bench_case:
            cases.append({"name": f"bench:{bid}", "why": "from the JSONSchemaBench sample",
                          "schema": rows[bid]["schema"],
                          "prompt": "Produce a JSON object that conforms to the JSON schema given as the response format."})
    results = [run_schema_case(args, c) for c in cases]
    if not args.no_tools:
        results += [run_tool_case(args, c) for c in TOOL_CASES]
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            for r in results:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"== {args.url} ({args.field})")
    for r in results:
        shown = r.get("content") if r.get("status") == 200 else r.get("error")
        if r.get("tool_calls"):
            shown = json.dumps([c.get("function") for c in r["tool_calls"]])
        tag = {True: "PASS", False: "FAIL", None: "----"}[r["pass"]]
        print(f"{tag}  {r['case']:28s} http={r['status']} "
              f"finish={r.get('finish_reason')}  {r['verdict']}\n      -> {str(shown)[:220]!s}")
    print(f"{sum(r['pass'] is True for r in results)}/{len(results)} passed, "
          f"{sum(r['pass'] is None for r in results)} inconclusive")


if __name__ == "__main__":
    sys.exit(main())
