"""Every weight type a GGUF file may hold (f16, bf16, the legacy and K-quants, the i-quants, the
ternary and FP4 types): a model quantized to it loads, and lucebox's CPU logits are llama.cpp's bits
where llama.cpp runs its plain kernels (no repacked weights, one token a micro-batch; see
test_synth_mix.py), and the same bits whether the tokens come one at a time or in one batch. The
i-quants that ggml quantizes only with an importance matrix are written by synth with a uniform one."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import lucebox
from lucebox import synth

oracle = pytest.importorskip("oracle")

# Row lengths that are multiples of 256, so every matrix takes the type (no fallbacks).
SHAPE = dict(n_embd=256, n_ff=512, ssm_d_state=64, head_dim=64, n_layer=4)
SINGLE_TYPES = [t for t in synth.TYPES if t not in ("q4_k_m", "q5_k_m")]


@pytest.mark.parametrize("type_", SINGLE_TYPES)
def test_weight_type_logits_are_upstreams(type_: str, tmp_path: Path) -> None:
    ok, why = oracle.available()
    if not ok:
        pytest.skip(why)
    path = tmp_path / f"{type_}.gguf"
    synth.write_target(path, "tiny", type=type_, seed=1, overrides=SHAPE)
    written = {t.name: t.tensor_type.name.lower() for t in gguf.GGUFReader(path).tensors}
    assert written["blk.0.attn_qkv.weight"] == type_ and written["token_embd.weight"] == type_
    ids = [int(x) for x in np.random.default_rng(1).integers(0, 1000, 12)]
    ref = oracle.reference_logits(path, ids, n_ctx=256, n_batch=1, n_ubatch=1, repack=False)
    engine = lucebox.Engine(str(path), ctx=256, device="cpu")
    session = engine.session()
    ours = np.concatenate([session.eval([t]) for t in ids])
    np.testing.assert_array_equal(ours, ref)
    # and the same bits in one batch (ggml patch 0009: no llamafile GEMM in the reference mode,
    # whose order of sums differs from the one-column vec_dot for F32 / F16 / BF16 / IQ4_NL)
    np.testing.assert_array_equal(engine.session().eval(ids), ours)
