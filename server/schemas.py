"""Request bodies of the HTTP API (pydantic v2), validated before any work.

Unknown fields are accepted and ignored (clients send vendor extensions); a field this server
cannot honour *and* that would change the answer (a completions ``suffix`` for a model without
fill-in-the-middle tokens) is rejected with a 400 by the endpoint, never ignored.
Numbers must be finite. Value ranges follow the OpenAI API where it states them. The bodies are
parsed as strict JSON (``StrictJSONRoute``): ``NaN`` and ``Infinity``, which Python's json module
takes but JSON has not, are a 400 anywhere in a body, also inside the free-form objects (tool
schemas, ``reasoning``, ``metadata``) an answer may echo.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Coroutine, Literal, Optional, Union

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["StrictJSONRoute", "ChatCompletionRequest", "CompletionRequest", "FunctionDef", "Tool", "NamedToolChoice",
           "StreamOptions", "SamplingFields", "MessagesRequest", "ResponsesRequest", "TokenizeRequest",
           "DetokenizeRequest"]


def _refuse_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not a JSON value (numbers must be finite)", name, 0)


class _StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json.loads(await self.body(), parse_constant=_refuse_constant)
        return self._json


class StrictJSONRoute(APIRoute):
    """The routers' route class: request bodies parsed as strict JSON (no NaN / Infinity); FastAPI
    answers a body that is not with its json_invalid validation error (a 400, see app.py)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(_StrictJSONRequest(request.scope, request.receive))

        return strict_handler


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, populate_by_name=True)


class StreamOptions(_Lenient):
    include_usage: bool = False


class FunctionDef(_Lenient):
    name: str = Field(min_length=1, max_length=256)
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class Tool(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionDef


class _NamedFunction(_Lenient):
    name: str = Field(min_length=1)


class NamedToolChoice(_Lenient):
    type: Literal["function"] = "function"
    function: _NamedFunction


Stop = Union[str, list[str], None]


class SamplingFields(_Lenient):
    """Sampling and length fields shared by the OpenAI endpoints."""

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=100.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(default=None, ge=0)
    min_p: Optional[float] = Field(default=None, ge=0.0, lt=1.0)
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: Optional[float] = Field(default=None, gt=0.0, le=10.0)
    seed: Optional[int] = None
    n: int = Field(default=1, ge=1)
    stop: Stop = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    logprobs: Any = None
    top_logprobs: Optional[int] = None
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: Stop) -> Stop:
        items = [v] if isinstance(v, str) else (v or [])
        if len(items) > 16:
            raise ValueError("at most 16 stop sequences")
        for s in items:
            if not s:
                raise ValueError("stop sequences must be non-empty strings")
        return v

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: Optional[bool] = None
    response_format: Optional[dict[str, Any]] = None
    structured_outputs: Optional[dict[str, Any]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    reasoning_effort: Optional[str] = None
    max_reasoning_tokens: Optional[int] = Field(default=None, ge=0)
    prediction: Optional[dict[str, Any]] = None


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    prompt: Union[str, list[str], list[int], list[list[int]]]
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None
    response_format: Optional[dict[str, Any]] = None
    structured_outputs: Optional[dict[str, Any]] = None

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and v and isinstance(v[0], list) and any(not p for p in v):
            raise ValueError("token prompts must not be empty")
        return v


# ---------------------------------------------------------------------------------------------
# Anthropic Messages (POST /v1/messages)
# ---------------------------------------------------------------------------------------------

class AnthropicTool(_Lenient):
    name: str = Field(min_length=1, max_length=256)
    description: Optional[str] = None
    input_schema: dict[str, Any] = Field(default_factory=dict)


class MessagesRequest(_Lenient):
    """POST /v1/messages (the Anthropic Messages API, as Claude Code speaks it)."""

    model: Optional[str] = None
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: Union[str, list[dict[str, Any]], None] = None
    temperature: Optional[float] = Field(default=None, ge=0.0, le=100.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(default=None, ge=0)
    stop_sequences: Optional[list[str]] = None
    stream: bool = False
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None
    output_config: Optional[dict[str, Any]] = None
    metadata: Optional[dict[str, Any]] = None


class TokenizeRequest(_Lenient):
    """POST /tokenize: text (``prompt``, or llama.cpp's ``content``) or chat ``messages`` (with
    ``tools``, ``chat_template_kwargs``) as the model's template renders them for a reply.
    add_special_tokens: also the vocabulary's bos where it asks for one (off by default, as
    /v1/completions parses a prompt)."""

    model: Optional[str] = None
    prompt: Optional[str] = None
    content: Optional[str] = None
    messages: Optional[list[dict[str, Any]]] = Field(default=None, min_length=1)
    tools: Optional[list[Tool]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    add_special_tokens: bool = False


class DetokenizeRequest(_Lenient):
    """POST /detokenize."""

    model: Optional[str] = None
    tokens: list[int]


class CountTokensRequest(_Lenient):
    model: Optional[str] = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: Union[str, list[dict[str, Any]], None] = None
    tools: Optional[list[dict[str, Any]]] = None


# ---------------------------------------------------------------------------------------------
# OpenAI Responses (POST /v1/responses)
# ---------------------------------------------------------------------------------------------

class ResponsesRequest(_Lenient):
    """POST /v1/responses (the subset Codex-style clients use; no server-side state)."""

    model: Optional[str] = None
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=100.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    reasoning: Optional[dict[str, Any]] = None
    previous_response_id: Optional[str] = None
    store: Optional[bool] = None
    include: Optional[list[str]] = None
    top_logprobs: Optional[int] = None
    text: Optional[dict[str, Any]] = None
