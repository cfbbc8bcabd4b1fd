"""Scenario 1: the official openai client gets a completion, a chat completion, and streamed
versions of both, with the right usage counts; and the prompt's logprobs (`echo` with
`logprobs`, vLLM's `prompt_logprobs`)."""

from e2e_common import (
    RawStream,
    client,
    expect,
    expect_eq,
    get,
    log,
    parser,
    run,
    tokenize,
)

PROMPT = "the quick brown fox jumps over"
MESSAGES = [{"role": "user", "content": "say something about the lazy dog"}]
IGNORE_EOS = {"ignore_eos": True}


def check_usage(usage, prompt_tokens, completion_tokens, what):
    expect(usage is not None, "%s: no usage" % what)
    expect_eq(usage.prompt_tokens, prompt_tokens, "%s: usage.prompt_tokens" % what)
    expect_eq(usage.completion_tokens, completion_tokens, "%s: usage.completion_tokens" % what)
    expect_eq(usage.total_tokens, prompt_tokens + completion_tokens, "%s: usage.total_tokens" % what)


def main():
    args = parser(__doc__).parse_args()
    base, model = args.base, args.model
    api = client(base)

    names = [m.id for m in api.models.list().data]
    expect_eq(names, [model], "GET /v1/models ids")

    prompt_tokens = tokenize(base, model, prompt=PROMPT)
    chat_tokens = tokenize(base, model, messages=MESSAGES)
    log("prompt: %d tokens, chat: %d tokens" % (prompt_tokens, chat_tokens))

    # A whole completion.
    whole = api.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, extra_body=IGNORE_EOS
    )
    expect_eq(whole.object, "text_completion", "completion object")
    expect_eq(whole.model, model, "completion model")
    expect_eq(len(whole.choices), 1, "completion choices")
    expect_eq(whole.choices[0].finish_reason, "length", "completion finish_reason")
    expect(isinstance(whole.choices[0].text, str), "completion text is not a string")
    check_usage(whole.usage, prompt_tokens, 12, "completion")
    log("completion: %r" % whole.choices[0].text)

    # The same request streamed, with usage: chunks, then the usage chunk, then the end.
    stream = api.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=IGNORE_EOS,
    )
    texts, finishes, usage, after_usage, ids = [], [], None, 0, set()
    for chunk in stream:
        ids.add(chunk.id)
        if usage is not None:
            after_usage += 1
        if chunk.usage is not None:
            expect_eq(chunk.choices, [], "the usage chunk's choices")
            usage = chunk.usage
        for choice in chunk.choices:
            texts.append(choice.text)
            if choice.finish_reason is not None:
                finishes.append(choice.finish_reason)
    expect_eq(len(ids), 1, "one id across the stream's chunks")
    expect(len(texts) >= 2, "the completion stream came in %d chunk(s)" % len(texts))
    expect_eq(finishes, ["length"], "completion stream finish_reasons")
    expect_eq(after_usage, 0, "chunks after the usage chunk")
    check_usage(usage, prompt_tokens, 12, "completion stream")
    expect_eq("".join(texts), whole.choices[0].text, "streamed text vs whole text (greedy)")

    # Without include_usage a stream carries no usage.
    stream = api.completions.create(
        model=model, prompt=PROMPT, max_tokens=3, temperature=0, stream=True, extra_body=IGNORE_EOS
    )
    chunks = list(stream)
    expect(all(c.usage is None for c in chunks), "usage sent without stream_options.include_usage")
    expect_eq(chunks[-1].choices[0].finish_reason, "length", "last chunk's finish_reason")

    # A whole chat completion, limited by max_completion_tokens (the newer name).
    chat = api.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_completion_tokens=10,
        temperature=0,
        extra_body=IGNORE_EOS,
    )
    expect_eq(chat.object, "chat.completion", "chat object")
    expect_eq(len(chat.choices), 1, "chat choices")
    message = chat.choices[0].message
    expect_eq(message.role, "assistant", "chat message role")
    expect(isinstance(message.content, str), "chat content is not a string")
    expect_eq(chat.choices[0].finish_reason, "length", "chat finish_reason")
    check_usage(chat.usage, chat_tokens, 10, "chat")
    log("chat: %r" % message.content)

    # The same chat streamed with max_tokens: the role first, then content, then usage.
    stream = api.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=IGNORE_EOS,
    )
    roles, contents, finishes, usage = [], [], [], None
    for chunk in stream:
        expect_eq(chunk.object, "chat.completion.chunk", "chat chunk object")
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.role is not None:
                roles.append(choice.delta.role)
            if choice.delta.content:
                contents.append(choice.delta.content)
            if choice.finish_reason is not None:
                finishes.append(choice.finish_reason)
    expect_eq(roles, ["assistant"], "roles in the chat stream")
    expect_eq(finishes, ["length"], "chat stream finish_reasons")
    check_usage(usage, chat_tokens, 10, "chat stream")
    expect_eq("".join(contents), message.content, "streamed chat vs whole chat (greedy)")

    # On the wire, a stream ends with `data: [DONE]` and nothing after it.
    raw = RawStream(
        base,
        "/v1/chat/completions",
        {
            "model": model,
            "messages": MESSAGES,
            "max_tokens": 4,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
    )
    expect_eq(raw.status, 200, "raw stream status")
    expect(
        raw.resp.getheader("Content-Type", "").startswith("text/event-stream"),
        "stream Content-Type %r" % raw.resp.getheader("Content-Type"),
    )
    events = list(raw.events())
    raw.close()
    expect_eq(events[-1], "[DONE]", "the last event")
    expect_eq(events.count("[DONE]"), 1, "[DONE] events")
    expect_eq(events[-2]["usage"]["completion_tokens"], 4, "raw usage chunk")

    check_prompt_scores(api, model, prompt_tokens, chat_tokens)

    expect_eq(get(base, "/health").status, 200, "GET /health after the checks")


def check_prompt_scores(api, model, prompt_tokens, chat_tokens):
    """The prompt's logprobs: OpenAI's `echo` with `logprobs` (with `max_tokens: 0`, a
    prompt scored alone, as lm-evaluation-harness asks), and vLLM's `prompt_logprobs`."""
    scored = api.completions.create(
        model=model, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    choice = scored.choices[0]
    expect_eq(choice.text, PROMPT, "a scored prompt's text")
    expect_eq(choice.finish_reason, "length", "a scored prompt's finish_reason")
    check_usage(scored.usage, prompt_tokens, 0, "a scored prompt")
    echoed = choice.logprobs
    for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        expect_eq(len(getattr(echoed, field)), prompt_tokens, "one %s entry a prompt token" % field)
    expect_eq(echoed.token_logprobs[0], None, "the first prompt token's logprob")
    expect_eq(echoed.top_logprobs[0], None, "the first prompt token's alternatives")
    for at in range(1, prompt_tokens):
        logprob, top = echoed.token_logprobs[at], echoed.top_logprobs[at]
        expect(isinstance(logprob, float) and logprob <= 0, "token %d's logprob %r" % (at, logprob))
        expect(1 <= len(top) <= 2, "token %d's alternatives %r" % (at, top))
        expect(echoed.tokens[at] in top, "token %d among its alternatives" % at)
        expect(max(top.values()) >= logprob, "token %d: the most likely first" % at)

    # With output: the prompt's entries, the same as alone, then the output's.
    both = api.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=4,
        echo=True,
        logprobs=1,
        temperature=0,
        extra_body=IGNORE_EOS,
    )
    logprobs = both.choices[0].logprobs
    expect(both.choices[0].text.startswith(PROMPT), "the echo opens the text")
    expect_eq(len(logprobs.tokens), prompt_tokens + 4, "prompt and output entries")
    expect_eq(logprobs.token_logprobs[:prompt_tokens], echoed.token_logprobs, "the prompt's scores")
    expect(all(lp is not None for lp in logprobs.token_logprobs[prompt_tokens:]), "output logprobs")
    offsets = logprobs.text_offset
    expect(all(a <= b for a, b in zip(offsets, offsets[1:])), "offsets grow: %r" % offsets)

    # vLLM's prompt_logprobs: on the completion choice, at the top of a chat response.
    extra = api.completions.create(
        model=model, prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 2}
    )
    positions = extra.choices[0].model_extra["prompt_logprobs"]
    expect_eq(len(positions), prompt_tokens, "prompt_logprobs entries")
    expect_eq(positions[0], None, "the first prompt token's entry")
    for at in range(1, prompt_tokens):
        entry = positions[at]
        expect(2 <= len(entry) <= 3, "position %d: the token and 2 alternatives: %r" % (at, entry))
        for token_id, value in entry.items():
            expect(token_id.isdigit(), "position %d: key %r is a token id" % (at, token_id))
            expect_eq(sorted(value), ["decoded_token", "logprob", "rank"], "an entry's fields")
        own = entry[next(iter(entry))]
        expect_eq(own["logprob"], echoed.token_logprobs[at], "position %d: the echo's score" % at)
    chat = api.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=1, extra_body={"prompt_logprobs": 0}
    )
    positions = chat.model_extra["prompt_logprobs"]
    expect_eq(len(positions), chat_tokens, "chat prompt_logprobs entries")
    expect(all(len(entry) == 1 for entry in positions[1:]), "0 alternatives: the token alone")


if __name__ == "__main__":
    run(main)
