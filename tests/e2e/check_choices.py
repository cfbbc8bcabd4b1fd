"""Scenario 22: `n` > 1 through the official openai client, on both endpoints, whole and
streamed: `n` choices in index order, usage counting the prompt once and every choice's
completion; a seeded request repeats choice for choice, and its choices differ; the later
choices share the first one's prompt blocks (the prefix cache's hits grow by the prompt's
full blocks for each of them); `n` out of range gets a 400 naming it."""

import random

from e2e_common import (
    client, expect, expect_eq, expect_param_error, log, metric, parser, post, run,
)

BLOCK = 16  # the default --block-size


def main():
    args = parser(__doc__).parse_args()
    base, model = args.base, args.model
    api = client(base)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "zeta"]
    rng = random.Random(7)
    prompt = " ".join(rng.choice(words) for _ in range(90))

    # Whole completions: three seeded choices, repeated.
    extra = {"ignore_eos": True}
    hits_before = metric(base, "peregrine:prefix_cache_hits_total")
    first = api.completions.create(
        model=model, prompt=prompt, n=3, seed=11, temperature=1.0, max_tokens=8,
        extra_body=extra,
    )
    hits = metric(base, "peregrine:prefix_cache_hits_total") - hits_before
    expect_eq([c.index for c in first.choices], [0, 1, 2], "choice indices")
    prompt_tokens = first.usage.prompt_tokens
    expect_eq(first.usage.completion_tokens, 24, "completion tokens of three choices")
    expect_eq(first.usage.total_tokens, prompt_tokens + 24, "total tokens")
    shared = 2 * (prompt_tokens // BLOCK) * BLOCK
    log("prompt of %d tokens; prefix-cache hits %d (at least %d)" % (prompt_tokens, hits, shared))
    expect(hits >= shared, "the later choices computed the prompt's full blocks again")
    texts = [c.text for c in first.choices]
    expect(len(set(texts)) > 1, "three seeded choices are all %r" % texts[0])
    again = api.completions.create(
        model=model, prompt=prompt, n=3, seed=11, temperature=1.0, max_tokens=8,
        extra_body=extra,
    )
    expect_eq([c.text for c in again.choices], texts, "a seeded request repeated")
    single = api.completions.create(
        model=model, prompt=prompt, n=1, seed=12, temperature=1.0, max_tokens=8,
        extra_body=extra,
    )
    expect_eq(single.choices[0].text, texts[1], "choice 1 is the request with seed + 1")

    # Whole chat: greedy choices are equal.
    messages = [{"role": "user", "content": prompt[:200]}]
    chat = api.chat.completions.create(
        model=model, messages=messages, n=2, temperature=0, max_tokens=6, extra_body=extra,
    )
    expect_eq([c.index for c in chat.choices], [0, 1], "chat choice indices")
    expect_eq(chat.choices[0].message.content, chat.choices[1].message.content,
              "greedy choices")
    expect_eq(chat.usage.completion_tokens, 12, "chat completion tokens")

    # Streamed chat: each choice's deltas under its index, the usage last.
    stream = api.chat.completions.create(
        model=model, messages=messages, n=2, seed=3, temperature=1.0, max_tokens=6,
        stream=True, stream_options={"include_usage": True}, extra_body=extra,
    )
    texts, reasons, usage = ["", ""], [None, None], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    expect_eq(reasons, ["length", "length"], "streamed finish reasons")
    expect(usage is not None, "no usage at the end of the stream")
    expect_eq(usage.completion_tokens, 12, "streamed completion tokens")
    whole = api.chat.completions.create(
        model=model, messages=messages, n=2, seed=3, temperature=1.0, max_tokens=6,
        extra_body=extra,
    )
    expect_eq(texts, [c.message.content for c in whole.choices], "streamed = whole")

    # Streamed completions.
    stream = api.completions.create(
        model=model, prompt=prompt, n=3, seed=11, temperature=1.0, max_tokens=8,
        stream=True, extra_body=extra,
    )
    streamed = ["", "", ""]
    for chunk in stream:
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    expect_eq(streamed, [c.text for c in first.choices], "streamed completions")

    # Out of range.
    for n in (0, 129):
        resp = post(base, "/v1/completions", {"model": model, "prompt": "x", "n": n})
        expect_param_error(resp, ["n"], "n = %d" % n)


if __name__ == "__main__":
    run(main)
