"""Scenario 2: a seeded sampled request and a greedy one return the text that
`peregrine generate` printed for the same prompt and settings (the expectations file holds
them), sent alone and sent as several copies at once. An expectations file may hold only
one of the two."""

import json
import threading

from e2e_common import client, expect, expect_eq, log, parser, run


def main():
    p = parser(__doc__)
    p.add_argument("--expected", required=True, help="JSON written by the Rust test")
    p.add_argument("--copies", type=int, default=4, help="copies sent at once")
    args = p.parse_args()
    with open(args.expected, encoding="utf-8") as f:
        expected = json.load(f)
    api = client(args.base)
    prompt = expected["prompt"]

    for kind in ("seeded", "greedy"):
        if kind not in expected:
            continue
        case = expected[kind]
        settings = {"temperature": case["temperature"], "max_tokens": case["max_tokens"]}
        if "seed" in case:
            settings["seed"] = case["seed"]

        def once():
            out = api.completions.create(
                model=args.model, prompt=prompt, extra_body={"ignore_eos": True}, **settings
            )
            expect_eq(out.usage.completion_tokens, case["max_tokens"], "%s completion_tokens" % kind)
            return out.choices[0].text

        alone = once()
        log("%s: generate %r, server %r" % (kind, case["text"], alone))
        expect_eq(alone, case["text"], "%s request (%s) vs peregrine generate" % (kind, settings))

        # The same request beside copies of itself (each with its own seeded sampler).
        results = [None] * args.copies
        errors = []

        def worker(i):
            try:
                results[i] = once()
            except Exception as err:  # noqa: BLE001
                errors.append(err)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.copies)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        expect(not errors, "%s copies failed: %r" % (kind, errors))
        for i, text in enumerate(results):
            expect_eq(text, case["text"], "%s copy %d of %d sent at once" % (kind, i, args.copies))


if __name__ == "__main__":
    run(main)
