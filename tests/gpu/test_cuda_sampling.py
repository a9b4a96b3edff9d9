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


@pytest.mark.parametrize("spec", ["off", "chain", "tree"])
def test_logprobs_on_cuda(pair: tuple[str, str], spec: str) -> None:
    """The normalizer computed in the CUDA graph (argmax, get_rows, sub, exp, sum_rows) gives the
    exact log-softmax of the CUDA logits, on plain, chain and tree steps."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
    from test_logprobs import check_logprobs  # noqa: E402

    import lucebox

    target, draft = pair
    engine = lucebox.Engine(target, None if spec == "off" else draft, ctx=512, device="cuda",
                            spec="auto" if spec == "off" else spec)
    p = [3, 14, 15, 92, 65, 35, 89, 79]
    for sampling in (dict(), dict(temperature=0.8, seed=5)):
        ref = engine.session().generate(p, max_tokens=32, **sampling)
        got = engine.session().generate(p, max_tokens=32, logprobs=5, **sampling)
        assert got.tokens == ref.tokens
        check_logprobs(engine, p, got, 5)
