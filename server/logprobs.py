"""OpenAI logprobs objects from the engine's per-token `lucebox.TokenLogprob` entries.

A token's logprob is its log probability under the model (the log-softmax of its raw logits, before
temperature, penalties or top-k/p), as OpenAI reports it. Token strings are the token's bytes
decoded as UTF-8 (a token that ends inside a character shows U+FFFD; `bytes` has the exact bytes).

* chat (``logprobs: true``, ``top_logprobs: N``): ``{"content": [{"token", "logprob", "bytes",
  "top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...], "refusal": null}``, one entry per
  generated token (reasoning and tool-call tokens included: they are generated text too);
* responses (``include: ["message.output_text.logprobs"]``, ``top_logprobs: N``): the chat entries,
  on the message's ``output_text`` (and on each ``response.output_text.delta`` event, the entries
  of the tokens since the previous delta);
* completions (``logprobs: N``): ``{"tokens": [...], "token_logprobs": [...], "top_logprobs":
  [{token: logprob, ...}, ...], "text_offset": [...]}``, a token's offset being the characters of
  the token strings before it (the generated text's, unless a token ends inside a character). With
  ``echo``, the prompt's tokens come first, the first of them with null logprob and alternatives.

`chat_logprobs_n` / `completion_logprobs_n` validate the request fields (400 on misuse).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from lucebox._core import MAX_TOP_LOGPROBS

from .errors import invalid

__all__ = ["MAX_TOP", "chat_logprobs_n", "completion_logprobs_n", "responses_logprobs_n", "LogprobFormatter",
           "UnscoredToken"]

MAX_TOP = MAX_TOP_LOGPROBS  # alternatives per token (20, OpenAI's limit)


def _top(value: Any, param: str) -> int:
    """A count of alternatives per token, checked (400 naming `param`)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP:
        raise invalid(f"{param} must be an integer in [0, {MAX_TOP}], got {value!r}", param=param)
    return value


def chat_logprobs_n(logprobs: Any, top_logprobs: Any) -> int | None:
    """Alternatives per token a chat request asks for, or None when it asks for no logprobs."""
    if logprobs is None or logprobs is False:
        if top_logprobs:
            raise invalid("top_logprobs needs logprobs: true", param="top_logprobs")
        return None
    if logprobs is not True:
        raise invalid(f"logprobs must be a boolean on /v1/chat/completions, got {logprobs!r}", param="logprobs")
    return _top(0 if top_logprobs is None else top_logprobs, "top_logprobs")


def completion_logprobs_n(logprobs: Any, top_logprobs: Any) -> int | None:
    """Alternatives per token a completions request asks for (its integer `logprobs`), or None."""
    if top_logprobs is not None:
        raise invalid("/v1/completions takes the number of alternatives as logprobs: N (top_logprobs is the "
                      "chat API's field)", param="top_logprobs")
    if logprobs is None or logprobs is False:
        return None
    return _top(logprobs, "logprobs")


def responses_logprobs_n(include: Any, top_logprobs: Any) -> int | None:
    """Alternatives per token a Responses request asks for: with ``include`` naming
    ``message.output_text.logprobs`` or a ``top_logprobs``; None when it asks for no logprobs."""
    if top_logprobs is None and "message.output_text.logprobs" not in (include or []):
        return None
    return _top(0 if top_logprobs is None else top_logprobs, "top_logprobs")


@dataclass(frozen=True)
class UnscoredToken:
    """An echoed prompt's first token: nothing before it, so no logprob (null in the answer)."""

    token: int
    logprob: None = None
    top: None = None


@dataclass
class LogprobFormatter:
    """Turns TokenLogprob entries into OpenAI's objects with the model's tokenizer."""

    tokenizer: Any

    def _token(self, token_id: int) -> tuple[str, list[int]]:
        data = self.tokenizer.token_bytes(int(token_id))
        return data.decode("utf-8", errors="replace"), list(data)

    def chat_entries(self, entries: Sequence[Any]) -> list[dict[str, Any]]:
        out = []
        for e in entries:
            text, data = self._token(e.token)
            top = []
            for tid, lp in e.top:
                t_text, t_data = self._token(tid)
                top.append({"token": t_text, "logprob": lp, "bytes": t_data})
            out.append({"token": text, "logprob": e.logprob, "bytes": data, "top_logprobs": top})
        return out

    def chat_object(self, entries: Sequence[Any]) -> dict[str, Any]:
        return {"content": self.chat_entries(entries), "refusal": None}

    def completion_object(self, entries: Sequence[Any], offset: int = 0) -> tuple[dict[str, Any], int]:
        """The legacy object for `entries`, the first at character `offset` of the generated
        text; also returns the offset after them (for the next streamed piece)."""
        tokens: list[str] = []
        logprobs: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for e in entries:
            text, _ = self._token(e.token)
            tokens.append(text)
            logprobs.append(e.logprob)
            tops.append(None if e.top is None else {self._token(tid)[0]: lp for tid, lp in e.top})
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}, offset
