"""Typed configuration of the engine and of sampling, validated at construction.

These dataclasses are the Python face of the C++ structs `engine_config` and `sampling_params`
(cpp/include/lucebox/engine.h, sampling.h); `to_core()` converts them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from lucebox.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from lucebox import _core

KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
SPEC_MODES = ("auto", "off", "chain", "tree", "ngram")
# Placement of the target over devices (docs/multi-gpu.md): one device, contiguous layer ranges
# per device, or tensor parallel (heads and FFN channels dealt over the devices; cuda:N or cpu:N).
SPLIT_MODES = ("none", "layer", "tensor")
MAX_DEVICES = 16
ROLLBACK_MODES = ("fast", "replay")
# Where a session snapshot keeps its tensor data (see `Session.snapshot`).
SNAPSHOT_LOCATIONS = ("host", "device")


def check_snapshot_location(location: object) -> str:
    """`location` if it is one of SNAPSHOT_LOCATIONS, else ConfigError."""
    if not isinstance(location, str) or location not in SNAPSHOT_LOCATIONS:
        raise ConfigError(f"snapshot location {location!r} must be one of {', '.join(SNAPSHOT_LOCATIONS)}")
    return location


def kv_cache_types(kv_type: str | None, kv_type_k: str | None = None, kv_type_v: str | None = None) -> tuple[str, str]:
    """The K and V cache types: each cache's own type where given, else kv_type (both caches), else f16.
    The one rule of Engine, the CLI's --kv-type / --kv-type-k / --kv-type-v and the server's config."""
    default = kv_type if kv_type is not None else "f16"
    return (kv_type_k if kv_type_k is not None else default, kv_type_v if kv_type_v is not None else default)


@dataclass(frozen=True)
class EngineConfig:
    """How an engine loads and runs a model.

    ctx: tokens of context per session. kv_type_k / kv_type_v: KV cache types. device: "auto"
    (first GPU, else CPU), "cpu", "cuda", "cuda:N" or a ggml device name. ubatch: prefill
    micro-batch. threads: CPU threads (0: all). spec: speculative decoding with a draft: "auto" (the
    default) speculates while that is measured to be faster than plain decoding and decodes
    plainly otherwise, "chain" speculates every step, "tree" verifies a best-first tree of the
    draft's top-k continuations every step (DDTree; greedy or sampled acceptance, rollback "fast"), "off"
    never; without a draft "auto" is off and "chain" / "tree" are errors. "ngram" (no draft)
    speculates from the context itself: prompt lookup, what followed an earlier occurrence of its
    last tokens, verified as a chain while that is measured to be faster; for text that repeats
    its context (code edits). rollback: how a partly
    rejected verify restores the DeltaNet state: "fast" (per-token checkpoints, one copy) or
    "replay" (one backup, re-run the kept tokens; less memory, more compute). tree_budget: tree
    nodes besides the root (1..256; each costs one recurrent checkpoint, see the memory plan);
    tree_top_k: draft candidates per position (1..64).

    Placement over several devices of one host: devices lists them ("cuda:0", "cuda:1", ...; also
    "cpu:N", a distinct CPU backend instance, for tests), split is "none" (one device), "layer"
    (contiguous layer ranges, one per device, sized by layer_proportions: one positive weight per
    device, default even) or "tensor" (tensor parallel: every layer's heads and FFN channels dealt over
    the devices, through ggml's meta backend; cuda:N or cpu:N). draft_device: where the DFlash
    draft runs (default: the last device). Device presence is checked when the engine is built.
    """

    ctx: int = 4096
    kv_type_k: str = "f16"
    kv_type_v: str = "f16"
    device: str = "auto"
    ubatch: int = 512
    threads: int = 0
    spec: str = "auto"
    rollback: str = "fast"
    tree_budget: int = 22
    tree_top_k: int = 8
    capture_layers: tuple[int, ...] = field(default_factory=tuple)
    devices: tuple[str, ...] = field(default_factory=tuple)
    split: str = "none"
    layer_proportions: tuple[float, ...] = field(default_factory=tuple)
    draft_device: str = ""

    def __post_init__(self) -> None:
        _check_int("ctx", self.ctx, 1, 1 << 24)
        _check_int("ubatch", self.ubatch, 1, 8192)
        _check_int("threads", self.threads, 0, 4096)
        for name in ("kv_type_k", "kv_type_v"):
            value = getattr(self, name)
            if value not in KV_TYPES:
                raise ConfigError(f"{name}={value!r} is not a supported KV cache type (expected one of {', '.join(KV_TYPES)})")
        if not isinstance(self.device, str) or not self.device:
            raise ConfigError(f"device={self.device!r} must be a non-empty string")
        if self.spec not in SPEC_MODES:
            raise ConfigError(f"spec={self.spec!r} must be one of {', '.join(SPEC_MODES)}")
        if self.rollback not in ROLLBACK_MODES:
            raise ConfigError(f"rollback={self.rollback!r} must be one of {', '.join(ROLLBACK_MODES)}")
        _check_int("tree_budget", self.tree_budget, 1, 256)
        _check_int("tree_top_k", self.tree_top_k, 1, 64)
        if self.spec == "tree" and self.rollback != "fast":
            raise ConfigError("spec='tree' needs rollback='fast' (a tree commits from its verify checkpoints)")
        self._check_placement()

    def _check_placement(self) -> None:
        """The placement rules of engine_config::validate (cpp/src/placement.cpp), checked here first
        so a bad placement fails before any file is opened."""
        if self.split not in SPLIT_MODES:
            raise ConfigError(f"split={self.split!r} must be one of {', '.join(SPLIT_MODES)}")
        devices = self.devices
        if isinstance(devices, str) or not isinstance(devices, (tuple, list)):
            raise ConfigError(f"devices={devices!r} must be a sequence of device names")
        if len(devices) > MAX_DEVICES:
            raise ConfigError(f"{len(devices)} devices given; at most {MAX_DEVICES} are supported")
        if devices and self.device.lower() != "auto":
            raise ConfigError(f"give either device ({self.device!r}) or devices, not both")
        seen: dict[str, str] = {}
        for d in devices:
            if not isinstance(d, str) or not d:
                raise ConfigError(f"devices entries must be non-empty strings, got {d!r}")
            if d.lower() == "auto":
                raise ConfigError("devices must name each device ('auto' is not allowed in a list)")
            key = canonical_device(d)
            if key in seen:
                raise ConfigError(f"device {d!r} appears twice in devices ({', '.join(devices)})")
            seen[key] = d
        if not isinstance(self.draft_device, str):
            raise ConfigError(f"draft_device={self.draft_device!r} must be a string")
        props = self.layer_proportions
        if isinstance(props, str) or not isinstance(props, (tuple, list)):
            raise ConfigError(f"layer_proportions={props!r} must be a sequence of numbers")
        if self.split == "none":
            if len(devices) > 1:
                raise ConfigError(f"{len(devices)} devices need split='layer' or split='tensor'")
            if props:
                raise ConfigError("layer_proportions need split='layer'")
            target = devices[0] if devices else self.device
            if self.draft_device and canonical_device(self.draft_device) != canonical_device(target):
                raise ConfigError(f"draft_device={self.draft_device!r} differs from the target's device {target!r}; "
                                  "a draft on its own device needs split='layer'")
            return
        if len(devices) < 2:
            raise ConfigError(f"split={self.split!r} needs at least 2 devices, got {len(devices)}")
        if props:
            if self.split != "layer":
                raise ConfigError("layer_proportions apply to split='layer' only")
            if len(props) != len(devices):
                raise ConfigError(f"layer_proportions has {len(props)} entries, expected one per device ({len(devices)})")
            for p in props:
                _check_float("layer_proportions entry", p, 0.0, math.inf, lo_open=True)
        if self.draft_device.lower() == "auto":
            raise ConfigError("draft_device must name a device ('auto' is not allowed)")
        n_cpu = sum(canonical_device(d).startswith("cpu:") for d in devices)
        if self.split == "tensor" and 0 < n_cpu < len(devices):
            raise ConfigError(f"split='tensor' cannot mix CPU backend instances and GPUs ({', '.join(devices)}): "
                              "the devices of a tensor split all-reduce with each other")

    def to_core(self, model_path: str) -> "_core.EngineConfig":
        from lucebox import _core

        c = _core.EngineConfig()
        c.model_path = model_path
        c.n_ctx = self.ctx
        c.kv_type_k = self.kv_type_k
        c.kv_type_v = self.kv_type_v
        c.device = self.device
        c.n_ubatch = self.ubatch
        c.n_threads = self.threads
        c.capture_layers = list(self.capture_layers)
        c.rollback = self.rollback
        c.tree_budget = self.tree_budget
        c.tree_top_k = self.tree_top_k
        c.devices = list(self.devices)
        c.split = self.split
        c.layer_proportions = [float(p) for p in self.layer_proportions]
        c.draft_device = self.draft_device
        return c


@dataclass(frozen=True)
class SamplingConfig:
    """Token sampling. temperature 0 is greedy; the filters apply in the order logit_bias,
    penalties, top_k, temperature, top_p, min_p (temperature before top_p / min_p, as in HF
    transformers, vLLM and SGLang; llama.cpp's default chain applies it after min_p). logit_bias:
    {token id: bias in [-100, 100]} (or (id, bias) pairs) added to those logits, as OpenAI's; -100
    bans a token in practice. See cpp/include/lucebox/sampling.h."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    penalty_last_n: int = 64
    seed: int = 0
    logit_bias: Any = ()  # Mapping[int, float] or (id, bias) pairs; stored as sorted pairs

    def __post_init__(self) -> None:
        items = self.logit_bias.items() if isinstance(self.logit_bias, Mapping) else self.logit_bias
        try:
            pairs = [(tid, b) for tid, b in items]
        except (TypeError, ValueError):
            raise ConfigError(f"logit_bias={self.logit_bias!r} must map token ids to biases") from None
        for tid, b in pairs:
            _check_int("logit_bias token id", tid, 0, (1 << 31) - 1)
            _check_float(f"logit_bias[{tid}]", b, -100.0, 100.0)
        if len({tid for tid, _ in pairs}) != len(pairs):
            raise ConfigError("logit_bias names a token id twice")
        object.__setattr__(self, "logit_bias", tuple(sorted((int(t), float(b)) for t, b in pairs)))
        _check_float("temperature", self.temperature, 0.0, math.inf, lo_open=False)
        _check_int("top_k", self.top_k, 0, 1 << 31)
        _check_float("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        _check_float("min_p", self.min_p, 0.0, 1.0, lo_open=False, hi_open=True)
        _check_float("presence_penalty", self.presence_penalty, -math.inf, math.inf)
        _check_float("frequency_penalty", self.frequency_penalty, -math.inf, math.inf)
        _check_float("repetition_penalty", self.repetition_penalty, 0.0, math.inf, lo_open=True)
        _check_int("penalty_last_n", self.penalty_last_n, -1, 1 << 31)
        _check_int("seed", self.seed, 0, (1 << 64) - 1)

    def to_core(self) -> "_core.SamplingParams":
        from lucebox import _core

        p = _core.SamplingParams()
        for name in ("temperature", "top_k", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty", "penalty_last_n", "seed"):
            setattr(p, name, getattr(self, name))
        p.logit_bias = list(self.logit_bias)
        return p


def canonical_device(spec: str) -> str:
    """One spelling per device, so duplicates are found (cpp/src/placement.cpp canonical_device):
    lower case; cpu -> cpu:0; cuda, gpu, gpu:N -> cuda:N; CUDAn -> cuda:n."""
    s = spec.lower()
    if s == "cpu":
        return "cpu:0"
    if s in ("cuda", "gpu"):
        return "cuda:0"
    for prefix, out in (("cuda:", "cuda:"), ("gpu:", "cuda:"), ("cpu:", "cpu:")):
        if s.startswith(prefix):
            n = s[len(prefix):]
            if not n.isdigit():
                raise ConfigError(f"device {spec!r}: expected {prefix}N")
            return f"{out}{int(n)}"
    if s.startswith("cuda") and s[4:].isdigit():
        return f"cuda:{int(s[4:])}"
    return s


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}={value!r} must be an integer")
    if not lo <= value <= hi:
        raise ConfigError(f"{name}={value} must be in [{lo}, {hi}]")


def _check_float(name: str, value: object, lo: float, hi: float, *, lo_open: bool = False,
                 hi_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name}={value!r} must be a number")
    v = float(value)
    if math.isnan(v) or math.isinf(v) and not (math.isinf(lo) and v < 0 or math.isinf(hi) and v > 0):
        raise ConfigError(f"{name}={value!r} must be finite")
    if math.isinf(v):
        raise ConfigError(f"{name}={value!r} must be finite")
    if (v <= lo if lo_open else v < lo) or (v >= hi if hi_open else v > hi):
        lb = "(" if lo_open else "["
        rb = ")" if hi_open else "]"
        raise ConfigError(f"{name}={value} must be in {lb}{lo}, {hi}{rb}")


def stop_list(stop: str | Sequence[str] | None) -> list[str]:
    """Normalise the `stop` argument (a string or a list of strings) and validate it."""
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else list(stop)
    for s in items:
        if not isinstance(s, str) or not s:
            raise ConfigError(f"stop strings must be non-empty strings, got {s!r}")
    return items
