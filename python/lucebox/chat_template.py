"""Chat templates: turn a list of chat messages into the prompt text a model was trained on.

`DEFAULT_CHAT_TEMPLATE` is lucebox's own ChatML template in the style Qwen models expect
(tools in the system prompt, ``<tool_call>`` blocks, ``<think>`` reasoning). `ChatTemplate`
compiles any jinja chat template (for example the one stored in a GGUF file) in a sandbox and
renders validated messages with it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

__all__ = ["DEFAULT_CHAT_TEMPLATE", "ChatTemplate", "normalize_messages", "THINK_OPEN", "THINK_CLOSE",
           "prompt_opens_reasoning"]

ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")

# A think block: Qwen3.5/3.6 templates open it in the generation prompt (``...<think>\n``) unless
# thinking is disabled, so the model writes only its closing tag.
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """True when the rendered prompt ends inside an open think block (``...<think>\n``)."""
    return prompt_text.rstrip().endswith(THINK_OPEN)


# Rendering of one conversation, for reference:
#   <|im_start|>system\n{system text}[\n\n# Tools ... </tool_call>]<|im_end|>\n
#   <|im_start|>user\n{text}<|im_end|>\n
#   <|im_start|>assistant\n[<think>\n{reasoning}\n</think>\n\n]{text}[\n<tool_call>...]<|im_end|>\n
#   <|im_start|>user\n<tool_response>\n{result}\n</tool_response>...<|im_end|>\n   (tool turns)
#   <|im_start|>assistant\n[<think>\n\n</think>\n\n]                                 (prompt)
DEFAULT_CHAT_TEMPLATE: str = r"""
{#- lucebox default chat template: ChatML turns with Qwen-style tools and thinking. -#}
{%- set system_text = '' -%}
{%- set turns = messages -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set system_text = messages[0].content -%}
    {%- set turns = messages[1:] -%}
{%- endif -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if system_text -%}
        {{- system_text + '\n\n' -}}
    {%- endif -%}
    {{- '# Tools\n\nYou can call the functions below. Each is described by a JSON signature, all of them inside <tools></tools>:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nTo call a function, answer with a JSON object that gives its name and its arguments, inside <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function name>, "arguments": <arguments as a JSON object>}\n</tool_call><|im_end|>\n' -}}
{%- elif system_text -%}
    {{- '<|im_start|>system\n' + system_text + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in turns -%}
    {%- if message.role == 'user' or message.role == 'system' -%}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if message.reasoning_content -%}
            {{- '<think>\n' + (message.reasoning_content | trim) + '\n</think>\n\n' -}}
        {%- endif -%}
        {{- message.content -}}
        {%- for call in message.tool_calls or [] -%}
            {%- set fn = call.function if call.function is defined else call -%}
            {%- if message.content or not loop.first -%}
                {{- '\n' -}}
            {%- endif -%}
            {{- '<tool_call>\n{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
            {%- if fn.arguments is string -%}
                {{- fn.arguments -}}
            {%- else -%}
                {{- fn.arguments | tojson -}}
            {%- endif -%}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or loop.previtem.role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
        {%- if loop.last or loop.nextitem.role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- raise_exception('unknown role: ' + message.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}
        {{- '<think>\n\n</think>\n\n' -}}
    {%- endif -%}
{%- endif -%}
""".strip()


def _tojson(
    value: Any,
    indent: int | None = None,
    ensure_ascii: bool = False,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """JSON filter for templates; unlike jinja's own it keeps non-ASCII and does not escape HTML."""
    return json.dumps(
        value, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    """Current local time formatted with `fmt` (templates use it to state today's date)."""
    return datetime.now().strftime(fmt)


class _TemplateRaised(Exception):
    """Raised by `raise_exception` inside a template."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        texts: list[str] = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping):
                raise ValueError(f"{where}.content[{j}] must be a dict, got {type(part).__name__}")
            if part.get("type") != "text":
                raise ValueError(
                    f"{where}.content[{j}] has type {part.get('type')!r}; only 'text' parts are "
                    "supported"
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise ValueError(f"{where}.content[{j}].text must be a string")
            texts.append(text)
        return "\n".join(texts)
    raise ValueError(
        f"{where}.content must be a string or a list of text parts, got {type(content).__name__}"
    )


def _check_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
        raise ValueError(f"{where}.tool_calls must be a list, got {type(calls).__name__}")
    out: list[dict[str, Any]] = []
    for j, call in enumerate(calls):
        here = f"{where}.tool_calls[{j}]"
        if not isinstance(call, Mapping):
            raise ValueError(f"{here} must be a dict, got {type(call).__name__}")
        fn = call.get("function", call)
        if not isinstance(fn, Mapping):
            raise ValueError(f"{here}.function must be a dict")
        if not isinstance(fn.get("name"), str) or not fn.get("name"):
            raise ValueError(f"{here} has no function name")
        arguments = fn.get("arguments", {})
        if not isinstance(arguments, (str, Mapping)):
            raise ValueError(f"{here}.arguments must be a JSON string or a dict")
        out.append(dict(call))
    return out


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Validate chat messages and return copies ready for a template.

    Each message must be a dict with ``role`` in system/user/assistant/tool and ``content`` a
    string or a list of ``{"type": "text", "text": ...}`` parts (joined with newlines). An
    assistant message may have ``content`` None (rendered as ""), ``reasoning_content`` (a
    string) and ``tool_calls`` (a list of ``{"function": {"name", "arguments"}}`` or
    ``{"name", "arguments"}`` dicts, arguments a dict or a JSON string). Other keys are kept.
    Raises ValueError naming the message index and the problem.
    """
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise ValueError(f"messages must be a list of dicts, got {type(messages).__name__}")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise ValueError(f"{where} must be a dict, got {type(message).__name__}")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"{where} has role {role!r}; expected one of {', '.join(ROLES)}")
        fixed = dict(message)
        content = message.get("content")
        if content is None and role == "assistant":
            fixed["content"] = ""
        elif "content" not in message:
            raise ValueError(f"{where} ({role}) has no content")
        else:
            fixed["content"] = _content_text(content, where)
        if role == "assistant":
            reasoning = message.get("reasoning_content")
            if reasoning is not None and not isinstance(reasoning, str):
                raise ValueError(f"{where}.reasoning_content must be a string")
            if message.get("tool_calls") is not None:
                fixed["tool_calls"] = _check_tool_calls(message["tool_calls"], where)
        elif message.get("tool_calls"):
            raise ValueError(f"{where}: only assistant messages may have tool_calls")
        out.append(fixed)
    return out


class ChatTemplate:
    """A compiled jinja chat template.

    Templates run in jinja2's immutable sandbox with ``trim_blocks`` and ``lstrip_blocks``, and
    can use ``raise_exception(msg)``, ``strftime_now(fmt)`` and a ``tojson`` filter that keeps
    non-ASCII characters.
    """

    def __init__(self, source: str) -> None:
        """Compile `source`; raises ValueError with the line number on a syntax error."""
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if not isinstance(source, str):
            raise TypeError(f"chat template source must be str, got {type(source).__name__}")
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=False,
            extensions=["jinja2.ext.loopcontrols"],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise ValueError(
                f"chat template syntax error on line {error.lineno}: {error.message}"
            ) from None
        self.source: str = source

    @classmethod
    def default(cls) -> "ChatTemplate":
        """The built-in `DEFAULT_CHAT_TEMPLATE`."""
        return cls(DEFAULT_CHAT_TEMPLATE)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> "ChatTemplate":
        """The ``tokenizer.chat_template`` of the GGUF file at `path`, or the default if absent; a
        template that does not compile is a GGUFError naming the file."""
        from .errors import GGUFError
        from .vocab import read_chat_template

        source = read_chat_template(path)
        try:
            return cls(source if source is not None else DEFAULT_CHAT_TEMPLATE)
        except ValueError as e:
            raise GGUFError(f"file '{os.fspath(path)}': {e}") from e

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        **extra: Any,
    ) -> str:
        """Render `messages` (validated by `normalize_messages`) to prompt text.

        tools: OpenAI-style tool definitions, passed to the template as ``tools`` (None or
        empty means no tools). add_generation_prompt: end with the opening of an assistant turn.
        enable_thinking: passed to the template only when not None; False asks for an empty
        think block so the model answers directly. extra: more template variables.
        Raises ValueError for invalid messages/tools or an error raised while rendering.
        """
        import jinja2

        normalized = normalize_messages(messages)
        if tools is not None:
            if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
                raise ValueError(f"tools must be a list of dicts, got {type(tools).__name__}")
            for k, tool in enumerate(tools):
                if not isinstance(tool, Mapping):
                    raise ValueError(f"tools[{k}] must be a dict, got {type(tool).__name__}")
            tools = [dict(t) for t in tools] or None
        variables: dict[str, Any] = dict(extra)
        variables.update(
            messages=normalized, tools=tools, add_generation_prompt=add_generation_prompt
        )
        if enable_thinking is not None:
            variables["enable_thinking"] = bool(enable_thinking)
        try:
            return self._template.render(**variables)
        except _TemplateRaised as error:
            raise ValueError(f"chat template error: {error}") from None
        except jinja2.TemplateError as error:
            raise ValueError(f"chat template error: {error}") from None
