"""Scenario 6: a repeated prompt of at least 40 tokens hits the prefix cache: the second
request's usage reports cached prompt tokens, peregrine:prefix_cache_hits_total grows by as
many, and the output is identical (greedy and seeded)."""

from e2e_common import client, expect, expect_eq, log, metric, metrics, parser, run, tokenize

HITS = "peregrine:prefix_cache_hits_total"
QUERIES = "peregrine:prefix_cache_queries_total"
BLOCK_SIZE = 16


def main():
    args = parser(__doc__).parse_args()
    base, model = args.base, args.model
    api = client(base)

    cases = [
        ("greedy", "the quick brown fox jumps over the lazy dog. " * 6, {"temperature": 0}),
        ("seeded", "then the cat sat on the mat with another hat; " * 6, {"temperature": 0.9, "seed": 11}),
    ]
    for name, prompt, sampling in cases:
        count = tokenize(base, model, prompt=prompt)
        expect(count >= 40, "the %s prompt has only %d tokens" % (name, count))

        def once():
            before = metrics(base)
            out = api.completions.create(
                model=model, prompt=prompt, max_tokens=8, extra_body={"ignore_eos": True}, **sampling
            )
            after = metrics(base)
            usage = out.usage.model_dump()
            expect_eq(usage["prompt_tokens"], count, "%s prompt_tokens" % name)
            details = usage.get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens")
            expect(cached is not None, "%s: no usage.prompt_tokens_details.cached_tokens in %r" % (name, usage))
            hits = metric(after, HITS) - metric(before, HITS)
            queries = metric(after, QUERIES) - metric(before, QUERIES)
            return out.choices[0].text, cached, hits, queries

        first, cached1, hits1, queries1 = once()
        second, cached2, hits2, queries2 = once()
        log(
            "%s (%d prompt tokens): first cached %d (hits +%d, queries +%d); second cached %d (hits +%d, queries +%d)"
            % (name, count, cached1, hits1, queries1, cached2, hits2, queries2)
        )
        expect_eq(cached1, 0, "%s: cached_tokens of the first request" % name)
        expect(cached2 > 0, "%s: the repeated prompt reported no cached tokens" % name)
        # Whole blocks only, and never the whole prompt (its last token must be computed).
        expect_eq(cached2 % BLOCK_SIZE, 0, "%s: cached_tokens modulo the block size" % name)
        expect(cached2 < count, "%s: %d of %d prompt tokens cached" % (name, cached2, count))
        expect(cached2 >= (count - 1) // BLOCK_SIZE * BLOCK_SIZE, "%s: only %d of %d prompt tokens cached" % (name, cached2, count))
        expect(hits2 > 0, "%s did not increase on the repeated prompt" % HITS)
        expect_eq(hits2, cached2, "%s increase vs usage cached_tokens" % HITS)
        expect(queries2 >= hits2, "%s grew less than %s" % (QUERIES, HITS))
        expect_eq(second, first, "%s output of the repeated prompt" % name)


if __name__ == "__main__":
    run(main)
