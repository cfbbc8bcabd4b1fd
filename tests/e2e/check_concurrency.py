"""Scenario 3: many concurrent streaming requests (completions and chats, max_tokens 1..20)
all finish, each with usage.completion_tokens == its max_tokens and usage.prompt_tokens ==
the /tokenize count of its prompt."""

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


def main():
    p = parser(__doc__)
    p.add_argument("--requests", type=int, default=64)
    args = p.parse_args()
    base, model, n = args.base, args.model, args.requests
    api = client(base, timeout=300.0)

    # Half completions, half chats, with prompts of different lengths.
    jobs = []
    for i in range(n):
        words = " ".join(["the lazy dog"] * (i % 7) + ["request %d" % i])
        max_tokens = i % 20 + 1
        if i % 2 == 0:
            count = tokenize(base, model, prompt=words)
            jobs.append({"kind": "completion", "prompt": words, "max_tokens": max_tokens, "count": count})
        else:
            messages = [{"role": "user", "content": words}]
            count = tokenize(base, model, messages=messages)
            jobs.append({"kind": "chat", "messages": messages, "max_tokens": max_tokens, "count": count})

    before = metrics(base)
    start = threading.Barrier(n)
    results = [None] * n

    def worker(i):
        job = jobs[i]
        common = dict(
            model=model,
            max_tokens=job["max_tokens"],
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        try:
            start.wait()
            if job["kind"] == "completion":
                stream = api.completions.create(prompt=job["prompt"], **common)
            else:
                stream = api.chat.completions.create(messages=job["messages"], **common)
            finishes, usage, chunks = [], None, 0
            for chunk in stream:
                chunks += 1
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    if choice.finish_reason is not None:
                        finishes.append(choice.finish_reason)
            results[i] = (finishes, usage, chunks)
        except Exception as err:  # noqa: BLE001
            results[i] = err

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    expect(not any(t.is_alive() for t in threads), "some requests never finished")

    for i, (job, result) in enumerate(zip(jobs, results)):
        what = "request %d (%s, max_tokens %d)" % (i, job["kind"], job["max_tokens"])
        expect(not isinstance(result, Exception), "%s failed: %r" % (what, result))
        finishes, usage, chunks = result
        expect_eq(finishes, ["length"], "%s finish_reasons" % what)
        expect(usage is not None, "%s: no usage chunk" % what)
        expect_eq(usage.completion_tokens, job["max_tokens"], "%s usage.completion_tokens" % what)
        expect_eq(usage.prompt_tokens, job["count"], "%s usage.prompt_tokens vs /tokenize" % what)
        expect_eq(usage.total_tokens, job["count"] + job["max_tokens"], "%s usage.total_tokens" % what)

    # The gauges are set at the end of each step: give the last one a moment.
    after = wait_for(lambda: idle(metrics(base)), 5, "the KV metrics returning to idle")
    generated = sum(job["max_tokens"] for job in jobs)
    prompts = sum(job["count"] for job in jobs)
    name = "peregrine:generation_tokens_total"
    expect_eq(metric(after, name) - metric(before, name), generated, name + " increase")
    name = "peregrine:prompt_tokens_total"
    expect_eq(metric(after, name) - metric(before, name), prompts, name + " increase")
    name = 'peregrine:request_success_total{finished_reason="length"}'
    expect_eq(metric(after, name) - metric(before, name), n, name + " increase")
    log("%d streams finished: %d prompt tokens, %d generated" % (n, prompts, generated))


if __name__ == "__main__":
    run(main)
