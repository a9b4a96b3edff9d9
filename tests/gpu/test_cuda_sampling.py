"""Sampled decoding on CUDA: the device's top-k candidates (ggml top_k + get_rows on the GPU) and
the host draw give the target's exact two-token distribution, with and without penalties (the
check of tests/integration/test_sampling.py, on the GPU)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lucebox import synth

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_sampling import check_two_token_distribution  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("penalized", [False, True])
def test_two_sampled_tokens_on_cuda(tmp_path: Path, penalized: bool) -> None:
    path = str(tmp_path / "t.gguf")
    synth.write_target(path, "tiny", type="q8_0", seed=1234)
    check_two_token_distribution(path, "cuda", penalized)
