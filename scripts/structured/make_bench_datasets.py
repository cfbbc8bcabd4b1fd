#!/usr/bin/env python3
"""Writes the datasets `bench serve --dataset` compares structured output with: the same
chat prompts constrained to a list schema whose keys and punctuation the grammar forces
(`list.jsonl`), to a schema that is one long free string, masked at every token and
forcing almost nothing (`prose.jsonl`), and free (`free.jsonl`); all past end-of-sequence
(`ignore_eos`), so that each free request gives `--max-tokens` tokens and each constrained
one runs until its JSON is complete.

    python3 scripts/structured/make_bench_datasets.py --out target/structured-bench
"""
import argparse
import json
import os

TOPICS = [
    "planets of the solar system", "famous bridges", "kinds of bread", "rivers of Europe",
    "chess openings", "programming languages", "birds of prey", "jazz musicians",
    "mountain ranges", "card games", "types of clouds", "ancient cities", "spices",
    "sailing terms", "board games", "painters", "desserts", "volcanoes", "trees",
    "constellations", "inventions", "sports", "deserts", "minerals", "opera composers",
    "islands", "dog breeds", "coffee drinks", "lakes", "musical instruments",
    "poets", "castles", "languages of Asia", "rainforest animals", "cheeses",
    "space missions", "flowers", "martial arts", "fonts", "weather instruments",
]

SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 40},
        "items": {
            "type": "array",
            "minItems": 6,
            "maxItems": 6,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 24},
                    "rank": {"type": "integer", "minimum": 1, "maximum": 10},
                },
                "required": ["name", "rank"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["topic", "items"],
    "additionalProperties": False,
}


PROSE = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 300, "maxLength": 500}},
    "required": ["answer"],
    "additionalProperties": False,
}


def constrained(messages, max_tokens, schema, name):
    """A dataset line asking for `schema` as OpenAI's `response_format`."""
    return {
        "messages": messages,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    free, lists, prose = [], [], []
    for topic in TOPICS:
        messages = [{"role": "user", "content": "List six %s with a rank from 1 to 10 as JSON." % topic}]
        free.append({"messages": messages, "max_tokens": args.max_tokens, "ignore_eos": True})
        lists.append(constrained(messages, args.max_tokens, SCHEMA, "list"))
        prose.append(constrained(messages, args.max_tokens, PROSE, "prose"))
    for name, lines in (("free", free), ("list", lists), ("prose", prose)):
        with open(os.path.join(args.out, name + ".jsonl"), "w") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
    print("wrote %d prompts each to %s/{free,list,prose}.jsonl" % (len(TOPICS), args.out))


if __name__ == "__main__":
    main()
