"""Anthropic Messages API: POST /v1/messages (streaming too) and /v1/messages/count_tokens.

What Claude Code and other Anthropic clients send is mapped onto the same chat machinery as
the OpenAI endpoint:

* ``system`` (text or text blocks) -> a system message; ``messages`` content blocks: ``text``,
  ``tool_use`` (assistant) -> tool_calls, ``tool_result`` (user) -> tool messages, ``thinking``
  (assistant) -> reasoning_content; images and documents are refused (400).
* ``tools`` (name, description, input_schema) -> function tools; ``tool_choice`` auto / any
  (-> required) / tool (-> a named function) / none; ``disable_parallel_tool_use``.
* ``thinking: {"type": "enabled", "budget_tokens": N}`` turns thinking on with a budget of N;
  ``{"type": "adaptive"}`` turns it on; ``{"type": "disabled"}`` off; absent: the chat
  template's default. ``output_config.format`` ``{"type": "json_schema", "schema": {...}}``: the
  text answer is JSON valid under the schema (server/structured.py).
* ``stop_sequences``, ``temperature``, ``top_p``, ``top_k``, ``max_tokens`` (required).

The answer has ``thinking``, ``text`` and ``tool_use`` blocks and a ``stop_reason`` of end_turn,
max_tokens, stop_sequence or tool_use. Streaming sends message_start, content_block_start /
_delta / _stop per block, message_delta and message_stop; an engine failure after the start is
an ``error`` event. Errors on these paths use Anthropic's body:
``{"type": "error", "error": {"type", "message"}}``.
"""
from __future__ import annotations

import secrets
from typing import Any, AsyncIterator, Mapping

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from lucebox.chat_output import ChatOutput
from .structured import grammar_from_output_format
from .errors import api_error_from, invalid
from .generation import ChoiceDone, ChoiceResult, ErrorEvent, GenerationJob, TextEvent
from .openai_api import collect_chat, job_events, service_of, start_stream
from .schemas import CountTokensRequest, MessagesRequest, StrictJSONRoute
from .service import ChatSpec, PreparedChat, Service
from .streaming import EventStreamResponse, sse_event

__all__ = ["router", "anthropic_error_body", "chat_spec_from_anthropic"]

router = APIRouter(route_class=StrictJSONRoute)

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                503: "overloaded_error"}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error body for an HTTP status."""
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error" if status >= 500
                                                                else "invalid_request_error"),
                                       "message": message}}


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, block in enumerate(content):
            if isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
            else:
                kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
                raise invalid(f"{where}[{j}]: content blocks of type {kind!r} are not supported here",
                              param=where)
        return "\n".join(parts)
    raise invalid(f"{where} must be a string or a list of text blocks", param=where)


def _messages(body: MessagesRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if body.system:
        out.append({"role": "system", "content": _text_of(body.system, "system")})
    for i, m in enumerate(body.messages):
        where = f"messages[{i}]"
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise invalid(f"{where}.role must be 'user' or 'assistant', got {role!r}", param=where)
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise invalid(f"{where}.content must be a string or a list of blocks", param=where)
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, Mapping) else None
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "thinking" and role == "assistant":
                reasoning.append(str(block.get("thinking", "")))
            elif kind == "redacted_thinking":
                continue
            elif kind == "tool_use" and role == "assistant":
                calls.append({"id": str(block.get("id", "")), "type": "function",
                              "function": {"name": str(block.get("name", "")), "arguments": block.get("input") or {}}})
            elif kind == "tool_result" and role == "user":
                if texts:
                    out.append({"role": "user", "content": "\n".join(texts)})
                    texts = []
                result = block.get("content", "")
                text = _text_of(result, f"{where}.content[{j}].content") if result else ""
                if block.get("is_error"):
                    text = "Error: " + text
                out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": text})
            else:
                raise invalid(f"{where}.content[{j}]: blocks of type {kind!r} are not supported", param=where)
        if role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            if reasoning:
                msg["reasoning_content"] = "\n".join(reasoning)
            out.append(msg)
        elif texts:
            out.append({"role": "user", "content": "\n".join(texts)})
    return out


def chat_spec_from_anthropic(body: MessagesRequest, svc: Service) -> ChatSpec:
    tools = None
    if body.tools:
        tools = []
        for k, t in enumerate(body.tools):
            name = t.get("name")
            if not isinstance(name, str) or not name:
                raise invalid(f"tools[{k}] has no name", param="tools")
            if t.get("type") not in (None, "custom"):
                continue  # server tools (web search, ...) are Anthropic's, not the model's
            tools.append({"type": "function", "function": {
                "name": name, "description": t.get("description") or "",
                "parameters": t.get("input_schema") or {"type": "object", "properties": {}}}})
        tools = tools or None
    choice, forced, parallel = "auto", None, True
    tc = body.tool_choice or {}
    if tc:
        kind = tc.get("type")
        parallel = not tc.get("disable_parallel_tool_use", False)
        if kind == "any":
            choice = "required"
        elif kind == "tool":
            forced = tc.get("name")
            if not isinstance(forced, str):
                raise invalid("tool_choice of type 'tool' needs a name", param="tool_choice")
        elif kind in ("auto", "none"):
            choice = kind
        else:
            raise invalid(f"unknown tool_choice type {kind!r}", param="tool_choice")
    enable_thinking, budget = None, None
    th = body.thinking or {}
    if th.get("type") == "adaptive":
        enable_thinking = True
    elif th.get("type") == "enabled":
        enable_thinking = True
        if isinstance(th.get("budget_tokens"), int):
            budget = max(0, int(th["budget_tokens"]))
    elif th.get("type") == "disabled":
        enable_thinking = False
    sampling = svc.sampling({"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k}, None)
    stops = [s for s in (body.stop_sequences or []) if s]
    return ChatSpec(messages=_messages(body), tools=tools, tool_choice=choice, forced_name=forced,
                    parallel_tool_calls=parallel, enable_thinking=enable_thinking, max_tokens=body.max_tokens,
                    sampling=sampling, stop=stops, n=1, reasoning_budget=budget,
                    grammar=grammar_from_output_format((body.output_config or {}).get("format")))


def _stop_reason(result: ChoiceResult, has_calls: bool) -> str:
    if result.finish_reason == "length":
        return "max_tokens"
    if has_calls:
        return "tool_use"
    return "stop_sequence" if result.stop_sequence else "end_turn"


def _blocks(out: ChatOutput) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if out.reasoning:
        blocks.append({"type": "thinking", "thinking": out.reasoning, "signature": ""})
    if out.content:
        blocks.append({"type": "text", "text": out.content})
    for call in out.tool_calls:
        blocks.append({"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name,
                       "input": call.arguments})
    return blocks


@router.post("/v1/messages")
async def messages(body: MessagesRequest, request: Request) -> Response:
    svc = service_of(request)
    svc.check_model(body.model)
    prepared = svc.prepare_chat(chat_spec_from_anthropic(body, svc))
    job = await svc.start(prepared.plans, request)
    mid = "msg_" + secrets.token_hex(12)
    if body.stream:
        taken, ended = await start_stream(svc, job, request)
        return EventStreamResponse(_stream(svc, job, prepared, mid, taken, ended), on_disconnect=job.cancel,
                                   on_close=job.cancel)
    (out,), (res,), _ = await collect_chat(job, prepared, 1, request)
    return JSONResponse({
        "id": mid, "type": "message", "role": "assistant", "model": svc.model_name, "content": _blocks(out),
        "stop_reason": _stop_reason(res, bool(out.tool_calls)), "stop_sequence": res.stop_sequence,
        "usage": {"input_tokens": prepared.n_prompt, "output_tokens": res.n_generated}})


async def _stream(svc: Service, job: GenerationJob, prepared: PreparedChat, mid: str, taken: list[Any],
                  ended: bool) -> AsyncIterator[str]:
    yield sse_event("message_start", {"type": "message_start", "message": {
        "id": mid, "type": "message", "role": "assistant", "model": svc.model_name, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": prepared.n_prompt, "output_tokens": 0}}})
    out = ChatOutput(prepared.think_open, prepared.parse_tools)
    state: dict[str, Any] = {"index": -1, "kind": None, "call": None}

    def close() -> list[str]:
        events = []
        if state["kind"] == "thinking":
            events.append(sse_event("content_block_delta", {"type": "content_block_delta", "index": state["index"],
                                                            "delta": {"type": "signature_delta", "signature": ""}}))
        if state["kind"] is not None:
            events.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": state["index"]}))
        state["kind"] = None
        return events

    def open_block(kind: str, block: dict[str, Any]) -> list[str]:
        events = close()
        state["index"] += 1
        state["kind"] = kind
        events.append(sse_event("content_block_start", {"type": "content_block_start", "index": state["index"],
                                                        "content_block": block}))
        return events

    def render(deltas: list[Any]) -> list[str]:
        events: list[str] = []
        for d in deltas:
            if d.kind == "reasoning":
                if state["kind"] != "thinking":
                    events += open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                delta = {"type": "thinking_delta", "thinking": d.text}
            elif d.kind == "content":
                if state["kind"] != "text":
                    events += open_block("text", {"type": "text", "text": ""})
                delta = {"type": "text_delta", "text": d.text}
            elif d.kind == "tool_start":
                events += open_block("tool_use", {"type": "tool_use", "id": "toolu_" + d.call_id.removeprefix("call_"),
                                                  "name": d.name, "input": {}})
                state["call"] = d.index
                continue
            else:
                if state["kind"] != "tool_use" or state["call"] != d.index:
                    continue
                delta = {"type": "input_json_delta", "partial_json": d.text}
            events.append(sse_event("content_block_delta", {"type": "content_block_delta",
                                                            "index": state["index"], "delta": delta}))
        return events

    result: ChoiceResult | None = None
    try:
        async for ev in job_events(job, taken, ended):
            if ev is None:
                yield sse_event("ping", {"type": "ping"})
            elif isinstance(ev, TextEvent):
                for e in render(out.feed(ev.text)):
                    yield e
            elif isinstance(ev, ChoiceDone):
                for e in render(out.finish()):
                    yield e
                result = ev.result
            elif isinstance(ev, ErrorEvent):
                err = api_error_from(ev.error)
                svc.metrics.observe_error(err.type, err.code)
                yield sse_event("error", anthropic_error_body(err.status, err.message))
                return
        for e in close():
            yield e
        res = result or ChoiceResult("cancelled", prepared.n_prompt, 0)
        yield sse_event("message_delta", {"type": "message_delta", "delta": {
            "stop_reason": _stop_reason(res, bool(out.tool_calls)), "stop_sequence": res.stop_sequence},
            "usage": {"output_tokens": res.n_generated}})
        yield sse_event("message_stop", {"type": "message_stop"})
    finally:
        job.cancel()


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> JSONResponse:
    svc = service_of(request)
    svc.check_model(body.model)
    mreq = MessagesRequest(max_tokens=1, messages=body.messages, system=body.system, tools=body.tools)
    spec = chat_spec_from_anthropic(mreq, svc)
    n = len(svc.prompt_ids(spec))
    return JSONResponse({"input_tokens": n})
