"""Anthropic's Messages API (`POST /v1/messages`) through the official `anthropic` client,
against a server started with `--enable-auto-tool-choice --tool-call-parser hermes`.

The model is a tiny random Llama, so the checks rely only on what the API guarantees:
`messages.create` answers a message of text blocks with Anthropic's stop reason and usage
(cache reads counted apart); `messages.count_tokens` counts the prompt it would send;
a system prompt adds to the input tokens; a stop sequence taken from a greedy answer ends
the same greedy answer just before it, with `stop_reason` `stop_sequence`; `messages.stream`
gives text deltas that put together are the final message and the whole greedy answer.
With check_tools.py's tools, `tool_choice` `any` and `tool` answer with `tool_use` blocks whose input
validates against the tool's `input_schema` (jsonschema), ending with `tool_use`; a second
turn sending the `tool_result` back is served; a streamed call's `input_json_delta`
fragments put together are valid JSON that validates. A missing `max_tokens`, an unknown
model and extended thinking are refused through the SDK's exception classes, in
Anthropic's error shape."""

import json

try:
    import anthropic
except ImportError as err:  # pragma: no cover - exercised on bare machines only
    raise SystemExit("FAIL: the `anthropic` Python client is not importable (%s)" % err)

import check_tools
from check_tools import MAX_TOKENS, PARAMETERS as SCHEMAS, MESSAGES as QUESTION
from e2e_common import expect, expect_eq, log, parser, run, validate_json

# check_tools.py's function tools, in Anthropic's shape.
TOOLS = [
    {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
    for f in (tool["function"] for tool in check_tools.TOOLS)
]
# The client has no `temperature` parameter any more (newer Claude models take none); the
# server honours it, so it goes in the body.
GREEDY = {"temperature": 0}
SAMPLED = {"temperature": 1.0}


def text_of(message):
    return "".join(block.text for block in message.content if block.type == "text")


def prompt_tokens(usage):
    """The prompt's tokens: those computed plus those read from the prefix cache, which
    Anthropic's usage counts apart."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def check_message(message, model, what):
    """The fields every answer has."""
    expect(message.id.startswith("msg_"), "%s: id %r" % (what, message.id))
    expect_eq((message.type, message.role, message.model), ("message", "assistant", model), "%s: type, role, model" % what)
    expect(prompt_tokens(message.usage) > 0, "%s: usage %r" % (what, message.usage))
    expect(message.usage.cache_read_input_tokens is not None, "%s: no cache_read_input_tokens" % what)
    if message.stop_reason == "max_tokens":
        expect(message.usage.output_tokens > 0, "%s: output_tokens %r" % (what, message.usage.output_tokens))


def check_plain(api, model):
    log("messages.create: text blocks, stop reason and usage; a system prompt; a stop sequence")
    plain = api.messages.create(model=model, max_tokens=16, messages=QUESTION, extra_body=GREEDY)
    check_message(plain, model, "plain")
    expect(all(b.type == "text" for b in plain.content), "plain: blocks %r" % plain.content)
    expect(plain.stop_reason in ("end_turn", "max_tokens"), "plain: stop_reason %r" % plain.stop_reason)
    if plain.stop_reason == "max_tokens":
        expect_eq(plain.usage.output_tokens, 16, "plain: output_tokens at max_tokens")
    log("  %s %r" % (plain.stop_reason, text_of(plain)))

    short = api.messages.create(model=model, max_tokens=16, messages=QUESTION, extra_body=GREEDY, system="Be terse.")
    system = api.messages.create(
        model=model, max_tokens=16, messages=QUESTION, extra_body=GREEDY, system="Be terse. Answer in one word, always."
    )
    check_message(system, model, "with a system prompt")
    expect(
        prompt_tokens(system.usage) > prompt_tokens(short.usage),
        "a longer system prompt adds no input tokens (%r vs %r)" % (system.usage, short.usage),
    )
    blocks = api.messages.create(
        model=model, max_tokens=16, messages=QUESTION, extra_body=GREEDY,
        system=[{"type": "text", "text": "Be terse. Answer in one word, always."}],
    )
    expect_eq(text_of(blocks), text_of(system), "a system prompt as text blocks vs as a string")
    expect_eq(prompt_tokens(blocks.usage), prompt_tokens(system.usage), "input tokens, text blocks vs a string")
    expect(blocks.usage.cache_read_input_tokens > 0, "the same prompt again read nothing from the cache")
    counted = api.messages.count_tokens(
        model=model, messages=QUESTION, system=[{"type": "text", "text": "Be terse. Answer in one word, always."}],
    )
    expect_eq(counted.input_tokens, prompt_tokens(blocks.usage), "count_tokens vs the prompt sent")

    greedy = api.messages.create(model=model, max_tokens=32, messages=QUESTION, extra_body=GREEDY)
    text = text_of(greedy)
    expect(len(text) >= 8, "the greedy answer is too short to take a stop sequence from: %r" % text)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    stopped = api.messages.create(model=model, max_tokens=32, messages=QUESTION, extra_body=GREEDY, stop_sequences=[stop])
    expect_eq(stopped.stop_reason, "stop_sequence", "stopped: stop_reason")
    expect_eq(stopped.stop_sequence, stop, "stopped: stop_sequence")
    expect_eq(text_of(stopped), text[: text.index(stop)], "stopped: the text before the stop sequence")
    log("  stop sequence %r: %r" % (stop, text_of(stopped)))


def check_stream(api, model):
    log("messages.stream: the text deltas put together are the final message and the whole answer")
    whole = api.messages.create(model=model, max_tokens=24, messages=QUESTION, extra_body=GREEDY)
    pieces, events = [], []
    with api.messages.stream(model=model, max_tokens=24, messages=QUESTION, extra_body=GREEDY) as stream:
        for event in stream:
            events.append(event.type)
            if event.type == "text":
                pieces.append(event.text)
        final = stream.get_final_message()
    expect_eq(events[0], "message_start", "the first event")
    expect_eq(events[-1], "message_stop", "the last event")
    expect(len(pieces) > 1, "the text came in %d pieces" % len(pieces))
    expect_eq("".join(pieces), text_of(final), "the deltas vs the final message")
    expect_eq(text_of(final), text_of(whole), "the streamed vs the whole answer")
    expect_eq(final.stop_reason, whole.stop_reason, "stop_reason, streamed vs whole")
    expect_eq(final.usage.output_tokens, whole.usage.output_tokens, "output_tokens, streamed vs whole")
    expect_eq(prompt_tokens(final.usage), prompt_tokens(whole.usage), "prompt tokens, streamed vs whole")
    log("  %d pieces, %s" % (len(pieces), final.stop_reason))


def tool_uses(message, what, names=None):
    """The tool_use blocks of `message`, each valid: input validated against its schema."""
    names = names or list(SCHEMAS)
    uses = [b for b in message.content if b.type == "tool_use"]
    expect(uses, "%s: no tool_use block (content %r)" % (what, message.content))
    for use in uses:
        expect(use.id.startswith("toolu_"), "%s: id %r" % (what, use.id))
        expect(use.name in names, "%s: the tool %r is none of %r" % (what, use.name, names))
        validate_json(json.dumps(use.input), SCHEMAS[use.name], "%s: input" % what)
    return uses


def check_tools(api, model):
    log("tool_choice any (one call) and tool: valid tool_use blocks, stop_reason tool_use")
    ids = set()
    for attempt in range(8):
        what = "any, no parallel calls (%d)" % attempt
        message = api.messages.create(
            model=model, max_tokens=MAX_TOKENS, messages=QUESTION, extra_body=SAMPLED, tools=TOOLS,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
        )
        check_message(message, model, what)
        uses = tool_uses(message, what)
        expect_eq(len(uses), 1, "%s: calls" % what)
        expect_eq(message.stop_reason, "tool_use", "%s: stop_reason" % what)
        expect(uses[0].id not in ids, "%s: the id %r was given before" % (what, uses[0].id))
        ids.add(uses[0].id)
        log("  %s: %s %s" % (what, uses[0].name, json.dumps(uses[0].input)))
    for attempt in range(3):
        what = "tool get_time (%d)" % attempt
        message = api.messages.create(
            model=model, max_tokens=MAX_TOKENS, messages=QUESTION, extra_body=SAMPLED, tools=TOOLS,
            tool_choice={"type": "tool", "name": "get_time"},
        )
        tool_uses(message, what, names=["get_time"])
        expect_eq(message.stop_reason, "tool_use", "%s: stop_reason" % what)


def check_two_turns(api, model):
    log("a second turn: the assistant's tool_use, then the tool_result answering it")
    # One call a turn, so that each ends within max_tokens (parallel calls may run out of it).
    first = api.messages.create(
        model=model, max_tokens=MAX_TOKENS, messages=QUESTION, extra_body=SAMPLED, tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    uses = tool_uses(first, "first turn")
    results = [
        {"type": "tool_result", "tool_use_id": use.id, "content": json.dumps({"result": "sunny, 21 degrees"})}
        for use in uses
    ]
    results[-1]["is_error"] = len(results) > 1
    turns = QUESTION + [{"role": "assistant", "content": first.content}, {"role": "user", "content": results}]
    for kind in ("auto", "none", "any"):
        what = "second turn, tool_choice %s" % kind
        message = api.messages.create(
            model=model, max_tokens=MAX_TOKENS if kind == "any" else 24, messages=turns, extra_body=SAMPLED,
            tools=TOOLS, tool_choice=dict({"type": kind}, **({"disable_parallel_tool_use": True} if kind == "any" else {})),
        )
        check_message(message, model, what)
        if kind == "any":
            tool_uses(message, what)
            expect_eq(message.stop_reason, "tool_use", "%s: stop_reason" % what)
        elif kind == "none":
            expect(all(b.type == "text" for b in message.content), "%s: blocks %r" % (what, message.content))
        log("  %s: %s" % (what, message.stop_reason))


def check_streamed_tool(api, model):
    log("a streamed call: a tool_use block whose input_json_delta fragments make valid JSON")
    for attempt in range(3):
        what = "streamed any (%d)" % attempt
        # One call, so that it ends within max_tokens (parallel calls may run out of it).
        stream = api.messages.create(
            model=model, max_tokens=MAX_TOKENS, messages=QUESTION, extra_body=SAMPLED, tools=TOOLS,
            tool_choice={"type": "any", "disable_parallel_tool_use": True}, stream=True,
        )
        blocks, stop_reason = {}, None
        for event in stream:
            if event.type == "content_block_start":
                expect(event.index not in blocks, "%s: block %d started twice" % (what, event.index))
                blocks[event.index] = {"block": event.content_block, "partial": []}
            elif event.type == "content_block_delta":
                expect(event.index in blocks, "%s: a delta of block %d before its start" % (what, event.index))
                if event.delta.type == "input_json_delta":
                    blocks[event.index]["partial"].append(event.delta.partial_json)
            elif event.type == "message_delta":
                stop_reason = event.delta.stop_reason
        expect_eq(stop_reason, "tool_use", "%s: stop_reason" % what)
        calls = [b for b in blocks.values() if b["block"].type == "tool_use"]
        expect(calls, "%s: no tool_use block" % what)
        for call in calls:
            text = "".join(call["partial"])
            validate_json(text, SCHEMAS[call["block"].name], "%s: the fragments put together" % what)
            log("  %s: %s %s in %d fragments" % (what, call["block"].name, text, len(call["partial"])))

    with api.messages.stream(
        model=model, max_tokens=MAX_TOKENS, messages=QUESTION, extra_body=SAMPLED, tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as stream:
        final = stream.get_final_message()
    tool_uses(final, "messages.stream with a tool", names=["get_weather"])


def check_errors(api, model):
    log("refusals: the SDK's exception classes, Anthropic's error shape")

    def refused(exception, status, kind, **kw):
        args = dict(model=model, max_tokens=16, messages=QUESTION)
        args.update(kw)
        try:
            api.messages.create(**args)
        except exception as err:
            expect_eq(err.status_code, status, "%s: status" % kw)
            expect_eq(err.body["type"], "error", "%s: body type" % kw)
            expect_eq(err.body["error"]["type"], kind, "%s: error type" % kw)
            return err.body["error"]["message"]
        expect(False, "%s was not refused" % kw)

    message = refused(anthropic.BadRequestError, 400, "invalid_request_error", max_tokens=anthropic.omit)
    expect("max_tokens" in message, "missing max_tokens: %r" % message)
    message = refused(anthropic.BadRequestError, 400, "invalid_request_error", thinking={"type": "enabled", "budget_tokens": 1024})
    expect("thinking" in message, "thinking: %r" % message)
    refused(anthropic.NotFoundError, 404, "not_found_error", model="claude-no-such-model")
    log("  400, 400, 404")


def main():
    args = parser(__doc__).parse_args()
    api = anthropic.Anthropic(base_url=args.base, api_key="no-key", max_retries=0, timeout=120.0)
    check_plain(api, args.model)
    check_stream(api, args.model)
    check_tools(api, args.model)
    check_two_turns(api, args.model)
    check_streamed_tool(api, args.model)
    check_errors(api, args.model)


if __name__ == "__main__":
    run(main)
