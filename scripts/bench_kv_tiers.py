#!/usr/bin/env python3
"""Time to first token for a long shared prefix, cold, from the KV pool and from a tier below
it (`--kv-host-memory`, `--kv-cache-dir`), against a running `peregrine serve`: issue 50's
measurement. The prompt is PREFIX_TOKENS words of one text plus a short question; between
the pool run and the tier run, OTHERS prompts of the same length (other texts) push the
prefix out of a pool that holds about one and a half of them, so it goes down to the tier
and is brought back. With --once, the prompt alone, once (after a restart over a disk
tier: the blocks found there). Each request is greedy, 8 tokens, streamed; TTFT is the time
to its first content chunk. Prints one line per case, and whether the outputs agree (with
--once, the output itself). With --beside, another request decodes a long answer while the
prefix comes back from the tier: its longest gap between two tokens in that time, against
its median gap, says whether the batch waited for the load or only the request did.

    peregrine serve --kv-cache-memory 140MB --kv-host-memory 1GiB &
    python3 scripts/bench_kv_tiers.py --base http://127.0.0.1:8000 --tier "host memory"
    peregrine serve --kv-cache-memory 140MB --kv-cache-dir /tmp/kv &
    python3 scripts/bench_kv_tiers.py --tier disk
    # stop the server, start it again with the same flags, then
    python3 scripts/bench_kv_tiers.py --once
"""
import argparse
import json
import statistics
import threading
import time
import urllib.request


def stream(base, model, prompt, max_tokens=8, arrivals=None):
    """(seconds to the first content chunk, text, usage) of one streamed completion; each
    content chunk's arrival time (perf_counter) goes to `arrivals` when given."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    start = time.perf_counter()
    first, text, usage = None, "", None
    with urllib.request.urlopen(req) as resp:
        for line in resp:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                if choice.get("text"):
                    if first is None:
                        first = time.perf_counter() - start
                    if arrivals is not None:
                        arrivals.append(time.perf_counter())
                text += choice.get("text", "")
    return first, text, usage


def beside(base, model, run, tokens):
    """Runs `run()` while another request decodes `tokens` tokens; returns run's result and
    (the decoding request's median gap between tokens, its longest gap while `run` ran)."""
    arrivals = []
    decoding = threading.Thread(
        target=stream, args=(base, model, "Count: one, two, three,", tokens, arrivals))
    decoding.start()
    while len(arrivals) < 20 and decoding.is_alive():
        time.sleep(0.005)
    start = time.perf_counter()
    result = run()
    end = time.perf_counter()
    decoding.join()
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    during = [b - a for a, b in zip(arrivals, arrivals[1:]) if b > start and a < end]
    if not during or arrivals[-1] < end:
        raise SystemExit("the decoding request ended before the tier request did: raise --beside")
    return result, (statistics.median(gaps), max(during))


def text(seed, words):
    """`words` words of a text of its own for `seed`."""
    vocab = ["river", "stone", "bridge", "mill", "orchard", "lantern", "harbour", "meadow",
             "tower", "market", "valley", "forest", "garden", "window", "letter", "winter"]
    return " ".join(vocab[(seed * 7 + i * (seed + 3)) % len(vocab)] + str(i % 97) for i in range(words))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None)
    p.add_argument("--words", type=int, default=1500, help="words of the prefix (about 2.7 tokens each)")
    p.add_argument("--others", type=int, default=2)
    p.add_argument("--tier", default="the tier", help="the tier's name, for the third row")
    p.add_argument("--once", action="store_true", help="the prompt alone, once")
    p.add_argument("--beside", type=int, default=0, metavar="TOKENS",
                   help="another request decodes TOKENS tokens while the tier's prefix comes back")
    a = p.parse_args()
    model = a.model or json.load(urllib.request.urlopen(a.base + "/v1/models"))["data"][0]["id"]
    prompt = text(0, a.words) + "\nQuestion: what comes next?\nAnswer:"
    rows = []
    ttft, out0, usage = stream(a.base, model, prompt)
    rows.append(("once" if a.once else "cold", ttft, usage))
    outs = [out0]
    if not a.once:
        ttft, out1, usage = stream(a.base, model, prompt)
        rows.append(("from the pool", ttft, usage))
        for i in range(a.others):
            stream(a.base, model, text(i + 1, a.words) + "\nQuestion: what comes next?\nAnswer:")
        if a.beside:
            (ttft, out2, usage), gaps = beside(a.base, model, lambda: stream(a.base, model, prompt), a.beside)
        else:
            ttft, out2, usage = stream(a.base, model, prompt)
        rows.append(("from " + a.tier, ttft, usage))
        outs += [out1, out2]
    for name, ttft, usage in rows:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        print("%-20s ttft %.3f s  prompt_tokens %d  cached_tokens %s" % (name, ttft, usage["prompt_tokens"], cached))
    print("output:" if a.once else "outputs equal:", repr(out0) if a.once else all(o == out0 for o in outs))
    if a.beside and not a.once:
        print("beside: median gap between tokens %.1f ms, longest while the prefix came back %.1f ms"
              % (gaps[0] * 1e3, gaps[1] * 1e3))


if __name__ == "__main__":
    main()
