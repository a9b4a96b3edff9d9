"""Fixtures shared by the test folders."""
from __future__ import annotations

import pytest

from lucebox import synth


@pytest.fixture(scope="session")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The tiny synthetic target and its DFlash draft (Q8_0, fixed seeds): the speculative, tree and
    GPU tests' pair. A module that needs another pair defines its own `pair`."""
    d = tmp_path_factory.mktemp("tiny-pair")
    target, draft = d / "target.gguf", d / "draft.gguf"
    synth.write_target(str(target), "tiny", type="q8_0", seed=5)
    synth.write_draft(str(draft), "tiny", type="q8_0", seed=6)
    return str(target), str(draft)
