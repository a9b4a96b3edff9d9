"""Running generations on a slot in a worker thread, and bridging their output to asyncio.

`GenerationPlan` says what one choice generates. `run_plan` executes it on a session (in the
worker thread); `GenerationJob` runs the plans of one request (one per choice) in a thread and
hands `TextEvent` / `ChoiceDone` / `ErrorEvent` items to the event loop through an
`asyncio.Queue`, then gives the slot back.

A plan may run in two phases on the same session, when the prompt left a think block open and
a thinking budget, a forced tool call or a grammar needs the reasoning to end at a known point:

1. reasoning: generate with ``</think>`` as an extra stop string, at most the budget;
2. answer: if the budget ran out, append ``\\n</think>\\n\\n`` (closing the block for the model);
   else, with a forced call or a grammar, the blank line after the model's ``</think>``;
   append the forced tool-call prefix if any; continue generating up to the rest of
   max_tokens, under the grammar if any. Injected text is emitted like generated text, so the
   parsers see it.

With a prefix cache (`lucebox.prefix_cache.PrefixCache`), a plan starts from the longest
cached prefix of its prompt (the snapshot is restored into the session) instead of an empty
session, and a long prompt is prefilled up to its last token, snapshotted into the cache, and
generated from its last token; a cold run gives the same tokens (see `start_session`).

Contracts: the session is reset (or restored from the cache) before each plan; `cancel` (a
threading.Event) stops the generation at the next committed token (prefill itself cannot be interrupted); the slot is
released only after the engine stopped using the session; an exception from the engine
becomes an `ErrorEvent` and ends the job (never the server).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Sequence, Union

from lucebox.engine import GenerationStats
from lucebox.grammar import Grammar
from lucebox.prefix_cache import start_session

from .logprobs import UnscoredToken
from lucebox.chat_template import THINK_CLOSE
from lucebox.toolcalls import TOOL_CALL_OPEN
from .scheduler import Scheduler, Slot

__all__ = ["GenerationPlan", "ChoiceResult", "TextEvent", "ChoiceDone", "ErrorEvent", "Event",
           "GenerationJob", "run_plan"]

log = logging.getLogger("lucebox.server")

BUDGET_CLOSE = "\n" + THINK_CLOSE + "\n\n"


@dataclass(frozen=True)
class GenerationPlan:
    """One choice to generate.

    prompt_ids: the prompt (already including `echo_prefix`). max_tokens: generated tokens at
    most (already capped by the context). sampling: keyword arguments of `Session.stream`
    (temperature, top_k, top_p, min_p, presence/frequency/repetition penalties, seed).
    stop: stop strings. echo_prefix: text that ends the prompt but belongs to the answer (a
    forced tool-call opening); emitted before the first generated text. think_open: the
    prompt ends inside a think block. reasoning_budget: most tokens of reasoning (think_open
    only). after_reasoning: text appended when the reasoning ends (a forced tool-call opening).
    cache_points: prompt prefix lengths to snapshot into the prefix cache besides the cache's
    own `boundaries` (the ends of chat turns, so a later request sharing the turns hits them).
    echo_prompt: the answer begins with the prompt's text (completions' ``echo``); with
    ``logprobs`` in `sampling`, with the prompt tokens' logprobs too (the first token's unscored),
    which needs every prompt row: the prompt is then scored from an empty session, not the cache.
    grammar: the answer's language (structured outputs); with think_open it applies from the
    answer phase on, so the model reasons freely first. open_call: with tools under ``auto``,
    the grammar of the rest of the turn once the model opens a call in its answer (called with
    the text from ``<tool_call>`` to the end; None: the call goes on unconstrained): the answer
    phase stops at ``<tool_call>`` and goes on under that grammar. prediction: token ids of the
    answer the client expects (OpenAI's predicted outputs), a source of speculative proposals in
    every phase.
    """

    prompt_ids: Sequence[int]
    max_tokens: int
    sampling: dict[str, Any] = field(default_factory=dict)
    stop: tuple[str, ...] = ()
    echo_prefix: str = ""
    think_open: bool = False
    reasoning_budget: int | None = None
    after_reasoning: str = ""
    cache_points: tuple[int, ...] = ()  # extra prefix lengths to snapshot (chat-turn boundaries)
    echo_prompt: bool = False
    grammar: Grammar | None = None
    open_call: Callable[[str], Grammar | None] | None = None
    prediction: tuple[int, ...] = ()

    @property
    def two_phase(self) -> bool:
        return self.think_open and (self.reasoning_budget is not None or bool(self.after_reasoning)
                                    or self.grammar is not None or self.open_call is not None)


@dataclass
class ChoiceResult:
    """How one choice ended. finish_reason: "stop", "length" (max_tokens or the context) or
    "cancelled". n_generated counts generated and injected tokens."""

    finish_reason: str
    n_prompt: int
    n_generated: int
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    spec: dict[str, Any] = field(default_factory=dict)
    stop_sequence: str | None = None  # the stop string that ended it, if one did
    prediction_tokens: int = 0  # the length of the plan's prediction


@dataclass
class TextEvent:
    """Text of one choice, in order; logprobs: the lucebox.TokenLogprob entries of the tokens
    generated since the previous event (when the plan asked for them; text injected by the plan
    has none, and a token's entry may come before or after its text)."""

    choice: int
    text: str
    logprobs: list[Any] | None = None


@dataclass
class ChoiceDone:
    choice: int
    result: ChoiceResult


@dataclass
class ErrorEvent:
    error: BaseException


Event = Union[TextEvent, ChoiceDone, ErrorEvent]

_SUMMED = ("steps", "drafted", "accepted", "predicted_accepted", "fast_rollbacks", "replays",
           "draft_seconds", "verify_seconds", "commit_seconds")


def _merge_spec(total: dict[str, Any], part: dict[str, Any]) -> None:
    for k, v in part.items():
        if k in _SUMMED and isinstance(v, (int, float)):
            total[k] = total.get(k, 0) + v
        elif k == "accept_histogram" and isinstance(v, list):
            old = total.get(k) or []
            n = max(len(old), len(v))
            total[k] = [(old[i] if i < len(old) else 0) + (v[i] if i < len(v) else 0) for i in range(n)]
        elif k not in total:
            total[k] = v


def _ending_with(tokenizer: Any, generated: Sequence[int], candidates: Sequence[str]) -> tuple[str, str] | None:
    """(candidate, text from it to the end) when the last generated token completed one of
    `candidates` (how the engine's stop strings end a generation), else None."""
    if not generated or not candidates:
        return None
    full = tokenizer.decode(list(generated))
    last = len(tokenizer.decode([generated[-1]]))
    best: tuple[int, str] | None = None
    for c in candidates:
        i = full.rfind(c)
        if i >= 0 and i + len(c) >= len(full) - last and (best is None or i < best[0]):
            best = (i, c)
    return None if best is None else (best[1], full[best[0]:])


def _phase(session: Any, tokenizer: Any, prompt: Sequence[int], max_tokens: int, stop: Sequence[str],
           sampling: dict[str, Any], emit: Callable[[str, list[Any] | None], None],
           cancel: threading.Event, grammar: Grammar | None = None,
           prediction: Sequence[int] = ()) -> tuple[str, Any, tuple[str, str] | None]:
    """One `Session.stream` call: (finish reason, GenerationStats (the stream's, or made here where a
    cancel ended it first), (stop string, text from it to the end) when a stop string ended it)."""
    finish, stats = "cancelled", None
    start = len(session.tokens) + len(prompt)
    called_at, first_chunk_at = time.perf_counter(), None
    it = session.stream(list(prompt), max_tokens=max_tokens, stop=list(stop) or None, grammar=grammar,
                        prediction=list(prediction) or None, **sampling)
    try:
        for chunk in it:
            if first_chunk_at is None:
                first_chunk_at = time.perf_counter()
            if chunk.text or chunk.logprobs:
                emit(chunk.text, chunk.logprobs)
            if chunk.finish_reason is not None:
                finish, stats = chunk.finish_reason, chunk.stats
            if cancel.is_set():
                break
    finally:
        it.close()  # cancels the engine at its next token and joins its thread
    if cancel.is_set() and stats is None:
        finish = "cancelled"
        # the stream ended before its stats: count the tokens the session kept, the time to the first
        # chunk as prefill (with the first token's step) and the rest as decoding, so that the metrics
        # see the cancelled work
        now = time.perf_counter()
        first = first_chunk_at if first_chunk_at is not None else now
        stats = GenerationStats(len(prompt), max(0, len(session.tokens) - start), first - called_at, now - first)
    matched = _ending_with(tokenizer, session.tokens[start:], stop) if finish == "stop" else None
    return finish, stats, matched


def _score_prompt(session: Any, tokenizer: Any, prompt_ids: Sequence[int], n_top: int,
                  emit: Callable[[str, list[Any] | None], None]) -> tuple[list[int], float]:
    """Echo with logprobs: reset `session`, score the prompt less its last token (whose entry comes
    from the last scored row), emit the prompt's text with every token's entry, and return the
    ids left to generate from (the last one) and the seconds spent."""
    t0 = time.perf_counter()
    ids = [int(t) for t in prompt_ids]
    session.reset()
    entries: list[Any] = [UnscoredToken(ids[0])]
    if len(ids) > 1:
        entries += session.score(ids[:-1], top_logprobs=n_top, next=ids[-1])
    emit(tokenizer.decode(ids), entries)
    return ids[-1:], time.perf_counter() - t0


def run_plan(session: Any, tokenizer: Any, plan: GenerationPlan, emit: Callable[[str, list[Any] | None], None],
             cancel: threading.Event, n_ctx: int, prefix_cache: Any = None) -> ChoiceResult:
    """Execute `plan` on `session` (reset first, or restored from `prefix_cache`); `emit(text,
    logprobs)` receives the answer's text in order, with the generated tokens' logprobs when the
    plan's sampling asks for them (else None). Raises what the engine raises (ConfigError,
    OutOfMemoryError, LuceboxError)."""
    n_top = plan.sampling.get("logprobs")
    if plan.echo_prompt and n_top is not None:
        first_ids, start_seconds = _score_prompt(session, tokenizer, plan.prompt_ids, n_top, emit)
    else:
        first_ids, start_seconds = start_session(session, plan.prompt_ids, prefix_cache, plan.cache_points)
        if plan.echo_prompt:
            emit(tokenizer.decode(list(plan.prompt_ids)), None)
    prefix_pending = [plan.echo_prefix]

    def out(text: str, logprobs: list[Any] | None = None) -> None:
        if prefix_pending[0]:
            emit(prefix_pending[0], None)
            prefix_pending[0] = ""
        if text or logprobs:
            emit(text, logprobs)

    result = ChoiceResult("stop", len(plan.prompt_ids), 0, prefill_seconds=start_seconds,
                          prediction_tokens=len(plan.prediction))
    remaining = plan.max_tokens

    def account(stats: Any, injected: int = 0) -> None:
        nonlocal remaining
        if stats is not None:
            result.n_generated += stats.n_generated
            result.prefill_seconds += stats.prefill_seconds
            result.decode_seconds += stats.decode_seconds
            _merge_spec(result.spec, dict(stats.spec))
            remaining -= stats.n_generated
        result.n_generated += injected
        remaining -= injected

    def end(finish: str, matched: tuple[str, str] | None = None) -> ChoiceResult:
        out("")  # a forced prefix is part of the answer even if nothing followed it
        result.finish_reason = "length" if finish in ("length", "context") else finish
        result.stop_sequence = matched[0] if matched is not None and finish == "stop" else None
        return result

    prompt: list[int] = first_ids
    if plan.two_phase:
        limit = remaining if plan.reasoning_budget is None else min(remaining, plan.reasoning_budget)
        finish, stats, matched = _phase(session, tokenizer, prompt, limit, tuple(plan.stop) + (THINK_CLOSE,),
                                        plan.sampling, out, cancel, prediction=plan.prediction)
        account(stats)
        if finish == "cancelled":
            result.finish_reason = "cancelled"
            return result
        if matched is not None and matched[0] == THINK_CLOSE:
            out(matched[1])  # the model closed its reasoning: go on with the answer
            # (the answer's grammar starts after the blank line the model would write)
            injection = "\n\n" + plan.after_reasoning if plan.after_reasoning or plan.grammar else ""
        elif finish == "length" and remaining > 0:  # the thinking budget ran out: close the block
            injection = BUDGET_CLOSE + plan.after_reasoning
        else:  # a user stop string, end of sequence, max_tokens or the context
            return end(finish, matched)
        ids = tokenizer.encode(injection, parse_special=True) if injection else []
        if len(session.tokens) + len(ids) + 1 > n_ctx:
            return end("length")
        out(injection)
        account(None, injected=len(ids))
        if remaining <= 0:
            return end("length")
        prompt = ids
    grammar, open_call = plan.grammar, plan.open_call
    while True:
        stop = plan.stop + ((TOOL_CALL_OPEN,) if open_call is not None else ())
        finish, stats, matched = _phase(session, tokenizer, prompt, remaining, stop, plan.sampling, out, cancel,
                                        grammar, plan.prediction)
        account(stats)
        if finish == "cancelled":
            result.finish_reason = "cancelled"
            return result
        if open_call is None or matched is None or matched[0] != TOOL_CALL_OPEN:
            return end(finish, matched)
        out(matched[1])  # the model opened a tool call: the rest of the turn under the tools' grammar
        if remaining <= 0:
            return end("length")
        prompt, grammar, open_call = [], open_call(matched[1]), None


_END = object()


class GenerationJob:
    """The plans of one request running on one slot in a worker thread.

    `events()` yields TextEvent / ChoiceDone / ErrorEvent until the job ends (after an
    ErrorEvent nothing follows). `cancel()` may be called at any time, from the loop."""

    def __init__(self, scheduler: Scheduler[Any], slot: Slot[Any], tokenizer: Any, plans: Sequence[GenerationPlan],
                 n_ctx: int, on_choice: Callable[[ChoiceResult], None] | None = None,
                 prefix_cache: Any = None) -> None:
        self._scheduler = scheduler
        self._slot = slot
        self._tokenizer = tokenizer
        self._plans = list(plans)
        self._n_ctx = n_ctx
        self._on_choice = on_choice
        self._prefix_cache = prefix_cache
        self._cancel = threading.Event()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self.finished = False
        self._thread = threading.Thread(target=self._work, name=f"lucebox-slot-{slot.index}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def _put(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is shutting down
            self._cancel.set()

    def _work(self) -> None:
        try:
            for i, plan in enumerate(self._plans):
                if self._cancel.is_set():
                    break
                result = run_plan(self._slot.session, self._tokenizer, plan,
                                  lambda text, lps, i=i: self._put(TextEvent(i, text, lps)), self._cancel,
                                  self._n_ctx, self._prefix_cache)
                if self._on_choice is not None:
                    self._on_choice(result)
                self._put(ChoiceDone(i, result))
                if result.finish_reason == "cancelled":
                    break
        except BaseException as exc:  # delivered to the request, never raised in the server
            if not isinstance(exc, Exception):
                log.error("generation thread stopped by %r", exc)
            self._put(ErrorEvent(exc))
        finally:
            self._scheduler.release_threadsafe(self._slot)
            self._put(_END)

    async def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event; None when the job has ended; raises TimeoutError after `timeout`."""
        if self.finished:
            return None
        if timeout is None:
            item = await self._queue.get()
        else:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        if item is _END:
            self.finished = True
            return None
        return item

    async def events(self) -> AsyncIterator[Event]:
        while True:
            ev = await self.next_event()
            if ev is None:
                return
            yield ev
