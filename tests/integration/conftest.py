"""Fixtures for the integration tests: tiny synthetic ``qwen35`` targets written once per session.

The models come from `lucebox.synth.write_target` (random weights at the ``tiny`` preset's
shapes: 3 Gated DeltaNet layers + 1 gated attention layer, hidden 128, vocabulary 1024), so the
tests need no download. Each file is written at most once per test session, on first use.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

# `import oracle` from the test modules, whatever pytest's import mode.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

#: Seed of every synthetic target; fixed so failures reproduce.
TARGET_SEED = 1234
#: Weight types the integration tests run on.
TARGET_TYPES = ("f32", "q8_0")


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("synth-models")


@pytest.fixture(scope="session")
def tiny_target(synth_dir: Path):
    """Factory: ``tiny_target(type)`` -> path of a tiny qwen35 target with that weight type.

    Written on first request for each type and reused for the rest of the session.
    """
    from lucebox.synth import write_target

    written: dict[str, Path] = {}

    def get(type_: str = "f32") -> Path:
        if type_ not in written:
            path = synth_dir / f"tiny-{type_}-seed{TARGET_SEED}.gguf"
            write_target(path, "tiny", type=type_, seed=TARGET_SEED)
            written[type_] = path
        return written[type_]

    return get


@pytest.fixture(scope="session")
def tiny_f32(tiny_target) -> Path:
    """Tiny qwen35 target with F32 weights (norms and vectors are F32 in every file)."""
    return tiny_target("f32")


@pytest.fixture(scope="session")
def tiny_q8_0(tiny_target) -> Path:
    """Tiny qwen35 target with Q8_0 matrices and embeddings."""
    return tiny_target("q8_0")


@pytest.fixture(scope="session", params=TARGET_TYPES)
def tiny_model(request: pytest.FixtureRequest, tiny_target) -> Path:
    """Parametrized over `TARGET_TYPES`: each test using it runs once per weight type."""
    return tiny_target(request.param)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_f32: Path):
    """The tokenizer of the tiny targets (all types share one vocabulary)."""
    from lucebox.tokenizer import Tokenizer

    return Tokenizer.from_gguf(tiny_f32)
