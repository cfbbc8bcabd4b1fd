#!/usr/bin/env python3
"""Constrained requests against a running server, checked by hand-written validators (the
standard library only: the GPU machine has no network to install `jsonschema`). Each case
goes out greedy and sampled (temperature 1, seeded), streamed and whole, on both
endpoints, mixed with unconstrained requests so that batches hold both kinds. An answer
that ends with `stop` must satisfy its constraint; one that ends with `length` is counted
but not judged (a random-weight model may fill a bounded field slowly). Exits 1 on any
violation, 5xx or wrong status.

    scripts/structured/device_check.py --url http://127.0.0.1:8123 --model M [--rounds 4]
        [--record FILE | --compare FILE]

`--record` writes every greedy answer to FILE; `--compare` fails unless every greedy answer
equals the one FILE holds (the same server flags but speculation, under `--deterministic`:
speculation must not change a greedy constrained output). `scripts/gpu_run.sh structured`
runs it against a model with random weights on the GPU.
"""
import argparse
import concurrent.futures as cf
import json
import re
import sys
import urllib.error
import urllib.request

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}
REGEX = r"\d{3}-[a-z]{2,4}"
CHOICES = ["red", "green", "blue"]
GBNF_SUM = 'root ::= num ("+" num){0,3}\nnum ::= [0-9] | [1-9][0-9] | [1-9][0-9][0-9]'
SUM_RE = r"(0|[1-9]\d{0,2}|\d)(\+(\d|[1-9]\d{1,2})){0,3}"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


def person_ok(text):
    value = json.loads(text)
    assert isinstance(value, dict) and set(value) == set(PERSON["required"]), value
    assert isinstance(value["name"], str) and len(value["name"]) <= 12, value
    age = value["age"]
    assert isinstance(age, int) and not isinstance(age, bool) and 0 <= age <= 120, value
    assert isinstance(value["tags"], list) and len(value["tags"]) <= 3, value
    assert all(tag in ("a", "b", "c") for tag in value["tags"]), value
    assert isinstance(value["ok"], bool), value


def object_ok(text):
    assert isinstance(json.loads(text), dict), text


def weather_ok(calls):
    assert calls, "no tool call"
    for call in calls:
        assert call["function"]["name"] == "get_weather", call
        args = json.loads(call["function"]["arguments"])
        assert set(args) == {"city", "unit"}, args
        assert isinstance(args["city"], str) and len(args["city"]) <= 16, args
        assert args["unit"] in ("celsius", "fahrenheit"), args


def full_match(pattern):
    def check(text):
        assert re.fullmatch(pattern, text), text

    return check


def one_of(choices):
    def check(text):
        assert text in choices, text

    return check


# Every greedy answer by request, for --record and --compare.
GREEDY = {}

CASES = [
    ("response_format json_schema", {"response_format": {"type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True}}}, person_ok),
    ("response_format json_object", {"response_format": {"type": "json_object"}}, object_ok),
    ("structured_outputs.regex", {"structured_outputs": {"regex": REGEX}}, full_match(REGEX)),
    ("guided_choice", {"guided_choice": CHOICES}, one_of(CHOICES)),
    ("grammar (GBNF)", {"grammar": GBNF_SUM}, full_match(SUM_RE)),
    ("tools required", {"tools": [WEATHER_TOOL], "tool_choice": "required"}, weather_ok),
    ("tools named", {"tools": [WEATHER_TOOL], "tool_choice":
        {"type": "function", "function": {"name": "get_weather"}}}, weather_ok),
    ("free", {}, None),
]


def post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def streamed(raw, chat):
    """The text, tool calls and finish reason joined from an SSE body."""
    text, calls, finish = "", {}, None
    for line in raw.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices", []):
            finish = choice.get("finish_reason") or finish
            if not chat:
                text += choice.get("text") or ""
                continue
            delta = choice.get("delta", {})
            text += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call["index"], {"function": {"name": "", "arguments": ""}})
                function = call.get("function", {})
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
    return text, [calls[i] for i in sorted(calls)], finish


def one(args, name, fields, check, chat, stream, temperature, seed):
    body = {"model": args.model, "max_tokens": args.max_tokens, "temperature": temperature,
            "seed": seed, "stream": stream, **fields}
    if chat:
        body["messages"] = [{"role": "user", "content": "Describe a person, or the weather."}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = "Describe a person:"
        path = "/v1/completions"
    status, raw = post(args.url + path, body)
    what = "%s %s%s t=%s seed=%d" % (name, "chat" if chat else "completions",
                                      " stream" if stream else "", temperature, seed)
    if status != 200:
        return name, what, "status %d: %s" % (status, raw[:300])
    if stream:
        text, calls, finish = streamed(raw, chat)
    else:
        choice = json.loads(raw)["choices"][0]
        finish = choice["finish_reason"]
        if chat:
            text = choice["message"].get("content") or ""
            calls = choice["message"].get("tool_calls") or []
        else:
            text, calls = choice["text"], []
    if temperature == 0.0:
        GREEDY[what] = [text, [c["function"] for c in calls], finish]
    if check is None or finish == "length":
        return name, what, finish
    try:
        check(calls if name.startswith("tools") else text)
    except (AssertionError, ValueError, KeyError, TypeError) as error:
        return name, what, "VIOLATION (%s): %r" % (finish, str(error)[:300])
    return name, what, "valid " + finish


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--record", help="write every greedy answer to this file")
    p.add_argument("--compare", help="fail unless every greedy answer equals this file's")
    args = p.parse_args()
    jobs = []
    for name, fields, check in CASES:
        chat_only = name.startswith("tools")
        for chat in (True,) if chat_only else (True, False):
            for stream in (False, True):
                for temperature in (0.0, 1.0):
                    for seed in range(args.rounds if temperature else 1):
                        jobs.append((name, fields, check, chat, stream, temperature, seed))
    tally, failures = {}, []
    with cf.ThreadPoolExecutor(args.concurrency) as pool:
        for name, what, outcome in pool.map(lambda job: one(args, *job), jobs):
            kind = outcome.split(":")[0].split(" (")[0]
            counts = tally.setdefault(name, {})
            counts[kind] = counts.get(kind, 0) + 1
            if outcome.startswith(("VIOLATION", "status")):
                failures.append("%s: %s" % (what, outcome))
    for name, counts in tally.items():
        print("%-30s %s" % (name, ", ".join("%s %d" % kv for kv in sorted(counts.items()))))
    if args.record:
        with open(args.record, "w") as f:
            json.dump(GREEDY, f, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare) as f:
            recorded = json.load(f)
        for what in sorted(recorded):
            if GREEDY.get(what) != recorded[what]:
                failures.append("%s: greedy answer %r differs from the recorded %r"
                                % (what, GREEDY.get(what), recorded[what]))
        print("greedy answers compared: %d" % len(recorded))
    for failure in failures:
        print("FAIL", failure)
    print("%d requests, %d failures" % (len(jobs), len(failures)))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
