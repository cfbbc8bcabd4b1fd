"""Structured output: every way a client asks for constrained output, on /v1/completions and
/v1/chat/completions, gets output that keeps the constraint.

The spellings: OpenAI's `response_format` (`json_schema` through the SDK's
`chat.completions.parse` with a Pydantic model, and `json_object`), vLLM's
`structured_outputs` (`json`, `regex`, `choice`, `grammar` in Lark) and its older `guided_json`,
`guided_regex`, `guided_choice` and `guided_grammar`, and llama.cpp's `json_schema` and
`grammar` (GBNF). The model is a tiny random Llama, so its outputs are gibberish: the checks
rely only on what the constraints guarantee. Every schema here bounds its output (enums,
`const`, bounded integers, `maxLength`, `maxItems`), so every request must finish with
`stop` and its output must validate (`jsonschema`, `re.fullmatch`, membership); `length` is
accepted only where a check says so: a `max_tokens` too small for the schema, `json_object`
(whose strings and objects no schema bounds), and a JSON number's fraction digits.

Requests are sampled (temperature 1 with fixed seeds), which explores more of each grammar
than greedy decoding would, and reproducibly. Also: bad constraints get a 400 whose
`error.param` names the field, and the cases where llama.cpp's server was found to let
outputs break their schemas (an unanchored `pattern`, `minProperties`, numeric
`minimum`/`exclusiveMinimum`, `patternProperties` with `oneOf`) are each validated."""

import enum
import json
import re
from typing import Annotated, List, Literal

import openai
from pydantic import BaseModel, ConfigDict, Field

from e2e_common import (
    CheckFailed,
    client,
    expect,
    expect_eq,
    expect_fullmatch,
    expect_param_error,
    get,
    log,
    parse_json,
    parser,
    post,
    run,
    validate_json,
)

PROMPT = "the quick brown fox jumps over"
MESSAGES = [{"role": "user", "content": "Describe the lazy dog. Answer as asked."}]
SEEDS = (11, 12, 13)
MAX_TOKENS = 400
ENDPOINTS = ("completions", "chat")

# ---------------------------------------------------------------------------------------
# Schemas, patterns and grammars (all of them bound their output)
# ---------------------------------------------------------------------------------------

# A plain JSON schema with every kind of bounded field.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 10},
        "kind": {"type": "string", "enum": ["cat", "dog", "fox"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
        "version": {"const": 2},
    },
    "required": ["name", "kind", "age", "ok", "tags", "version"],
    "additionalProperties": False,
}

REGEX = r"(yes|no|maybe)-[0-9]{1,3}"
EMAIL_REGEX = r"[a-z]{2,6}@[a-z]{2,5}\.(com|org)"
CHOICES = ["red", "green", "a|b (c)"]

# vLLM's grammars are Lark (llguidance's dialect); llama.cpp's are GBNF.
ARITHMETIC_RE = r"[1-9][0-9]?([-+*][1-9][0-9]?){0,2}"
LARK_ARITHMETIC = """
start: NUM | NUM OP NUM | NUM OP NUM OP NUM
NUM: /[1-9][0-9]?/
OP: "+" | "-" | "*"
"""
GBNF_YES_NO = 'root ::= "yes" | "no"'
GBNF_ARITHMETIC = """
root ::= expr
expr ::= num | num op num | num op num op num
num  ::= [1-9] [0-9]?
op   ::= "+" | "-" | "*"
"""


# The SDK's Pydantic route: a nested model, an enum, a Literal, a bounded int and a bounded
# list of bounded strings.
class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str = Field(min_length=1, max_length=8)
    level: int = Field(ge=1, le=5)


class Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=12)
    color: Color
    mood: Literal["calm", "busy"]
    count: int = Field(ge=0, le=999)
    tags: List[Annotated[str, Field(max_length=6)]] = Field(max_length=3)
    inner: Inner


# ---------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------


class Server:
    def __init__(self, base, model):
        self.base, self.model, self.api = base, model, client(base)

    def generate(self, endpoint, fields, seed, max_tokens=MAX_TOKENS, **kw):
        """One sampled request with the extra body `fields`: (text, finish_reason, usage)."""
        common = dict(model=self.model, max_tokens=max_tokens, temperature=1.0, seed=seed, extra_body=fields)
        common.update(kw)
        if endpoint == "chat":
            resp = self.api.chat.completions.create(messages=MESSAGES, **common)
            choice = resp.choices[0]
            return choice.message.content, choice.finish_reason, resp.usage
        resp = self.api.completions.create(prompt=PROMPT, **common)
        choice = resp.choices[0]
        return choice.text, choice.finish_reason, resp.usage

    def raw(self, endpoint, fields, max_tokens=16):
        """The same request over raw HTTP (for the refused ones): the Response."""
        body = {"model": self.model, "max_tokens": max_tokens}
        if endpoint == "chat":
            body["messages"] = MESSAGES
        else:
            body["prompt"] = PROMPT
        body.update(fields)
        return post(self.base, "/v1/chat/completions" if endpoint == "chat" else "/v1/completions", body)


def finished(text, finish, usage, what, max_tokens=MAX_TOKENS):
    """The output of a request that must end by its constraint: finish_reason `stop`."""
    expect(
        finish == "stop",
        "%s: finish_reason %r, expected 'stop' (the constraint bounds the output; "
        "max_tokens %d): %r" % (what, finish, max_tokens, text),
    )
    expect(usage is not None and usage.completion_tokens <= max_tokens, "%s: usage %r" % (what, usage))
    return text


def check_each(server, name, fields, validate, endpoints=ENDPOINTS, seeds=SEEDS):
    """Sends `fields` on each endpoint with each seed; every output must finish and pass
    `validate(text, what)`."""
    for endpoint in endpoints:
        for seed in seeds:
            what = "%s on %s (seed %d)" % (name, endpoint, seed)
            text, finish, usage = server.generate(endpoint, fields, seed)
            validate(finished(text, finish, usage, what), what)
            log("  %s: %r" % (what, text))


def schema_check(schema):
    return lambda text, what: validate_json(text, schema, what)


def regex_check(pattern):
    return lambda text, what: expect_fullmatch(pattern, text, what)


def choice_check(choices):
    return lambda text, what: expect(text in choices, "%s: %r is none of %r" % (what, text, choices))


# ---------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------


def check_openai_parse(server):
    log("OpenAI response_format json_schema through the SDK's parse(), with a Pydantic model")
    schema = Reply.model_json_schema()
    for seed in SEEDS:
        what = "parse(Reply) (seed %d)" % seed
        completion = server.api.chat.completions.parse(
            model=server.model,
            messages=MESSAGES,
            response_format=Reply,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed,
        )
        choice = completion.choices[0]
        finished(choice.message.content, choice.finish_reason, completion.usage, what)
        validate_json(choice.message.content, schema, what)
        parsed = choice.message.parsed
        expect(isinstance(parsed, Reply), "%s: message.parsed is %r, not a Reply" % (what, parsed))
        expect_eq(parsed, Reply.model_validate_json(choice.message.content), "%s: parsed vs content" % what)
        log("  %s: %r" % (what, choice.message.content))

    log("OpenAI response_format json_schema as a dict, on both endpoints")
    fields = {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "animal", "schema": SCHEMA, "strict": True},
        }
    }
    check_each(server, "response_format json_schema", fields, schema_check(SCHEMA))


def check_json_object(server):
    log("OpenAI response_format json_object (no schema bounds it: `length` accepted)")
    fields = {"response_format": {"type": "json_object"}}
    stopped = 0
    for endpoint in ENDPOINTS:
        for seed in SEEDS + (14, 15, 16):
            what = "json_object on %s (seed %d)" % (endpoint, seed)
            text, finish, usage = server.generate(endpoint, fields, seed, max_tokens=200)
            expect(finish in ("stop", "length"), "%s: finish_reason %r" % (what, finish))
            expect(isinstance(text, str) and text.startswith("{"), "%s: does not start an object: %r" % (what, text))
            if finish == "stop":
                value = parse_json(text, what)
                expect(isinstance(value, dict), "%s: not a JSON object: %r" % (what, text))
                stopped += 1
            log("  %s: %s %r" % (what, finish, text[:120]))
    log("  %d json_object outputs finished" % stopped)


def check_streamed(server):
    log("a streamed json_schema: the text put together validates")
    for seed in SEEDS:
        what = "streamed chat json_schema (seed %d)" % seed
        stream = server.api.chat.completions.create(
            model=server.model,
            messages=MESSAGES,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed,
            stream=True,
            response_format={"type": "json_schema", "json_schema": {"name": "animal", "schema": SCHEMA}},
        )
        parts, finishes, chunks = [], [], 0
        for chunk in stream:
            for choice in chunk.choices:
                chunks += 1
                if choice.delta.content:
                    parts.append(choice.delta.content)
                if choice.finish_reason is not None:
                    finishes.append(choice.finish_reason)
        text = "".join(parts)
        expect_eq(finishes, ["stop"], "%s: finish_reasons (text %r)" % (what, text))
        expect(chunks >= 2, "%s: came in %d chunk(s)" % (what, chunks))
        validate_json(text, SCHEMA, what)
        log("  %s: %r" % (what, text))

        what = "streamed completion structured_outputs.json (seed %d)" % seed
        stream = server.api.completions.create(
            model=server.model,
            prompt=PROMPT,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed,
            stream=True,
            extra_body={"structured_outputs": {"json": SCHEMA}},
        )
        parts, finishes = [], []
        for chunk in stream:
            for choice in chunk.choices:
                parts.append(choice.text)
                if choice.finish_reason is not None:
                    finishes.append(choice.finish_reason)
        text = "".join(parts)
        expect_eq(finishes, ["stop"], "%s: finish_reasons (text %r)" % (what, text))
        validate_json(text, SCHEMA, what)
        log("  %s: %r" % (what, text))


def check_vllm(server):
    log("vLLM structured_outputs: json, regex, choice, grammar (Lark)")
    check_each(server, "structured_outputs.json", {"structured_outputs": {"json": SCHEMA}}, schema_check(SCHEMA))
    check_each(server, "structured_outputs.regex", {"structured_outputs": {"regex": REGEX}}, regex_check(REGEX))
    check_each(server, "structured_outputs.choice", {"structured_outputs": {"choice": CHOICES}}, choice_check(CHOICES))
    check_each(
        server,
        "structured_outputs.grammar",
        {"structured_outputs": {"grammar": LARK_ARITHMETIC}},
        regex_check(ARITHMETIC_RE),
    )

    log("vLLM's older guided_json, guided_regex, guided_choice, guided_grammar")
    check_each(server, "guided_json", {"guided_json": SCHEMA}, schema_check(SCHEMA))
    check_each(server, "guided_regex", {"guided_regex": EMAIL_REGEX}, regex_check(EMAIL_REGEX))
    check_each(server, "guided_choice", {"guided_choice": CHOICES}, choice_check(CHOICES))
    check_each(server, "guided_grammar", {"guided_grammar": LARK_ARITHMETIC}, regex_check(ARITHMETIC_RE))


def check_llamacpp(server):
    log("llama.cpp json_schema and grammar (GBNF)")
    check_each(server, "json_schema", {"json_schema": SCHEMA}, schema_check(SCHEMA))
    check_each(server, "grammar yes/no", {"grammar": GBNF_YES_NO}, choice_check(["yes", "no"]))
    check_each(server, "grammar arithmetic", {"grammar": GBNF_ARITHMETIC}, regex_check(ARITHMETIC_RE))


def check_length(server):
    log("max_tokens too small for the schema: finish_reason `length`, the text so far returned")
    schema = {
        "type": "object",
        "properties": {"story": {"type": "string", "minLength": 60, "maxLength": 80}},
        "required": ["story"],
        "additionalProperties": False,
    }
    for name, fields in (
        ("structured_outputs.json", {"structured_outputs": {"json": schema}}),
        ("guided_json", {"guided_json": schema}),
        ("json_schema", {"json_schema": schema}),
        ("response_format", {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}),
    ):
        for endpoint in ENDPOINTS:
            what = "%s on %s, max_tokens 6" % (name, endpoint)
            text, finish, usage = server.generate(endpoint, fields, SEEDS[0], max_tokens=6)
            expect_eq(finish, "length", "%s: finish_reason (text %r)" % (what, text))
            expect_eq(usage.completion_tokens, 6, "%s: usage.completion_tokens" % what)
            expect(isinstance(text, str) and text.startswith("{"), "%s: the text so far %r" % (what, text))
            try:
                json.loads(text)
            except ValueError:
                pass
            else:
                raise CheckFailed("%s: %r is already whole JSON" % (what, text))
            log("  %s: %r" % (what, text))
    # The SDK's parse() turns a cut-off answer into its own error.
    try:
        server.api.chat.completions.parse(
            model=server.model, messages=MESSAGES, response_format=Reply, max_tokens=6, temperature=1.0, seed=1
        )
    except openai.LengthFinishReasonError:
        log("  parse() with max_tokens 6: LengthFinishReasonError")
    else:
        raise CheckFailed("parse() with max_tokens 6 did not raise LengthFinishReasonError")


def check_bad_input(server):
    log("bad constraints: 400 naming the field")
    bad_schema = {"type": "no-such-type"}
    cases = [
        ("an invalid schema in response_format", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": bad_schema}}}, ["response_format"]),
        ("an invalid schema in structured_outputs.json", {"structured_outputs": {"json": bad_schema}}, ["structured_outputs"]),
        ("an invalid schema in guided_json", {"guided_json": bad_schema}, ["guided_json"]),
        ("an invalid schema in json_schema", {"json_schema": bad_schema}, ["json_schema"]),
        ("an invalid regex in guided_regex", {"guided_regex": "(unclosed"}, ["guided_regex"]),
        ("an invalid regex in structured_outputs.regex", {"structured_outputs": {"regex": "[z-a]"}}, ["structured_outputs"]),
        ("an invalid GBNF grammar", {"grammar": 'root ::= ("yes" | "no"'}, ["grammar"]),
        ("a GBNF grammar with an undefined rule", {"grammar": "root ::= answer"}, ["grammar"]),
        ("an invalid Lark grammar in guided_grammar", {"guided_grammar": "start: ("}, ["guided_grammar"]),
        ("two constraints: guided_json and guided_regex", {"guided_json": SCHEMA, "guided_regex": REGEX}, ["guided_json", "guided_regex"]),
        (
            "two constraints: response_format and guided_choice",
            {"response_format": {"type": "json_object"}, "guided_choice": CHOICES},
            ["response_format", "guided_choice"],
        ),
        ("two constraints: json_schema and grammar", {"json_schema": SCHEMA, "grammar": GBNF_YES_NO}, ["json_schema", "grammar"]),
        (
            "two constraints in structured_outputs",
            {"structured_outputs": {"json": SCHEMA, "regex": REGEX}},
            ["structured_outputs"],
        ),
    ]
    for endpoint in ENDPOINTS:
        for what, fields, params in cases:
            expect_param_error(server.raw(endpoint, fields), params, "%s on %s" % (what, endpoint))
    expect_eq(get(server.base, "/health").status, 200, "GET /health after the refusals")


def check_llamacpp_breakers(server):
    log("schemas llama.cpp's server let outputs break")
    # An unanchored pattern: with maxLength 3 the one way to contain a match of
    # [A-Z][0-9]{2} is to be one, so the whole string must match it.
    pattern = {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "[A-Z][0-9]{2}", "maxLength": 3}},
        "required": ["code"],
        "additionalProperties": False,
    }

    def pattern_check(text, what):
        value = validate_json(text, pattern, what)
        expect_fullmatch(r"[A-Z][0-9]{2}", value["code"], what + ": code")

    # minProperties over optional properties (at least one of them), and over
    # patternProperties alone (between 2 and 3 keys).
    min_optional = {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 9},
            "b": {"enum": ["x", "y"]},
            "c": {"type": "boolean"},
        },
        "additionalProperties": False,
        "minProperties": 1,
    }
    min_pattern = {
        "type": "object",
        "patternProperties": {"^k[0-9]$": {"type": "integer", "minimum": 0, "maximum": 9}},
        "additionalProperties": False,
        "minProperties": 2,
        "maxProperties": 3,
    }
    # Numeric bounds: minimum and exclusiveMinimum on integers and on a number (whose
    # fraction digits no schema bounds: a `length` finish is accepted there alone).
    integers = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 42, "maximum": 999},
            "m": {"type": "integer", "exclusiveMinimum": 7, "maximum": 99},
            "neg": {"type": "integer", "minimum": -5, "maximum": -1},
        },
        "required": ["n", "m", "neg"],
        "additionalProperties": False,
    }
    number = {
        "type": "object",
        "properties": {"x": {"type": "number", "exclusiveMinimum": 0.5, "maximum": 2}},
        "required": ["x"],
        "additionalProperties": False,
    }
    # patternProperties whose values are oneOf two disjoint schemas.
    one_of = {
        "type": "object",
        "patternProperties": {
            "^p_[a-z]{1,3}$": {
                "oneOf": [
                    {"type": "integer", "minimum": 0, "maximum": 99},
                    {"type": "string", "enum": ["on", "off"]},
                ]
            }
        },
        "additionalProperties": False,
        "minProperties": 1,
        "maxProperties": 3,
    }

    # minProperties counted over pattern keys: the grammar cannot keep those keys distinct
    # (a repeated key meets the count in the text and breaks it once parsed), so the
    # schema must be refused with its field named, never served unenforced.
    for endpoint in ENDPOINTS:
        what = "json_schema: minProperties over patternProperties on %s" % endpoint
        err = expect_param_error(server.raw(endpoint, {"json_schema": min_pattern}), ["json_schema"], what)
        expect("minProperties" in err["message"], "%s: the message says why: %r" % (what, err["message"]))
        log("  %s: refused" % what)

    for name, schema, validate in (
        ("unanchored pattern", pattern, pattern_check),
        ("minProperties over optional properties", min_optional, schema_check(min_optional)),
        ("integer minimum / exclusiveMinimum", integers, schema_check(integers)),
    ):
        check_each(server, "json_schema: " + name, {"json_schema": schema}, validate)
        check_each(
            server,
            "response_format: " + name,
            {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}},
            validate,
            endpoints=("chat",),
        )

    for endpoint in ENDPOINTS:
        for seed in SEEDS:
            what = "json_schema: number exclusiveMinimum on %s (seed %d)" % (endpoint, seed)
            text, finish, usage = server.generate(endpoint, {"json_schema": number}, seed)
            if finish == "length":
                expect_fullmatch(r'\{"x": ?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]*)?', text, what + " (cut off in the number)")
                log("  %s: cut off in the number: %r" % (what, text[:80]))
                continue
            validate_json(finished(text, finish, usage, what), number, what)
            log("  %s: %r" % (what, text))

    # oneOf: kept, or refused with the field named (never silently loosened into anyOf,
    # which llguidance does only when told to; here the branches are disjoint, so both
    # keep the schema).
    for endpoint in ENDPOINTS:
        what = "json_schema: patternProperties with oneOf on %s" % endpoint
        resp = server.raw(endpoint, {"json_schema": one_of})
        if resp.status == 400:
            expect_param_error(resp, ["json_schema"], what + " (refused)")
            continue
        expect_eq(resp.status, 200, "%s: status (%r)" % (what, resp))
        check_each(server, "json_schema: patternProperties with oneOf", {"json_schema": one_of}, schema_check(one_of), endpoints=(endpoint,))


def main():
    args = parser(__doc__).parse_args()
    server = Server(args.base, args.model)
    check_openai_parse(server)
    check_json_object(server)
    check_streamed(server)
    check_vllm(server)
    check_llamacpp(server)
    check_length(server)
    check_bad_input(server)
    check_llamacpp_breakers(server)
    expect_eq(get(server.base, "/health").status, 200, "GET /health after the checks")


if __name__ == "__main__":
    run(main)
