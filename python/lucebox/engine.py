"""`lucebox.Engine` and `lucebox.Session`: load a qwen35 GGUF and generate.

The C++ core runs every forward pass and the whole token loop with the GIL released; Python
turns text or chat messages into token ids, applies stop strings, and streams decoded text.
"""
from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, Union

import numpy as np

from lucebox import _core
from lucebox.chat_output import ChatMessage, ChatOutput
from lucebox.chat_template import THINK_CLOSE, ChatTemplate, prompt_opens_reasoning
from lucebox.config import EngineConfig, SamplingConfig, check_snapshot_location, kv_cache_types, stop_list
from lucebox.errors import ConfigError
from lucebox.grammar import Grammar, GrammarConstraint
from lucebox.tokenizer import Tokenizer

Prompt = Union[str, Sequence[int], Sequence[dict]]
# The proposal test hooks. Their context is the session's tokens so far, a read-only int32 array.
# Forced chain: (context, last token, n) -> n proposals.
Propose = Callable[[np.ndarray, int, int], list[int]]
# Forced tree: (context, last token, max nodes) -> (tokens, parents) of the non-root nodes.
ProposeTree = Callable[[np.ndarray, int, int], tuple[list[int], list[int]]]


@dataclass
class GenerationStats:
    """Counts and timings of one generation. `spec` holds the speculative-decoding counters
    (steps, drafted, accepted, accept_histogram, fast_rollbacks, replays, plain_steps: the
    one-token steps spec="auto" took where speculating did not pay, and draft/verify/commit
    seconds when phase timings were requested)."""

    n_prompt: int
    n_generated: int
    prefill_seconds: float
    decode_seconds: float
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def acceptance_length(self) -> float:
        """Committed tokens per speculative step (accepted proposals + the target's token)."""
        steps = self.spec.get("steps", 0)
        return (self.spec.get("accepted", 0) + steps) / steps if steps else 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.n_prompt / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        return self.n_generated / self.decode_seconds if self.decode_seconds > 0 else 0.0


def _check_top_logprobs(name: str, value: object) -> None:
    """A count of alternatives reported per token: an integer in [0, MAX_TOP_LOGPROBS]."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _core.MAX_TOP_LOGPROBS:
        raise ConfigError(f"{name}={value!r} must be an integer in [0, {_core.MAX_TOP_LOGPROBS}] "
                          "(the alternatives reported per token)")


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log probability under the model: the log-softmax of its raw logits (no
    temperature, penalties or top-k/p, as OpenAI reports them), and its `top` most likely
    alternatives as (token id, logprob), best first (the lower id first on ties)."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class GenerationResult:
    """A finished generation: text (stop string excluded), token ids, why it ended, and stats.
    finish_reason is "stop" (stop token or string), "length" (max_tokens), "context" (the
    context is full) or "cancelled". logprobs: with logprobs=N, one TokenLogprob per token of
    `tokens`; else None. message: for a prompt of chat messages (Engine.generate), the reply split
    into reasoning, content and tool calls (parsed when tools were given); else None."""

    text: str
    tokens: list[int]
    finish_reason: str
    stats: GenerationStats
    logprobs: list[TokenLogprob] | None = None
    message: ChatMessage | None = None


@dataclass
class GenerationChunk:
    """One streamed piece: new text and the token ids generated since the previous chunk (their
    concatenation over a stream is the result's `tokens`; a token whose text is held back, e.g. as
    a possible stop string's start, comes with the chunk that releases it). logprobs: one per id
    of `tokens` with logprobs=N. The last chunk has finish_reason set and carries the final stats
    (and, for a prompt of chat messages, the whole reply's `message`, as GenerationResult's)."""

    text: str
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: GenerationStats | None = None
    logprobs: list[TokenLogprob] | None = None
    message: ChatMessage | None = None


class Engine:
    """A qwen35 target loaded on one device, or over several (devices=[...], split="layer").

    >>> engine = lucebox.Engine("model.gguf", ctx=8192)
    >>> engine.generate("Hello", max_tokens=32).text
    """

    def __init__(self, model: str | os.PathLike[str], draft: str | os.PathLike[str] | None = None, *,
                 ctx: int = 4096, kv_type: str | None = None, kv_type_k: str | None = None, kv_type_v: str | None = None,
                 device: str = "auto", spec: str = "auto", rollback: str = "fast", ubatch: int = 512, threads: int = 0,
                 capture_layers: Sequence[int] = (), devices: Sequence[str] = (), split: str = "none",
                 layer_proportions: Sequence[float] = (), draft_device: str = "",
                 progress: Callable[[int, int], None] | None = None,
                 tree_budget: int = 22, tree_top_k: int = 8) -> None:
        kv_type_k, kv_type_v = kv_cache_types(kv_type, kv_type_k, kv_type_v)
        if isinstance(devices, str):
            raise ConfigError(f"devices={devices!r} must be a sequence of device names, e.g. ['cuda:0', 'cuda:1']")
        self.config = EngineConfig(ctx=ctx, kv_type_k=kv_type_k, kv_type_v=kv_type_v, device=device,
                                   ubatch=ubatch, threads=threads, spec=spec, rollback=rollback,
                                   tree_budget=tree_budget, tree_top_k=tree_top_k,
                                   capture_layers=tuple(capture_layers), devices=tuple(devices), split=split,
                                   layer_proportions=tuple(layer_proportions), draft_device=draft_device)
        self.model_path = os.fspath(model)
        target = _core.TargetFile.open(self.model_path)
        self.draft_path = os.fspath(draft) if draft is not None else None
        if self.draft_path is not None:
            draft_file = _core.DraftFile.open(self.draft_path)
            _core.validate_draft(target, draft_file)
        elif spec in ("chain", "tree"):
            raise ConfigError(f"spec={spec!r} needs a DFlash draft")
        if self.draft_path is not None and spec == "ngram":
            raise ConfigError("spec='ngram' proposes from the context and takes no draft (with a draft: "
                              "'auto', 'chain' or 'tree')")
        self.tokenizer = Tokenizer.from_gguf(self.model_path)
        self.chat_template = ChatTemplate.from_gguf(self.model_path)
        core_cfg = self.config.to_core(self.model_path)
        if self.draft_path is not None and spec != "off":  # spec="off": validated above, not loaded
            core_cfg.draft_path = self.draft_path
            core_cfg.spec = spec  # "chain"/"tree": every step speculates; "auto": while that is faster
        elif spec == "ngram":
            core_cfg.spec = spec  # no draft: proposals looked up in the context, while that is faster
        if draft_device and (self.draft_path is None or spec == "off"):
            if self.draft_path is None:
                raise ConfigError(f"draft_device={draft_device!r} is set but there is no draft model")
            core_cfg.draft_device = ""  # the draft is not loaded (spec="off")
        self._core = _core.Engine(core_cfg, progress)
        self._default_session: Session | None = None

    def memory_plan(self) -> dict[str, int]:
        """What this engine's state costs, in bytes, per session: weights, KV cache, recurrent
        state, verify checkpoints (one per verified token: its conv input, and its whole DeltaNet
        state, or for chain verifies of layers that run the fused step, its fused inputs; with
        spec="tree" one per tree node), feature ring, and bytes_per_verified_token (the cost of one
        more verified token or tree node). Compute buffers are not included."""
        return dict(self._core.plan())

    @property
    def hparams(self) -> _core.Qwen35HParams:
        return self._core.hparams

    @property
    def device(self) -> str:
        return f"{self._core.device_name} ({self._core.device_description})"

    def copy_snapshot(self, snapshot: _core.Snapshot, location: str = "device") -> _core.Snapshot:
        """`snapshot` with its data at `location` of this engine ("device": this engine's device
        memory; "host": pinned host memory when the device offers it). Returns the same snapshot
        when it is already there. Raises OutOfMemoryError when it does not fit."""
        return self._core.copy_snapshot(snapshot, check_snapshot_location(location))

    def session(self) -> "Session":
        """A new, empty sequence with its own KV cache and recurrent state."""
        return Session(self)

    def encode_prompt(self, prompt: Prompt, *, add_generation_prompt: bool = True,
                      enable_thinking: bool | None = None, tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids for a text prompt, chat messages (rendered with the model's template) or ids."""
        return self._encode(prompt, add_generation_prompt, enable_thinking, tools)[0]

    def _encode(self, prompt: Prompt, add_generation_prompt: bool = True, enable_thinking: bool | None = None,
                tools: list[dict[str, Any]] | None = None) -> tuple[list[int], str | None]:
        """(token ids, the rendered text of chat messages or None) of a prompt."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt), None
        items = list(prompt)
        if not items:
            raise ConfigError("the prompt is empty")
        if all(isinstance(m, dict) for m in items):
            text = self.chat_template.render(items, tools=tools, add_generation_prompt=add_generation_prompt,
                                             enable_thinking=enable_thinking)
            return self.tokenizer.encode(text, parse_special=True), text
        if all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in items):
            return [int(t) for t in items], None
        raise ConfigError("prompt must be a string, a list of chat messages (dicts) or a list of token ids")

    def generate(self, prompt: Prompt, *, max_tokens: int = 256, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0, repetition_penalty: float = 1.0, penalty_last_n: int = 64,
                 seed: int = 0, logit_bias: Any = (), stop: str | Sequence[str] | None = None, stream: bool = False,
                 tools: list[dict[str, Any]] | None = None,
                 enable_thinking: bool | None = None,
                 prefill_progress: Callable[[int, int], None] | None = None,
                 phase_timings: bool = False, logprobs: int | None = None,
                 grammar: Grammar | None = None,
                 prediction: str | Sequence[int] | None = None) -> GenerationResult | Iterator[GenerationChunk]:
        """Generate from a fresh session. Returns a GenerationResult, or an iterator of chunks when
        stream=True. logprobs=N (0..20) reports each token's log probability and its N most likely
        alternatives (TokenLogprob). grammar (lucebox.Grammar) restricts the output to its language;
        for chat messages whose rendered prompt opens a think block (a thinking template), after
        the reasoning: the model reasons freely until ``</think>``, then answers in the grammar
        (`Grammar.after`). prediction: the output expected (text or ids), a source of speculative
        proposals that changes the speed only (Session.generate). For chat messages the result's
        `message` (stream: the last chunk's) is the reply split into reasoning, content and tool
        calls (with `tools`: the calls the model wrote, in the template's XML or JSON format, their
        arguments typed by the tools' schemas; `message.to_dict()` is the assistant turn to append
        for the next request). Raises ConfigError for invalid parameters or a prompt longer than
        the context, before any work."""
        ids, text = self._encode(prompt, enable_thinking=enable_thinking, tools=tools)
        think_open = text is not None and prompt_opens_reasoning(text)
        if isinstance(grammar, Grammar) and think_open:
            grammar = grammar.after(THINK_CLOSE)
        session = self.session()
        kwargs = dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                      presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                      repetition_penalty=repetition_penalty, penalty_last_n=penalty_last_n, seed=seed,
                      logit_bias=logit_bias, stop=stop,
                      prefill_progress=prefill_progress,
                      phase_timings=phase_timings, logprobs=logprobs, grammar=grammar, prediction=prediction)
        if text is None:  # text or ids: no chat reply to split
            return session.stream(ids, **kwargs) if stream else session.generate(ids, **kwargs)
        if stream:
            return _with_message(session.stream(ids, **kwargs), ChatOutput(think_open, tools))
        result = session.generate(ids, **kwargs)
        output = ChatOutput(think_open, tools)
        output.feed(result.text)
        output.finish()
        result.message = output.message()
        return result


def _with_message(chunks: Iterator[GenerationChunk], output: ChatOutput) -> Iterator[GenerationChunk]:
    """The chunks of a chat reply, the last with the reply split into a ChatMessage."""
    try:
        for chunk in chunks:
            output.feed(chunk.text)
            if chunk.finish_reason is not None:
                output.finish()
                chunk.message = output.message()
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()  # (a consumer that stops early cancels the generation)


class Session:
    """One sequence on an engine: holds its context (KV cache and recurrent state).

    `append(ids)` evaluates tokens; `generate(...)` continues the context; `reset()` empties it.
    A session is not thread-safe; use one per concurrent request."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._core = engine._core.new_session()

    @property
    def n_past(self) -> int:
        return self._core.n_past

    @property
    def tokens(self) -> list[int]:
        """Evaluated tokens plus the pending (generated, not yet evaluated) one, if any."""
        toks = list(self._core.tokens)
        if self._core.pending_token >= 0:
            toks.append(self._core.pending_token)
        return toks

    def reset(self) -> None:
        self._core.reset()

    def snapshot(self, location: str = "host") -> _core.Snapshot:
        """Copy of this session's state (tokens, KV rows, DeltaNet state, draft KV).

        location: where the copy's tensor data lives. "host" (default): host memory, pinned
        (page-locked) when the device offers it (CUDA), so restoring runs at full bus speed.
        "device": the engine's device memory, so restoring is a device-to-device copy (the
        fastest; it costs device memory). On a CPU engine both are the same plain memory
        (`snapshot.location` still says what was asked). Raises ConfigError for another value and
        OutOfMemoryError (naming the bytes) when the memory is short; the session is unchanged.

        `restore` it into any session of an engine with the same model, KV types and draft to
        continue token-identically; `snapshot.save(path)` / `lucebox.load_snapshot(path)` keep it
        on disk (a versioned file, written through host memory for a device snapshot; one from
        another layout is refused on restore). `snapshot.to_host()` copies a device snapshot to
        host memory; `engine.copy_snapshot(snapshot, "device")` the other way."""
        return self._core.snapshot(check_snapshot_location(location))

    @property
    def snapshot_nbytes(self) -> int:
        """Bytes a snapshot taken now would hold (`Snapshot.nbytes`), computed without copying."""
        return self._core.snapshot_nbytes

    @property
    def state_nbytes(self) -> int:
        """Bytes of memory this session holds for its state (KV caches, recurrent state, verify
        checkpoints, feature rings, the draft's caches); a tree asked of a session made for chain
        speculation adds its DeltaNet state checkpoints on first use."""
        return self._core.state_nbytes

    def restore(self, snapshot: _core.Snapshot) -> None:
        """Replace this session's state by `snapshot` (host or device). Raises ConfigError if it
        was taken with another model/KV/draft layout or does not fit this engine's context."""
        self._core.restore(snapshot)

    def eval(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        """Append tokens and return their logits, float32 [len(tokens) or 1, n_vocab]."""
        return self._core.eval([int(t) for t in tokens], all_logits)

    def score(self, tokens: Sequence[int], *, top_logprobs: int = 0, next: int | None = None) -> list[TokenLogprob]:
        """Append `tokens` (like eval) and return the logprobs of tokens[1:], each after the context
        and the tokens before it, then, if `next` is given, of `next` after all of them (it is not
        appended): each a TokenLogprob with `top_logprobs` (0..20) most likely alternatives. The
        rows stay on the device (only their top candidates and normalizers come back), so long
        prompts cost no vocabulary-sized copies."""
        _check_top_logprobs("top_logprobs", top_logprobs)
        ids = [int(t) for t in tokens]
        entries = self._core.score(ids, top_logprobs, -1 if next is None else int(next))
        targets = ids[1:] + ([int(next)] if next is not None else [])
        return [TokenLogprob(t, e.logprob, [(int(i), float(v)) for i, v in e.top]) for t, e in zip(targets, entries)]

    def append(self, tokens: Sequence[int]) -> None:
        """Append tokens (prefill) without returning logits."""
        self._core.eval([int(t) for t in tokens], False)

    def _prediction(self, prediction: str | Sequence[int] | None) -> list[int]:
        """The ids of an expected output (text is encoded as the model writes it: special tokens'
        text as their ids)."""
        if prediction is None:
            return []
        if isinstance(prediction, str):
            return self.engine.tokenizer.encode(prediction)
        ids = list(prediction)
        if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in ids):
            raise ConfigError("prediction must be text or a list of token ids")
        return [int(t) for t in ids]

    def _prepare(self, prompt: Prompt, max_tokens: int, stop: str | Sequence[str] | None, logprobs: int | None,
                 grammar: Grammar | None, **sampling: Any) -> tuple[list[int], SamplingConfig, list[str]]:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ConfigError(f"max_tokens={max_tokens!r} must be a non-negative integer")
        if logprobs is not None:
            _check_top_logprobs("logprobs", logprobs)
        if grammar is not None and not isinstance(grammar, Grammar):
            raise ConfigError(f"grammar must be a lucebox.Grammar, not {type(grammar).__name__}")
        ids = self.engine.encode_prompt(prompt) if not (isinstance(prompt, (list, tuple)) and not prompt) else []
        return ids, SamplingConfig(**sampling), stop_list(stop)

    def _run(self, ids: list[int], max_tokens: int, sampling: SamplingConfig, stops: list[str],
             emit: Callable[[str, list[int], list[TokenLogprob]], None],
             cancelled: Callable[[], bool] = lambda: False,
             prefill_progress: Callable[[int, int], None] | None = None,
             propose: Propose | None = None, block_size: int = 0,
             phase_timings: bool = False, propose_tree: ProposeTree | None = None,
             logprobs: int | None = None,
             grammar: Grammar | None = None,
             prediction: Sequence[int] = ()) -> tuple[Any, str, list[int], list[TokenLogprob]]:
        """Runs the C++ generation; `emit(text, ids, logprobs)` receives decoded pieces with the
        ids (and their logprobs, if asked for) generated since the previous piece. Returns the core
        result, the full text (cut at a stop string), the kept token ids and their logprobs."""
        tok = self.engine.tokenizer
        decoder = tok.incremental_decoder()
        text_parts: list[str] = []
        kept: list[int] = []
        kept_lps: list[TokenLogprob] = []
        unsent = [0]  # kept[unsent[0]:] have not gone out with a piece yet
        state = {"text": "", "stopped": False, "held": ""}
        longest = max((len(s) for s in stops), default=0)

        def send(text: str) -> None:
            text_parts.append(text)
            emit(text, kept[unsent[0]:], kept_lps[unsent[0]:])
            unsent[0] = len(kept)

        def on_token(t: int, lp: Any = None) -> bool:
            kept.append(t)
            if lp is not None:
                kept_lps.append(TokenLogprob(t, lp.logprob, [(int(i), float(v)) for i, v in lp.top]))
            piece = decoder.feed(t)
            if not stops:
                if piece:
                    send(piece)
                return not cancelled()
            state["held"] += piece
            full = state["text"] + state["held"]
            hits = [full.find(s, max(0, len(state["text"]) - longest)) for s in stops]
            hits = [h for h in hits if h >= 0]
            if hits:
                cut = min(hits)
                out = full[len(state["text"]):cut]
                if out or unsent[0] < len(kept):  # the stop string's own tokens go out too, with no text
                    send(out)
                state["stopped"] = True
                return False
            # hold back a tail that could start a stop string
            safe = len(full) - (longest - 1)
            if safe > len(state["text"]):
                out = full[len(state["text"]):safe]
                state["text"] = full[:safe]
                state["held"] = full[safe:]
                send(out)
            return not cancelled()

        stop_ids = sorted(tok.eos_ids)
        constraint = None if grammar is None else GrammarConstraint(grammar, tok, self._core.n_vocab, stop_ids)
        res = self._core.generate(ids, max_tokens, sampling.to_core(), stop_ids, on_token, prefill_progress,
                                  propose, block_size, phase_timings, propose_tree,
                                  -1 if logprobs is None else logprobs, constraint, list(prediction))
        if constraint is not None:
            constraint.check()
        if not state["stopped"]:
            tail = state["held"] + decoder.flush()
            if tail or unsent[0] < len(kept):
                send(tail)
        return res, "".join(text_parts), kept, kept_lps

    @staticmethod
    def _stats(res: Any) -> GenerationStats:
        return GenerationStats(res.n_prompt, res.n_generated, res.prefill_seconds, res.decode_seconds,
                               dict(res.spec_stats))

    def generate(self, prompt: Prompt = (), *, max_tokens: int = 256, stop: str | Sequence[str] | None = None,
                 prefill_progress: Callable[[int, int], None] | None = None,
                 propose: Propose | None = None, block_size: int = 0,
                 phase_timings: bool = False, propose_tree: ProposeTree | None = None,
                 logprobs: int | None = None, grammar: Grammar | None = None,
                 prediction: str | Sequence[int] | None = None, **sampling: Any) -> GenerationResult:
        """Append `prompt` (text, messages or ids) and generate up to max_tokens tokens.
        prefill_progress(done, total) is called after each prefill micro-batch. `propose(context,
        last, n)` (tests; context: the session's tokens, a read-only int32 array) replaces the
        draft's proposals with n forced token ids, verify width `block_size` (default 16);
        `propose_tree(context, last, max_nodes)` (tests, the same context) replaces the
        draft's tree: it returns (tokens, parents) of at most max_nodes non-root nodes, node i+1
        with parent parents[i] in [0, i] (0 = the root), verified as with spec="tree";
        phase_timings measures draft/verify/commit time; logprobs=N (0..20) fills the result's
        logprobs (TokenLogprob: each token's log probability and its N most likely alternatives);
        grammar (lucebox.Grammar) makes every generated token one its language allows (the
        generation stops when it is complete; GrammarError if its parser fails); prediction (text
        or ids: the output expected, such as a file being rewritten; OpenAI's predicted outputs)
        is a source of speculative proposals, looked up where the output matches it: it changes
        the speed only, never the tokens (stats.spec["predicted_accepted"]: proposals taken from it
        and accepted)."""
        ids, cfg, stops = self._prepare(prompt, max_tokens, stop, logprobs, grammar, **sampling)
        res, text, kept, lps = self._run(ids, max_tokens, cfg, stops, lambda _t, _i, _l: None,
                                         prefill_progress=prefill_progress, propose=propose, block_size=block_size,
                                         phase_timings=phase_timings, propose_tree=propose_tree, logprobs=logprobs,
                                         grammar=grammar, prediction=self._prediction(prediction))
        finish = "stop" if res.finish_reason == "cancelled" and stops else res.finish_reason
        return GenerationResult(text=text, tokens=kept, finish_reason=finish, stats=self._stats(res),
                                logprobs=lps if logprobs is not None else None)

    def stream(self, prompt: Prompt = (), *, max_tokens: int = 256, stop: str | Sequence[str] | None = None,
               prefill_progress: Callable[[int, int], None] | None = None, phase_timings: bool = False,
               logprobs: int | None = None, grammar: Grammar | None = None,
               prediction: str | Sequence[int] | None = None, **sampling: Any) -> Iterator[GenerationChunk]:
        """Like generate(), yielding chunks as tokens are committed (with logprobs=N, each chunk's
        logprobs). Parameters are validated before the first chunk; closing the iterator cancels
        the generation."""
        ids, cfg, stops = self._prepare(prompt, max_tokens, stop, logprobs, grammar, **sampling)
        predicted = self._prediction(prediction)
        q: queue.Queue[Any] = queue.Queue()
        cancel = threading.Event()
        done = object()

        def emit(text: str, toks: list[int], lps: list[TokenLogprob]) -> None:
            q.put(GenerationChunk(text=text, tokens=toks, logprobs=lps if logprobs is not None else None))

        def worker() -> None:
            try:
                res, _text, _kept, _lps = self._run(ids, max_tokens, cfg, stops, emit, cancel.is_set,
                                                    prefill_progress, phase_timings=phase_timings, logprobs=logprobs,
                                                    grammar=grammar, prediction=predicted)
                finish = "stop" if res.finish_reason == "cancelled" and not cancel.is_set() else res.finish_reason
                q.put(GenerationChunk(text="", finish_reason=finish, stats=self._stats(res),
                                      logprobs=[] if logprobs is not None else None))
            except BaseException as exc:  # delivered to the consumer
                q.put(exc)
            finally:
                q.put(done)

        thread = threading.Thread(target=worker, name="lucebox-generate", daemon=True)
        thread.start()
        return self._drain(q, done, thread, cancel)

    @staticmethod
    def _drain(q: "queue.Queue[Any]", done: object, thread: threading.Thread,
               cancel: threading.Event) -> Iterator[GenerationChunk]:
        try:
            while True:
                item = q.get()
                if item is done:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancel.set()
            thread.join()


def load_snapshot(path: str | os.PathLike[str], *, engine: Engine | None = None,
                  location: str = "host") -> _core.Snapshot:
    """Read a snapshot written by `Snapshot.save`. Without `engine` the data lands in plain host
    memory; with it, in that engine's memory at `location` ("host": pinned when the device
    offers it; "device": the engine's device). Raises ConfigError for a missing, truncated or
    foreign file, or for location="device" without an engine."""
    check_snapshot_location(location)
    if engine is None:
        if location != "host":
            raise ConfigError("load_snapshot: location='device' needs the engine whose device holds it")
        return _core.Snapshot.load(os.fspath(path))
    return engine._core.load_snapshot(os.fspath(path), location)
