"""Tool calls and reasoning end to end, on the server with a Qwen3.5-style XML chat template
(think block opened by the template, thinking budget 8 tokens by default).

The tiny model has random weights and never calls a tool by itself, so calls are forced with
tool_choice: the server prefills the call's opening and must return structured tool_calls,
streaming and not, with no markup in content."""
from __future__ import annotations

import json

import httpx

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
MSG = [{"role": "user", "content": "Weather in Paris?"}]
FORCE = {"type": "function", "function": {"name": "get_weather"}}


def test_reasoning_budget_splits_reasoning_and_content(small_client):
    r = small_client.chat.completions.create(model="tiny", messages=MSG, max_tokens=24, temperature=0)
    msg = r.choices[0].message
    reasoning = msg.model_extra.get("reasoning_content")
    assert reasoning, "the think block opened by the template must come back as reasoning_content"
    assert "<think>" not in reasoning and "</think>" not in reasoning
    assert "</think>" not in (msg.content or "")
    # the server default budget (8 tokens) closed the block: generation went on with the answer
    assert r.usage.completion_tokens == 24 or r.choices[0].finish_reason == "stop"
    if r.choices[0].finish_reason == "length":
        assert msg.content, "after the budget the answer must continue as content"


def test_request_budget_overrides_and_stream_agrees(small_client):
    kw = dict(model="tiny", messages=MSG, max_tokens=20, temperature=0, extra_body={"max_reasoning_tokens": 3})
    r = small_client.chat.completions.create(**kw)
    chunks = list(small_client.chat.completions.create(**kw, stream=True))
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == r.choices[0].message.model_extra["reasoning_content"]
    assert content == (r.choices[0].message.content or "")
    longer = small_client.chat.completions.create(**{**kw, "extra_body": {"max_reasoning_tokens": 12}})
    assert len(longer.choices[0].message.model_extra["reasoning_content"]) > len(reasoning)


def test_thinking_disabled_gives_no_reasoning(small_client):
    r = small_client.chat.completions.create(model="tiny", messages=MSG, max_tokens=8, temperature=0,
                                             extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert not r.choices[0].message.model_extra.get("reasoning_content")


def test_forced_tool_call_non_stream(small_client):
    r = small_client.chat.completions.create(model="tiny", messages=MSG, tools=TOOLS, tool_choice=FORCE,
                                             max_tokens=30, temperature=0)
    choice = r.choices[0]
    calls = choice.message.tool_calls
    assert calls and len(calls) == 1
    assert calls[0].type == "function" and calls[0].function.name == "get_weather"
    assert calls[0].id.startswith("call_")
    assert isinstance(json.loads(calls[0].function.arguments), dict)
    assert "<tool_call>" not in (choice.message.content or "")
    assert "<function" not in (choice.message.content or "")
    assert choice.finish_reason in ("tool_calls", "length")


def test_forced_tool_call_streaming_yields_structured_deltas(small_client):
    stream = small_client.chat.completions.create(model="tiny", messages=MSG, tools=TOOLS, tool_choice=FORCE,
                                                  max_tokens=30, temperature=0, stream=True)
    name, call_id, args, content = None, None, "", ""
    finish = None
    for c in stream:
        if not c.choices:
            continue
        d = c.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            assert tc.index == 0
            if tc.id:
                call_id, name = tc.id, tc.function.name
            args += tc.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    assert name == "get_weather" and call_id
    assert isinstance(json.loads(args), dict)
    assert "<tool_call" not in content and "<function" not in content and "<parameter" not in content
    assert finish in ("tool_calls", "length")


def test_forced_without_thinking_and_required(small_client):
    no_think = {"chat_template_kwargs": {"enable_thinking": False}}
    r = small_client.chat.completions.create(model="tiny", messages=MSG, tools=TOOLS, tool_choice=FORCE,
                                             max_tokens=10, temperature=0, extra_body=no_think)
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    # required with a single tool forces that tool
    r = small_client.chat.completions.create(model="tiny", messages=MSG, tools=TOOLS, tool_choice="required",
                                             max_tokens=10, temperature=0, extra_body=no_think)
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_tool_choice_none_hides_tools(small_server):
    h = {"Authorization": "Bearer sekrit"}
    body = {"messages": MSG, "max_tokens": 4, "temperature": 0, "tools": TOOLS}
    with_tools = httpx.post(small_server.base_url + "/v1/chat/completions", json=body, headers=h).json()
    none = httpx.post(small_server.base_url + "/v1/chat/completions", json={**body, "tool_choice": "none"},
                      headers=h).json()
    without = httpx.post(small_server.base_url + "/v1/chat/completions",
                         json={k: v for k, v in body.items() if k != "tools"}, headers=h).json()
    assert none["usage"]["prompt_tokens"] == without["usage"]["prompt_tokens"]
    assert with_tools["usage"]["prompt_tokens"] > none["usage"]["prompt_tokens"]


def test_history_with_tool_calls_renders(small_client):
    msgs = MSG + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = small_client.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS, max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens > 0
