"""lucebox: Qwen3.5/3.6 inference with DFlash speculative decoding on a pinned ggml core."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version as _version

from lucebox.errors import (
    ConfigError,
    DraftMismatchError,
    GGUFError,
    LuceboxError,
    OutOfMemoryError,
    UnsupportedError,
)

from lucebox.config import EngineConfig, SamplingConfig
from lucebox.engine import Engine, GenerationChunk, GenerationResult, GenerationStats, Session, load_snapshot

try:
    __version__ = _version("lucebox")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+dev"

__all__ = [
    "__version__",
    "Engine",
    "EngineConfig",
    "GenerationChunk",
    "GenerationResult",
    "GenerationStats",
    "SamplingConfig",
    "Session",
    "load_snapshot",
    "ConfigError",
    "DraftMismatchError",
    "GGUFError",
    "LuceboxError",
    "OutOfMemoryError",
    "UnsupportedError",
]
