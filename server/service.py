"""The serving core shared by every API flavour: one engine, its slots, prompt preparation.

`Service` turns a normalized chat request (`ChatSpec`) or a raw prompt into
`GenerationPlan`s, validating everything that can be known before any work (model name,
sampling values, tool_choice, the prompt's length against the context), and starts
`GenerationJob`s on free slots. The OpenAI, Anthropic and Responses endpoints are thin
adapters over it.

Tool choice (all API flavours):

* ``none``: tools are not shown to the model and its output is not parsed for calls.
* ``auto`` (default with tools): tools are rendered by the chat template; calls are parsed.
* ``required``: the assistant turn is prefilled with the opening of a call (with the name
  too when only one tool is declared), so the model can only continue a call.
* a named function: the turn is prefilled with ``<tool_call>\\n<function=NAME>\\n`` (XML
  templates) or ``<tool_call>\\n{"name": "NAME", "arguments": `` (JSON templates), and the
  generation stops at the call's end.

Every call is generated under a grammar (`structured.tool_call_grammar`): a function name among
the tools, its parameters typed by their schemas (the required ones present), the call's end,
and with parallel tool calls further calls; the turn then ends. So a call always parses. A forced
call's rest is under it from its prefix on (a response_format does not apply to it); under
``auto`` the model writes freely until it opens a call with ``<tool_call>``, and the call is
under it from there (`GenerationPlan.open_call`); with a response_format too, the answer is in
the format or is such calls (one grammar, `Grammar.or_`).

When the prompt leaves a think block open, the prefix is inserted after the reasoning ends
instead (see `generation`). The prefix is part of the prompt but is fed to the output
parsers, so it appears in the answer only as the structured call it opens.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from starlette.requests import Request

from lucebox.chat_template import ChatTemplate
from lucebox.config import SamplingConfig
from lucebox.errors import ConfigError
from lucebox.grammar import Grammar, compiled_vocabulary
from lucebox.prefix_cache import DiskStore, PrefixCache, disk_namespace

from .config import ServerConfig
from .errors import APIError, invalid
from .generation import ChoiceResult, GenerationJob, GenerationPlan
from .metrics import Metrics
from lucebox.chat_template import prompt_opens_reasoning
from .scheduler import Scheduler
from .streaming import ClientDisconnected, unless_disconnected
from .structured import tool_call_grammar
from lucebox.toolcalls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, forced_call_prefix, template_tool_format

__all__ = ["Service", "ChatSpec", "PreparedChat"]

log = logging.getLogger("lucebox.server")

_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                  "repetition_penalty", "seed")


@dataclass
class ChatSpec:
    """A chat request in the server's own terms (OpenAI message and tool shapes).

    tool_choice: "auto", "none" or "required"; forced_name: a named function (overrides
    tool_choice). enable_thinking: passed to the template when not None. template_kwargs: other
    chat template variables. max_tokens: None means the server default (the rest of the
    context). reasoning_budget: None means the server default. grammar: the answer's language
    (structured outputs; server/structured.py). prediction: the answer the client expects
    (OpenAI's predicted outputs), a source of speculative proposals: the speed changes, the
    answer does not."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str = "auto"
    forced_name: str | None = None
    parallel_tool_calls: bool = True
    enable_thinking: bool | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    stop: list[str] = field(default_factory=list)
    n: int = 1
    reasoning_budget: int | None = None
    grammar: Grammar | None = None
    prediction: str | None = None


@dataclass
class PreparedChat:
    """What a chat request will run: plans (one per choice), the tools the output is parsed
    for (None: no parsing), whether the answer starts inside a think block, prompt length."""

    plans: list[GenerationPlan]
    parse_tools: list[dict[str, Any]] | None
    think_open: bool
    n_prompt: int
    prompt_text: str


def _fix_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI message -> template message: developer is system; tool-call arguments sent as
    JSON text become objects (XML templates iterate over them)."""
    m = dict(message)
    if m.get("role") == "developer":
        m["role"] = "system"
    calls = m.get("tool_calls")
    if isinstance(calls, list):
        fixed = []
        for call in calls:
            if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
                fn = dict(call["function"])
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        parsed = json.loads(args) if args.strip() else {}
                    except ValueError:
                        parsed = None
                    if isinstance(parsed, dict):
                        fn["arguments"] = parsed
                call = {**call, "function": fn}
            fixed.append(call)
        m["tool_calls"] = fixed
    return m


def _warm_vocabulary(tokenizer: Any, n_vocab: int) -> None:
    try:
        compiled_vocabulary(tokenizer, n_vocab)
    except Exception as exc:  # the requests that need it will report it
        log.warning("structured outputs will not work: %s", exc)


class Service:
    """One loaded engine served through `config.slots` sessions."""

    def __init__(self, config: ServerConfig, engine: Any) -> None:
        self.config = config
        self.engine = engine
        self.tokenizer = engine.tokenizer
        if config.chat_template_file:
            with open(config.chat_template_file, encoding="utf-8") as f:
                self.template = ChatTemplate(f.read())
        else:
            self.template = engine.chat_template
        self.tool_format = template_tool_format(self.template.source)
        self.n_ctx = int(engine.config.ctx)
        self.model_name = config.served_name
        self.created = int(time.time())
        from lucebox import __version__

        self._fingerprint = f"lucebox-{__version__}"
        sessions = [engine.session() for _ in range(config.slots)]
        self.scheduler: Scheduler[Any] = Scheduler(sessions, config.queue, config.retry_after)
        self.metrics = Metrics()
        self.metrics.add_gauge("lucebox_queue_depth", "Requests waiting for a slot.", lambda: self.scheduler.queued)
        self.metrics.add_gauge("lucebox_slots_active", "Slots generating or reserved.", lambda: self.scheduler.active)
        self.metrics.add_gauge("lucebox_slots_total", "Session slots.", lambda: self.scheduler.n_slots)
        self.metrics.add_gauge("lucebox_context_tokens", "Context length per slot.", lambda: self.n_ctx)
        # llguidance's view of the vocabulary, built once (0.7-1.5 s for 248k tokens) before the
        # first structured-output request needs it
        threading.Thread(target=_warm_vocabulary, args=(self.tokenizer, int(engine.hparams.n_vocab)),
                         name="lucebox-grammar-vocabulary", daemon=True).start()
        self.prefix_cache: PrefixCache | None = None
        if config.prefix_cache_mb > 0:
            disk, load = None, None
            if config.prefix_cache_dir is not None:
                from lucebox import load_snapshot

                layout = sessions[0].snapshot().fingerprint  # an empty session: a few bytes
                namespace = disk_namespace(layout, engine.model_path, engine.draft_path)
                try:
                    disk = DiskStore(config.prefix_cache_dir, config.prefix_cache_disk_mb << 20, namespace)
                except OSError as exc:
                    raise ConfigError(f"prefix_cache_dir={config.prefix_cache_dir!r}: {exc}") from None
                location = config.prefix_cache_location
                load = lambda path: load_snapshot(path, engine=engine, location=location)  # noqa: E731
            self.prefix_cache = PrefixCache(config.prefix_cache_mb << 20, location=config.prefix_cache_location,
                                            interval_tokens=config.prefix_cache_interval, disk=disk, load=load)
            self._add_prefix_cache_metrics(self.prefix_cache)

    def _add_prefix_cache_metrics(self, cache: PrefixCache) -> None:
        m = self.metrics
        m.add_gauge("lucebox_prefix_cache_hits_total", "Prompts that started from a cached prefix.",
                    lambda: cache.hits, kind="counter")
        m.add_gauge("lucebox_prefix_cache_misses_total", "Long prompts with no cached prefix.",
                    lambda: cache.misses, kind="counter")
        m.add_gauge("lucebox_prefix_cache_hit_tokens_total", "Prompt tokens restored from the prefix cache.",
                    lambda: cache.hit_tokens, kind="counter")
        m.add_gauge("lucebox_prefix_cache_bytes",
                    f"Memory held by prefix-cache snapshots (in {cache.location} memory).", lambda: cache.bytes)
        m.add_gauge("lucebox_prefix_cache_entries", "Snapshots in the prefix cache.", lambda: cache.entries)
        m.add_gauge("lucebox_prefix_cache_evictions_total", "Snapshots evicted from the prefix cache.",
                    lambda: cache.evictions, kind="counter")
        m.add_gauge("lucebox_prefix_cache_too_large_total",
                    "Snapshots not stored because each alone exceeds the whole budget (--prefix-cache-mb).",
                    lambda: cache.too_large, kind="counter")
        m.add_gauge("lucebox_prefix_cache_out_of_memory_total",
                    "Snapshots not taken because memory at the cache's location ran out, even after evicting.",
                    lambda: cache.out_of_memory, kind="counter")
        disk = cache.disk
        if disk is not None:
            counters = disk.counters
            for name, help_text, kind in (
                    ("disk_hits", "Prompts that resumed from a prefix loaded from the disk tier.", "counter"),
                    ("disk_entries", "Snapshots in the disk tier (--prefix-cache-dir).", "gauge"),
                    ("disk_bytes", "Bytes of the disk tier's files.", "gauge"),
                    ("disk_writes", "Snapshots written to the disk tier.", "counter"),
                    ("disk_dropped", "Snapshots not written: the writer was behind, or one exceeded the disk budget.",
                     "counter"),
                    ("disk_errors", "Disk tier writes or loads that failed (see the log).", "counter")):
                m.add_gauge(f"lucebox_prefix_cache_{name}" + ("_total" if kind == "counter" else ""), help_text,
                            lambda name=name: counters()[name], kind=kind)

    @property
    def fingerprint(self) -> str:
        """`system_fingerprint` of answers: the lucebox version and the model file."""
        return self._fingerprint

    def model_card(self) -> dict[str, Any]:
        """The /v1/models entry of the served model."""
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "lucebox",
                "context_length": self.n_ctx, "max_model_len": self.n_ctx,
                "meta": {"draft": self.config.draft is not None,
                         "slots": self.config.slots, "tool_call_format": self.tool_format}}

    # -- validation -------------------------------------------------------------------------
    def check_model(self, name: str | None) -> None:
        """400 unless `name` is None or one of the served model's ids."""
        if name is not None and name not in self.config.accepted_names:
            raise APIError(400, f"the model {name!r} is not served here (this server serves {self.model_name!r})",
                           param="model", code="model_not_found")

    def sampling(self, values: Mapping[str, Any], seed: int | None) -> dict[str, Any]:
        """Session.stream sampling arguments: request values over the server defaults,
        validated (400 naming the field)."""
        cfg = self.config
        out: dict[str, Any] = {"temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k,
                               "min_p": cfg.min_p}
        for key in _SAMPLING_KEYS:
            if values.get(key) is not None:
                out[key] = values[key]
        out["seed"] = (secrets.randbits(63) if seed is None else seed) % (1 << 64)
        bias = values.get("logit_bias")
        if bias:  # OpenAI's form: {"token id": bias}
            parsed: dict[int, float] = {}
            vocab = self.tokenizer.n_vocab
            for key, b in bias.items():
                try:
                    tid = int(key)
                except (TypeError, ValueError):
                    raise invalid(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
                if not 0 <= tid < vocab:
                    raise invalid(f"logit_bias token id {tid} is outside the vocabulary [0, {vocab})",
                                  param="logit_bias")
                parsed[tid] = b
            out["logit_bias"] = parsed
        try:
            SamplingConfig(**out)
        except ConfigError as exc:
            param = str(exc).split("=", 1)[0].split("[", 1)[0] if "=" in str(exc) else None
            raise invalid(str(exc), param=param, code="invalid_value") from None
        return out

    def _room(self, n_prompt: int, param: str) -> int:
        room = self.n_ctx - n_prompt
        if room < 1:
            raise APIError(400, f"this model's context holds {self.n_ctx} tokens, but the prompt has "
                                f"{n_prompt} tokens (at least 1 must remain for the answer)",
                           param=param, code="context_length_exceeded")
        return room

    def _max_tokens(self, requested: int | None, room: int) -> int:
        wanted = requested if requested is not None else (self.config.default_max_tokens or room)
        return max(1, min(wanted, room))

    # -- preparation ------------------------------------------------------------------------
    def _render(self, spec: ChatSpec) -> tuple[str, list[dict[str, Any]] | None, str, str, list[str], str | None]:
        """(prompt text, tools to parse for, echo prefix, after-reasoning prefix, stop strings, the
        forced function's name: None when no call is forced or, under "required" with several
        tools, the model picks it)."""
        tools = spec.tools or None
        names = [t["function"]["name"] for t in tools or []]
        choice = spec.tool_choice
        forced = spec.forced_name
        if forced is not None:
            if not tools:
                raise invalid("tool_choice names a function but no tools were given", param="tool_choice")
            if forced not in names:
                raise invalid(f"tool_choice names {forced!r}, which is not among the tools ({', '.join(names)})",
                              param="tool_choice")
        elif choice == "required":
            if not tools:
                raise invalid("tool_choice is 'required' but no tools were given", param="tool_choice")
            if len(names) == 1:
                forced = names[0]
        elif choice not in ("auto", "none"):
            raise invalid(f"unknown tool_choice {choice!r}", param="tool_choice")
        if choice == "none" and forced is None:
            tools = None
        messages = [_fix_message(m) for m in spec.messages]
        try:
            prompt = self.template.render(messages, tools=tools, add_generation_prompt=True,
                                          enable_thinking=spec.enable_thinking, **spec.template_kwargs)
        except (ValueError, TypeError) as exc:
            raise invalid(str(exc), param="messages") from None
        prefix = ""
        if forced is not None or choice == "required":
            prefix = forced_call_prefix(self.tool_format, forced)
        echo, after = "", ""
        if prefix and prompt_opens_reasoning(prompt):
            after = prefix
        elif prefix:
            prompt += prefix
            echo = prefix
        stop = list(spec.stop)
        if tools and (forced is not None or not spec.parallel_tool_calls):
            stop.append(TOOL_CALL_CLOSE)
        return prompt, tools, echo, after, stop, forced

    def prompt_ids(self, spec: ChatSpec) -> list[int]:
        """The token ids of the prompt `spec` renders to (no context check)."""
        return self.tokenizer.encode(self._render(spec)[0], parse_special=True)

    def prepare_chat(self, spec: ChatSpec) -> PreparedChat:
        """Render, tokenize and plan a chat request; raises APIError (400) for anything invalid."""
        prompt, tools, echo, after, stop, forced = self._render(spec)
        think_open = prompt_opens_reasoning(prompt[: len(prompt) - len(echo)] if echo else prompt)
        ids = self.tokenizer.encode(prompt, parse_special=True)
        room = self._room(len(ids), "messages")
        max_tokens = self._max_tokens(spec.max_tokens, room)
        budget = spec.reasoning_budget if spec.reasoning_budget is not None else self.config.max_reasoning_tokens
        if not think_open:
            budget = None
        points = self._turn_boundaries(spec, tools, ids)
        grammar, open_call = spec.grammar, None
        more = spec.parallel_tool_calls and forced is None
        fmt = self.tool_format
        if (echo or after) and tools:  # a forced call: its rest typed by the tool's schema
            grammar = tool_call_grammar(fmt, tools, echo or after, name=forced, more=more)
        elif grammar is not None and tools:  # the model may call tools instead of answering
            calls = tool_call_grammar(fmt, tools, "", more=more)  # (None: not even untyped calls compile; logged)
            grammar = grammar.or_(calls) if calls is not None else grammar
        elif tools and TOOL_CALL_OPEN not in stop:  # free text until the model opens a call, then typed
            open_call = functools.partial(tool_call_grammar, fmt, tools, more=more)
        base_seed = int(spec.sampling.get("seed") or 0)
        prediction = tuple(self.tokenizer.encode(spec.prediction)) if spec.prediction else ()
        if len(prediction) > self.n_ctx:  # (an answer cannot be longer than the context)
            raise invalid(f"the prediction has {len(prediction)} tokens, more than this model's context of "
                          f"{self.n_ctx}", param="prediction")
        plans = []
        for i in range(spec.n):
            sampling = dict(spec.sampling)
            sampling["seed"] = (base_seed + i) % (1 << 64)
            plans.append(GenerationPlan(prompt_ids=ids, max_tokens=max_tokens, sampling=sampling, stop=tuple(stop),
                                        echo_prefix=echo, think_open=think_open, reasoning_budget=budget,
                                        after_reasoning=after, cache_points=points, grammar=grammar,
                                        open_call=open_call, prediction=prediction))
        return PreparedChat(plans=plans, parse_tools=tools, think_open=think_open, n_prompt=len(ids),
                            prompt_text=prompt)

    def _turn_boundaries(self, spec: ChatSpec, tools: list[dict[str, Any]] | None, ids: list[int]) -> tuple[int, ...]:
        """Prefix-cache points of a chat prompt: the token lengths of the rendered system prompt
        and of every message but the last, where those renderings are token prefixes of `ids`
        (so a later request sharing the system prompt, or the next turn of this chat, starts
        from a snapshot). Empty without a cache or for a short prompt."""
        cache = self.prefix_cache
        if cache is None or len(ids) - 1 < cache.min_tokens:
            return ()
        messages = [_fix_message(m) for m in spec.messages]
        cuts = {len(messages) - 1}
        if messages and messages[0].get("role") == "system":
            cuts.add(1)
        points = []
        for k in sorted(c for c in cuts if 0 < c < len(messages)):
            try:
                text = self.template.render(messages[:k], tools=tools, add_generation_prompt=False,
                                            enable_thinking=spec.enable_thinking, **spec.template_kwargs)
            except Exception:  # a template may refuse a partial conversation: no point there
                continue
            prefix = self.tokenizer.encode(text, parse_special=True)
            if cache.min_tokens <= len(prefix) < len(ids) - 1 and ids[:len(prefix)] == prefix:
                points.append(len(prefix))
        return tuple(points)

    def prepare_prompts(self, prompts: Sequence[str | Sequence[int]], max_tokens: int | None,
                        sampling: dict[str, Any], stop: list[str], n: int,
                        echo: bool = False, grammar: Grammar | None = None,
                        suffix: str | None = None) -> tuple[list[GenerationPlan], int]:
        """Plans for raw prompts (text, parsed with special tokens, or token ids), n per prompt
        (echo: each answer begins with its prompt; grammar: the generated text's language; suffix:
        fill in the middle, the answer is what goes between the prompt and the suffix, in the
        model's fill-in-the-middle tokens). Returns (plans, total prompt tokens)."""
        if suffix is not None and echo:
            raise invalid("echo cannot be combined with suffix (the answer goes between prompt and suffix)",
                          param="suffix")
        plans: list[GenerationPlan] = []
        n_prompt_total = 0
        vocab = self.tokenizer.n_vocab
        base_seed = sampling.get("seed", 0)
        for p_index, prompt in enumerate(prompts):
            head: str | list[int] = prompt if isinstance(prompt, str) else [int(t) for t in prompt]
            bad = [t for t in head if not 0 <= t < vocab] if isinstance(head, list) else []
            if bad:
                raise invalid(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="prompt")
            if suffix is not None:  # (text before a suffix is plain text: fill_in_the_middle encodes it)
                try:
                    ids = self.tokenizer.fill_in_the_middle(head, suffix)
                except ValueError as exc:
                    raise invalid(str(exc), param="suffix", code="unsupported") from None
            else:
                ids = self.tokenizer.encode(head, parse_special=True) if isinstance(head, str) else head
            if not ids:
                raise invalid("the prompt is empty", param="prompt")
            room = self._room(len(ids), "prompt")
            n_prompt_total += len(ids)
            for i in range(n):
                s = dict(sampling)
                s["seed"] = (base_seed + p_index * n + i) % (1 << 64)
                plans.append(GenerationPlan(prompt_ids=ids, max_tokens=self._max_tokens(max_tokens, room),
                                            sampling=s, stop=tuple(stop), echo_prompt=echo, grammar=grammar))
        return plans, n_prompt_total

    # -- running ------------------------------------------------------------------------------
    def _on_choice(self, result: ChoiceResult) -> None:
        if result.finish_reason == "cancelled":
            self.metrics.observe_cancelled()
        tps = result.n_generated / result.decode_seconds if result.decode_seconds > 0 else 0.0
        steps = int(result.spec.get("steps", 0) or 0)
        accept = f", acceptance {(int(result.spec.get('accepted', 0)) + steps) / steps:.2f}" if steps else ""
        log.info("generation %s: prompt %d tokens (%.0f ms), %d tokens at %.1f tok/s%s",
                 result.finish_reason, result.n_prompt, result.prefill_seconds * 1000, result.n_generated, tps, accept)
        self.metrics.observe_generation(result.n_prompt, result.n_generated, result.prefill_seconds,
                                        result.decode_seconds, result.spec)

    async def start(self, plans: Sequence[GenerationPlan], request: Request) -> GenerationJob:
        """Reserve a slot (429 at once when the queue is full), wait for it unless the client
        leaves, and start the plans on it."""
        ticket = self.scheduler.reserve()  # QueueFullError -> 429
        try:
            slot = await unless_disconnected(request, ticket.slot())
        except BaseException:
            ticket.cancel()
            raise
        try:
            job = GenerationJob(self.scheduler, slot, self.tokenizer, plans, self.n_ctx, self._on_choice,
                                prefix_cache=self.prefix_cache)
            job.start()
        except BaseException:
            self.scheduler.release(slot)
            raise
        return job

    async def first_event(self, job: GenerationJob, request: Request) -> tuple[list[Any], bool]:
        """Wait (up to config.stream_header_wait, unless the client leaves) for the job's first
        event so an error at prefill can still be answered with its HTTP status. Returns (events
        already taken, whether the job has ended)."""
        try:
            ev = await unless_disconnected(request, job.next_event(self.config.stream_header_wait))
        except ClientDisconnected:
            job.cancel()
            raise
        except (asyncio.TimeoutError, TimeoutError):
            return [], False
        if ev is None:
            return [], True
        return [ev], False
