"""Attention heads of 128 and 256 (the 27B's, 6 query heads a KV head; the other integration tests
use the tiny preset's heads of 64): speculation (chains at several accept lengths, DDTree trees)
gives plain decoding's tokens, over a short context and past 512 cache rows (where ggml's faster
CPU attention would split a single row's keys over the threads: configure_cpu_backend)."""
from __future__ import annotations

import numpy as np
import pytest

import lucebox
from lucebox import synth
from forcing import forced, forced_tree


@pytest.fixture(scope="module", params=[128, 256])
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp(f"heads{request.param}") / "target.gguf"
    synth.write_target(str(path), "tiny", type="f32", seed=4,
                       overrides=dict(head_dim=request.param, n_head=12, n_head_kv=2))
    return str(path)


@pytest.mark.parametrize("n_prompt", [40, 600])
def test_speculation_equals_plain_decoding(target: str, n_prompt: int) -> None:
    engine = lucebox.Engine(target, ctx=1024, device="cpu", threads=2)
    p = [int(x) for x in np.random.default_rng(5).integers(0, 1000, n_prompt)]
    ref = engine.generate(p, max_tokens=24).tokens
    for k in (0, 6, None):
        assert engine.session().generate(p, max_tokens=24, propose=forced(ref, len(p), k)).tokens == ref
    assert engine.session().generate(p, max_tokens=24, propose_tree=forced_tree(ref, len(p), 4)).tokens == ref


def test_the_attention_split_settings_are_checked() -> None:
    # _core.set_fattn_fixed_split (the CUDA attention's fixed key split, ggml patch 0008): settings
    # patch 0008 cannot take are refused in every build, not stored
    from lucebox import _core
    for bad in (dict(rows=-1), dict(rows=1024), dict(piece_keys=0), dict(piece_keys=512), dict(piece_keys=129),
                dict(tile_cols=48), dict(tile_cols=128), dict(long_keys=-1), dict(long_tile_cols=48),
                dict(long_piece_keys=0), dict(long_piece_keys=2048), dict(long_piece_keys=384)):
        with pytest.raises(ValueError, match="attention split"):
            _core.set_fattn_fixed_split(**bad)
    _core.set_fattn_fixed_split()  # the defaults
    _core.set_fattn_fixed_split(piece_keys=256, long_piece_keys=1024)  # the longest pieces allowed
    _core.set_fattn_fixed_split()
