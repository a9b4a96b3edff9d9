"""Gated attention with heads of 256 on CUDA inside the model: a tiny model with attention heads of
256 (6 query heads a KV head, as the 27B) and DeltaNet heads of 128 (so the DeltaNet layers run
their fused ops), Q8_0 weights: its logits on CUDA against the CPU, a 16-token forward against 16
single-token steps (the same bits: lucebox's products and DeltaNet ops do not depend on the batch,
and ggml's flash attention cuts its keys at fixed rows for up to 64 query rows, patch 0008), and
chain speculation at forced accept lengths equal to plain greedy decoding (a tree's DeltaNet layers
run ggml's tree kernel: equal, or parted at a near-tie), also across the switch to a wider query tile
for long key views. The model's attention is ggml's flash attention and gate ops; the other GPU tests'
models have the tiny preset's attention heads of 64. In Q8_0 and in llama.cpp's Q4_K_M mix (Q6_K for
the head and for layers 2 and 3's attn_qkv / attn_v and ffn_down: layer 2's DeltaNet stack holds attn_gate,
ssm_beta and ssm_alpha only, layer 3's attention stack attn_q and attn_k), and in its Q5_K_M mix (Q5_K
in ggml's layout on lucebox's kernel, beside row-tiled Q6_K)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import lucebox
from lucebox import _core, synth

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from exact_model import check_like_the_cpu, check_same_or_near_tie, exact_logits  # noqa: E402
from forcing import forced, forced_tree  # noqa: E402

pytestmark = pytest.mark.gpu

# hidden and FFN sizes multiples of 256, so that every product runs lucebox's kernel (the tiny
# preset's 128-wide hidden leaves them to ggml's, whose results depend on the batch)
SHAPE = dict(n_embd=256, n_ff=512, head_dim=256, n_head=12, n_head_kv=2, ssm_d_state=128, ssm_n_k_heads=2,
             ssm_n_v_heads=4)
MAX_ABS = 0.5  # Q8_0 weights, as test_cuda_target.py (the 16-token forward against 16 steps)


@pytest.fixture(scope="module", params=["q8_0", "q4_k_m", "q5_k_m"])
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("attn-gpu") / f"target-{request.param}.gguf"
    synth.write_target(str(path), "tiny", type=request.param, seed=21, overrides=SHAPE)
    return str(path)


def test_logits_match_cpu(target: str, tmp_path: Path) -> None:
    """A 40-token batch and 30 decode steps on CUDA against the exact model, as the CPU's run
    (exact_model.py: the backends' quantized activations differ)."""
    ids = [int(x) for x in np.random.default_rng(3).integers(0, 1000, 70)]
    exact = exact_logits(target, ids, SHAPE, tmp_path, ctx=300, ubatch=32)
    cpu = lucebox.Engine(target, ctx=300, device="cpu", ubatch=32).session().eval(ids)
    s = lucebox.Engine(target, ctx=300, device="cuda", ubatch=32).session()
    masks = _core.range_mask_runs()
    cuda = np.concatenate([s.eval(ids[:40]), *[s.eval([t]) for t in ids[40:]]])
    assert _core.range_mask_runs() > masks  # the masks were built on the device (kernels/range_mask.h)
    check_like_the_cpu(Path(target).stem, exact, cpu, cuda)


def _batch_and_steps(engine: lucebox.Engine, prompt: list[int], nxt: list[int]) -> tuple[np.ndarray, np.ndarray]:
    a = engine.session()
    a.eval(prompt)
    steps = np.concatenate([a.eval([t]) for t in nxt])
    b = engine.session()
    b.eval(prompt)
    return b.eval(nxt), steps


# one key chunk of 256; the steps crossing into a second one while the batch sees two; several
PROMPTS = (5, 250, 300, 700)


# every query tile width the fixed split takes (the default, cuda_kernels.h, is one of them), every piece
# length class: a multiple of the kernel's key batch (256), and one shorter than it (8: a CTA a KV tile)
@pytest.mark.parametrize("tile_cols,piece_keys", [(8, None), (16, None), (32, None), (64, 256), (8, 8)])
def test_a_batch_of_16_is_16_steps_bit_for_bit(target: str, tile_cols: int | None, piece_keys: int | None) -> None:
    _core.set_fattn_fixed_split(**{k: v for k, v in dict(tile_cols=tile_cols, piece_keys=piece_keys).items() if v})
    try:
        engine = lucebox.Engine(target, ctx=1024, device="cuda")
        rng = np.random.default_rng(4)
        for n_prompt in PROMPTS:
            p = [int(x) for x in rng.integers(0, 1000, n_prompt)]
            nxt = [int(x) for x in rng.integers(0, 1000, 16)]
            batch, steps = _batch_and_steps(engine, p, nxt)
            equal = [bool(np.array_equal(batch[i], steps[i])) for i in range(16)]
            print(f"tile {tile_cols}, piece {piece_keys}, prompt {n_prompt}: {sum(equal)}/16 rows bit-equal, "
                  f"max abs diff {np.abs(batch - steps).max():.4g}")
            assert np.isfinite(batch).all() and all(equal)
    finally:
        _core.set_fattn_fixed_split()


def test_without_the_fixed_split_a_batch_rounds_differently(target: str) -> None:
    # the A/B: ggml's own choice of attention kernel and key split by the row count (the products and
    # DeltaNet ops stay lucebox's), so what makes the test above pass is the fixed split
    _core.set_fattn_fixed_split(rows=0)
    try:
        engine = lucebox.Engine(target, ctx=1024, device="cuda")
        rng = np.random.default_rng(4)
        p = [int(x) for x in rng.integers(0, 1000, 300)]
        nxt = [int(x) for x in rng.integers(0, 1000, 16)]
        batch, steps = _batch_and_steps(engine, p, nxt)
        diff = float(np.abs(batch - steps).max())
        print(f"without the fixed split: max abs diff {diff:.4g}")
        assert 0 < diff <= MAX_ABS
    finally:
        _core.set_fattn_fixed_split()


def test_speculation_matches_plain_greedy(target: str) -> None:
    engine = lucebox.Engine(target, ctx=1024, device="cuda")
    cpu = lucebox.Engine(target, ctx=1024, device="cpu")
    for n_prompt in (60, 240):  # the second crosses into a second key chunk while generating
        p = [30 + i % 900 for i in range(n_prompt)]
        ref = engine.generate(p, max_tokens=40).tokens
        for k in (0, 1, 5, None):  # a chain verify: the same bits as the decode steps, so the same tokens
            got = engine.session().generate(p, max_tokens=40, propose=forced(ref, len(p), k)).tokens
            assert got == ref, f"prompt {n_prompt}, accept {k}"
        # a tree's DeltaNet layers run ggml's tree kernel, not the fused step: equal, or parted at a near-tie
        got = engine.session().generate(p, max_tokens=40, propose_tree=forced_tree(ref, len(p), 4)).tokens
        check_same_or_near_tie(engine, cpu, p, ref, got)


def _speculation_is_plain_greedy(engine: lucebox.Engine, cpu: lucebox.Engine, prompt_lengths: tuple[int, ...]) -> None:
    # forced chains (accept 0, 5, all) give plain greedy decoding's tokens; a forced tree's DeltaNet layers
    # run ggml's tree kernel: equal, or parted at a near-tie
    for n_prompt in prompt_lengths:
        p = [30 + i % 900 for i in range(n_prompt)]
        ref = engine.generate(p, max_tokens=40).tokens
        for k in (0, 5, None):
            got = engine.session().generate(p, max_tokens=40, propose=forced(ref, len(p), k)).tokens
            assert got == ref, f"prompt {n_prompt}, accept {k}"
        got = engine.session().generate(p, max_tokens=40, propose_tree=forced_tree(ref, len(p), 4)).tokens
        check_same_or_near_tie(engine, cpu, p, ref, got)


def test_the_wide_tile_for_long_key_views(target: str) -> None:
    # views of >= 512 keys (the decode steps from position 256 on: views are padded to 256 rows, long
    # ones then to 1024) take 64 columns, shorter ones 16
    _core.set_fattn_fixed_split(tile_cols=16, long_keys=512, long_tile_cols=64)
    try:
        engine = lucebox.Engine(target, ctx=1024, device="cuda")
        cpu = lucebox.Engine(target, ctx=1024, device="cpu")
        # a batch from position 250 sees 512 keys: its rows from 256 on are the steps' bits; its rows
        # below 256 are the wide tile's and the steps' the narrow one's, so some differ (the switch is real)
        rng = np.random.default_rng(6)
        p = [int(x) for x in rng.integers(0, 1000, 250)]
        nxt = [int(x) for x in rng.integers(0, 1000, 16)]
        batch, steps = _batch_and_steps(engine, p, nxt)
        equal = [bool(np.array_equal(batch[i], steps[i])) for i in range(16)]
        print(f"across the switch: rows bit-equal {equal}, max abs diff {np.abs(batch - steps).max():.4g}")
        assert all(equal[6:]) and not all(equal[:6])
        # speculation keeps each verify on one side of position 256: the tokens of plain decoding
        _speculation_is_plain_greedy(engine, cpu, (240, 250, 300))
    finally:
        _core.set_fattn_fixed_split()


@pytest.mark.parametrize("long_piece", [256, 1024])
def test_long_pieces_and_a_clipped_view(target: str, long_piece: int) -> None:
    # views of >= 512 keys are long: padded to 1024 rows and cut into pieces of long_piece keys. The
    # engine is made before the switch moves to 512, so its 2816-row cache is not whole pads: the views
    # end at 1024, 2048, then 2816, which patch 0008 cuts at its KV tiles (32 keys for the wide tile)
    engine = lucebox.Engine(target, ctx=2816, device="cuda")
    cpu = lucebox.Engine(target, ctx=2816, device="cpu")
    _core.set_fattn_fixed_split(long_keys=512, long_piece_keys=long_piece)
    try:
        rng = np.random.default_rng(7)
        # a batch from 1020 sees 2048 keys, its first 4 rows' steps 1024; from 2050 every view is the clipped one
        for n_prompt in (1020, 2050):
            p = [int(x) for x in rng.integers(0, 1000, n_prompt)]
            nxt = [int(x) for x in rng.integers(0, 1000, 16)]
            batch, steps = _batch_and_steps(engine, p, nxt)
            equal = [bool(np.array_equal(batch[i], steps[i])) for i in range(16)]
            print(f"long piece {long_piece}, prompt {n_prompt}: {sum(equal)}/16 rows bit-equal")
            assert np.isfinite(batch).all() and all(equal)
        # a batch from 2040 sees the clipped view, its first 8 rows' steps 2048 keys: where the long piece
        # does not divide 2816 the clipped view is cut at the KV tiles and those rows differ (the switch
        # the engine's verify blocks stop at is real); 256-key pieces divide it, so the cuts are the same
        p = [int(x) for x in rng.integers(0, 1000, 2040)]
        nxt = [int(x) for x in rng.integers(0, 1000, 16)]
        batch, steps = _batch_and_steps(engine, p, nxt)
        equal = [bool(np.array_equal(batch[i], steps[i])) for i in range(16)]
        print(f"long piece {long_piece}, across the clip: rows bit-equal {equal}")
        assert all(equal[8:]) and all(equal[:8]) == (2816 % long_piece == 0)
        # speculation while a long view grows (1024 to 2048 keys: the same cuts) and across the clip (a
        # verify from below 2048 ends there): the tokens of plain decoding
        _speculation_is_plain_greedy(engine, cpu, (1010, 2035))
    finally:
        _core.set_fattn_fixed_split()
