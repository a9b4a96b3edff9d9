"""Server metrics in the Prometheus text exposition format (version 0.0.4), no dependencies.

All updates and `render()` take one lock, so they may be called from the event loop and from
generation threads alike. Names start with ``lucebox_``; counters end in ``_total``.
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any, Callable, Mapping

__all__ = ["Metrics", "ENDPOINTS"]

# Paths reported under their own label; every other path is "other" (bounded cardinality).
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/messages",
             "/v1/messages/count_tokens", "/v1/responses", "/tokenize", "/detokenize", "/health", "/metrics", "/")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def _fmt(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class Metrics:
    """Counters and gauges of one server.

    `gauges` maps a gauge name to a callable read at render time (queue depth, active slots),
    so those values are always current."""

    def __init__(self, gauges: Mapping[str, tuple[str, Callable[[], float]]] | None = None) -> None:
        self._lock = threading.Lock()
        self._start = time.time()
        self._live_gauges: dict[str, tuple[str, Callable[[], float], str]] = {
            name: (help_text, read, "gauge") for name, (help_text, read) in (gauges or {}).items()}
        self.requests: dict[tuple[str, str], int] = defaultdict(int)      # (endpoint, status)
        self.errors: dict[tuple[str, str], int] = defaultdict(int)        # (type, code)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.generations = 0
        self.cancelled = 0
        self.rejected = 0
        self.prefill_seconds = 0.0
        self.decode_seconds = 0.0
        self.spec_steps = 0
        self.spec_drafted = 0
        self.spec_accepted = 0
        self.predicted_accepted = 0
        self.spec_fallbacks = 0
        self.last_decode_tps = 0.0
        self.last_prefill_tps = 0.0
        self.last_acceptance_length = 0.0

    def add_gauge(self, name: str, help_text: str, read: Callable[[], float], kind: str = "gauge") -> None:
        """A value read at render time; kind "counter" for a live counter kept elsewhere."""
        with self._lock:
            self._live_gauges[name] = (help_text, read, kind)

    def observe_request(self, endpoint: str, status: int) -> None:
        label = endpoint if endpoint in ENDPOINTS else "other"
        with self._lock:
            self.requests[(label, str(status))] += 1

    def observe_error(self, type_: str, code: str | None) -> None:
        with self._lock:
            self.errors[(type_, code or "")] += 1

    def observe_rejected(self) -> None:
        with self._lock:
            self.rejected += 1

    def observe_cancelled(self) -> None:
        with self._lock:
            self.cancelled += 1

    def observe_generation(self, n_prompt: int, n_generated: int, prefill_seconds: float,
                           decode_seconds: float, spec: Mapping[str, Any]) -> None:
        """One finished generation (one choice): tokens, timings and speculative counters."""
        with self._lock:
            self.generations += 1
            self.prompt_tokens += n_prompt
            self.completion_tokens += n_generated
            self.prefill_seconds += prefill_seconds
            self.decode_seconds += decode_seconds
            if prefill_seconds > 0:
                self.last_prefill_tps = n_prompt / prefill_seconds
            if decode_seconds > 0 and n_generated > 0:
                self.last_decode_tps = n_generated / decode_seconds
            steps = int(spec.get("steps", 0) or 0)
            if steps:
                accepted = int(spec.get("accepted", 0) or 0)
                self.spec_steps += steps
                self.spec_accepted += accepted
                self.spec_drafted += int(spec.get("drafted", 0) or 0)
                self.predicted_accepted += int(spec.get("predicted_accepted", 0) or 0)
                self.last_acceptance_length = (accepted + steps) / steps
            if spec.get("replays"):
                self.spec_fallbacks += 1

    def render(self) -> str:
        """The metrics page."""
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[Mapping[str, str], float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                lines.append(f"{name}{_labels(labels)} {_fmt(value)}")

        with self._lock:
            family("lucebox_requests_total", "counter", "HTTP requests by endpoint and status code.",
                   [({"endpoint": e, "status": s}, n) for (e, s), n in sorted(self.requests.items())])
            family("lucebox_errors_total", "counter", "Error responses and error stream events by type and code.",
                   [({"type": t, "code": c}, n) for (t, c), n in sorted(self.errors.items())])
            family("lucebox_queue_rejected_total", "counter", "Requests refused with 429 because the queue was full.",
                   [({}, self.rejected)])
            family("lucebox_requests_cancelled_total", "counter",
                   "Generations cancelled because the client went away.", [({}, self.cancelled)])
            family("lucebox_generations_total", "counter", "Finished generations (one per choice).",
                   [({}, self.generations)])
            family("lucebox_prompt_tokens_total", "counter", "Prompt tokens prefilled.", [({}, self.prompt_tokens)])
            family("lucebox_completion_tokens_total", "counter", "Tokens generated.",
                   [({}, self.completion_tokens)])
            family("lucebox_prefill_seconds_total", "counter", "Time spent in prefill.",
                   [({}, self.prefill_seconds)])
            family("lucebox_decode_seconds_total", "counter", "Time spent in decode.", [({}, self.decode_seconds)])
            family("lucebox_decode_tokens_per_second", "gauge", "Decode speed of the last generation.",
                   [({}, self.last_decode_tps)])
            family("lucebox_prefill_tokens_per_second", "gauge", "Prefill speed of the last generation.",
                   [({}, self.last_prefill_tps)])
            family("lucebox_spec_steps_total", "counter", "Speculative decoding steps (draft + verify).",
                   [({}, self.spec_steps)])
            family("lucebox_spec_drafted_tokens_total", "counter", "Draft tokens proposed.",
                   [({}, self.spec_drafted)])
            family("lucebox_spec_accepted_tokens_total", "counter", "Draft tokens accepted by the target.",
                   [({}, self.spec_accepted)])
            family("lucebox_predicted_accepted_tokens_total", "counter",
                   "Of them, tokens proposed from a request's prediction (predicted outputs).",
                   [({}, self.predicted_accepted)])
            family("lucebox_spec_acceptance_length", "gauge",
                   "Tokens committed per speculative step in the last generation (accepted + 1).",
                   [({}, self.last_acceptance_length)])
            family("lucebox_spec_acceptance_length_mean", "gauge",
                   "Tokens committed per speculative step over all generations.",
                   [({}, (self.spec_accepted + self.spec_steps) / self.spec_steps if self.spec_steps else 0.0)])
            family("lucebox_spec_fallbacks_total", "counter",
                   "Generations that rolled back by restore-and-replay instead of a verify checkpoint.",
                   [({}, self.spec_fallbacks)])
            family("lucebox_uptime_seconds", "gauge", "Seconds since the server started.",
                   [({}, time.time() - self._start)])
            gauges = list(self._live_gauges.items())
        for name, (help_text, read, kind) in gauges:
            try:
                value = float(read())
            except Exception:  # a gauge must never break the page
                continue
            family(name, kind, help_text, [({}, value)])
        return "\n".join(lines) + "\n"
