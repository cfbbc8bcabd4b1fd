"""Writes the held-out prompts as a `bench spec` / `bench serve` dataset.

Each held-out item becomes one line {"prompt": TEXT, "max_tokens": 256}: a chat item's
first turn with the target's chat template applied (as `/v1/chat/completions` renders
it), a completion item's text as it is. Multi-turn items keep their first turn only,
since later turns hold the target's own earlier answers.

    python3 bench_dataset.py /tmp/smollm2 prompts/heldout.jsonl heldout_bench.jsonl
"""
import argparse
import json

from transformers import AutoTokenizer


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target", help="the target's folder (its tokenizer and chat template)")
    p.add_argument("prompts", help="the held-out prompt set (build_prompts.py's)")
    p.add_argument("out")
    p.add_argument("--max-tokens", type=int, default=256)
    a = p.parse_args()
    tok = AutoTokenizer.from_pretrained(a.target)
    with open(a.prompts) as f, open(a.out, "w") as out:
        for line in f:
            item = json.loads(line)
            if item["kind"] == "completion":
                prompt = item["prompt"]
            else:
                prompt = tok.apply_chat_template(
                    [{"role": "user", "content": item["turns"][0]}],
                    tokenize=False, add_generation_prompt=True)
            out.write(json.dumps({"prompt": prompt, "max_tokens": a.max_tokens}) + "\n")


if __name__ == "__main__":
    main()
