"""Scenario 23: what clients of other engines rely on, through the official openai client
and raw HTTP: the OpenAI routes without their `/v1` prefix (llama.cpp serves both), vLLM's
`root` and `parent` on models and `return_token_strs` on `/tokenize`, one
`system_fingerprint` on every response and chunk, and vLLM's `continuous_usage_stats`
putting the usage so far on every streamed chunk."""

from e2e_common import client, expect, expect_eq, get, log, parser, post, run


def main():
    args = parser(__doc__).parse_args()
    base, model = args.base, args.model
    api = client(base)

    # Routes without /v1 answer as the /v1 ones do.
    for path in ("/models", "/v1/models"):
        resp = get(base, path)
        expect_eq(resp.status, 200, "GET %s" % path)
        entry = resp.json()["data"][0]
        expect_eq(entry["id"], model, "%s: id" % path)
        expect(isinstance(entry.get("root"), str) and entry["root"], "%s: root %r" % (path, entry))
        expect("parent" in entry and entry["parent"] is None, "%s: parent %r" % (path, entry))
    body = {"model": model, "prompt": "hello there", "max_tokens": 4, "temperature": 0}
    bare, v1 = post(base, "/completions", body), post(base, "/v1/completions", body)
    expect_eq(bare.status, 200, "POST /completions")
    expect_eq(bare.json()["choices"][0]["text"], v1.json()["choices"][0]["text"], "/completions vs /v1")
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "temperature": 0}
    expect_eq(post(base, "/chat/completions", chat).status, 200, "POST /chat/completions")
    log("routes without /v1, root and parent")

    # /tokenize with the tokens' strings.
    resp = post(base, "/tokenize", {"model": model, "prompt": "hello there",
                                    "return_token_strs": True})
    expect_eq(resp.status, 200, "POST /tokenize")
    out = resp.json()
    expect_eq(len(out["token_strs"]), len(out["tokens"]), "a string per token")
    expect_eq(out["count"], len(out["tokens"]), "count")

    # One fingerprint everywhere.
    whole = api.completions.create(model=model, prompt="x y z", max_tokens=3, temperature=0)
    fingerprint = whole.system_fingerprint
    expect(fingerprint and fingerprint.startswith("fp_"), "system_fingerprint %r" % fingerprint)
    chat = api.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=3, temperature=0)
    expect_eq(chat.system_fingerprint, fingerprint, "chat's fingerprint")
    stream = api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "x"}], max_tokens=5, temperature=0,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True},
    )
    completions = []
    for chunk in stream:
        expect_eq(chunk.system_fingerprint, fingerprint, "a chunk's fingerprint")
        expect(chunk.usage is not None, "a chunk without usage under continuous_usage_stats")
        completions.append(chunk.usage.completion_tokens)
    expect(completions == sorted(completions), "usage went down: %r" % completions)
    expect_eq(completions[-1], 5, "the last chunk's completion tokens")
    log("fingerprint %s; continuous usage %r" % (fingerprint, completions))


if __name__ == "__main__":
    run(main)
