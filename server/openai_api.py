"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions, /v1/models, and the
/tokenize and /detokenize that vLLM and llama.cpp servers offer.

Streaming answers are SSE ``data: {chunk}`` events ending with ``data: [DONE]``; with
``stream_options.include_usage`` a last chunk with empty ``choices`` carries the usage. An error
after the headers went out is sent as ``data: {"error": {...}}`` and ends the stream (no
[DONE]), so a failure never looks like a finished answer. While nothing is generated for a
while (a long prefill) the stream carries SSE comments (``: ping``) to keep proxies patient.

Logprobs (server/logprobs.py): chat ``logprobs: true`` with ``top_logprobs: N``, completions
``logprobs: N`` (N <= 20); a streamed chunk carries the entries of the tokens generated since the
previous chunk of its choice. Completions' ``echo: true`` starts each answer with its prompt (with
``logprobs``, the prompt tokens' entries too, the first one null: how evaluation harnesses score
a text).

Structured outputs (server/structured.py): ``response_format`` ``json_object`` / ``json_schema``
on chat and completions, and the ``structured_outputs`` extension (``json``, ``regex``,
``choice``, ``grammar``): every generated token of the answer is one the grammar allows.

Extensions: ``reasoning_content`` in messages and deltas (text of the think block);
``chat_template_kwargs`` (e.g. ``{"enable_thinking": false}``); ``max_reasoning_tokens`` (a
thinking budget); ``top_k``, ``min_p``, ``repetition_penalty``; a ``timings`` object in
non-streaming answers (and in the usage chunk).
"""
from __future__ import annotations

import asyncio
import math
import secrets
import time
from typing import Any, AsyncIterator, Sequence

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from lucebox.grammar import Grammar

from lucebox.chat_output import ChatOutput, OutputDelta, finish_reason_for
from .errors import APIError, api_error_from, invalid
from .generation import ChoiceDone, ChoiceResult, ErrorEvent, GenerationJob, TextEvent
from .logprobs import LogprobFormatter, chat_logprobs_n, completion_logprobs_n
from .schemas import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, NamedToolChoice, SamplingFields,
                      StrictJSONRoute, TokenizeRequest)
from .service import ChatSpec, PreparedChat, Service
from .structured import grammar_from_response_format, grammar_from_structured_outputs, request_grammar
from .streaming import ClientDisconnected, EventStreamResponse, sse, unless_disconnected

__all__ = ["router", "chat_spec_from_openai", "usage_of", "timings_of"]

router = APIRouter(route_class=StrictJSONRoute)

PING_SECONDS = 15.0


def service_of(request: Request) -> Service:
    return request.app.state.service


def check_common(body: SamplingFields, svc: Service) -> None:
    """Fields every OpenAI endpoint bounds the same way."""
    if body.n > svc.config.max_n:
        raise invalid(f"n={body.n} is larger than this server allows ({svc.config.max_n})", param="n")


def usage_of(n_prompt: int, results: Sequence[ChoiceResult | None]) -> dict[str, Any]:
    rs = [r for r in results if r is not None]
    completion = sum(r.n_generated for r in rs)
    usage: dict[str, Any] = {"prompt_tokens": n_prompt, "completion_tokens": completion,
                             "total_tokens": n_prompt + completion}
    if any(r.prediction_tokens for r in rs):  # predicted outputs: the prediction's tokens used or not
        accepted = [int(r.spec.get("predicted_accepted", 0) or 0) for r in rs]
        usage["completion_tokens_details"] = {
            "accepted_prediction_tokens": sum(accepted),
            "rejected_prediction_tokens": sum(max(0, r.prediction_tokens - a) for r, a in zip(rs, accepted))}
    return usage


def prediction_of(body: ChatCompletionRequest) -> str | None:
    """The text of OpenAI's ``prediction`` (``{"type": "content", "content": str | [text parts]}``)."""
    p = body.prediction
    if p is None:
        return None
    content = p.get("content") if p.get("type") == "content" else None
    if isinstance(content, list) and all(isinstance(c, dict) and c.get("type") == "text"
                                         and isinstance(c.get("text"), str) for c in content):
        content = "".join(c["text"] for c in content)
    if not isinstance(content, str):
        raise invalid("prediction must be {'type': 'content', 'content': text or a list of text parts}",
                      param="prediction")
    return content or None


def timings_of(results: Sequence[ChoiceResult | None]) -> dict[str, Any]:
    rs = [r for r in results if r is not None]
    prefill = sum(r.prefill_seconds for r in rs)
    decode = sum(r.decode_seconds for r in rs)
    generated = sum(r.n_generated for r in rs)
    steps = sum(int(r.spec.get("steps", 0) or 0) for r in rs)
    accepted = sum(int(r.spec.get("accepted", 0) or 0) for r in rs)
    out: dict[str, Any] = {"prompt_ms": round(prefill * 1000, 3), "predicted_ms": round(decode * 1000, 3),
                           "predicted_n": generated,
                           "predicted_per_second": round(generated / decode, 3) if decode > 0 else 0.0}
    if steps:
        out["acceptance_length"] = round((accepted + steps) / steps, 4)
    return out


def with_logprobs(sampling: dict[str, Any], n_top: int | None) -> dict[str, Any]:
    """Session.stream arguments that also ask for logprobs with n_top alternatives (None: none)."""
    return sampling if n_top is None else {**sampling, "logprobs": n_top}


def grammar_of(body: ChatCompletionRequest | CompletionRequest) -> Grammar | None:
    """The structured-output grammar a chat or completions request asks for (server/structured.py)."""
    return request_grammar(response_format=(grammar_from_response_format, body.response_format),
                           structured_outputs=(grammar_from_structured_outputs, body.structured_outputs))


def chat_spec_from_openai(body: ChatCompletionRequest, svc: Service) -> ChatSpec:
    kwargs = dict(body.chat_template_kwargs or {})
    enable_thinking = kwargs.pop("enable_thinking", None)
    if enable_thinking is not None and not isinstance(enable_thinking, bool):
        raise invalid("chat_template_kwargs.enable_thinking must be a boolean", param="chat_template_kwargs")
    if enable_thinking is None and body.reasoning_effort in ("none", "minimal"):
        enable_thinking = False
    forced = None
    choice = "auto"
    if isinstance(body.tool_choice, NamedToolChoice):
        forced = body.tool_choice.function.name
    elif body.tool_choice is not None:
        choice = body.tool_choice
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    return ChatSpec(
        messages=body.messages, tools=tools, tool_choice=choice, forced_name=forced,
        parallel_tool_calls=body.parallel_tool_calls is not False, enable_thinking=enable_thinking,
        template_kwargs=kwargs, max_tokens=body.max_completion_tokens or body.max_tokens,
        sampling=with_logprobs(svc.sampling(body.model_dump(), body.seed),
                               chat_logprobs_n(body.logprobs, body.top_logprobs)),
        stop=body.stop_list(), n=body.n,
        reasoning_budget=body.max_reasoning_tokens, grammar=grammar_of(body), prediction=prediction_of(body))


async def collect_events(job: GenerationJob, n: int, request: Request
                         ) -> tuple[list[str], list[ChoiceResult | None], list[list[Any]]]:
    """Run a job to its end (non-streaming): each choice's text, result (None if it never ended) and
    token logprobs. Raises the mapped APIError of an engine failure, or ClientDisconnected (after
    cancelling the job) when the client leaves."""
    pieces: list[list[str]] = [[] for _ in range(n)]  # (joined once: a long output is many small pieces)
    results: list[ChoiceResult | None] = [None] * n
    logprobs: list[list[Any]] = [[] for _ in range(n)]

    async def run() -> None:
        async for ev in job.events():
            if isinstance(ev, TextEvent):
                pieces[ev.choice].append(ev.text)
                logprobs[ev.choice].extend(ev.logprobs or [])
            elif isinstance(ev, ChoiceDone):
                results[ev.choice] = ev.result
            elif isinstance(ev, ErrorEvent):
                raise api_error_from(ev.error)

    try:
        await unless_disconnected(request, run())
    except ClientDisconnected:
        job.cancel()
        raise
    return ["".join(p) for p in pieces], results, logprobs


async def collect_chat(job: GenerationJob, prepared: PreparedChat, n: int, request: Request
                       ) -> tuple[list[ChatOutput], list[ChoiceResult], list[list[Any]]]:
    """collect_events, each choice's text split into reasoning, content and tool calls."""
    texts, results, logprobs = await collect_events(job, n, request)
    outputs = [ChatOutput(prepared.think_open, prepared.parse_tools) for _ in range(n)]
    for out, text, result in zip(outputs, texts, results):
        out.feed(text)
        if result is not None:
            out.finish()
    return outputs, [r if r is not None else ChoiceResult("cancelled", 0, 0) for r in results], logprobs


def message_of(out: ChatOutput) -> dict[str, Any]:
    calls = out.tool_calls
    msg: dict[str, Any] = {"role": "assistant", "content": out.content if (out.content or not calls) else None}
    if out.reasoning:
        msg["reasoning_content"] = out.reasoning
    if calls:
        msg["tool_calls"] = [c.to_openai() for c in calls]
    return msg


def delta_of(d: OutputDelta) -> dict[str, Any]:
    if d.kind == "content":
        return {"content": d.text}
    if d.kind == "reasoning":
        return {"reasoning_content": d.text}
    if d.kind == "tool_start":
        return {"tool_calls": [{"index": d.index, "id": d.call_id, "type": "function",
                                "function": {"name": d.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]}


def _merge_text_deltas(deltas: list[OutputDelta]) -> list[OutputDelta]:
    out: list[OutputDelta] = []
    for d in deltas:
        if out and d.kind in ("content", "reasoning") and out[-1].kind == d.kind:
            out[-1] = OutputDelta(d.kind, out[-1].text + d.text)
        else:
            out.append(d)
    return out


async def job_events(job: GenerationJob, taken: list[Any], ended: bool) -> AsyncIterator[Any]:
    """The job's events after those already `taken`; None items are keep-alive ticks."""
    for ev in taken:
        yield ev
    if ended:
        return
    while True:
        try:
            ev = await job.next_event(PING_SECONDS)
        except (TimeoutError, asyncio.TimeoutError):
            yield None
            continue
        if ev is None:
            return
        yield ev


async def start_stream(svc: Service, job: GenerationJob, request: Request) -> tuple[list[Any], bool]:
    """First event of a streaming job; an engine error there becomes a plain HTTP error."""
    taken, ended = await svc.first_event(job, request)
    if taken and isinstance(taken[0], ErrorEvent):
        raise api_error_from(taken[0].error)
    return taken, ended


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    svc = service_of(request)
    svc.check_model(body.model)
    check_common(body, svc)
    spec = chat_spec_from_openai(body, svc)
    prepared = svc.prepare_chat(spec)
    job = await svc.start(prepared.plans, request)
    rid = "chatcmpl-" + secrets.token_hex(12)
    created = int(time.time())
    base = {"id": rid, "created": created, "model": svc.model_name, "system_fingerprint": svc.fingerprint}
    fmt = LogprobFormatter(svc.tokenizer) if "logprobs" in spec.sampling else None
    if body.stream:
        taken, ended = await start_stream(svc, job, request)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventStreamResponse(
            _chat_stream(svc, job, prepared, body.n, base, include_usage, taken, ended, fmt),
            on_disconnect=job.cancel, on_close=job.cancel)
    outputs, results, logprobs = await collect_chat(job, prepared, body.n, request)
    choices = []
    for i, (out, res) in enumerate(zip(outputs, results)):
        choices.append({"index": i, "message": message_of(out),
                        "logprobs": fmt.chat_object(logprobs[i]) if fmt else None,
                        "finish_reason": finish_reason_for(res.finish_reason, bool(out.tool_calls))})
    return JSONResponse({**base, "object": "chat.completion", "choices": choices,
                         "usage": usage_of(prepared.n_prompt, results), "timings": timings_of(results)})


async def _chat_stream(svc: Service, job: GenerationJob, prepared: PreparedChat, n: int, base: dict[str, Any],
                       include_usage: bool, taken: list[Any], ended: bool,
                       fmt: LogprobFormatter | None) -> AsyncIterator[str]:
    obj = {**base, "object": "chat.completion.chunk"}
    extra = {"usage": None} if include_usage else {}
    # token logprobs not sent yet, per choice: they go with that choice's next chunk
    pending: list[list[Any]] = [[] for _ in range(n)]

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> str:
        lps = None
        if fmt is not None and pending[index]:
            lps = fmt.chat_object(pending[index])
            pending[index] = []
        return sse({**obj, "choices": [{"index": index, "delta": delta, "logprobs": lps,
                                        "finish_reason": finish}], **extra})

    outputs = [ChatOutput(prepared.think_open, prepared.parse_tools) for _ in range(n)]
    results: list[ChoiceResult | None] = [None] * n
    for i in range(n):
        yield chunk(i, {"role": "assistant", "content": ""})
    try:
        async for ev in job_events(job, taken, ended):
            if ev is None:
                yield ": ping\n\n"
            elif isinstance(ev, TextEvent):
                pending[ev.choice].extend(ev.logprobs or [])
                for d in _merge_text_deltas(outputs[ev.choice].feed(ev.text)):
                    yield chunk(ev.choice, delta_of(d))
            elif isinstance(ev, ChoiceDone):
                out = outputs[ev.choice]
                for d in _merge_text_deltas(out.finish()):
                    yield chunk(ev.choice, delta_of(d))
                results[ev.choice] = ev.result
                if ev.result.finish_reason != "cancelled":
                    yield chunk(ev.choice, {}, finish_reason_for(ev.result.finish_reason, bool(out.tool_calls)))
            elif isinstance(ev, ErrorEvent):
                err = api_error_from(ev.error)
                svc.metrics.observe_error(err.type, err.code)
                yield sse(err.body())
                return
        if include_usage:
            yield sse({**obj, "choices": [], "usage": usage_of(prepared.n_prompt, results),
                       "timings": timings_of(results)})
        yield sse("[DONE]")
    finally:
        job.cancel()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    svc = service_of(request)
    svc.check_model(body.model)
    check_common(body, svc)
    best_of = body.n if body.best_of is None else body.best_of
    if best_of < body.n:
        raise invalid(f"best_of={best_of} must be at least n={body.n}", param="best_of")
    if best_of > svc.config.max_n:
        raise invalid(f"best_of={best_of} is larger than this server allows ({svc.config.max_n})", param="best_of")
    rank = best_of > body.n  # generate best_of per prompt, return the n of highest logprob per token
    if rank and body.stream:
        raise invalid("best_of > n cannot be streamed (the best candidates are known only at the end)",
                      param="best_of")
    p = body.prompt
    prompts: list[Any]
    if isinstance(p, str):
        prompts = [p]
    elif p and isinstance(p[0], int):
        prompts = [p]
    else:
        prompts = list(p)
    n_top = completion_logprobs_n(body.logprobs, body.top_logprobs)
    sampling = with_logprobs(svc.sampling(body.model_dump(), body.seed), 0 if n_top is None and rank else n_top)
    plans, n_prompt = svc.prepare_prompts(prompts, body.max_tokens, sampling, body.stop_list(), best_of,
                                          echo=body.echo, grammar=grammar_of(body), suffix=body.suffix or None)
    job = await svc.start(plans, request)
    rid = "cmpl-" + secrets.token_hex(12)
    base = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": svc.model_name,
            "system_fingerprint": svc.fingerprint}
    n_choices = len(plans)
    fmt = LogprobFormatter(svc.tokenizer) if n_top is not None else None
    if body.stream:
        taken, ended = await start_stream(svc, job, request)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventStreamResponse(_completion_stream(svc, job, n_choices, n_prompt, base, include_usage, taken,
                                                      ended, fmt), on_disconnect=job.cancel, on_close=job.cancel)
    texts, results, logprobs = await collect_events(job, n_choices, request)
    chosen = list(range(n_choices))
    if rank:  # per prompt, the n candidates of highest mean logprob of their generated tokens
        def score(i: int) -> float:
            generated = logprobs[i][len(plans[i].prompt_ids):] if body.echo else logprobs[i]
            return sum(e.logprob for e in generated) / len(generated) if generated else -math.inf

        chosen = [i for g in range(0, n_choices, best_of)
                  for i in sorted(range(g, g + best_of), key=lambda i: (-score(i), i))[:body.n]]
    choices = [{"index": k, "text": texts[i], "logprobs": fmt.completion_object(logprobs[i])[0] if fmt else None,
                "finish_reason": finish_reason_for(results[i].finish_reason if results[i] else "stop", False)}
               for k, i in enumerate(chosen)]
    return JSONResponse({**base, "choices": choices, "usage": usage_of(n_prompt, results),
                         "timings": timings_of(results)})


async def _completion_stream(svc: Service, job: GenerationJob, n: int, n_prompt: int, base: dict[str, Any],
                             include_usage: bool, taken: list[Any], ended: bool,
                             fmt: LogprobFormatter | None) -> AsyncIterator[str]:
    extra = {"usage": None} if include_usage else {}
    results: list[ChoiceResult | None] = [None] * n
    offsets = [0] * n  # text_offset of each choice's next token
    try:
        async for ev in job_events(job, taken, ended):
            if ev is None:
                yield ": ping\n\n"
            elif isinstance(ev, TextEvent):
                lps = None
                if fmt is not None:
                    lps, offsets[ev.choice] = fmt.completion_object(ev.logprobs or [], offsets[ev.choice])
                yield sse({**base, "choices": [{"index": ev.choice, "text": ev.text, "logprobs": lps,
                                                "finish_reason": None}], **extra})
            elif isinstance(ev, ChoiceDone):
                results[ev.choice] = ev.result
                if ev.result.finish_reason != "cancelled":
                    yield sse({**base, "choices": [{"index": ev.choice, "text": "", "logprobs": None,
                                                    "finish_reason": finish_reason_for(ev.result.finish_reason,
                                                                                       False)}], **extra})
            elif isinstance(ev, ErrorEvent):
                err = api_error_from(ev.error)
                svc.metrics.observe_error(err.type, err.code)
                yield sse(err.body())
                return
        if include_usage:
            yield sse({**base, "choices": [], "usage": usage_of(n_prompt, results), "timings": timings_of(results)})
        yield sse("[DONE]")
    finally:
        job.cancel()


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> JSONResponse:
    """vLLM's and llama.cpp's /tokenize: the ids of a text (as /v1/completions parses it) or of chat
    messages (as /v1/chat/completions renders them), their count and the context length."""
    svc = service_of(request)
    svc.check_model(body.model)
    texts = [t for t in (body.prompt, body.content) if t is not None]
    if len(texts) + (body.messages is not None) != 1:
        raise invalid("give exactly one of prompt (or content) and messages", param="prompt")
    if body.messages is not None:
        chat = ChatCompletionRequest(messages=body.messages, tools=body.tools,
                                     chat_template_kwargs=body.chat_template_kwargs)
        ids = svc.prompt_ids(chat_spec_from_openai(chat, svc))
    else:
        ids = svc.tokenizer.encode(texts[0], add_special=body.add_special_tokens, parse_special=True)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": svc.n_ctx})


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> JSONResponse:
    """The text of token ids (``prompt``, vLLM's name; ``content``, llama.cpp's)."""
    svc = service_of(request)
    svc.check_model(body.model)
    vocab = svc.tokenizer.n_vocab
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise invalid(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="tokens")
    text = svc.tokenizer.decode(body.tokens)
    return JSONResponse({"prompt": text, "content": text})


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    svc = service_of(request)
    return JSONResponse({"object": "list", "data": [svc.model_card()]})


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> JSONResponse:
    svc = service_of(request)
    if model_id not in svc.config.accepted_names:
        raise APIError(404, f"the model {model_id!r} does not exist", param="model", code="model_not_found")
    return JSONResponse(svc.model_card())
