"""Gated attention with heads of 256 on CUDA inside the model: a tiny model with attention heads of
256 (6 query heads a KV head, as the 27B) and DeltaNet heads of 128 (so the DeltaNet layers run
their fused ops), Q8_0 weights: its logits on CUDA against the CPU, a 16-token forward against 16
single-token steps, and chain and tree speculation at forced accept lengths against plain greedy
decoding (equal, or parted at a near-tie: this tiny shape's ops round differently at 1 and 16
tokens). The model's attention is ggml's flash attention and gate ops; the other GPU tests' models
have the tiny preset's attention heads of 64."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import lucebox
from lucebox import synth

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from forcing import forced, forced_tree  # noqa: E402
from test_cuda_speculative import _check_same_or_tie  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPE = dict(head_dim=256, n_head=12, n_head_kv=2, ssm_d_state=128, ssm_n_k_heads=2, ssm_n_v_heads=4)
MAX_ABS = 0.5  # Q8_0 weights, as test_cuda_target.py


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("attn-gpu") / "target.gguf"
    synth.write_target(str(path), "tiny", type="q8_0", seed=21, overrides=SHAPE)
    return str(path)


def test_logits_match_cpu(target: str) -> None:
    ids = [int(x) for x in np.random.default_rng(3).integers(0, 1000, 70)]
    ref = lucebox.Engine(target, ctx=300, device="cpu", ubatch=32).session().eval(ids)
    s = lucebox.Engine(target, ctx=300, device="cuda", ubatch=32).session()
    got = np.concatenate([s.eval(ids[:40]), *[s.eval([t]) for t in ids[40:]]])
    diff = np.abs(got - ref).max()
    print(f"max abs diff to the CPU {diff:.4g}")
    assert diff <= MAX_ABS


def test_a_batch_of_16_matches_16_steps(target: str) -> None:
    # ggml's products, norms and attention pick kernels by batch size: on this tiny shape the rows
    # differ by ~0.06 (fifteenth session), so they agree to MAX_ABS
    engine = lucebox.Engine(target, ctx=600, device="cuda")
    rng = np.random.default_rng(4)
    for n_prompt in (5, 70, 300):  # one chunk of keys, two, several
        p = [int(x) for x in rng.integers(0, 1000, n_prompt)]
        nxt = [int(x) for x in rng.integers(0, 1000, 16)]
        a = engine.session()
        a.eval(p)
        steps = np.concatenate([a.eval([t]) for t in nxt])
        b = engine.session()
        b.eval(p)
        batch = b.eval(nxt)
        diff = float(np.abs(steps - batch).max())
        print(f"prompt {n_prompt}: max abs diff {diff:.4g}")
        assert np.isfinite(batch).all() and diff <= MAX_ABS


def test_speculation_matches_plain_greedy(target: str) -> None:
    engine = lucebox.Engine(target, ctx=512, device="cuda")
    cpu = lucebox.Engine(target, ctx=512, device="cpu")
    p = list(range(30, 90))
    ref = engine.generate(p, max_tokens=40).tokens
    # a verify's other ops round differently from a decode step's (above): equal, or parted at a near-tie
    for k in (0, 1, 5, None):
        got = engine.session().generate(p, max_tokens=40, propose=forced(ref, len(p), k)).tokens
        _check_same_or_tie(engine, cpu, p, ref, got)
    # a tree's DeltaNet layers run ggml's tree kernel, not the fused step: equal, or parted at a near-tie
    got = engine.session().generate(p, max_tokens=40, propose_tree=forced_tree(ref, len(p), 4)).tokens
    _check_same_or_tie(engine, cpu, p, ref, got)
