"""Row-tiled weights on CUDA (cpp/kernels/weight_tiles.h): Q8_0 and Q4_K product weights load in the
layout lucebox's few-column kernel reads fastest, and compute the same bits as in ggml's layout with
the same kernels (decode steps, a 16-token forward, a 300-token micro-batch on the BF16 route), stay
close to the CPU where only tiled weights can take a product (300 columns with the BF16 route off:
lucebox's kernel in groups of 64 columns; 96 columns on the BF16 route, which only tiled weights
take there), leave no fused product to ggml, and are unregistered when their engine goes. Q6_K
weights (whole 16-row tiles) are tiled too and stay as close to the CPU as ggml's kernels are."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import lucebox
from lucebox import _core, synth

pytestmark = pytest.mark.gpu

# lucebox's int8 kernel against the CPU reference, a 300-token micro-batch (same rounding of the
# activations per 32 values as the CPU's q8_0): as MMQ in test_cuda_target.py.
MAX_ABS = 0.5


def _tiny256(tmp_path_factory: pytest.TempPathFactory, folder: str, type: str, seed: int) -> str:
    # hidden 256 and FFN 512: the matrices have whole 256-value chunks (tiny's 128 would not); 16 V
    # heads: the DeltaNet stack's beta and alpha have 16 rows, so the stack tiles (as the 27B's 48);
    # a vocabulary of 1000: the output head ends in a partial tile of 8 rows
    path = tmp_path_factory.mktemp(folder) / f"tiny256-{type}.gguf"
    synth.write_target(str(path), "tiny", type=type, seed=seed,
                       overrides={"n_embd": 256, "n_ff": 512, "ssm_n_v_heads": 16, "n_vocab": 1000})
    return str(path)


@pytest.fixture(scope="module", params=["q8_0", "q4_k", "q5_k"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return _tiny256(tmp_path_factory, "tiles", request.param, 4)


IDS = [int(x) for x in np.random.default_rng(8).integers(0, 1000, 320)]


def forwards(engine: lucebox.Engine) -> list[np.ndarray]:
    s = engine.session()
    return [s.eval(IDS[:300]), *[s.eval([t]) for t in IDS[300:304]], s.eval(IDS[304:320])]


def load(path: str, tiles: bool) -> tuple[lucebox.Engine, int]:
    _core.set_weight_tiles(tiles)
    try:
        before = _core.tiled_weights()
        engine = lucebox.Engine(path, ctx=512, device="cuda", ubatch=512)
        return engine, _core.tiled_weights() - before
    finally:
        _core.set_weight_tiles(True)


def test_tiled_weights_give_the_same_bits(model: str) -> None:
    declined = _core.tiles_declined()
    plain, n_plain = load(model, tiles=False)
    want = forwards(plain)
    del plain
    gc.collect()
    before = _core.tiled_weights()
    tiled, n_tiled = load(model, tiles=True)
    got = forwards(tiled)
    print(f"{model}: {n_tiled} row-tiled ranges")
    assert n_plain == 0 and n_tiled > 0
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    assert _core.tiles_declined() == declined
    del tiled
    gc.collect()
    assert _core.tiled_weights() == before  # unregistered with their buffer


def test_tiled_weights_without_the_bf16_route_match_cpu(model: str) -> None:
    """300 columns on lucebox's kernel (tiled) against the CPU and against ggml's MMQ (untiled): the
    kernel's error to the CPU may not exceed MMQ's by more than a quarter (Q4_K's CPU product rounds
    the activations per 256 values, the GPU's per 32, so the bound is relative to MMQ's)."""
    ref = lucebox.Engine(model, ctx=512, device="cpu", ubatch=512).session().eval(IDS[:300])
    got = {}
    for tiles in (False, True):
        engine, n_tiled = load(model, tiles=tiles)
        assert (n_tiled > 0) == tiles
        try:
            _core.set_bf16_gemm_min_cols(0)  # tiled: lucebox's kernel, 64 columns at a time; else MMQ
            got[tiles] = engine.session().eval(IDS[:300])
        finally:
            _core.set_own_cuda_kernels(True)  # restores the default threshold
        del engine
        gc.collect()
    diff = np.abs(got[True] - ref).max()
    diff_mmq = np.abs(got[False] - ref).max()
    print(f"{model}: max abs diff to the CPU {diff:.4g} (lucebox's kernel, tiled), {diff_mmq:.4g} (MMQ); "
          f"kernel to MMQ {np.abs(got[True] - got[False]).max():.4g}")
    assert diff <= max(MAX_ABS, 1.25 * diff_mmq)
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * diff
    assert (got[True].argmax(-1) == ref.argmax(-1))[clear].all()


def test_tiled_products_past_64_columns_take_the_bf16_route(model: str) -> None:
    """A 96-token micro-batch: products of tiled weights run on the BF16 route (k_bf16_gemm_min_cols_tiled:
    faster there than lucebox's kernel), bit for bit as ggml's layout does with the route forced
    from 65 columns (every product weight of these models is tiled), as close to the CPU as the
    route is elsewhere, while in ggml's layout they stay with MMQ by default (its threshold is higher)."""
    n = 96
    declined = _core.tiles_declined()
    ref = lucebox.Engine(model, ctx=512, device="cpu", ubatch=512).session().eval(IDS[:n])
    untiled, n_untiled = load(model, tiles=False)
    mmq = untiled.session().eval(IDS[:n])
    try:
        _core.set_bf16_gemm_min_cols(65)
        forced = untiled.session().eval(IDS[:n])
    finally:
        _core.set_own_cuda_kernels(True)
    del untiled
    gc.collect()
    engine, n_tiled = load(model, tiles=True)
    assert n_untiled == 0 and n_tiled > 0
    routed = engine.session().eval(IDS[:n])
    try:
        _core.set_bf16_gemm_min_cols(0)
        kernel = engine.session().eval(IDS[:n])  # tiled: lucebox's kernel, 64 + 32 columns
    finally:
        _core.set_own_cuda_kernels(True)
    diff, diff_mmq = np.abs(routed - ref).max(), np.abs(mmq - ref).max()
    print(f"{model}: {n} columns, max abs diff to the CPU {diff:.4g} (BF16 route), {diff_mmq:.4g} (MMQ), "
          f"{np.abs(kernel - ref).max():.4g} (kernel)")
    np.testing.assert_array_equal(routed, forced)  # every product on the route, none on the kernel
    assert not np.array_equal(mmq, forced)  # and the untiled default did not take it
    assert _core.tiles_declined() == declined
    assert diff <= max(0.6, 1.25 * diff_mmq)  # as test_cuda_target.py's MAX_ABS_BF16_ROUTE


@pytest.fixture(scope="module", params=["q6_k", "q4_k_m"])
def q6_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    # the same shapes; q4_k_m (llama.cpp's mix): Q6_K head (1000 rows: not whole tiles, so that one
    # stays in ggml's layout) and layers 2 and 3's attn_qkv / attn_v and ffn_down (layer 2's DeltaNet
    # stack then holds attn_gate, ssm_beta and ssm_alpha only), Q4_K elsewhere
    return _tiny256(tmp_path_factory, "tiles_q6", request.param, 5)


def test_tiled_q6_k_products_stay_as_close_to_the_cpu_as_ggml(q6_model: str) -> None:
    """Row-tiled Q6_K weights run on lucebox's kernel (decode steps, a 16-token forward) and the BF16
    route (300 tokens, its converter reading the tiles); in ggml's layout they run on ggml's own
    kernels, which round differently: each forward's error to the CPU may not exceed ggml's by
    more than a quarter."""
    ref = forwards(lucebox.Engine(q6_model, ctx=512, device="cpu", ubatch=512))
    untiled, n_untiled = load(q6_model, tiles=False)
    ggml_out = forwards(untiled)
    del untiled
    gc.collect()
    tiled, n_tiled = load(q6_model, tiles=True)
    assert n_untiled == 0 and n_tiled > 0
    got = forwards(tiled)
    for i, (r, a, b) in enumerate(zip(ref, got, ggml_out)):
        diff, diff_ggml = np.abs(a - r).max(), np.abs(b - r).max()
        print(f"{q6_model} forward {i}: max abs diff to the CPU {diff:.4g} tiled, {diff_ggml:.4g} ggml")
        assert diff <= max(MAX_ABS, 1.25 * diff_ggml)
