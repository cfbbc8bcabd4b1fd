#!/usr/bin/env python3
"""A `bench serve --dataset` of agent-like conversations whose prefixes outgrow the KV pool:
CONVERSATIONS conversations of TURNS turns, each turn's prompt the same long system text
(tool descriptions, shared by all), the conversation's earlier turns (each a user message
and a fixed assistant answer) and a new user message. Lines go round-robin over the
conversations (turn 1 of each, then turn 2 of each, ...), as interleaved agent loops send
them, so each turn's prefix is its conversation's previous prompt, last seen several
requests ago. Issue 50's agent workload: prompt tokens computed with the tiers below the
pool against without.

    python3 scripts/agent_dataset.py > /tmp/agent.jsonl
    peregrine bench serve --dataset /tmp/agent.jsonl --concurrency 1
"""
import argparse
import json

VOCAB = ["river", "stone", "bridge", "mill", "orchard", "lantern", "harbour", "meadow",
         "tower", "market", "valley", "forest", "garden", "window", "letter", "winter"]


def words(seed, n):
    """`n` words of a text of its own for `seed`."""
    return " ".join(VOCAB[(seed * 7 + i * (seed + 3)) % len(VOCAB)] + str(i % 97) for i in range(n))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-words", type=int, default=300)
    p.add_argument("--turn-words", type=int, default=250, help="words a turn adds (message and answer)")
    p.add_argument("--max-tokens", type=int, default=16)
    a = p.parse_args()
    system = "System: you can call these tools.\n" + words(1, a.system_words) + "\n"
    for turn in range(a.turns):
        for conv in range(a.conversations):
            history = ""
            for t in range(turn):
                seed = 100 + conv * 31 + t
                history += "User: " + words(seed, a.turn_words // 2) + "\n"
                history += "Assistant: " + words(seed + 7, a.turn_words // 2) + "\n"
            ask = "User: " + words(500 + conv * 31 + turn, a.turn_words // 2) + "\nAssistant:"
            line = {"prompt": system + history + ask, "max_tokens": a.max_tokens, "ignore_eos": True,
                    "temperature": 0}
            print(json.dumps(line))


if __name__ == "__main__":
    main()
