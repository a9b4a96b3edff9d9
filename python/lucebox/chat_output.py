"""The assistant message of one choice, built incrementally from generated text.

`ChatOutput` chains the reasoning splitter and (when the request has tools) the tool-call
parser: text goes in, `OutputDelta`s come out, in order, each of one kind:

* ``reasoning``: text of the think block (``text``)
* ``content``: answer text (``text``), never containing tool-call markup that was parsed
* ``tool_start``: a call begins (``index``, ``call_id``, ``name``)
* ``tool_args``: a fragment of a call's JSON arguments (``index``, ``text``)

The same object accumulates the final message (`reasoning`, `content`, `tool_calls`, or all
three as a `ChatMessage`), so the streaming and non-streaming answers are built by one code path
and always agree: the server's endpoints and `Engine.generate` on chat messages alike.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

from .reasoning import ReasoningSplitter
from .toolcalls import TextDelta, ToolCall, ToolCallArgsDelta, ToolCallParser, ToolCallStart

__all__ = ["ChatMessage", "ChatOutput", "OutputDelta", "finish_reason_for"]


@dataclass
class ChatMessage:
    """An assistant reply split into its parts: the reasoning (the think block's text, "" without
    one), the answer text without any parsed tool-call markup, and the tool calls, their arguments
    typed by the tools' JSON schemas (`lucebox.toolcalls`)."""

    content: str
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The reply as a chat message to append to the conversation for the next turn (OpenAI's
        assistant message: ``content``, ``reasoning_content`` when there is reasoning,
        ``tool_calls`` when calls were made)."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return out


@dataclass
class OutputDelta:
    kind: Literal["reasoning", "content", "tool_start", "tool_args"]
    text: str = ""
    index: int = 0
    call_id: str = ""
    name: str = ""


class ChatOutput:
    """Splits one choice's text into reasoning, content and tool calls.

    think_open: the prompt ended inside a think block. tools: the request's tool definitions
    (None: tool calls are not parsed, the text stays content)."""

    def __init__(self, think_open: bool = False, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self._splitter = ReasoningSplitter(in_reasoning=think_open)
        self._parser = ToolCallParser(tools) if tools else None
        self._reasoning: list[str] = []
        self._content: list[str] = []

    def feed(self, text: str) -> list[OutputDelta]:
        return self._route(self._splitter.feed(text), final=False)

    def finish(self) -> list[OutputDelta]:
        return self._route(self._splitter.finish(), final=True)

    def _route(self, pieces: list[tuple[str, str]], final: bool) -> list[OutputDelta]:
        out: list[OutputDelta] = []
        for kind, text in pieces:
            if kind == "reasoning":
                self._reasoning.append(text)
                out.append(OutputDelta("reasoning", text))
            elif self._parser is None:
                self._content.append(text)
                out.append(OutputDelta("content", text))
            else:
                out.extend(self._tool_events(self._parser.feed(text)))
        if final and self._parser is not None:
            out.extend(self._tool_events(self._parser.finish()))
        return out

    def _tool_events(self, events: list[Any]) -> list[OutputDelta]:
        out: list[OutputDelta] = []
        for ev in events:
            if isinstance(ev, TextDelta):
                self._content.append(ev.text)
                out.append(OutputDelta("content", ev.text))
            elif isinstance(ev, ToolCallStart):
                out.append(OutputDelta("tool_start", index=ev.index, call_id=ev.id, name=ev.name))
            elif isinstance(ev, ToolCallArgsDelta):
                out.append(OutputDelta("tool_args", ev.text, index=ev.index))
        return out

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return list(self._parser.calls) if self._parser is not None else []

    def message(self) -> ChatMessage:
        """The message so far (after `finish`: the whole reply)."""
        return ChatMessage(content=self.content, reasoning=self.reasoning, tool_calls=self.tool_calls)


def finish_reason_for(engine_finish: str, has_tool_calls: bool) -> str:
    """OpenAI finish_reason: "tool_calls" when calls were made and the model stopped on its own,
    "length" when max_tokens or the context ended it, else "stop"."""
    if engine_finish == "length":
        return "length"
    return "tool_calls" if has_tool_calls else "stop"
