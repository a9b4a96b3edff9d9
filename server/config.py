"""`ServerConfig`: everything `lucebox serve` is told, typed and validated at construction."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from lucebox.config import KV_TYPES, SNAPSHOT_LOCATIONS, SPEC_MODES, EngineConfig
from lucebox.errors import ConfigError

__all__ = ["ServerConfig"]


@dataclass(frozen=True)
class ServerConfig:
    """How the server loads its model and serves it.

    model / draft: GGUF paths (draft optional: DFlash speculative decoding). ctx: context
    tokens per slot (None: the model's training context, at most 32768). kv_type: KV cache
    type; kv_type_k / kv_type_v: the K or V cache's own type (None: kv_type). device: "auto",
    "cpu", "cuda", "cuda:N". spec: speculative mode ("auto" uses the draft when given;
    "ngram": no draft, proposals looked up in the context). threads / ubatch: CPU threads (0:
    all) and prefill micro-batch.
    slots: requests generating at once (one session each, claimed at start). queue: requests
    allowed to wait for a slot; beyond that the server answers 429 with Retry-After
    `retry_after` seconds. model_name: the id clients send as ``model`` (default: the file
    name without .gguf). api_key: when set, requests must carry ``Authorization: Bearer KEY``
    (or ``x-api-key: KEY``); /health and /metrics stay open. default_max_tokens: reply length
    when a request does not say (None: the rest of the context). max_reasoning_tokens: the
    default thinking budget (None: unlimited; a request may set its own). temperature / top_p
    / top_k / min_p: sampling defaults for requests that omit them. chat_template_file:
    replaces the GGUF's chat template. max_n: largest ``n`` accepted. 
    stream_header_wait: seconds a streaming request waits for its first token before the
    response headers go out (so an error at prefill still gets a proper status code).
    prefix_cache_mb: memory (MiB) for session snapshots of long prompts, reused by later
    requests that share the prefix (`lucebox.prefix_cache`); 0 disables the cache.
    prefix_cache_location: where those snapshots live: "host" (pinned host memory where the
    device offers it) or "device" (the engine's device memory: fastest restore, costs device
    memory; on a CPU engine the same as host). prefix_cache_interval: also snapshot every this
    many tokens of a long prompt (0: off). prefix_cache_dir: also keep those snapshots in this
    directory (a disk tier that outlives the server: after a restart a long prompt resumes from
    disk; `lucebox.prefix_cache.DiskStore`), at most prefix_cache_disk_mb MiB (least recently used
    files removed first). devices / split / layer_proportions / draft_device:
    placement over several devices (lucebox.EngineConfig; docs/multi-gpu.md).
    """

    model: str
    draft: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    ctx: int | None = None
    kv_type: str = "f16"
    kv_type_k: str | None = None
    kv_type_v: str | None = None
    device: str = "auto"
    spec: str = "auto"
    threads: int = 0
    ubatch: int = 512
    slots: int = 1
    queue: int = 16
    retry_after: int = 1
    model_name: str | None = None
    api_key: str | None = None
    default_max_tokens: int | None = None
    max_reasoning_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    chat_template_file: str | None = None
    max_n: int = 8
    stream_header_wait: float = 10.0
    log_level: str = "info"
    prefix_cache_mb: int = 1024
    prefix_cache_location: str = "host"
    prefix_cache_interval: int = 0
    prefix_cache_dir: str | None = None
    prefix_cache_disk_mb: int = 16384
    extra_model_names: tuple[str, ...] = field(default_factory=tuple)
    devices: tuple[str, ...] = field(default_factory=tuple)
    split: str = "none"
    layer_proportions: tuple[float, ...] = field(default_factory=tuple)
    draft_device: str = ""

    def __post_init__(self) -> None:
        # placement: the engine's own rules (lucebox.config.EngineConfig), checked before loading
        EngineConfig(device=self.device, devices=tuple(self.devices), split=self.split,
                     layer_proportions=tuple(self.layer_proportions), draft_device=self.draft_device)
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError("model must be a GGUF path")
        for name in ("model", "draft", "chat_template_file"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"{name}: no such file: {path}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port={self.port} must be in [0, 65535]")
        if self.ctx is not None and self.ctx < 16:
            raise ConfigError(f"ctx={self.ctx} must be at least 16")
        for name in ("kv_type", "kv_type_k", "kv_type_v"):
            value = getattr(self, name)
            if (value is not None or name == "kv_type") and value not in KV_TYPES:
                raise ConfigError(f"{name}={value!r} must be one of {', '.join(KV_TYPES)}")
        if self.spec not in SPEC_MODES:
            raise ConfigError(f"spec={self.spec!r} must be one of {', '.join(SPEC_MODES)}")
        if not 1 <= self.slots <= 256:
            raise ConfigError(f"slots={self.slots} must be in [1, 256]")
        if not 0 <= self.queue <= 100_000:
            raise ConfigError(f"queue={self.queue} must be in [0, 100000]")
        if self.retry_after < 1:
            raise ConfigError("retry_after must be at least 1 second")
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ConfigError("default_max_tokens must be at least 1")
        if self.max_reasoning_tokens is not None and self.max_reasoning_tokens < 0:
            raise ConfigError("max_reasoning_tokens must be >= 0")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"temperature={self.temperature} must be finite and >= 0")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise ConfigError(f"top_k={self.top_k} must be >= 0")
        if not 0 <= self.min_p < 1:
            raise ConfigError(f"min_p={self.min_p} must be in [0, 1)")
        if not 1 <= self.max_n <= 128:
            raise ConfigError("max_n must be in [1, 128]")
        if self.stream_header_wait < 0:
            raise ConfigError("stream_header_wait must be >= 0")
        if isinstance(self.prefix_cache_mb, bool) or not isinstance(self.prefix_cache_mb, int) \
                or self.prefix_cache_mb < 0:
            raise ConfigError(f"prefix_cache_mb={self.prefix_cache_mb!r} must be a non-negative integer")
        if isinstance(self.prefix_cache_interval, bool) or not isinstance(self.prefix_cache_interval, int) \
                or self.prefix_cache_interval < 0:
            raise ConfigError(f"prefix_cache_interval={self.prefix_cache_interval!r} must be a non-negative integer")
        if isinstance(self.prefix_cache_disk_mb, bool) or not isinstance(self.prefix_cache_disk_mb, int) \
                or self.prefix_cache_disk_mb < 1:
            raise ConfigError(f"prefix_cache_disk_mb={self.prefix_cache_disk_mb!r} must be a positive integer")
        if self.prefix_cache_dir is not None and self.prefix_cache_mb == 0:
            raise ConfigError("prefix_cache_dir needs the prefix cache (prefix_cache_mb > 0)")
        if self.prefix_cache_location not in SNAPSHOT_LOCATIONS:
            raise ConfigError(f"prefix_cache_location={self.prefix_cache_location!r} must be one of "
                              f"{', '.join(SNAPSHOT_LOCATIONS)}")
        if self.model_name is not None and not self.model_name.strip():
            raise ConfigError("model_name must not be empty")

    @property
    def served_name(self) -> str:
        """The model id reported by /v1/models and in responses."""
        if self.model_name:
            return self.model_name
        base = os.path.basename(self.model)
        return base[:-5] if base.endswith(".gguf") else base

    @property
    def accepted_names(self) -> frozenset[str]:
        """Model ids a request may name (the served name, the file name, the stem, extras)."""
        base = os.path.basename(self.model)
        names = {self.served_name, base, base[:-5] if base.endswith(".gguf") else base}
        names.update(self.extra_model_names)
        return frozenset(names)
