"""Exceptions raised by lucebox. Errors from the C++ core arrive as these classes.

Each also derives from the builtin a caller would expect, so ``except ValueError`` catches a
malformed file and ``except MemoryError`` catches an allocation that does not fit.
"""
from __future__ import annotations


class LuceboxError(Exception):
    """Base class of every lucebox error."""


class GGUFError(LuceboxError, ValueError):
    """A GGUF file that cannot be used: unreadable, truncated, corrupt, wrong architecture,
    missing or mistyped key, missing tensor, wrong shape or unsupported tensor type.
    The message names the file and the key or tensor."""


class DraftMismatchError(LuceboxError, ValueError):
    """A draft model that does not fit its target (hidden size, vocabulary, target layers)."""


class ConfigError(LuceboxError, ValueError):
    """An invalid configuration value."""


class UnsupportedError(LuceboxError, NotImplementedError):
    """A valid request that this build, backend or version cannot do (yet)."""


class GrammarError(LuceboxError):
    """A grammar's parser that failed during a generation (a resource limit of a pathological
    grammar); the generation ended at the failure."""


class OutOfMemoryError(LuceboxError, MemoryError):
    """An allocation that does not fit; the message names the sizes."""


__all__ = [
    "LuceboxError",
    "GGUFError",
    "DraftMismatchError",
    "ConfigError",
    "UnsupportedError",
    "OutOfMemoryError",
    "GrammarError",
]
