"""`lucebox synth --type q4_k_m` (or q5_k_m) writes the file llama.cpp's quantizer (the pinned upstream,
`llama_model_quantize`) makes of the same model's F32 file: each tensor's type by upstream's rules,
and the same bytes. Benchmarks on the synthetic mix then stream the bytes, and take the stacks, that a
real Q4_K_M (Q5_K_M) file has."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import lucebox
from forcing import forced, forced_tree
from lucebox import _core, synth

oracle = pytest.importorskip("oracle")

# Row lengths that are multiples of 256 (no K-quant fallbacks, which follow other rules in the two);
# layer counts whose eighths and thirds differ; a tied head (token_embd is the head then).
BASE = dict(n_embd=256, n_ff=512, ssm_d_state=64, head_dim=64)
SHAPES = {
    "16_layers": dict(n_layer=16),
    "27_layers_pattern": dict(n_layer=27, recurrent_layers=tuple(i % 3 != 1 for i in range(27))),
    "tied_head_10_layers": dict(n_layer=10, full_attention_interval=2, has_output=False),
}


def _tensors(path: Path) -> dict[str, tuple[str, bytes]]:
    return {t.name: (t.tensor_type.name, bytes(t.data.view("uint8").reshape(-1))) for t in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("mix", ["q4_k_m", "q5_k_m"])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_mix_is_llama_cpps(name: str, mix: str, tmp_path: Path) -> None:
    ok, why = oracle.available()
    if not ok:
        pytest.skip(why)
    overrides = {**BASE, **SHAPES[name]}
    src, ours, theirs = tmp_path / "f32.gguf", tmp_path / "ours.gguf", tmp_path / "theirs.gguf"
    synth.write_target(src, "tiny", type="f32", seed=1, overrides=overrides)
    synth.write_target(ours, "tiny", type=mix, seed=1, overrides=overrides)
    oracle.quantize(src, theirs, mix)
    ta, tb = _tensors(ours), _tensors(theirs)
    assert ta.keys() == tb.keys()
    a, b = ({n: v[0] for n, v in t.items()} for t in (ta, tb))
    differ = {n: (a[n], b[n]) for n in a if a[n] != b[n]}
    assert not differ, f"tensor: (synth, llama.cpp) {differ}"
    assert [n for n in ta if ta[n][1] != tb[n][1]] == []  # and the same quantized bytes
    # the mix is a real one: both kinds of the rule chose some tensors of each type
    for kind in ("ffn_down", "attn_"):
        kinds = {t for n, t in a.items() if kind in n and ("ffn_down" in n or n.endswith(("attn_v.weight", "attn_qkv.weight")))}
        assert kinds == {mix[:2].upper() + "_K", "Q6_K"}, (kind, kinds)


@pytest.mark.parametrize("mix", ["q4_k_m", "q5_k_m"])
def test_mix_logits_are_upstreams_plain_kernels_bit_for_bit(mix: str, tmp_path: Path) -> None:
    """On the real mix (16 layers: some DeltaNet stacks split by a Q6_K attn_qkv, some attention
    stacks by a Q6_K attn_v), lucebox's CPU logits, prompt at once and token by token, are llama.cpp's
    bits where llama.cpp runs its plain kernels (no repacked weights, one token a micro-batch: its
    larger micro-batches take other kernels for some K-quant products). A stack's wrong offset or
    member would show here; stacking itself is bit-neutral on the CPU."""
    ok, why = oracle.available()
    if not ok:
        pytest.skip(why)
    path = tmp_path / f"{mix}.gguf"
    synth.write_target(path, "tiny", type=mix, seed=1, overrides={**BASE, **SHAPES["16_layers"]})
    types, base = _tensors(path), mix[:2].upper() + "_K"
    assert types["blk.0.attn_qkv.weight"][0] == "Q6_K" and types["blk.0.attn_gate.weight"][0] == base
    assert types["blk.3.attn_v.weight"][0] == base and types["blk.7.attn_v.weight"][0] == "Q6_K"
    ids = [int(x) for x in np.random.default_rng(1).integers(0, 1000, 40)]
    ref = oracle.reference_logits(path, ids, n_ctx=512, n_batch=1, n_ubatch=1, repack=False)
    engine = lucebox.Engine(str(path), ctx=300, device="cpu", ubatch=32)
    at_once = engine.session().eval(ids)
    s = engine.session()
    one_by_one = np.concatenate([s.eval([t]) for t in ids])
    np.testing.assert_array_equal(at_once, ref)
    np.testing.assert_array_equal(one_by_one, ref)


@pytest.mark.parametrize("mix", ["q4_k_m", "q5_k_m"])
@pytest.mark.parametrize("head", [64, 128])
def test_speculation_on_the_mix_is_plain_greedy(mix: str, head: int, tmp_path: Path) -> None:
    """Forced chains (accept 0, 3, all) and trees on the real mix (split stacks, Q6_K beside the base
    type) give plain greedy decoding's tokens: a verify's rows are its decode steps' bits. With DeltaNet
    heads of 128 the fused step ops run, fed by split stacks (qkv alone, then gate | beta | alpha), a
    tree's too (its conv windows and parents: before they did, this very model parted from plain
    decoding at its last token, ggml's ops rounding otherwise than the fused decode steps)."""
    path = tmp_path / f"{mix}.gguf"
    shape = {**BASE, **SHAPES["16_layers"], "ssm_d_state": head}
    if head == 128:
        shape.update(ssm_n_k_heads=1, ssm_n_v_heads=2)
    synth.write_target(path, "tiny", type=mix, seed=2, overrides=shape)
    engine = lucebox.Engine(str(path), ctx=256, device="cpu")
    p = [int(x) for x in np.random.default_rng(4).integers(0, 1000, 30)]
    runs = _core.delta_net_step_runs()
    ref = engine.generate(p, max_tokens=24).tokens
    assert (_core.delta_net_step_runs() > runs) == (head == 128)
    for k in (0, 3, None):
        assert engine.session().generate(p, max_tokens=24, propose=forced(ref, len(p), k)).tokens == ref, k
    for depth in (1, 4):
        assert engine.session().generate(p, max_tokens=24, propose_tree=forced_tree(ref, len(p), depth)).tokens == ref
