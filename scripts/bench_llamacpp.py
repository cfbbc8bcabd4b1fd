"""Benchmark llama.cpp (via llama-cpp-python) prefill and decode speed on a GGUF.

Batch 1, 2 threads, a fixed prompt, then 128 tokens generated greedily by an
explicit eval loop (argmax of the last logits; EOS does not stop it).  Prompt
processing and decode are timed separately with time.perf_counter; after one
untimed warm-up the run is repeated 3 times and the medians are printed.

Needs:
    pip install llama-cpp-python

Run:
    python scripts/bench_llamacpp.py /work/scratch/SmolLM2-135M-Instruct.Q4_1.gguf

Prints to stdout only; writes no files.
"""

import argparse
import pathlib
import shlex
import statistics
import sys
import time

import llama_cpp
import numpy as np

# The benchmark prompt, shared with scripts/bench_cpu_vs_llamacpp.sh.
PROMPT = (pathlib.Path(__file__).parent / "bench_prompt.txt").read_text().strip()


def last_logits(llm):
    # With logits_all=False llama-cpp-python does not copy logits into
    # llm.scores, so read the last output row straight from the context.
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))


def run_once(llm, prompt_ids, n_new):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt_ids)
    t1 = time.perf_counter()
    for _ in range(n_new):
        tok = int(np.argmax(last_logits(llm)))
        llm.eval([tok])
    t2 = time.perf_counter()
    return len(prompt_ids) / (t1 - t0), n_new / (t2 - t1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    llm = llama_cpp.Llama(
        model_path=args.gguf, n_ctx=1024, n_threads=args.threads,
        n_threads_batch=args.threads, logits_all=False, seed=0, verbose=False,
    )
    prompt_ids = llm.tokenize(PROMPT.encode("utf-8"), add_bos=True)

    run_once(llm, prompt_ids, 8)  # warm-up
    runs = [run_once(llm, prompt_ids, args.new_tokens) for _ in range(args.repeats)]

    print("command:", shlex.join([sys.executable] + sys.argv))
    print(f"llama-cpp-python {llama_cpp.__version__}, threads={args.threads}, "
          f"prompt={len(prompt_ids)} tokens, new={args.new_tokens} tokens, repeats={args.repeats}")
    for i, (pp, tg) in enumerate(runs):
        print(f"  run {i}: prompt {pp:8.1f} tok/s   decode {tg:7.1f} tok/s")
    print(f"median prompt tokens/s: {statistics.median(r[0] for r in runs):.1f}")
    print(f"median decode tokens/s: {statistics.median(r[1] for r in runs):.1f}")


if __name__ == "__main__":
    main()
