"""Several CUDA devices of one host: a layer split and a tensor split (split="tensor", the ggml
meta backend with its all-reduce: NCCL when ggml was built with it) give the same greedy tokens as
one GPU (plain decoding and DFlash chain speculation with fast rollback, the draft on either
device), and a snapshot of a split session restores token-identically. Comparisons across
placements pair the same op paths (plain with plain, speculative with speculative): a 16-token
verify and a 1-token decode use different CUDA kernels. A tensor split sums partial products in
another order, so where two tokens are nearly tied the choice may differ: the tensor tests allow a
divergence only at such a near tie (the one-GPU logits of both tokens within 0.1). Skipped unless
at least 2 CUDA devices are visible."""
from __future__ import annotations

import numpy as np
import pytest

import lucebox
from lucebox import _core, synth

pytestmark = pytest.mark.gpu


def _n_gpus() -> int:
    return sum(d["type"] == "gpu" for d in _core.devices())


if _n_gpus() < 2:
    pytest.skip("needs at least 2 CUDA devices", allow_module_level=True)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("gpu-split")
    t, dr = str(d / "t.gguf"), str(d / "d.gguf")
    synth.write_target(t, "tiny", type="q8_0", seed=5, overrides={"n_layer": 8, "full_attention_interval": 4})
    synth.write_draft(dr, "tiny", type="q8_0", seed=6)
    return t, dr


def prompts(n: int) -> list[list[int]]:
    rng = np.random.default_rng(4321)
    return [[int(x) for x in rng.integers(0, 1000, int(rng.integers(5, 90)))] for _ in range(n)]


SPLITS = [
    (["cuda:0", "cuda:1"], ()),
    (["cuda:0", "cuda:1"], (3.0, 1.0)),
]


@pytest.mark.parametrize("devices,proportions", SPLITS)
def test_layer_split_matches_one_gpu(files: tuple[str, str], devices: list[str], proportions: tuple[float, ...]) -> None:
    target, _ = files
    single = lucebox.Engine(target, ctx=512, device="cuda:0", ubatch=32)
    split = lucebox.Engine(target, ctx=512, devices=devices, split="layer", layer_proportions=proportions, ubatch=32)
    assert "CUDA0+CUDA1" in split.device
    for p in prompts(6):
        assert split.generate(p, max_tokens=32).tokens == single.generate(p, max_tokens=32).tokens
    p = prompts(1)[0]
    np.testing.assert_allclose(split.session().eval(p), single.session().eval(p), rtol=0, atol=1e-3)


@pytest.mark.parametrize("draft_device", ["", "cuda:0"])
def test_layer_split_chain_speculation(files: tuple[str, str], draft_device: str) -> None:
    """Chain speculation on a split gives the same tokens as chain speculation on one GPU (the same
    kernels run on the same shapes, so the comparison is exact; a 16-token verify and a 1-token
    decode use different CUDA matmul kernels, so spec-vs-plain could flip near-tied argmaxes)."""
    target, draft = files
    single = lucebox.Engine(target, draft, ctx=512, device="cuda:0", spec="chain")
    spec = lucebox.Engine(target, draft, ctx=512, devices=["cuda:0", "cuda:1"], split="layer",
                          draft_device=draft_device, spec="chain")
    for p in prompts(6):
        got = spec.generate(p, max_tokens=40)
        assert got.tokens == single.generate(p, max_tokens=40).tokens
        assert got.stats.spec["fast_rollbacks"] == got.stats.spec["steps"] > 0


@pytest.mark.parametrize("split", ["layer", "tensor"])
@pytest.mark.parametrize("where", ["host", "device"])
def test_split_snapshot(files: tuple[str, str], split: str, where: str) -> None:
    """A restored split session continues exactly like one that never left (same batches: the prefix,
    then the suffix); on a layer split also exactly like the same sequence on one GPU (a tensor
    split sums partial products in another order, see same_or_near_tie)."""
    target, _ = files
    engine = lucebox.Engine(target, ctx=512, devices=["cuda:0", "cuda:1"], split=split)
    prefix = prompts(1)[0]
    s = engine.session()
    s.append(prefix)
    snap = s.snapshot(where)
    straight = s.generate([5, 6, 7], max_tokens=24).tokens
    s.generate([1, 2], max_tokens=8)
    warm = engine.session()
    warm.restore(snap)
    assert warm.generate([5, 6, 7], max_tokens=24).tokens == straight
    if split == "layer":
        one = lucebox.Engine(target, ctx=512, device="cuda:0").session()
        one.append(prefix)
        assert one.generate([5, 6, 7], max_tokens=24).tokens == straight


# ------------------------------------------------------------------------------------------------
# tensor split
# ------------------------------------------------------------------------------------------------

def same_or_near_tie(single: lucebox.Engine, prompt: list[int], ref: list[int], got: list[int],
                     tol: float = 0.1) -> None:
    if got == ref:
        return
    i = next(i for i, (a, b) in enumerate(zip(ref, got)) if a != b)
    row = np.asarray(single.session().eval(prompt + ref[:i]))[-1]  # the logits that chose token i
    assert abs(row[ref[i]] - row[got[i]]) < tol, (i, ref[i], got[i], row[ref[i]], row[got[i]])


def test_tensor_split_matches_one_gpu(files: tuple[str, str]) -> None:
    target, _ = files
    single = lucebox.Engine(target, ctx=512, device="cuda:0", ubatch=32)
    tensor = lucebox.Engine(target, ctx=512, devices=["cuda:0", "cuda:1"], split="tensor", ubatch=32)
    assert tensor.device.startswith("Meta(CUDA0,CUDA1)")
    for p in prompts(6):
        same_or_near_tie(single, p, single.generate(p, max_tokens=32).tokens, tensor.generate(p, max_tokens=32).tokens)
    p = prompts(1)[0]
    np.testing.assert_allclose(tensor.session().eval(p), single.session().eval(p), rtol=0, atol=0.1)


@pytest.mark.parametrize("draft_device", ["", "cuda:0"])
def test_tensor_split_chain_speculation(files: tuple[str, str], draft_device: str) -> None:
    """Chain speculation on the tensor split vs chain speculation on one GPU (the same op paths)."""
    target, draft = files
    single = lucebox.Engine(target, draft, ctx=512, device="cuda:0", spec="chain")
    spec = lucebox.Engine(target, draft, ctx=512, devices=["cuda:0", "cuda:1"], split="tensor",
                          draft_device=draft_device, spec="chain")
    plain_single = lucebox.Engine(target, ctx=512, device="cuda:0")
    for p in prompts(6):
        got = spec.generate(p, max_tokens=40)
        same_or_near_tie(plain_single, p, single.generate(p, max_tokens=40).tokens, got.tokens)
        assert got.stats.spec["fast_rollbacks"] == got.stats.spec["steps"] > 0


@pytest.mark.parametrize("split", ["layer", "tensor"])
def test_split_logprobs(files: tuple[str, str], split: str) -> None:
    """Logprobs on two GPUs: a layer split reads whole rows on the host, a tensor split computes the
    rows' normalizers in the meta backend's graph; asking for them does not change the tokens, and
    they are the split's own model's (test_cuda_sampling.check_device_logprobs)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_cuda_sampling import check_device_logprobs  # noqa: E402

    target, _ = files
    engine = lucebox.Engine(target, ctx=512, devices=["cuda:0", "cuda:1"], split=split, ubatch=32)
    for sampling in (dict(), dict(temperature=0.8, seed=3)):
        p = prompts(1)[0]
        got = engine.generate(p, max_tokens=24, logprobs=4, **sampling)
        assert got.tokens == engine.generate(p, max_tokens=24, **sampling).tokens
        check_device_logprobs(engine, p, got, 4, greedy=not sampling)


def test_conv_width_without_a_cuda_kernel(tmp_path) -> None:
    """A conv width ggml's CUDA conv has no kernel for (2): a layer split runs it padded with zero taps
    (graph::ssm_conv) and gives one GPU's tokens; a tensor split, whose meta backend runs the conv as it
    is, refuses it at load, naming the tensor, the width and the layer split to use instead."""
    from lucebox.errors import UnsupportedError

    path = str(tmp_path / "conv2.gguf")
    synth.write_target(path, "tiny", type="q8_0", seed=5, overrides=dict(ssm_d_conv=2, n_layer=8))
    p = prompts(1)[0]
    single = lucebox.Engine(path, ctx=512, device="cuda:0", ubatch=32)
    split = lucebox.Engine(path, ctx=512, devices=["cuda:0", "cuda:1"], split="layer", ubatch=32)
    assert split.generate(p, max_tokens=16).tokens == single.generate(p, max_tokens=16).tokens
    with pytest.raises(UnsupportedError, match=r"ssm_conv1d.weight' is a convolution of width 2.*tensor split"):
        lucebox.Engine(path, ctx=512, devices=["cuda:0", "cuda:1"], split="tensor")
