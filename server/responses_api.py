"""OpenAI Responses API: POST /v1/responses (streaming too), stateless.

Mapped onto the chat machinery:

* ``instructions`` -> a system message; ``input`` (a string, or items): messages with
  ``input_text`` / ``output_text`` parts (roles user, assistant, system, developer),
  ``function_call`` items -> assistant tool_calls, ``function_call_output`` -> tool messages,
  ``reasoning`` items -> the next assistant message's reasoning_content.
* ``tools`` of type ``function`` (flat: name, description, parameters); other tool types are
  hosted tools this server does not run and are not shown to the model. ``tool_choice`` auto /
  none / required / ``{"type": "function", "name"}``; ``parallel_tool_calls``.
* ``reasoning.effort`` "none" or "minimal" turns thinking off; ``max_output_tokens``,
  ``temperature``, ``top_p``. ``previous_response_id`` is refused (400): nothing is stored.
* ``text.format`` ``json_object`` / ``json_schema`` (name, schema, strict): the answer is JSON in
  the schema (server/structured.py).

Output items: ``reasoning`` (its text as a ``reasoning_text`` content part), ``message``
(``output_text``), ``function_call``. Status ``completed``, or ``incomplete`` with reason
``max_output_tokens``. Streaming sends the typed events (response.created, output_item.added,
output_text.delta, function_call_arguments.delta, ..., response.completed), each with a
sequence_number; an engine failure after the start ends with ``response.failed``.
"""
from __future__ import annotations

import secrets
import time
from typing import Any, AsyncIterator, Mapping

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from lucebox.chat_output import ChatOutput
from .errors import api_error_from, invalid
from .generation import ChoiceDone, ChoiceResult, ErrorEvent, GenerationJob, TextEvent
from .logprobs import LogprobFormatter, responses_logprobs_n
from .structured import grammar_from_text_format
from .openai_api import collect_chat, job_events, service_of, start_stream, with_logprobs
from .schemas import ResponsesRequest, StrictJSONRoute
from .service import ChatSpec, PreparedChat, Service
from .streaming import EventStreamResponse, sse_event

__all__ = ["router", "chat_spec_from_responses"]

router = APIRouter(route_class=StrictJSONRoute)


def _part_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
                texts.append(str(part.get("text", "")))
            else:
                raise invalid(f"{where}[{j}]: content of type {kind!r} is not supported", param="input")
        return "\n".join(texts)
    raise invalid(f"{where} must be a string or a list of content parts", param="input")


def _messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        out.append({"role": "user", "content": body.input})
        return out
    pending_reasoning: list[str] = []

    def assistant() -> dict[str, Any]:
        """The assistant message that function calls attach to (the last one, or a new one)."""
        if out and out[-1]["role"] == "assistant" and not out[-1].get("_closed"):
            return out[-1]
        msg: dict[str, Any] = {"role": "assistant", "content": ""}
        out.append(msg)
        return msg

    for i, item in enumerate(body.input):
        where = f"input[{i}]"
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise invalid(f"{where}.role {role!r} is not supported", param="input")
            msg = {"role": "system" if role == "developer" else role,
                   "content": _part_text(item.get("content", ""), f"{where}.content")}
            if role == "assistant" and pending_reasoning:
                msg["reasoning_content"] = "\n".join(pending_reasoning)
                pending_reasoning = []
            out.append(msg)
        elif kind == "function_call":
            msg = assistant()
            if pending_reasoning and not msg.get("reasoning_content"):
                msg["reasoning_content"] = "\n".join(pending_reasoning)
                pending_reasoning = []
            msg.setdefault("tool_calls", []).append({
                "id": str(item.get("call_id", "")), "type": "function",
                "function": {"name": str(item.get("name", "")), "arguments": item.get("arguments") or "{}"}})
        elif kind == "function_call_output":
            if out and out[-1]["role"] == "assistant":
                out[-1]["_closed"] = True
            output = item.get("output", "")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                        "content": output if isinstance(output, str) else _part_text(output, f"{where}.output")})
        elif kind == "reasoning":
            texts = [str(p.get("text", "")) for p in (item.get("content") or []) + (item.get("summary") or [])
                     if isinstance(p, Mapping)]
            pending_reasoning.append("\n".join(t for t in texts if t))
        else:
            raise invalid(f"{where}: items of type {kind!r} are not supported", param="input")
    for m in out:
        m.pop("_closed", None)
    if not out:
        raise invalid("input is empty (and there are no instructions): nothing to answer", param="input")
    return out


def chat_spec_from_responses(body: ResponsesRequest, svc: Service) -> ChatSpec:
    if body.previous_response_id:
        raise invalid("previous_response_id is not supported: this server stores no responses; send the "
                      "whole conversation in input", param="previous_response_id", code="unsupported")
    tools = []
    for k, t in enumerate(body.tools or []):
        if t.get("type") != "function":
            continue
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise invalid(f"tools[{k}] has no name", param="tools")
        tools.append({"type": "function", "function": {"name": name, "description": t.get("description") or "",
                                                       "parameters": t.get("parameters") or {"type": "object"}}})
    choice, forced = "auto", None
    tc = body.tool_choice
    if isinstance(tc, str):
        choice = tc
    elif isinstance(tc, Mapping):
        if tc.get("type") != "function" or not isinstance(tc.get("name"), str):
            raise invalid("tool_choice must be auto, none, required or {'type': 'function', 'name': ...}",
                          param="tool_choice")
        forced = tc["name"]
    effort = (body.reasoning or {}).get("effort")
    enable_thinking = False if effort in ("none", "minimal") else None
    sampling = with_logprobs(svc.sampling({"temperature": body.temperature, "top_p": body.top_p}, None),
                             responses_logprobs_n(body.include, body.top_logprobs))
    return ChatSpec(messages=_messages(body), tools=tools or None, tool_choice=choice, forced_name=forced,
                    parallel_tool_calls=body.parallel_tool_calls is not False, enable_thinking=enable_thinking,
                    max_tokens=body.max_output_tokens, sampling=sampling, n=1,
                    grammar=grammar_from_text_format(body.text))


def _usage(prepared: PreparedChat, res: ChoiceResult) -> dict[str, Any]:
    return {"input_tokens": prepared.n_prompt, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": res.n_generated, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prepared.n_prompt + res.n_generated}


def _envelope(body: ResponsesRequest, svc: Service, rid: str, created: float, status: str,
              output: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": rid, "object": "response", "created_at": created, "status": status, "model": svc.model_name,
            "output": output, "error": None, "incomplete_details": None, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "parallel_tool_calls": body.parallel_tool_calls is not False,
            "temperature": body.temperature, "top_p": body.top_p,
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
            "tools": body.tools or [], "text": body.text or {"format": {"type": "text"}}, "reasoning": body.reasoning,
            "store": False, "usage": None, "metadata": {}}


def _items(out: ChatOutput, logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The output items of a finished answer; `logprobs` (chat-style entries of every generated
    token), when asked for, go with the message's output_text."""
    items: list[dict[str, Any]] = []
    if out.reasoning:
        items.append({"type": "reasoning", "id": "rs_" + secrets.token_hex(12), "summary": [],
                      "content": [{"type": "reasoning_text", "text": out.reasoning}]})
    if out.content or not out.tool_calls:
        items.append({"type": "message", "id": "msg_" + secrets.token_hex(12), "status": "completed",
                      "role": "assistant",
                      "content": [{"type": "output_text", "text": out.content, "annotations": [],
                                   **({"logprobs": logprobs} if logprobs is not None else {})}]})
    for call in out.tool_calls:
        items.append({"type": "function_call", "id": "fc_" + call.id.removeprefix("call_"), "call_id": call.id,
                      "name": call.name, "arguments": call.arguments_json(), "status": "completed"})
    return items


@router.post("/v1/responses")
async def responses(body: ResponsesRequest, request: Request) -> Response:
    svc = service_of(request)
    svc.check_model(body.model)
    prepared = svc.prepare_chat(chat_spec_from_responses(body, svc))
    job = await svc.start(prepared.plans, request)
    rid = "resp_" + secrets.token_hex(12)
    created = time.time()
    if body.stream:
        taken, ended = await start_stream(svc, job, request)
        return EventStreamResponse(_stream(svc, body, job, prepared, rid, created, taken, ended),
                                   on_disconnect=job.cancel, on_close=job.cancel)
    (out,), (res,), (lps,) = await collect_chat(job, prepared, 1, request)
    incomplete = res.finish_reason == "length"
    fmt = LogprobFormatter(svc.tokenizer) if "logprobs" in prepared.plans[0].sampling else None
    resp = _envelope(body, svc, rid, created, "incomplete" if incomplete else "completed",
                     _items(out, fmt.chat_entries(lps) if fmt else None))
    if incomplete:
        resp["incomplete_details"] = {"reason": "max_output_tokens"}
    resp["usage"] = _usage(prepared, res)
    return JSONResponse(resp)


async def _stream(svc: Service, body: ResponsesRequest, job: GenerationJob, prepared: PreparedChat, rid: str,
                  created: float, taken: list[Any], ended: bool) -> AsyncIterator[str]:
    seq = [0]

    def event(kind: str, payload: dict[str, Any]) -> str:
        data = {"type": kind, "sequence_number": seq[0], **payload}
        seq[0] += 1
        return sse_event(kind, data)

    output: list[dict[str, Any]] = []
    cur: dict[str, Any] = {"item": None, "kind": None}
    fmt = LogprobFormatter(svc.tokenizer) if "logprobs" in prepared.plans[0].sampling else None
    pending: list[Any] = []  # token logprobs not yet sent with a text delta

    def close() -> list[str]:
        item = cur["item"]
        if item is None:
            return []
        idx = len(output) - 1
        evs = []
        if cur["kind"] == "message":
            text = item["content"][0]["text"]
            evs.append(event("response.output_text.done", {"item_id": item["id"], "output_index": idx,
                                                           "content_index": 0, "text": text}))
            evs.append(event("response.content_part.done", {"item_id": item["id"], "output_index": idx,
                                                            "content_index": 0, "part": item["content"][0]}))
        elif cur["kind"] == "reasoning":
            text = item["content"][0]["text"]
            evs.append(event("response.reasoning_text.done", {"item_id": item["id"], "output_index": idx,
                                                              "content_index": 0, "text": text}))
        elif cur["kind"] == "function_call":
            evs.append(event("response.function_call_arguments.done", {"item_id": item["id"], "output_index": idx,
                                                                       "arguments": item["arguments"]}))
        item["status"] = "completed"
        evs.append(event("response.output_item.done", {"output_index": idx, "item": item}))
        cur["item"], cur["kind"] = None, None
        return evs

    def open_item(kind: str, item: dict[str, Any]) -> list[str]:
        evs = close()
        output.append(item)
        cur["item"], cur["kind"] = item, kind
        idx = len(output) - 1
        evs.append(event("response.output_item.added", {"output_index": idx, "item": {**item}}))
        if kind == "message":
            evs.append(event("response.content_part.added", {"item_id": item["id"], "output_index": idx,
                                                             "content_index": 0,
                                                             "part": {"type": "output_text", "text": "",
                                                                      "annotations": []}}))
        return evs

    def render(deltas: list[Any]) -> list[str]:
        evs: list[str] = []
        for d in deltas:
            if d.kind == "reasoning":
                if cur["kind"] != "reasoning":
                    evs += open_item("reasoning", {"type": "reasoning", "id": "rs_" + secrets.token_hex(12),
                                                   "summary": [], "content": [{"type": "reasoning_text", "text": ""}],
                                                   "status": "in_progress"})
                cur["item"]["content"][0]["text"] += d.text
                evs.append(event("response.reasoning_text.delta", {"item_id": cur["item"]["id"],
                                                                   "output_index": len(output) - 1,
                                                                   "content_index": 0, "delta": d.text}))
            elif d.kind == "content":
                if cur["kind"] != "message":
                    evs += open_item("message", {"type": "message", "id": "msg_" + secrets.token_hex(12),
                                                 "status": "in_progress", "role": "assistant",
                                                 "content": [{"type": "output_text", "text": "", "annotations": []}]})
                cur["item"]["content"][0]["text"] += d.text
                entries = fmt.chat_entries(pending) if fmt is not None else []
                pending.clear()
                if fmt is not None:
                    cur["item"]["content"][0].setdefault("logprobs", []).extend(entries)
                evs.append(event("response.output_text.delta", {"item_id": cur["item"]["id"],
                                                                "output_index": len(output) - 1,
                                                                "content_index": 0, "delta": d.text,
                                                                "logprobs": entries}))
            elif d.kind == "tool_start":
                evs += open_item("function_call", {"type": "function_call",
                                                   "id": "fc_" + d.call_id.removeprefix("call_"),
                                                   "call_id": d.call_id, "name": d.name, "arguments": "",
                                                   "status": "in_progress"})
            elif cur["kind"] == "function_call":
                cur["item"]["arguments"] += d.text
                evs.append(event("response.function_call_arguments.delta", {"item_id": cur["item"]["id"],
                                                                            "output_index": len(output) - 1,
                                                                            "delta": d.text}))
        return evs

    yield event("response.created", {"response": _envelope(body, svc, rid, created, "in_progress", [])})
    yield event("response.in_progress", {"response": _envelope(body, svc, rid, created, "in_progress", [])})
    out = ChatOutput(prepared.think_open, prepared.parse_tools)
    result: ChoiceResult | None = None
    try:
        async for ev in job_events(job, taken, ended):
            if ev is None:
                yield ": ping\n\n"
            elif isinstance(ev, TextEvent):
                pending.extend(ev.logprobs or [])
                for e in render(out.feed(ev.text)):
                    yield e
            elif isinstance(ev, ChoiceDone):
                for e in render(out.finish()):
                    yield e
                messages = [o for o in output if o["type"] == "message"]
                if fmt is not None and pending and messages:  # tokens after the last text delta
                    messages[-1]["content"][0].setdefault("logprobs", []).extend(fmt.chat_entries(pending))
                    pending.clear()
                result = ev.result
            elif isinstance(ev, ErrorEvent):
                err = api_error_from(ev.error)
                svc.metrics.observe_error(err.type, err.code)
                failed = _envelope(body, svc, rid, created, "failed", output)
                failed["error"] = {"code": err.code or "server_error", "message": err.message}
                yield event("response.failed", {"response": failed})
                return
        for e in close():
            yield e
        res = result or ChoiceResult("cancelled", prepared.n_prompt, 0)
        incomplete = res.finish_reason == "length"
        final = _envelope(body, svc, rid, created, "incomplete" if incomplete else "completed", output)
        final["usage"] = _usage(prepared, res)
        if incomplete:
            final["incomplete_details"] = {"reason": "max_output_tokens"}
            yield event("response.incomplete", {"response": final})
        else:
            yield event("response.completed", {"response": final})
    finally:
        job.cancel()
