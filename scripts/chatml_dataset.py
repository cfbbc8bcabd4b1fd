#!/usr/bin/env python3
"""Turns a `bench serve` chat dataset (lines with "messages") into plain prompts for
`bench spec` (which sends no chat messages): each line's messages rendered with SmolLM2's
ChatML template and its default system turn, as `/v1/chat/completions` renders them for
the default model, then the assistant's opening; MAX_TOKENS (default 128) each, past
end-of-sequence.

    python3 scripts/structured/make_bench_datasets.py --out target/structured-bench
    python3 scripts/chatml_dataset.py target/structured-bench/free.jsonl target/chat40.jsonl [MAX_TOKENS]

The 40 chat prompts so made are the "ordinary chat prompts" of docs/performance.md's
speculative decoding sections: they share no source with the EAGLE-3 head's training
prompts (tools/eagle3/)."""
import json
import sys

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def render(messages):
    turns = messages if messages and messages[0]["role"] == "system" else [
        {"role": "system", "content": SYSTEM}] + messages
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in turns)
    return text + "<|im_start|>assistant\n"


def main():
    src, dst = sys.argv[1], sys.argv[2]
    max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    with open(src) as f, open(dst, "w") as out:
        for line in f:
            item = json.loads(line)
            plain = {"prompt": render(item["messages"]), "max_tokens": max_tokens,
                     "ignore_eos": True}
            out.write(json.dumps(plain) + "\n")


if __name__ == "__main__":
    main()
