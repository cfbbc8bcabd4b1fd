"""Tool calling through the official client, against a server started with
`--enable-auto-tool-choice --tool-call-parser hermes`.

The model is a tiny random Llama, so what it says is gibberish: the checks rely only on what
`tool_choice` guarantees. `"required"` (20 requests): every answer ends with
`finish_reason == "tool_calls"` and carries `message.tool_calls` whose ids are unique, whose
`type` is `function`, whose names are the tools' and whose `function.arguments` parse as JSON
and validate against the tool's `parameters`. A named function: calls of that function
only. `parallel_tool_calls: false`: exactly one call. `"none"`: no calls. `"auto"`: either
content or valid calls. Streamed, a call's first delta carries its `id`, `type` and
`function.name`, the later ones fragments of `function.arguments`, which put together
validate. A second turn (the assistant's calls, then `tool` messages answering them by
`tool_call_id`) is accepted. An unknown named function and a tool without a name get 400s
naming the field. Every parameter schema bounds its arguments, so no call may be cut off by
`max_tokens`."""

import json

from e2e_common import (
    client,
    expect,
    expect_eq,
    expect_param_error,
    get,
    log,
    parser,
    post,
    run,
    validate_json,
)

MESSAGES = [{"role": "user", "content": "What is the weather in Paris, and what time is it there?"}]
MAX_TOKENS = 400

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 12},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def check_call(call, what, names=None, ids=None):
    """One tool call of a whole answer (an SDK object): its arguments as a dict."""
    names = names or list(PARAMETERS)
    expect_eq(call.type, "function", "%s: type" % what)
    expect(isinstance(call.id, str) and call.id, "%s: no id (%r)" % (what, call.id))
    if ids is not None:
        expect(call.id not in ids, "%s: the id %r was given before" % (what, call.id))
        ids.add(call.id)
    expect(call.function.name in names, "%s: the function %r is none of %r" % (what, call.function.name, names))
    args = validate_json(call.function.arguments, PARAMETERS[call.function.name], "%s: arguments" % what)
    expect(isinstance(args, dict), "%s: the arguments are not an object" % what)
    return args


def no_content(message, what):
    """A message that answers with calls says nothing else (null or blank content)."""
    expect(
        message.content is None or not message.content.strip(),
        "%s: content beside the calls: %r" % (what, message.content),
    )


def chat(api, model, seed, max_tokens=MAX_TOKENS, messages=MESSAGES, **kw):
    return api.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=1.0, seed=seed, **kw
    )


def check_required(api, model):
    # One call per answer (parallel_tool_calls false): each must end in exactly one valid
    # call. With parallel calls the grammar lets a model go on calling, which a random
    # model may do until max_tokens: then every call before the cut-off must be valid.
    log("tool_choice required: 20 single and 20 parallel requests, each ends in valid calls")
    ids, calls = set(), 0
    for parallel in (False, True):
        for seed in range(20):
            what = "required, parallel %s (seed %d)" % (parallel, seed)
            resp = chat(api, model, seed, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel)
            choice = resp.choices[0]
            message = choice.message
            expect(message.tool_calls, "%s: no tool_calls (content %r)" % (what, message.content))
            no_content(message, what)
            checked = message.tool_calls
            if parallel and choice.finish_reason == "length":
                checked = checked[:-1]
            else:
                expect_eq(choice.finish_reason, "tool_calls", "%s: finish_reason (message %r)" % (what, message))
            if not parallel:
                expect_eq(len(message.tool_calls), 1, "%s: calls" % what)
            for i, call in enumerate(checked):
                check_call(call, "%s call %d" % (what, i), ids=ids)
                calls += 1
            log("  %s: %s %s" % (what, choice.finish_reason, [(c.function.name, c.function.arguments) for c in message.tool_calls]))
    log("  %d calls in 40 answers, ids unique" % calls)


def check_named(api, model):
    log("a named function: calls of that function only")
    named = {"type": "function", "function": {"name": "get_time"}}
    for seed in range(5):
        what = "named get_time (seed %d)" % seed
        resp = chat(api, model, seed, tools=TOOLS, tool_choice=named)
        choice = resp.choices[0]
        # OpenAI ends a forced call with "stop", vLLM with "tool_calls"; never "length".
        expect(
            choice.finish_reason in ("stop", "tool_calls"),
            "%s: finish_reason %r (message %r)" % (what, choice.finish_reason, choice.message),
        )
        expect(choice.message.tool_calls, "%s: no tool_calls (content %r)" % (what, choice.message.content))
        for i, call in enumerate(choice.message.tool_calls):
            check_call(call, "%s call %d" % (what, i), names=["get_time"])
        log("  %s: %s" % (what, [c.function.arguments for c in choice.message.tool_calls]))


def check_not_parallel(api, model):
    log("parallel_tool_calls false: exactly one call")
    for seed in range(5):
        what = "required, parallel_tool_calls false (seed %d)" % seed
        resp = chat(api, model, seed, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
        choice = resp.choices[0]
        expect_eq(choice.finish_reason, "tool_calls", "%s: finish_reason" % what)
        expect_eq(len(choice.message.tool_calls or []), 1, "%s: number of calls" % what)
        check_call(choice.message.tool_calls[0], what)


def check_none_and_auto(api, model):
    log("tool_choice none: no calls")
    for seed in range(3):
        what = "none (seed %d)" % seed
        resp = chat(api, model, seed, max_tokens=24, tools=TOOLS, tool_choice="none")
        choice = resp.choices[0]
        expect(not choice.message.tool_calls, "%s: tool calls %r" % (what, choice.message.tool_calls))
        expect(isinstance(choice.message.content, str), "%s: content %r" % (what, choice.message.content))
        # Free text from a random model: it ends where it ends.
        expect(choice.finish_reason in ("stop", "length"), "%s: finish_reason %r" % (what, choice.finish_reason))

    log("tool_choice auto: content or valid calls")
    for seed in range(5):
        what = "auto (seed %d)" % seed
        resp = chat(api, model, seed, max_tokens=64, tools=TOOLS, tool_choice="auto")
        choice = resp.choices[0]
        if choice.message.tool_calls:
            expect_eq(choice.finish_reason, "tool_calls", "%s: finish_reason with calls" % what)
            for i, call in enumerate(choice.message.tool_calls):
                check_call(call, "%s call %d" % (what, i))
            log("  %s: %d call(s)" % (what, len(choice.message.tool_calls)))
        else:
            expect(isinstance(choice.message.content, str), "%s: neither calls nor content" % what)
            expect(choice.finish_reason in ("stop", "length"), "%s: finish_reason %r" % (what, choice.finish_reason))
            log("  %s: content %r" % (what, choice.message.content[:60]))


def check_streamed(api, model):
    log("a streamed required call: id, type and name first, then argument fragments")
    ids = set()
    for seed in range(3):
        what = "streamed required (seed %d)" % seed
        stream = chat(api, model, seed, tools=TOOLS, tool_choice="required", stream=True)
        calls, finishes, content = {}, [], []
        for chunk in stream:
            for choice in chunk.choices:
                if choice.finish_reason is not None:
                    finishes.append(choice.finish_reason)
                if choice.delta.content:
                    content.append(choice.delta.content)
                for delta in choice.delta.tool_calls or []:
                    expect(delta.index is not None, "%s: a tool-call delta without an index" % what)
                    fn = delta.function
                    if delta.index not in calls:
                        where = "%s call %d, first delta" % (what, delta.index)
                        expect(isinstance(delta.id, str) and delta.id, "%s: no id" % where)
                        expect_eq(delta.type, "function", "%s: type" % where)
                        expect(fn is not None and fn.name in PARAMETERS, "%s: function %r" % (where, fn))
                        expect(delta.id not in ids, "%s: the id %r was given before" % (where, delta.id))
                        ids.add(delta.id)
                        calls[delta.index] = {"name": fn.name, "args": [fn.arguments or ""], "deltas": 1}
                    else:
                        where = "%s call %d, a later delta" % (what, delta.index)
                        expect(not delta.id, "%s: an id again (%r)" % (where, delta.id))
                        expect(fn is not None and not fn.name, "%s: a name again (%r)" % (where, fn))
                        expect(fn.arguments is not None, "%s: no arguments fragment" % where)
                        calls[delta.index]["args"].append(fn.arguments)
                        calls[delta.index]["deltas"] += 1
        expect_eq(finishes, ["tool_calls"], "%s: finish_reasons" % what)
        expect(calls, "%s: no tool-call deltas (content %r)" % (what, "".join(content)))
        expect(not "".join(content).strip(), "%s: content beside the calls: %r" % (what, "".join(content)))
        expect_eq(sorted(calls), list(range(len(calls))), "%s: call indexes" % what)
        for index, call in sorted(calls.items()):
            text = "".join(call["args"])
            validate_json(text, PARAMETERS[call["name"]], "%s call %d: arguments put together" % (what, index))
            log("  %s call %d: %s %s in %d deltas" % (what, index, call["name"], text, call["deltas"]))


def check_two_turns(api, model):
    log("a second turn: the assistant's calls, then tool messages answering them")
    first = chat(api, model, 1, tools=TOOLS, tool_choice="required").choices[0].message
    expect(first.tool_calls, "the first turn made no calls")
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in first.tool_calls
        ],
    }
    answers = [
        {"role": "tool", "tool_call_id": c.id, "content": json.dumps({"result": "sunny, 21 degrees"})}
        for c in first.tool_calls
    ]
    messages = MESSAGES + [assistant] + answers
    for choice_kind in ("auto", "none", "required"):
        what = "second turn, tool_choice %s" % choice_kind
        max_tokens = MAX_TOKENS if choice_kind == "required" else 24
        resp = chat(api, model, 2, max_tokens=max_tokens, messages=messages, tools=TOOLS, tool_choice=choice_kind)
        choice = resp.choices[0]
        if choice_kind == "required":
            expect_eq(choice.finish_reason, "tool_calls", "%s: finish_reason" % what)
            expect(choice.message.tool_calls, "%s: no tool_calls" % what)
            for i, call in enumerate(choice.message.tool_calls):
                check_call(call, "%s call %d" % (what, i))
        elif choice.message.tool_calls:
            expect_eq(choice_kind, "auto", "%s: tool calls %r" % (what, choice.message.tool_calls))
            expect_eq(choice.finish_reason, "tool_calls", "%s: finish_reason with calls" % what)
            for i, call in enumerate(choice.message.tool_calls):
                check_call(call, "%s call %d" % (what, i))
        else:
            expect(choice.finish_reason in ("stop", "length"), "%s: finish_reason %r" % (what, choice.finish_reason))
        log("  %s: %s" % (what, choice.finish_reason))


def check_errors(base, model):
    log("bad tools: 400 naming the field")

    def body(**kw):
        return dict({"model": model, "messages": MESSAGES, "max_tokens": 16}, **kw)

    expect_param_error(
        post(base, "/v1/chat/completions", body(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "no_such_tool"}})),
        "tool_choice",
        "a named function that is not among the tools",
    )
    nameless = {"type": "function", "function": {"description": "no name", "parameters": {"type": "object"}}}
    expect_param_error(
        post(base, "/v1/chat/completions", body(tools=[nameless], tool_choice="required")),
        "tools[0]",
        "a tool without a name",
    )
    expect_eq(get(base, "/health").status, 200, "GET /health after the refusals")


def main():
    args = parser(__doc__).parse_args()
    base, model = args.base, args.model
    api = client(base)
    check_required(api, model)
    check_named(api, model)
    check_not_parallel(api, model)
    check_none_and_auto(api, model)
    check_streamed(api, model)
    check_two_turns(api, model)
    check_errors(base, model)


if __name__ == "__main__":
    run(main)
