"""LangChain against the server (started with `--enable-auto-tool-choice --tool-call-parser
hermes`): `ChatOpenAI(base_url=..., api_key=..., model=...)` with
`.bind_tools([...], tool_choice="required")` answers with an `AIMessage` whose `tool_calls`
have valid arguments, and `.with_structured_output(PydanticModel)` (its default method,
`method="json_schema"` and `method="function_calling"`) returns a valid Pydantic object.

The model is a tiny random Llama: the checks rely only on what the constraints guarantee,
and every schema bounds its output, so nothing may be cut off by `max_tokens`."""

import json
from typing import Literal

from langchain_core.messages import AIMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field

from e2e_common import expect, expect_eq, get, log, parser, run, validate_json

SEEDS = (21, 22, 23)
PROMPT = "What is the weather in Paris? Then describe a pet."

# Every model is closed (`extra="forbid"`, so `additionalProperties: false`): an open object
# lets a random model add keys of any length, which no max_tokens bounds.
CLOSED = ConfigDict(extra="forbid")


class GetWeather(BaseModel):
    """The current weather in a city."""

    model_config = CLOSED

    city: str = Field(min_length=1, max_length=12)
    unit: Literal["celsius", "fahrenheit"]


class GetTime(BaseModel):
    """The time in a time zone."""

    model_config = CLOSED

    zone: Literal["UTC", "CET", "PST"]


class Owner(BaseModel):
    model_config = CLOSED

    name: str = Field(min_length=1, max_length=8)
    age: int = Field(ge=18, le=99)


class Pet(BaseModel):
    """A pet and its owner."""

    model_config = CLOSED

    name: str = Field(min_length=1, max_length=10)
    species: Literal["cat", "dog", "fox"]
    legs: int = Field(ge=0, le=4)
    owner: Owner


TOOLS = [GetWeather, GetTime]
PARAMETERS = {t.__name__: convert_to_openai_tool(t)["function"]["parameters"] for t in TOOLS}


def llm(base, model, seed):
    return ChatOpenAI(
        base_url=base + "/v1",
        api_key="no-key",
        model=model,
        temperature=1.0,
        seed=seed,
        max_tokens=400,
        max_retries=0,
        timeout=120,
    )


def check_bind_tools(base, model):
    log("bind_tools(..., tool_choice='required')")
    ids = set()
    for seed in SEEDS:
        what = "bind_tools required (seed %d)" % seed
        message = llm(base, model, seed).bind_tools(TOOLS, tool_choice="required").invoke(PROMPT)
        expect(isinstance(message, AIMessage), "%s: got %r, not an AIMessage" % (what, message))
        expect_eq(message.invalid_tool_calls, [], "%s: invalid_tool_calls" % what)
        expect(message.tool_calls, "%s: no tool_calls (content %r)" % (what, message.content))
        for i, call in enumerate(message.tool_calls):
            where = "%s call %d" % (what, i)
            expect(call["name"] in PARAMETERS, "%s: the tool %r is none of %r" % (where, call["name"], list(PARAMETERS)))
            expect(call["id"] and call["id"] not in ids, "%s: id %r missing or given before" % (where, call["id"]))
            ids.add(call["id"])
            validate_json(json.dumps(call["args"]), PARAMETERS[call["name"]], where + ": args")
            model_class = next(t for t in TOOLS if t.__name__ == call["name"])
            model_class.model_validate(call["args"])
        log("  %s: %s" % (what, [(c["name"], c["args"]) for c in message.tool_calls]))


def check_structured(base, model):
    schema = Pet.model_json_schema()
    for method in (None, "json_schema", "function_calling"):
        log("with_structured_output(Pet%s)" % ("" if method is None else ", method=%r" % method))
        for seed in SEEDS:
            what = "with_structured_output method %s (seed %d)" % (method or "default", seed)
            chat = llm(base, model, seed)
            if method is None:
                structured = chat.with_structured_output(Pet, include_raw=True)
            else:
                structured = chat.with_structured_output(Pet, method=method, include_raw=True)
            result = structured.invoke(PROMPT)
            raw, parsed, error = result["raw"], result["parsed"], result["parsing_error"]
            expect(error is None, "%s: parsing error %r (raw %r)" % (what, error, raw))
            expect(isinstance(parsed, Pet), "%s: got %r, not a Pet (raw %r)" % (what, parsed, raw))
            validate_json(parsed.model_dump_json(), schema, what)
            finish = (raw.response_metadata or {}).get("finish_reason")
            expect(finish in ("stop", "tool_calls"), "%s: finish_reason %r (raw %r)" % (what, finish, raw))
            log("  %s: %r" % (what, parsed))


def main():
    args = parser(__doc__).parse_args()
    check_bind_tools(args.base, args.model)
    check_structured(args.base, args.model)
    expect_eq(get(args.base, "/health").status, 200, "GET /health after the checks")


if __name__ == "__main__":
    run(main)
