#!/usr/bin/env python3
"""The share of `tool_choice: "required"` (and named) chat requests whose reply is a
parseable call with arguments valid against the tool's `parameters`, over varied tools and
prompts, sampled (temperature 0.8, one seed each), streamed and whole.

    python3 scripts/structured/tool_calls_share.py --url http://127.0.0.1:8000 --requests 100
"""
import argparse
import json
import urllib.request

import jsonschema

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "search_flights", "description": "Find flights",
        "parameters": {"type": "object", "properties": {
            "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "date": {"type": "string", "format": "date"},
            "passengers": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["origin", "destination", "date"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add_todo", "description": "Add items to a todo list",
        "parameters": {"type": "object", "properties": {
            "items": {"type": "array", "items": {"type": "string", "maxLength": 60}, "minItems": 1, "maxItems": 5},
            "priority": {"type": "integer", "minimum": 1, "maximum": 3}},
            "required": ["items"], "additionalProperties": False}}},
]

PROMPTS = [
    "What's the weather like in Lisbon?", "Find me a flight from Boston to Denver on 2027-03-14.",
    "Remind me to buy milk and call mum.", "Is it raining in Osaka right now, in fahrenheit?",
    "Book two seats from JFK to SFO next Friday.", "Add 'finish the report' to my list, high priority.",
    "Should I take an umbrella in London today?", "I need to fly LHR to CDG for 3 people on 2027-01-02.",
    "Put 'water plants', 'pay rent' and 'email Sam' on my todo list.", "How cold is it in Reykjavik?",
]


def post(url, body):
    request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)


def valid_calls(calls, allowed):
    if not calls:
        return False, "no calls"
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in calls:
        name = call["function"]["name"]
        if name not in allowed:
            return False, "called %s" % name
        try:
            arguments = json.loads(call["function"]["arguments"])
            jsonschema.validate(arguments, schemas[name], format_checker=jsonschema.FormatChecker())
        except Exception as err:  # the reason is reported, not raised
            return False, "%s: %s" % (name, str(err).splitlines()[0])
    return True, ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    names = [t["function"]["name"] for t in TOOLS]
    tally = {}
    for i in range(args.requests):
        named = i % 4 == 3
        choice = {"type": "function", "function": {"name": names[i % 3]}} if named else "required"
        allowed = [names[i % 3]] if named else names
        body = {"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], "tools": TOOLS,
                "tool_choice": choice, "temperature": 0.8, "seed": i, "max_tokens": args.max_tokens,
                "parallel_tool_calls": i % 2 == 0}
        reply = post(args.url, body)["choices"][0]
        ok, why = valid_calls(reply["message"].get("tool_calls"), allowed)
        kind = "named" if named else "required"
        done = reply["finish_reason"]
        counts = tally.setdefault(kind, {"requests": 0, "valid": 0, "finish": {}})
        counts["requests"] += 1
        counts["valid"] += ok
        counts["finish"][done] = counts["finish"].get(done, 0) + 1
        if not ok:
            print("request %d (%s, finish %s): %s" % (i, kind, done, why))
    for kind, counts in tally.items():
        print("%s: %d/%d replies are parseable calls with valid arguments; finish reasons %s"
              % (kind, counts["valid"], counts["requests"], counts["finish"]))


if __name__ == "__main__":
    main()
