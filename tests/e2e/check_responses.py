"""The Responses API (`POST /v1/responses`) through the official client and the OpenAI
Agents SDK, against a server started with `--enable-auto-tool-choice --tool-call-parser
hermes`.

The model is a tiny random Llama, so the checks rely only on what the request guarantees.
Every whole response and every streamed event is validated against the `openai` package's
own typed models (pydantic, strictly). String input with `instructions`: one completed or
incomplete message. A function tool with `tool_choice: "required"`: `function_call` items
whose arguments validate against the tool's parameters; a named function: calls of it only.
A second turn sends the calls back with `function_call_output` items. `text.format`
json_schema: the text validates. Streamed: the text deltas put together are the completed
response's text, the `function_call_arguments` deltas put together are its calls' valid
arguments, the sequence numbers count up from 0. `store: true`, `previous_response_id` and a
built-in tool get 400s naming the field. The Agents SDK (`OpenAIResponsesModel` over
`AsyncOpenAI` pointed at the server, tracing off) runs an agent whose first turn must call
its `@function_tool`: once stopping at the tool's result, once going on to a second turn
that sends the call's output back."""

import asyncio
import json
from typing import Literal

import openai
import pydantic
from openai.types.responses import Response, ResponseStreamEvent

import check_tools
from check_tools import PARAMETERS
from e2e_common import (
    CheckFailed,
    client,
    expect,
    expect_eq,
    expect_param_error,
    log,
    parser,
    post,
    run,
    validate_json,
)

# The chat tool checks' function tools, in the Responses API's flat shape.
TOOLS = [dict(tool["function"], type="function", strict=True) for tool in check_tools.TOOLS]
QUESTION = check_tools.MESSAGES[0]["content"]
MAX_OUTPUT_TOKENS = 300
EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)


class Report(pydantic.BaseModel):
    """The agent's final answer."""

    city: Literal["Paris", "Oslo", "Lima"]
    sunny: bool


def strict(resp, what):
    """The response (an SDK object) validated again, strictly, from its JSON."""
    try:
        return Response.model_validate(resp.model_dump(mode="json", by_alias=True, exclude_unset=True))
    except pydantic.ValidationError as err:
        raise CheckFailed("%s: the response does not fit openai's Response model: %s" % (what, err))


def texts(resp):
    return "".join(c.text for item in resp.output if item.type == "message" for c in item.content)


def calls_of(resp):
    return [item for item in resp.output if item.type == "function_call"]


def check_calls(resp, what, names=None):
    """The response's calls, each with ids and arguments valid for its function."""
    names = names or list(PARAMETERS)
    calls = calls_of(resp)
    expect(calls, "%s: no function_call items (output %r)" % (what, resp.output))
    expect(not texts(resp).strip(), "%s: text beside the calls: %r" % (what, texts(resp)))
    for i, call in enumerate(calls):
        where = "%s call %d" % (what, i)
        expect(call.call_id.startswith("call_"), "%s: call_id %r" % (where, call.call_id))
        expect(call.id.startswith("fc_"), "%s: id %r" % (where, call.id))
        expect_eq(call.status, "completed", "%s: status" % where)
        expect(call.name in names, "%s: the function %r is none of %r" % (where, call.name, names))
        validate_json(call.arguments, PARAMETERS[call.name], "%s: arguments" % where)
    expect_eq(len({c.call_id for c in calls}), len(calls), "%s: unique call ids" % what)
    return calls


def create(api, model, **kw):
    kw.setdefault("max_output_tokens", MAX_OUTPUT_TOKENS)
    return api.responses.create(model=model, temperature=1.0, **kw)


def check_text(api, model):
    log("string input with instructions: one message")
    resp = create(api, model, input="Say hello.", instructions="Be brief.", max_output_tokens=16, metadata={"k": "v"})
    strict(resp, "text")
    expect(resp.id.startswith("resp_"), "id %r" % resp.id)
    expect(resp.status in ("completed", "incomplete"), "status %r" % resp.status)
    if resp.status == "incomplete":
        expect_eq(resp.incomplete_details.reason, "max_output_tokens", "incomplete_details")
    expect_eq([item.type for item in resp.output], ["message"], "output item types")
    expect_eq(resp.output[0].role, "assistant", "role")
    expect_eq(resp.output_text, texts(resp), "output_text")
    expect_eq(resp.instructions, "Be brief.", "instructions echoed")
    expect_eq(resp.metadata, {"k": "v"}, "metadata echoed")
    usage = resp.usage
    expect(usage.input_tokens > 0 and 0 < usage.output_tokens <= 16, "usage %r" % usage)
    expect_eq(usage.total_tokens, usage.input_tokens + usage.output_tokens, "total_tokens")
    log("  %s: %r, usage %d + %d" % (resp.status, resp.output_text[:60], usage.input_tokens, usage.output_tokens))


def check_required(api, model):
    log("tool_choice required and a named function: valid function_call items")
    for seed in range(8):
        what = "required (run %d)" % seed
        resp = create(api, model, input=QUESTION, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
        strict(resp, what)
        expect_eq(resp.status, "completed", "%s: status" % what)
        calls = check_calls(resp, what)
        expect_eq(len(calls), 1, "%s: calls without parallel calls" % what)
        log("  %s: %s %s" % (what, calls[0].name, calls[0].arguments))
    for seed in range(3):
        what = "named get_time (run %d)" % seed
        resp = create(api, model, input=QUESTION, tools=TOOLS, tool_choice={"type": "function", "name": "get_time"})
        strict(resp, what)
        calls = check_calls(resp, what, names=["get_time"])
        expect_eq(resp.tool_choice.name, "get_time", "%s: tool_choice echoed" % what)
        log("  %s: %s" % (what, [c.arguments for c in calls]))


def check_two_turns(api, model):
    log("a second turn: the calls and their function_call_output items sent back")
    # One call a turn, so that each ends within max_output_tokens (a random model making
    # parallel calls may run out of it, leaving its last call incomplete).
    first = create(api, model, input=QUESTION, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    calls = check_calls(first, "first turn")
    history = [{"role": "user", "content": QUESTION}] + [item.model_dump(exclude_none=True) for item in first.output]
    history += [
        {"type": "function_call_output", "call_id": c.call_id, "output": json.dumps({"result": "sunny, 21 degrees"})}
        for c in calls
    ]
    for choice in ("none", "required"):
        what = "second turn, tool_choice %s" % choice
        resp = create(api, model, input=history, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False,
                      max_output_tokens=24 if choice == "none" else MAX_OUTPUT_TOKENS)
        strict(resp, what)
        if choice == "none":
            expect(not calls_of(resp), "%s: calls %r" % (what, calls_of(resp)))
            expect_eq([item.type for item in resp.output], ["message"], "%s: output" % what)
        else:
            check_calls(resp, what)
        log("  %s: %s, %d input tokens" % (what, resp.status, resp.usage.input_tokens))
    expect(resp.usage.input_tokens > first.usage.input_tokens, "the second turn's prompt holds the first's")


def check_json_schema(api, model):
    log("text.format json_schema: the text validates")
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 20}, "score": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["answer", "score"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "verdict", "schema": schema, "strict": True}
    for seed in range(3):
        what = "json_schema (run %d)" % seed
        resp = create(api, model, input="Judge this.", text={"format": fmt})
        strict(resp, what)
        expect_eq(resp.status, "completed", "%s: status" % what)
        expect_eq(resp.text.format.type, "json_schema", "%s: text.format echoed" % what)
        validate_json(resp.output_text, schema, what)
        log("  %s: %s" % (what, resp.output_text))


def read_stream(stream, what):
    """Every event of a stream, each validated against openai's event models."""
    events = []
    for event in stream:
        try:
            EVENTS.validate_python(event.model_dump(mode="json", by_alias=True, exclude_unset=True))
        except pydantic.ValidationError as err:
            raise CheckFailed("%s: %s does not fit openai's event models: %s" % (what, event.type, err))
        expect_eq(event.sequence_number, len(events), "%s: sequence_number of %s" % (what, event.type))
        events.append(event)
    types = [e.type for e in events]
    expect_eq(types[:2], ["response.created", "response.in_progress"], "%s: first events" % what)
    expect(types[-1] in ("response.completed", "response.incomplete"), "%s: last event %r" % (what, types[-1]))
    return events, events[-1].response


def check_streamed(api, model):
    log("streamed text: deltas put together are the completed text")
    for seed in range(2):
        what = "streamed text (run %d)" % seed
        stream = create(api, model, input="Tell me a story.", max_output_tokens=40, stream=True)
        events, final = read_stream(stream, what)
        strict(final, what)
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        expect_eq(deltas, final.output_text, "%s: deltas vs completed text" % what)
        done = [e.text for e in events if e.type == "response.output_text.done"]
        expect_eq(done, [final.output_text], "%s: output_text.done" % what)
        log("  %s: %d events, %s, %r" % (what, len(events), final.status, deltas[:50]))

    log("a streamed required call: argument deltas put together are valid JSON")
    # One call a response, so that each ends within max_output_tokens (the random model may
    # otherwise make calls until it runs out: that case is the last one, below).
    for seed in range(3):
        what = "streamed required (run %d)" % seed
        stream = create(api, model, input=QUESTION, tools=TOOLS, tool_choice="required", stream=True,
                        parallel_tool_calls=False)
        events, final = read_stream(stream, what)
        strict(final, what)
        expect_eq(final.status, "completed", "%s: status" % what)
        calls = check_calls(final, what)
        expect_eq(len(calls), 1, "%s: calls without parallel calls" % what)
        check_call_deltas(events, calls, what)
    # Parallel calls: every completed call's deltas are valid; a response that ran out of
    # tokens says so.
    what = "streamed parallel required"
    stream = create(api, model, input=QUESTION, tools=TOOLS, tool_choice="required", stream=True)
    events, final = read_stream(stream, what)
    strict(final, what)
    if final.status == "incomplete":
        expect_eq(final.incomplete_details.reason, "max_output_tokens", "%s: why incomplete" % what)
    else:
        expect_eq(final.status, "completed", "%s: status" % what)
    done = [c for c in calls_of(final) if c.status == "completed"]
    expect(done or final.status == "incomplete", "%s: no completed call" % what)
    for call in done:
        validate_json(call.arguments, PARAMETERS[call.name], "%s: %s arguments" % (what, call.name))
    check_call_deltas(events, done, what)


def check_call_deltas(events, calls, what):
    """Each of `calls` was streamed once, with its name, and its argument deltas put
    together are its arguments, valid for its function."""
    for call in calls:
        pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta" and e.item_id == call.id]
        expect(pieces, "%s: no argument deltas for %s" % (what, call.id))
        validate_json("".join(pieces), PARAMETERS[call.name], "%s: %s arguments put together" % (what, call.name))
        expect_eq("".join(pieces), call.arguments, "%s: deltas vs completed arguments" % what)
        added = [e.item for e in events if e.type == "response.output_item.added" and e.item.id == call.id]
        expect_eq([a.name for a in added], [call.name], "%s: the call added once, with its name" % what)
        log("  %s: %s in %d deltas" % (what, "".join(pieces), len(pieces)))


def check_refusals(base, api, model):
    log("stateful fields and built-in tools: 400 naming the field")
    body = {"model": model, "input": "x", "max_output_tokens": 8}
    for field, value in (("store", True), ("previous_response_id", "resp_123")):
        expect_param_error(post(base, "/v1/responses", dict(body, **{field: value})), field, "%s" % field)
    expect_param_error(post(base, "/v1/responses", dict(body, tools=[{"type": "web_search"}])), "tools", "a built-in tool")
    try:
        api.responses.create(model=model, input="x", store=True)
        raise CheckFailed("store=True was accepted")
    except openai.BadRequestError as err:
        expect_eq(err.param, "store", "the SDK's BadRequestError.param")
    resp = api.responses.create(model=model, input="x", store=False, max_output_tokens=4)
    expect(resp.status in ("completed", "incomplete"), "store=False is served: %r" % resp.status)


def check_agents(base, model):
    from agents import Agent, ModelSettings, OpenAIResponsesModel, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    asked = []

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo", "Lima"]) -> str:
        """The current weather in a city."""
        asked.append(city)
        return "sunny in %s" % city

    sdk = openai.AsyncOpenAI(base_url=base + "/v1", api_key="no-key", max_retries=0, timeout=120.0)
    responses_model = OpenAIResponsesModel(model=model, openai_client=sdk)

    def agent(**kw):
        return Agent(
            name="weather",
            instructions="Answer with the weather tool.",
            tools=[get_weather],
            model=responses_model,
            model_settings=ModelSettings(
                tool_choice="required", parallel_tool_calls=False, max_tokens=MAX_OUTPUT_TOKENS, temperature=0.0
            ),
            **kw,
        )

    # One event loop for both runs: the client's connections belong to the loop that made them.
    asyncio.run(run_agents(agent, asked))


async def run_agents(agent, asked):
    from agents import Runner

    log("the Agents SDK: a turn that must call the tool, stopping at its result")
    result = await Runner.run(agent(tool_use_behavior="stop_on_first_tool"), QUESTION, max_turns=2)
    expect_eq(len(asked), 1, "tool calls")
    expect_eq(result.final_output, "sunny in %s" % asked[0], "final_output")
    expect_eq(len(result.raw_responses), 1, "model calls")
    log("  called get_weather(%r); final output %r" % (asked[0], result.final_output))

    # A random model's free text runs to the output limit, which the SDK takes as a failed
    # turn: the final answer is asked for as JSON (the SDK's `output_type`), which ends.
    log("the Agents SDK: the tool's output sent back for a second turn answering as JSON")
    asked.clear()
    result = await Runner.run(agent(output_type=Report), QUESTION, max_turns=3)
    kinds = [item.type for item in result.new_items]
    expect_eq(kinds[:2], ["tool_call_item", "tool_call_output_item"], "the run's first items")
    expect_eq(kinds[-1], "message_output_item", "the run's last item")
    expect_eq(len(asked), 1, "tool calls")
    expect_eq(len(result.raw_responses), 2, "model calls")
    expect(isinstance(result.final_output, Report), "final_output %r" % (result.final_output,))
    log("  items %s; final output %r" % (kinds, result.final_output))


def main():
    args = parser(__doc__).parse_args()
    base, model = args.base, args.model
    api = client(base)
    check_text(api, model)
    check_required(api, model)
    check_two_turns(api, model)
    check_json_schema(api, model)
    check_streamed(api, model)
    check_refusals(base, api, model)
    check_agents(base, model)


if __name__ == "__main__":
    run(main)
