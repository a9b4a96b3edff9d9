"""The fused gated attention op (cpp/kernels/attention_step.h) inside the model, on the CPU: the
tiny preset's attention heads are 64 wide (ggml's flash attention then runs), so these tests use
heads of 128 and 256 (the sizes the op takes; the 27B's 256): the forward agrees with upstream
llama.cpp with the op in use, speculation (chains and DDTree trees, whose ancestor masks the op
applies) equals plain greedy decoding, and a head size the op does not take runs ggml's ops."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import lucebox
from lucebox import _core, synth
from forcing import forced, forced_tree


@pytest.fixture(scope="module", params=[128, 256])
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp(f"attn{request.param}") / "target.gguf"
    # 6 query heads a KV head, as the 27B
    synth.write_target(str(path), "tiny", type="f32", seed=4,
                       overrides=dict(head_dim=request.param, n_head=12, n_head_kv=2))
    return str(path)


def test_forward_with_the_op_matches_upstream(target: str) -> None:
    oracle = pytest.importorskip("oracle")
    ok, why = oracle.available()
    if not ok:
        pytest.skip(why)
    ids = [int(x) for x in np.random.default_rng(2).integers(0, 1000, 90)]
    before = _core.attention_step_runs()
    ours = lucebox.Engine(target, ctx=300, device="cpu", ubatch=32).session().eval(ids)
    assert _core.attention_step_runs() > before  # 32-token micro-batches: the op, not ggml's
    ref = oracle.reference_logits(target, ids, n_ctx=512)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 2e-2  # as test_oracle_shapes.py (F32 weights)
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() >= 0.98


def test_speculation_with_the_op_equals_plain_greedy(target: str) -> None:
    engine = lucebox.Engine(target, ctx=512, device="cpu")
    rng = np.random.default_rng(5)
    for i in range(2):
        p = [int(x) for x in rng.integers(0, 1000, int(rng.integers(5, 70)))]
        before = _core.attention_step_runs()
        ref = engine.generate(p, max_tokens=40).tokens
        assert _core.attention_step_runs() > before
        for k in (0, 1, 6, None):  # accept lengths 0, 1, 6, all 15
            got = engine.session().generate(p, max_tokens=40, propose=forced(ref, len(p), k))
            assert got.tokens == ref, f"prompt {i}, corrupt_at={k}"
        for depth in (1, 4):
            got = engine.session().generate(p, max_tokens=40, propose_tree=forced_tree(ref, len(p), depth))
            assert got.tokens == ref, f"prompt {i}, tree depth {depth}"


def test_a_head_size_the_op_does_not_take_runs_ggml_attention(tmp_path: Path) -> None:
    path = tmp_path / "hd64.gguf"
    synth.write_target(str(path), "tiny", type="f32", seed=6)  # heads of 64
    engine = lucebox.Engine(str(path), ctx=256, device="cpu")
    p = [int(x) for x in np.random.default_rng(8).integers(0, 1000, 20)]
    before = _core.attention_step_runs()
    ref = engine.generate(p, max_tokens=16).tokens
    assert _core.attention_step_runs() == before
    assert engine.session().generate(p, max_tokens=16, propose=forced(ref, len(p), 5)).tokens == ref


def test_a_quantized_kv_cache_runs_ggml_attention(target: str) -> None:
    engine = lucebox.Engine(target, ctx=256, device="cpu", kv_type_k="q8_0", kv_type_v="q8_0")
    p = [int(x) for x in np.random.default_rng(9).integers(0, 1000, 20)]
    before = _core.attention_step_runs()
    engine.generate(p, max_tokens=8)
    assert _core.attention_step_runs() == before
