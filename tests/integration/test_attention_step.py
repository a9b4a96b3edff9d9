"""The model runs ggml's attention, not the fused gated attention op (cpp/kernels/attention_step.h:
tests/cpp/bench_attention measured ggml's faster on an H200 at every token count and cache depth),
also for the head sizes the op takes (128, 256: the 27B's), and gives the same tokens with
speculation (chains and DDTree trees). The op itself against ggml's attention, on the CPU and the
GPU: tests/cpp/test_attention_step.cpp."""
from __future__ import annotations

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


def test_the_model_runs_ggml_attention(target: str) -> None:
    engine = lucebox.Engine(target, ctx=512, device="cpu")
    p = [int(x) for x in np.random.default_rng(5).integers(0, 1000, 40)]
    before = _core.attention_step_runs()
    ref = engine.generate(p, max_tokens=24).tokens
    for k in (0, 6, None):
        assert engine.session().generate(p, max_tokens=24, propose=forced(ref, len(p), k)).tokens == ref
    assert engine.session().generate(p, max_tokens=24, propose_tree=forced_tree(ref, len(p), 4)).tokens == ref
    assert _core.attention_step_runs() == before
