"""Scenario 5: under a KV pool too small for the batch (the server runs with a few blocks),
concurrent requests preempt each other, and every output equals the output of the same
request sent alone afterwards. Even-numbered requests are greedy; odd-numbered ones sample
with a seed (a recomputed request must carry on with its sampler where it was)."""

import threading

from e2e_common import (
    client,
    expect,
    expect_eq,
    idle,
    log,
    metric,
    metrics,
    parser,
    run,
    tokenize,
    wait_for,
)

PREEMPTIONS = "peregrine:num_preemptions_total"
ROUNDS = 5


def main():
    p = parser(__doc__)
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=100)
    args = p.parse_args()
    base, model, n = args.base, args.model, args.requests
    api = client(base, timeout=300.0)

    # Different prompts of 10 to 30-odd tokens.
    words = "the quick brown fox jumps over the lazy dog and then the cat sat on the mat".split()
    prompts = []
    for i in range(n):
        prompt = "%d: %s" % (i, " ".join(words[i % 5 : i % 5 + 3 + i]))
        prompts.append(prompt)
    counts = [tokenize(base, model, prompt=prompt) for prompt in prompts]
    log("prompt tokens: %r" % counts)

    def once(i):
        prompt = prompts[i]
        sampling = {"temperature": 0} if i % 2 == 0 else {"temperature": 0.9, "seed": 100 + i}
        out = api.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=args.max_tokens,
            extra_body={"ignore_eos": True},
            **sampling
        )
        expect_eq(out.usage.completion_tokens, args.max_tokens, "completion_tokens of %r" % prompt)
        expect_eq(out.choices[0].finish_reason, "length", "finish_reason of %r" % prompt)
        return out.choices[0].text

    def all_at_once():
        start = threading.Barrier(n)
        results = [None] * n

        def worker(i):
            try:
                start.wait()
                results[i] = once(i)
            except Exception as err:  # noqa: BLE001
                results[i] = err

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        expect(not any(t.is_alive() for t in threads), "some requests never finished")
        for i, result in enumerate(results):
            expect(not isinstance(result, Exception), "request %d failed: %r" % (i, result))
        return results

    # The requests only preempt each other if they overlap on the server, and a fast
    # machine may finish one before the client has sent the next: send the batch again
    # (a few times at most) until a round has preempted. Every round's outputs are checked.
    rounds = []
    for attempt in range(1, ROUNDS + 1):
        before = metric(base, PREEMPTIONS)
        rounds.append(all_at_once())
        preemptions = metric(base, PREEMPTIONS) - before
        log("round %d, %d requests at once: %d preemptions" % (attempt, n, preemptions))
        if preemptions > 0:
            break
    expect(preemptions > 0, "%s did not increase in %d rounds: the requests never overlapped" % (PREEMPTIONS, ROUNDS))

    wait_for(lambda: idle(metrics(base)), 5, "the KV metrics returning to idle")
    for i in range(n):
        alone = once(i)
        for attempt, together in enumerate(rounds, 1):
            expect_eq(together[i], alone, "request %d's output in round %d vs alone" % (i, attempt))
    log("all %d outputs equal their solo runs" % n)


if __name__ == "__main__":
    run(main)
