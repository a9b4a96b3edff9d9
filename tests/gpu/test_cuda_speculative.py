"""DFlash chain speculative decoding on CUDA: the same tokens as plain greedy decoding on CUDA,
with the real tiny draft and with forced proposals (accept lengths 0, 5 and full); the draft's block
masks (a window inside the block, a causal block) propose the CPU's tokens. Where CUDA's verify and
one-token steps round otherwise, a run may part from plain decoding at a near tie only
(exact_model.check_same_or_near_tie)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import lucebox
from lucebox import synth

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from forcing import forced  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exact_model import check_same_or_near_tie  # noqa: E402

pytestmark = pytest.mark.gpu


def test_real_draft_on_cuda(pair: tuple[str, str]) -> None:
    target, draft = pair
    plain = lucebox.Engine(target, ctx=512, device="cuda")
    cpu = lucebox.Engine(target, ctx=512, device="cpu")
    spec = lucebox.Engine(target, draft, ctx=512, device="cuda", spec="chain")
    rng = np.random.default_rng(7)
    for _ in range(20):
        p = [int(x) for x in rng.integers(0, 1000, int(rng.integers(5, 80)))]
        ref = plain.generate(p, max_tokens=40).tokens
        got = spec.generate(p, max_tokens=40)
        assert got.stats.spec["speculative"]
        check_same_or_near_tie(plain, cpu, p, ref, got.tokens)


@pytest.mark.parametrize("corrupt_at", [0, 5, None])
def test_forced_proposals_on_cuda(pair: tuple[str, str], corrupt_at: int | None) -> None:
    target, _ = pair
    engine = lucebox.Engine(target, ctx=512, device="cuda")
    cpu = lucebox.Engine(target, ctx=512, device="cpu")
    rng = np.random.default_rng(8)
    for _ in range(5):
        p = [int(x) for x in rng.integers(0, 1000, 40)]
        ref = engine.generate(p, max_tokens=48).tokens
        got = engine.session().generate(p, max_tokens=48, propose=forced(ref, len(p), corrupt_at))
        check_same_or_near_tie(engine, cpu, p, ref, got.tokens)


def test_demo_pair_on_cuda() -> None:
    """The bundled trained pair: speculative output parts from plain decoding only at near ties."""
    from lucebox import default_model

    target, draft = (str(p) for p in default_model.default_model_paths())
    plain = lucebox.Engine(target, ctx=1024, device="cuda", spec="off")
    cpu = lucebox.Engine(target, ctx=1024, device="cpu", spec="off")
    spec = lucebox.Engine(target, draft, ctx=1024, device="cuda", spec="chain")
    for text in ["def fibonacci(n):\n", "class Stack:\n    def __init__(self):\n", "import os\nimport sys\n\n",
                 "for i in range(10):\n", "def read_lines(path):\n    with open(path) as f:\n"]:
        p = plain.encode_prompt(text)
        ref = plain.generate(p, max_tokens=96).tokens
        got = spec.generate(p, max_tokens=96)
        assert got.stats.spec["accepted"] > 0
        check_same_or_near_tie(plain, cpu, p, ref, got.tokens)


def test_ngram_lookup_on_cuda(pair: tuple[str, str]) -> None:
    """Draftless n-gram speculation (spec "ngram") on CUDA: the bundled demo target's greedy text
    repeats itself, which the lookup proposes; the tokens are plain decoding's (or part at a near
    tie). Likewise a prediction (the plain answer) given to an engine that decodes plainly, on the
    random tiny target: its proposals are verified as a chain on CUDA and mostly accepted."""
    from lucebox import default_model

    demo = str(default_model.default_model_paths()[0])
    plain = lucebox.Engine(demo, ctx=1024, device="cuda", spec="off")
    cpu = lucebox.Engine(demo, ctx=1024, device="cpu", spec="off")
    ngram = lucebox.Engine(demo, ctx=1024, device="cuda", spec="ngram")
    accepted = 0
    for text in ["def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\ndef fib(n):\n",
                 "import os\nimport sys\n", "class Stack:\n    def __init__(self):\n"]:
        p = plain.encode_prompt(text)
        ref = plain.generate(p, max_tokens=120).tokens
        got = ngram.generate(p, max_tokens=120)
        accepted += got.stats.spec["accepted"]
        check_same_or_near_tie(plain, cpu, p, ref, got.tokens)
    assert accepted > 0
    target, _ = pair
    plain = lucebox.Engine(target, ctx=512, device="cuda", spec="off")
    cpu = lucebox.Engine(target, ctx=512, device="cpu", spec="off")
    rng = np.random.default_rng(9)
    for _ in range(5):
        p = [int(x) for x in rng.integers(0, 1000, int(rng.integers(5, 80)))]
        ref = plain.generate(p, max_tokens=120).tokens
        predicted = plain.generate(p, max_tokens=120, prediction=ref)
        check_same_or_near_tie(plain, cpu, p, ref, predicted.tokens)
        assert predicted.stats.spec["predicted_accepted"] > 0


@pytest.mark.parametrize("overrides", [dict(sliding_window=4), dict(causal=True)], ids=["window-in-block", "causal"])
def test_draft_masks_on_cuda(tmp_path, overrides: dict) -> None:
    """The DFlash draft's block masks on CUDA (built in the graph from each row's key range) are the
    CPU's: an upstream-schema draft whose sliding window starts inside the block, and a causal block,
    propose the CPU's tokens (F32 weights; a position may part only at a near tie, rare: at most 1 in 50)."""
    target, draft = str(tmp_path / "t.gguf"), str(tmp_path / "d.gguf")
    synth.write_target(target, "tiny", type="f32", seed=31)
    synth.write_draft(draft, "tiny", type="f32", seed=32, overrides=overrides)
    engines = [lucebox.Engine(target, draft, ctx=512, device=d, spec="chain") for d in ("cuda", "cpu")]
    rng = np.random.default_rng(9)
    same = total = 0
    for _ in range(8):
        p = [int(x) for x in rng.integers(0, 1000, int(rng.integers(5, 120)))]
        props = []
        for e in engines:
            s = e.session()
            s.append(p[:-1])
            props.append(s._core.draft_proposals(p[-1]))
        same += sum(a == b for a, b in zip(*props))
        total += len(props[1])
    assert total == 8 * 15 and same >= total - total // 50, (same, total)
