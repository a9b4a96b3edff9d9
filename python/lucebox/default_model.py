"""The model lucebox uses when none is given: the bundled demo pair.

``lucebox/models/lucebox-demo.gguf`` is a 14M-parameter qwen35 target (8 layers, 3 Gated DeltaNet
: 1 attention) trained on the Python standard library, and ``lucebox-demo-draft.gguf`` its
2.8M-parameter DFlash draft, both Q8_0 (18.5 MB together). `train/demo_pair.py` reproduces them;
``lucebox/models/README.md`` is their model card. They write Python-like code and give speculative
decoding a real acceptance behaviour on every machine, offline, in seconds.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DEFAULT_MODEL_NAME", "MODELS_DIR", "cache_dir", "default_model_paths"]

#: The id the default model is served under.
DEFAULT_MODEL_NAME = "lucebox-demo"
#: Where the bundled model files live (inside the installed package).
MODELS_DIR = Path(__file__).resolve().parent / "models"
_TARGET = "lucebox-demo.gguf"
_DRAFT = "lucebox-demo-draft.gguf"


def cache_dir() -> Path:
    """``$LUCEBOX_CACHE_DIR`` or ``~/.cache/lucebox``."""
    env = os.environ.get("LUCEBOX_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lucebox"


def default_model_paths() -> tuple[Path, Path]:
    """(target, draft) of the bundled demo pair.

    Raises FileNotFoundError naming the missing file when the package was installed without its
    model files (e.g. a source tree missing them)."""
    target, draft = MODELS_DIR / _TARGET, MODELS_DIR / _DRAFT
    for p in (target, draft):
        if not p.is_file():
            raise FileNotFoundError(f"the bundled demo model file {p} is missing; reinstall lucebox "
                                    f"or pass --model")
    return target, draft
