"""lucebox: Qwen3.5/3.6 inference with DFlash speculative decoding on a pinned ggml core."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version as _version
from typing import TYPE_CHECKING, Any

from lucebox.errors import (
    ConfigError,
    DraftMismatchError,
    GGUFError,
    GrammarError,
    LuceboxError,
    OutOfMemoryError,
    UnsupportedError,
)

from lucebox.config import EngineConfig, SamplingConfig

if TYPE_CHECKING:  # pragma: no cover - typing only
    from lucebox.engine import (Engine, GenerationChunk, GenerationResult, GenerationStats, Session,
                                TokenLogprob, load_snapshot)
    from lucebox.grammar import Grammar

# The engine needs the compiled core (lucebox._core); it is imported on first use so that the
# pure-Python parts (vocab, tokenizer, chat templates, the demo-pair trainer) work without it.
_ENGINE_NAMES = ("Engine", "GenerationChunk", "GenerationResult", "GenerationStats", "Session",
                 "TokenLogprob", "load_snapshot")


def __getattr__(name: str) -> Any:
    if name == "Grammar":  # needs llguidance, loaded on first use
        from lucebox.grammar import Grammar

        return Grammar
    if name in _ENGINE_NAMES:
        from lucebox import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'lucebox' has no attribute {name!r}")

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
    "Grammar",
    "GrammarError",
    "SamplingConfig",
    "Session",
    "TokenLogprob",
    "load_snapshot",
    "ConfigError",
    "DraftMismatchError",
    "GGUFError",
    "LuceboxError",
    "OutOfMemoryError",
    "UnsupportedError",
]
