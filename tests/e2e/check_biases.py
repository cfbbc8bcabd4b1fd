"""Scenario 19: the official openai client's `logit_bias` and vLLM's `min_tokens` (through
`extra_body`) on both endpoints, whole and streamed: a +100 bias makes a greedy request
repeat its token; a stop token pulled up by +100 ends a request at once, and only after
`min_tokens` when that is set; bad values get a 400 naming the field."""

from e2e_common import client, expect, expect_eq, expect_param_error, log, parser, post, run

PROMPT = "the quick brown fox jumps over"
MESSAGES = [{"role": "user", "content": "say something about the lazy dog"}]


def token_ids(choice):
    """The ids of a choice, from vLLM's `return_token_ids` (an extra field to the SDK)."""
    ids = (choice.model_extra or {}).get("token_ids")
    expect(isinstance(ids, list), "no token_ids in %r" % choice)
    return ids


def prompt_ids(base, model, text):
    resp = post(base, "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})
    expect_eq(resp.status, 200, "POST /tokenize")
    return resp.json()["tokens"]


def main():
    args = parser(__doc__).parse_args()
    base, model = args.base, args.model
    api = client(base)
    favoured, stop = prompt_ids(base, model, " dog")[-1], prompt_ids(base, model, " fox")[-1]
    log("favoured token %d, stop token %d" % (favoured, stop))

    # +100 on one token: every greedy token is that one, on both endpoints.
    extra = {"ignore_eos": True, "return_token_ids": True}
    whole = api.completions.create(
        model=model, prompt=PROMPT, max_tokens=6, temperature=0,
        logit_bias={str(favoured): 100}, extra_body=extra,
    )
    expect_eq(token_ids(whole.choices[0]), [favoured] * 6, "completion with logit_bias")
    chat = api.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=6, temperature=0,
        logit_bias={str(favoured): 100}, extra_body=extra,
    )
    expect_eq(token_ids(chat.choices[0]), [favoured] * 6, "chat with logit_bias")
    # -100 on the token greedy decoding picks first: it is never picked.
    plain = api.completions.create(
        model=model, prompt=PROMPT, max_tokens=6, temperature=0, extra_body=extra
    )
    first = token_ids(plain.choices[0])[0]
    banned = api.completions.create(
        model=model, prompt=PROMPT, max_tokens=6, temperature=0,
        logit_bias={str(first): -100}, extra_body=extra,
    )
    expect(first not in token_ids(banned.choices[0]), "a -100 token was sampled")

    # A stop token pulled up ends the request at its first token, or after min_tokens.
    pulled = {"logit_bias": {str(stop): 100}}
    for min_tokens, want in [(None, 1), (5, 6)]:
        extra = {"stop_token_ids": [stop], "return_token_ids": True}
        if min_tokens is not None:
            extra["min_tokens"] = min_tokens
        what = "min_tokens %s" % min_tokens
        got = api.completions.create(
            model=model, prompt=PROMPT, max_tokens=20, temperature=0.7, seed=3,
            extra_body=extra, **pulled,
        )
        ids = token_ids(got.choices[0])
        expect_eq(got.choices[0].finish_reason, "stop", what)
        expect_eq(got.usage.completion_tokens, want, "%s: completion tokens" % what)
        expect_eq(ids[-1], stop, "%s: the last token" % what)
        expect(stop not in ids[:-1], "%s: the stop token came early: %r" % (what, ids))
        streamed = api.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=20, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body=extra, **pulled,
        )
        chunks = list(streamed)
        expect_eq(chunks[-1].usage.completion_tokens, want, "streamed chat, %s" % what)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        expect_eq(finishes, ["stop"], "streamed chat, %s: finish" % what)

    # Bad values: a 400 naming the field.
    for fields, param in [
        ({"logit_bias": {str(favoured): 100.5}}, "logit_bias"),
        ({"logit_bias": {"not-a-token": 1}}, "logit_bias"),
        ({"logit_bias": {"999999999": 1}}, "logit_bias"),
        ({"min_tokens": 30, "max_tokens": 20}, "min_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
    ]:
        body = {"model": model, "prompt": PROMPT, "max_tokens": 20}
        body.update(fields)
        expect_param_error(post(base, "/v1/completions", body), [param], "completion %r" % fields)


if __name__ == "__main__":
    run(main)
