"""Structured outputs over HTTP: ``response_format`` (chat, completions), Responses ``text.format``
and the ``structured_outputs`` extension. The tiny model has random weights, so every answer's shape
comes from the grammar alone; the answers equal what `Engine.generate(grammar=...)` gives."""
from __future__ import annotations

import json
import re

import httpx
import pytest

import lucebox

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1,
                                                                          "maximum": 7},
                   "unit": {"enum": ["C", "F"]}},
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": SCHEMA, "strict": True}}
MSG = [{"role": "user", "content": "Forecast for Paris as JSON"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def check_forecast(text: str) -> None:
    obj = json.loads(text)
    assert set(obj) == {"city", "days", "unit"}, obj
    assert isinstance(obj["city"], str) and len(obj["city"]) <= 10
    assert isinstance(obj["days"], int) and 1 <= obj["days"] <= 7
    assert obj["unit"] in ("C", "F")


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=60)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_chat_json_schema_stream_and_not(client, temperature):
    kw = dict(model="tiny", messages=MSG, max_tokens=200, temperature=temperature, seed=7,
              response_format=RESPONSE_FORMAT)
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "stop"
    check_forecast(r.choices[0].message.content)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content


def test_chat_json_object_and_n(client):
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=200, temperature=1.0, n=3, seed=1,
                                       response_format={"type": "json_object"})
    for choice in r.choices:
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
        else:  # cut by max_tokens: still a prefix the grammar allowed
            assert choice.message.content.lstrip().startswith("{")


def test_completions_equal_the_engine(server, tiny_models):
    """Completions with a token prompt, greedy: the server's text is the engine's under the same grammar."""
    prompt = [5, 17, 300, 42, 8]
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 150, "temperature": 0, "response_format": RESPONSE_FORMAT}
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    check_forecast(text)
    engine = lucebox.Engine(tiny_models[0], ctx=1024, device="cpu")
    assert engine.generate(prompt, max_tokens=150, grammar=lucebox.Grammar.json_schema(SCHEMA)).text == text


@pytest.mark.parametrize("so, check", [
    ({"regex": r"[A-Z][a-z]{2,6} [0-9]{2}"}, lambda t: re.fullmatch(r"[A-Z][a-z]{2,6} [0-9]{2}", t)),
    ({"choice": ["sunny", "rainy", "windy"]}, lambda t: t in ("sunny", "rainy", "windy")),
    ({"grammar": 'start: "temp=" /-?[0-9]{1,2}/ "C"'}, lambda t: re.fullmatch(r"temp=-?[0-9]{1,2}C", t)),
    ({"json": SCHEMA}, lambda t: check_forecast(t) is None),
])
def test_structured_outputs_extension(server, so, check):
    for path, body in (("/v1/completions", {"prompt": "Weather:"}), ("/v1/chat/completions", {"messages": MSG})):
        r = post(server, path, {"model": "tiny", "max_tokens": 120, "temperature": 0.8, "seed": 3,
                                "structured_outputs": so, **body})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        assert choice["finish_reason"] == "stop" and check(text), text


def test_responses_text_format(server):
    body = {"model": "tiny", "input": "Forecast for Paris", "max_output_tokens": 200, "temperature": 0,
            "text": {"format": {"type": "json_schema", "name": "forecast", "schema": SCHEMA, "strict": True}}}
    r = post(server, "/v1/responses", body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["status"] == "completed" and out["text"]["format"]["type"] == "json_schema"
    message = [i for i in out["output"] if i["type"] == "message"][0]
    check_forecast(message["content"][0]["text"])


def test_grammar_applies_after_the_reasoning(small_client):
    """A template that opens a think block: the model reasons freely (the budget closes the block),
    then answers in the schema."""
    r = small_client.chat.completions.create(model="tiny", messages=MSG, max_tokens=200, temperature=0,
                                             response_format=RESPONSE_FORMAT)
    msg = r.choices[0].message
    assert msg.model_extra.get("reasoning_content")
    assert r.choices[0].finish_reason == "stop"
    check_forecast(msg.content)


def test_tools_with_a_format(small_client):
    """tool_choice auto: the answer is JSON in the schema or a tool call; a forced call ignores the format."""
    r = small_client.chat.completions.create(model="tiny", messages=MSG, max_tokens=200, temperature=0,
                                             tools=TOOLS, response_format=RESPONSE_FORMAT,
                                             extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    msg = r.choices[0].message
    if msg.tool_calls:
        assert msg.tool_calls[0].function.name == "get_weather"
    else:
        check_forecast(msg.content)
    forced = small_client.chat.completions.create(
        model="tiny", messages=MSG, max_tokens=60, temperature=0, tools=TOOLS, response_format=RESPONSE_FORMAT,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = forced.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "xml"}}, "response_format"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_schema"}}, "response_format"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "integr"}}}}, "response_format.json_schema"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_object"},
                              "structured_outputs": {"regex": "a+"}}, "structured_outputs"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {"regex": "a+", "choice": ["a"]}},
     "structured_outputs"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {"regex": "(a"}}, "structured_outputs.regex"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {"grammar": "start: nothing"}},
     "structured_outputs.grammar"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": "json"}, "structured_outputs"),
    ("/v1/responses", {"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": {"type": "array", "uniqueItems": True}}}}, "response_format.json_schema"),
])
def test_bad_formats_are_400s(server, path, body, param):
    r = post(server, path, {"model": "tiny", "max_tokens": 5, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"], err


def test_anthropic_output_format(server):
    body = {"model": "tiny", "max_tokens": 200, "temperature": 0, "messages": [{"role": "user", "content": "Go"}],
            "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}
    r = post(server, "/v1/messages", body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["stop_reason"] == "end_turn"
    check_forecast("".join(b["text"] for b in out["content"] if b["type"] == "text"))
    bad = post(server, "/v1/messages", {**body, "output_config": {"format": {"type": "regex"}}})
    assert bad.status_code == 400 and bad.json()["type"] == "error", bad.text
    assert "output_config.format" in bad.json()["error"]["message"]


def test_non_strict_schemas_ignore_unimplemented_keywords(client):
    """OpenAI's default strict: false: a keyword llguidance does not implement (uniqueItems) is
    ignored, the rest of the schema still holds (strict: true refuses it: test_bad_formats_are_400s)."""
    schema = {"type": "array", "items": {"type": "integer", "maximum": 9}, "maxItems": 4, "uniqueItems": True}
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=60, temperature=0,
                                       response_format={"type": "json_schema", "json_schema": {"name": "x",
                                                                                               "schema": schema}})
    items = json.loads(r.choices[0].message.content)
    assert isinstance(items, list) and len(items) <= 4 and all(isinstance(i, int) and i <= 9 for i in items)


CALL_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"},
                                         "unit": {"enum": ["C", "F"]}, "hourly": {"type": "boolean"}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string", "maxLength": 12}, "limit": {"type": "integer"}},
        "required": ["query"]}}},
]


def check_call(call) -> None:
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert isinstance(args["city"], str) and len(args["city"]) <= 12 and isinstance(args["days"], int), args
        assert args.get("unit", "C") in ("C", "F") and isinstance(args.get("hourly", True), bool), args
        assert set(args) <= {"city", "days", "unit", "hourly"}
    else:
        assert call.function.name == "search", call.function.name
        assert isinstance(args["query"], str) and len(args["query"]) <= 12, args
        assert isinstance(args.get("limit", 0), int), args
        assert set(args) <= {"query", "limit"}


@pytest.mark.parametrize("which", ["client", "small_client"])  # JSON and XML (Qwen3.5-style) call formats
@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_calls_follow_the_tool_schema(request, which, choice):
    """A forced call's arguments are generated under the tool's schema: the random model's calls
    always parse, with the required parameters present and every value of its declared type."""
    c = request.getfixturevalue(which)
    tool_choice = ("required" if choice == "required"
                   else {"type": "function", "function": {"name": "get_weather"}})
    for seed in range(3):
        kw = dict(model="tiny", messages=MSG, max_tokens=400, temperature=1.0, seed=seed, tools=CALL_TOOLS,
                  tool_choice=tool_choice, parallel_tool_calls=False,
                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        r = c.chat.completions.create(**kw)
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
        assert calls and len(calls) == 1, r.choices[0]
        if choice == "named":
            assert calls[0].function.name == "get_weather"
        for call in calls:
            check_call(call)
        streamed = list(c.chat.completions.create(**kw, stream=True))
        args: dict[int, str] = {}
        for ch in streamed:
            for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
        assert [json.loads(a) for _, a in sorted(args.items())] == [json.loads(c.function.arguments) for c in calls]


@pytest.fixture(scope="module")
def call_open_id(tiny_models) -> int:
    from lucebox.tokenizer import Tokenizer

    ids = Tokenizer.from_gguf(tiny_models[0]).encode("<tool_call>", parse_special=True)
    assert len(ids) == 1
    return ids[0]


@pytest.mark.parametrize("which", ["client", "small_client"])  # JSON and XML call formats; small: a think block
@pytest.mark.parametrize("parallel", [False, True])
def test_calls_under_auto_follow_the_tool_schema(request, which, parallel, call_open_id):
    """tool_choice auto: the model writes freely until it opens a call (a logit_bias on <tool_call>
    makes the random model do so), and from there the call is generated under the tools' schemas:
    every call parses with typed arguments; without parallel calls there is one; text before the
    call stays content."""
    c = request.getfixturevalue(which)
    for seed in range(4):
        kw = dict(model="tiny", messages=MSG, max_tokens=300, temperature=1.0, seed=seed, tools=CALL_TOOLS,
                  parallel_tool_calls=parallel, logit_bias={str(call_open_id): 6})
        r = c.chat.completions.create(**kw)
        choice = r.choices[0]
        calls = choice.message.tool_calls
        assert calls, choice
        assert choice.finish_reason in ("tool_calls", "length"), choice
        complete = calls if choice.finish_reason == "tool_calls" else calls[:-1]
        assert parallel or len(calls) == 1
        for call in complete:
            check_call(call)
        assert "<tool_call>" not in (choice.message.content or "")
        streamed = list(c.chat.completions.create(**kw, stream=True))
        args: dict[int, str] = {}
        for ch in streamed:
            for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
        assert [json.loads(args[i]) for i in range(len(complete))] == [json.loads(c.function.arguments)
                                                                        for c in complete]


@pytest.mark.parametrize("which", ["client", "small_client"])
def test_calls_or_a_format(request, which):
    """tool_choice auto with a response_format: the answer is JSON in the format or typed calls (the
    random model takes each way in some of the seeds)."""
    c = request.getfixturevalue(which)
    kinds = set()
    for seed in range(6):
        r = c.chat.completions.create(model="tiny", messages=MSG, max_tokens=300, temperature=1.0, seed=seed,
                                      tools=CALL_TOOLS, parallel_tool_calls=False, response_format=RESPONSE_FORMAT,
                                      extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        choice = r.choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
            check_call(choice.message.tool_calls[0])
            kinds.add("call")
        else:
            assert choice.finish_reason == "stop", choice
            check_forecast(choice.message.content)
            kinds.add("answer")
    assert kinds == {"call", "answer"}, kinds


AGENT_TOOLS = [  # schemas as coding agents write them: local $refs, draft-07 definitions, unions
    {"type": "function", "function": {"name": "todo", "parameters": {
        "type": "object", "$defs": {"Item": {"type": "object", "properties": {
            "text": {"type": "string"}, "state": {"enum": ["open", "done"]}}, "required": ["text", "state"]}},
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
                       "limit": {"type": ["integer", "null"]}, "mode": {"$ref": "#/$defs/Mode"}},
        "required": ["items"]}}},
    {"type": "function", "function": {"name": "bash", "parameters": {
        "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
        "definitions": {"Secs": {"type": "number"}},
        "properties": {"command": {"type": "string"}, "timeout": {"$ref": "#/definitions/Secs"},
                       "background": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}},
        "required": ["command"], "additionalProperties": False}}},
]
AGENT_TOOLS[0]["function"]["parameters"]["$defs"]["Mode"] = {"enum": ["fast", "slow"]}
BROKEN_TOOL = {"type": "function", "function": {"name": "fetch", "parameters": {
    "type": "object", "properties": {"urls": {"type": "array", "items": {"$ref": "https://example.com/url.json"}}}}}}


def grammar_accepts(grammar, text: str, tiny_models) -> bool:
    """Whether `text` followed by the end of the turn is in the grammar's language."""
    import llguidance

    from lucebox.grammar import compiled_vocabulary
    from lucebox.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(tiny_models[0])
    m = llguidance.LLMatcher(compiled_vocabulary(tok, tok.n_vocab), grammar.source, log_level=0)
    return m.consume_tokens(tok.encode(text, parse_special=False)) and m.is_accepting()


XML_CALLS = {  # text after "<tool_call>": accepted?
    '\n<function=todo>\n<parameter=items>\n[{"text": "a", "state": "done"}]\n</parameter>\n'
    '<parameter=limit>\nnull\n</parameter>\n<parameter=mode>\nfast\n</parameter>\n</function>\n</tool_call>': True,
    '\n<function=todo>\n<parameter=items>\n[]\n</parameter>\n<parameter=limit>\n7\n</parameter>\n'
    '</function>\n</tool_call>': True,
    '\n<function=todo>\n<parameter=items>\n[{"text": "a", "state": "later"}]\n</parameter>\n'
    '</function>\n</tool_call>': False,  # not in the $ref'd enum
    '\n<function=todo>\n<parameter=items>\n[]\n</parameter>\n<parameter=limit>\nmany\n</parameter>\n'
    '</function>\n</tool_call>': False,  # integer or null
    '\n<function=todo>\n<parameter=items>\n[]\n</parameter>\n<parameter=mode>\nmedium\n</parameter>\n'
    '</function>\n</tool_call>': False,
    '\n<function=bash>\n<parameter=command>\nls -l\n</parameter>\n<parameter=timeout>\n2.5\n</parameter>\n'
    '<parameter=background>\nnull\n</parameter>\n</function>\n</tool_call>': True,
    '\n<function=bash>\n<parameter=command>\nls\n</parameter>\n<parameter=timeout>\nsoon\n</parameter>\n'
    '</function>\n</tool_call>': False,
    '\n<function=bash>\n<parameter=timeout>\n1\n</parameter>\n</function>\n</tool_call>': False,  # required
    '\n<function=fetch>\n<parameter=urls>\nanything goes\n</parameter>\n</function>\n</tool_call>': True,
    '\n<function=fetch>\n<parameter=whatever>\n1\n</parameter>\n</function>\n</tool_call>': True,
    '\n<function=rm>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>': False,  # not a tool
}
JSON_CALLS = {
    '\n{"name": "todo", "arguments": {"items": [{"text": "a", "state": "open"}], "limit": null, "mode": "slow"}}'
    '\n</tool_call>': True,
    '\n{"name": "todo", "arguments": {"items": [{"text": "a", "state": "later"}]}}\n</tool_call>': False,
    '\n{"name": "bash", "arguments": {"command": "ls", "timeout": 3, "background": true}}\n</tool_call>': True,
    '\n{"name": "bash", "arguments": {"command": "ls", "cwd": "/"}}\n</tool_call>': False,  # additional
    '\n{"name": "fetch", "arguments": {"urls": 5, "x": [1]}}\n</tool_call>': True,
    '\n{"name": "rm", "arguments": {}}\n</tool_call>': False,
}


@pytest.mark.parametrize("fmt, cases", [("xml", XML_CALLS), ("json", JSON_CALLS)])
def test_tool_call_grammar_types_agent_schemas(fmt, cases, tiny_models):
    """The calls' grammar follows local $refs ($defs, draft-07 definitions), unions of types and
    enums in both call formats; a tool whose schema does not compile (a remote $ref) is called
    with any arguments while the others stay typed; parallel calls follow on new lines."""
    from lucebox.server.structured import tool_call_grammar

    tools = AGENT_TOOLS + [BROKEN_TOOL]
    single = tool_call_grammar(fmt, tools, "<tool_call>")
    parallel = tool_call_grammar(fmt, tools, "<tool_call>", more=True)
    for text, ok in cases.items():
        assert grammar_accepts(single, text, tiny_models) == ok, text
    good = [t for t, ok in cases.items() if ok]
    two = good[0] + "\n<tool_call>" + good[1]
    assert grammar_accepts(parallel, two, tiny_models) and not grammar_accepts(single, two, tiny_models)
    forced = tool_call_grammar(fmt, tools, "", name="bash")  # a named call from the turn's start
    bash_call = next(t for t in good if "bash" in t)
    prefix = "<tool_call>\n<function=bash>\n" if fmt == "xml" else '<tool_call>\n{"name": "bash", "arguments": '
    assert grammar_accepts(forced, "<tool_call>" + bash_call, tiny_models)
    assert tool_call_grammar(fmt, tools, prefix, name="bash") is not None
    assert tool_call_grammar(fmt, tools, "<tool_call>\n<x") is None  # not a prefix of the opening
