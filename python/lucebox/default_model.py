"""The model `lucebox serve` uses when none is given.

Until the trained demo pair exists, this is the ``tiny`` synthetic pair (a qwen35 target and a
matching DFlash draft with *random weights*, fixed seeds), written by `lucebox.synth` into the
cache directory on first use and reused afterwards. It answers with noise: it exists so the
server, its API and its clients can be exercised on any machine in seconds.

Cache directory: ``$LUCEBOX_CACHE_DIR/models`` (default ``~/.cache/lucebox/models``). Files are
written to a temporary name in the same directory and renamed into place, so a reader never
sees a partial file and two processes starting together both end up with a complete pair.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["DEFAULT_MODEL_NAME", "IS_PLACEHOLDER", "cache_dir", "default_model_paths"]

#: The id the default model is served under.
DEFAULT_MODEL_NAME = "lucebox-default"
#: True while the default model is the random-weight stand-in (not a trained model).
IS_PLACEHOLDER = True

# Bump the version when the synthetic format or shapes change, so stale files are not reused.
_VERSION = "v1"
_TARGET = f"lucebox-tiny-synth-{_VERSION}.gguf"
_DRAFT = f"lucebox-tiny-synth-{_VERSION}-draft.gguf"
_SEED = 0


def cache_dir() -> Path:
    """``$LUCEBOX_CACHE_DIR`` or ``~/.cache/lucebox``."""
    env = os.environ.get("LUCEBOX_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lucebox"


def _write_atomic(path: Path, write: Callable[[str], object]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def default_model_paths() -> tuple[Path, Path]:
    """(target, draft) of the default model, writing them on first use.

    Raises OSError when the cache directory cannot be created or written."""
    from lucebox import synth

    models = cache_dir() / "models"
    models.mkdir(parents=True, exist_ok=True)
    target, draft = models / _TARGET, models / _DRAFT
    if not target.is_file():
        _write_atomic(target, lambda p: synth.write_target(p, "tiny", seed=_SEED))
    if not draft.is_file():
        _write_atomic(draft, lambda p: synth.write_draft(p, "tiny", seed=_SEED + 1))
    return target, draft
