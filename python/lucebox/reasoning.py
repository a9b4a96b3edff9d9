"""Split generated text into reasoning (inside ``<think>...</think>``) and content.

Qwen3.5/3.6 chat templates open the think block in the prompt (the generation prompt ends with
``<think>\\n``) unless thinking is disabled, so the output starts *inside* the block and only
its closing tag is generated; other templates leave it to the model to write ``<think>``.
`ReasoningSplitter` handles both: construct it with ``in_reasoning=True`` when the prompt
already opened the block (`prompt_opens_reasoning`).

Contracts:

* Every character of the input is either reasoning, content, or one of the two tags.
  Tags are never emitted; a suffix that could be the start of a tag is held back until the
  next piece decides.
* Whitespace at the start and end of the reasoning, and at the start of the content, is
  dropped (the template writes newlines around the tags); nothing else is.
* ``<think>`` opens reasoning only before any content (models think first); later it is
  content. After ``</think>`` everything is content.
"""
from __future__ import annotations

from typing import Literal

from lucebox.chat_template import THINK_CLOSE, THINK_OPEN, prompt_opens_reasoning

__all__ = ["THINK_OPEN", "THINK_CLOSE", "ReasoningSplitter", "Piece", "prompt_opens_reasoning"]

Kind = Literal["reasoning", "content"]
Piece = tuple[Kind, str]


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningSplitter:
    """Incremental splitter; `feed` and `finish` return (kind, text) pieces in order."""

    def __init__(self, in_reasoning: bool = False) -> None:
        self.in_reasoning = in_reasoning
        self.reasoning_closed = False   # a think block was closed (by the model or forced)
        self._buf = ""
        self._held_ws = ""              # trailing whitespace of reasoning, pending
        self._at_start = True           # nothing emitted yet in the current section
        self._content_seen = False

    def feed(self, text: str) -> list[Piece]:
        """Consume `text`; return the pieces it completes."""
        self._buf += text
        out: list[Piece] = []
        while self._buf:
            if self.in_reasoning:
                if not self._step_reasoning(out):
                    break
            elif not self._step_content(out):
                break
        return out

    def finish(self) -> list[Piece]:
        """End of output: flush what was held back (an unclosed think block stays reasoning)."""
        out: list[Piece] = []
        buf, self._buf = self._buf, ""
        if self.in_reasoning:
            self._emit(out, "reasoning", buf.rstrip())
        else:
            self._emit(out, "content", buf)
        return out

    # -- steps: return True when they consumed something and may continue ---------------------
    def _step_reasoning(self, out: list[Piece]) -> bool:
        buf = self._buf
        i = buf.find(THINK_CLOSE)
        if i >= 0:
            self._emit(out, "reasoning", buf[:i].rstrip())
            self._buf = buf[i + len(THINK_CLOSE):]
            self._held_ws = ""
            self.in_reasoning = False
            self.reasoning_closed = True
            self._at_start = True
            return True
        keep = _partial_suffix(buf, THINK_CLOSE)
        body = buf[: len(buf) - keep]
        stripped = body.rstrip()
        self._emit(out, "reasoning", stripped)
        # trailing whitespace waits: it is dropped if the block closes next
        self._held_ws += body[len(stripped):]
        self._buf = buf[len(buf) - keep:]
        return False

    def _step_content(self, out: list[Piece]) -> bool:
        buf = self._buf
        if self._content_seen or self.reasoning_closed:
            self._emit(out, "content", buf)
            self._buf = ""
            return False
        lead = buf[: len(buf) - len(buf.lstrip())]
        rest = buf[len(lead):]
        if rest.startswith(THINK_OPEN):
            self._buf = rest[len(THINK_OPEN):]
            self.in_reasoning = True
            self._at_start = True
            return True
        if not rest or THINK_OPEN.startswith(rest):
            return False  # only whitespace, or a possible "<think>" so far
        self._emit(out, "content", buf)
        self._buf = ""
        return False

    def _emit(self, out: list[Piece], kind: Kind, text: str) -> None:
        if kind == "reasoning" and text and self._held_ws:
            text = self._held_ws + text
            self._held_ws = ""
        if self._at_start:
            text = text.lstrip()
        if not text:
            return
        self._at_start = False
        if kind == "content":
            self._content_seen = True
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))

    def close_reasoning(self) -> None:
        """The think block was closed by the server (a thinking budget): what follows is content."""
        if self.in_reasoning:
            self.in_reasoning = False
            self.reasoning_closed = True
            self._held_ws = ""
            self._at_start = True
