"""Scenario 7: bad requests get the right status and an OpenAI-shaped error
({"error": {"message", "type", "param", "code"}}) whose message names the problem. The
server runs with an API key and a small --max-model-len."""

import openai

from e2e_common import client, expect, expect_eq, expect_error, log, parser, post, request, run, tokenize


def main():
    p = parser(__doc__)
    p.add_argument("--api-key", required=True)
    p.add_argument("--max-model-len", type=int, required=True)
    args = p.parse_args()
    base, model, key, limit = args.base, args.model, args.api_key, args.max_model_len

    def completion(body, token=key):
        return post(base, "/v1/completions", dict({"model": model, "prompt": "hello"}, **body), token=token)

    def chat(body, token=key):
        messages = [{"role": "user", "content": "hello"}]
        return post(base, "/v1/chat/completions", dict({"model": model, "messages": messages}, **body), token=token)

    # The key works, so what follows is refused for its own reason.
    ok = completion({"max_tokens": 2})
    expect_eq(ok.status, 200, "a valid request (%r)" % ok)

    log("malformed JSON")
    for path in ("/v1/completions", "/v1/chat/completions"):
        resp = request(base, "POST", path, raw='{"model": "%s", "prompt": "hi", ' % model, token=key)
        expect_error(resp, 400, ["JSON"], what="%s truncated body" % path)
        resp = request(base, "POST", path, raw="{'model': 'single quotes'}", token=key)
        expect_error(resp, 400, ["JSON"], what="%s single-quoted body" % path)

    log("a field of the wrong type")
    expect_error(completion({"max_tokens": "ten"}), 400, ["max_tokens"], param="max_tokens", what="max_tokens as a string")
    expect_error(completion({"temperature": "hot"}), 400, ["temperature"], param="temperature", what="temperature as a string")
    expect_error(completion({"prompt": {"text": "hi"}}), 400, ["prompt"], param="prompt", what="prompt as an object")
    expect_error(chat({"stream": "yes"}), 400, ["stream"], param="stream", what="chat stream as a string")
    expect_error(
        chat({"messages": [{"role": "user", "content": 42}]}),
        400,
        ["messages[0].content"],
        param="messages[0].content",
        what="chat content as a number",
    )

    log("negative max_tokens")
    expect_error(completion({"max_tokens": -5}), 400, ["max_tokens", "-5"], param="max_tokens", what="max_tokens -5")
    expect_error(
        chat({"max_completion_tokens": -1}),
        400,
        ["max_completion_tokens", "-1"],
        param="max_completion_tokens",
        what="max_completion_tokens -1",
    )
    expect_error(completion({"max_tokens": 0}), 400, ["max_tokens"], param="max_tokens", what="max_tokens 0")

    log("a prompt over the context limit (max_model_len %d)" % limit)
    long_prompt = "the quick brown fox jumps over the lazy dog " * 8
    n = tokenize(base, model, token=key, prompt=long_prompt)
    expect(n > limit, "the long prompt has only %d tokens" % n)
    expect_error(completion({"prompt": long_prompt, "max_tokens": 8}), 400, [str(n), str(limit)], what="%d-token prompt, max_tokens 8" % n)
    expect_error(completion({"prompt": long_prompt}), 400, [str(n), str(limit)], what="%d-token prompt, no max_tokens" % n)
    messages = [{"role": "user", "content": long_prompt}]
    n_chat = tokenize(base, model, token=key, messages=messages)
    expect_error(chat({"messages": messages, "max_tokens": 4}), 400, [str(n_chat), str(limit)], what="%d-token chat" % n_chat)
    short = "the quick brown fox"
    m = tokenize(base, model, token=key, prompt=short)
    over = limit - m + 1
    expect_error(
        completion({"prompt": short, "max_tokens": over}),
        400,
        [str(m), str(over), str(limit)],
        param="max_tokens",
        what="%d-token prompt + max_tokens %d" % (m, over),
    )
    fits = completion({"prompt": short, "max_tokens": over - 1, "ignore_eos": True})
    expect_eq(fits.status, 200, "prompt + max_tokens == max_model_len (%r)" % fits)
    expect_eq(fits.json()["usage"]["total_tokens"], limit, "total_tokens at the limit")

    log("temperature < 0")
    expect_error(completion({"temperature": -0.5}), 400, ["temperature"], param="temperature", what="temperature -0.5")
    expect_error(chat({"temperature": -1}), 400, ["temperature"], param="temperature", what="chat temperature -1")

    log("an unknown model")
    expect_error(completion({"model": "no-such-model"}), 404, ["no-such-model"], what="completion for an unknown model")
    expect_error(chat({"model": "no-such-model"}), 404, ["no-such-model"], what="chat for an unknown model")

    log("missing and wrong API keys")
    for path, call in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
        expect_error(call({}, token=None), 401, ["API key"], what="%s without a key" % path)
        expect_error(call({}, token="sk-wrong"), 401, ["API key"], what="%s with a wrong key" % path)
    expect_error(request(base, "GET", "/v1/models"), 401, ["API key"], what="/v1/models without a key")

    log("the same through the openai client")
    api = client(base, api_key=key)
    checks = [
        (openai.AuthenticationError, lambda: client(base, api_key="sk-wrong").completions.create(model=model, prompt="hi", max_tokens=2)),
        (openai.NotFoundError, lambda: api.completions.create(model="no-such-model", prompt="hi", max_tokens=2)),
        (openai.BadRequestError, lambda: api.completions.create(model=model, prompt="hi", max_tokens=-5)),
        (openai.BadRequestError, lambda: api.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], temperature=-1)),
        (openai.BadRequestError, lambda: api.completions.create(model=model, prompt=long_prompt, max_tokens=8)),
    ]
    for kind, call in checks:
        try:
            call()
        except kind as err:
            log("  %s: %s" % (kind.__name__, err))
        except Exception as err:  # noqa: BLE001
            expect(False, "expected %s, got %r" % (kind.__name__, err))
        else:
            expect(False, "expected %s, the call succeeded" % kind.__name__)


if __name__ == "__main__":
    run(main)
