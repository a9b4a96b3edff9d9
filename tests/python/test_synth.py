"""Tests for lucebox.synth: synthetic qwen35 targets and DFlash drafts."""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as VT

from lucebox import _core, synth
from lucebox.errors import ConfigError
from lucebox.vocab import read_gguf_metadata

VECTOR_ROLES = ("norm", "vector", "conv")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _specs_roles(specs) -> dict[str, str]:
    return {name: role for name, _ne, role, _req in specs}


def _reader_fields(path: Path) -> dict[str, gguf.ReaderField]:
    return dict(gguf.GGUFReader(path).fields)


def _field_types(f: gguf.ReaderField) -> list[VT]:
    return list(f.types)


def _tensor_values(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a file dequantized to float32, in numpy (reversed ggml) order."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    return out


# --------------------------------------------------------------------------------------------
# tiny pair at each type
# --------------------------------------------------------------------------------------------

# Expected ggml type of a matrix/embedding tensor with row length ne0 for each --type:
# the type itself when ne0 is a multiple of its block size, else q8_0 (block 32).
BLOCK = {"f32": 1, "f16": 1, "bf16": 1, "q8_0": 32, "q4_0": 32, "q4_K": 256, "q5_K": 256, "q6_K": 256}
GGML = {"f32": "f32", "f16": "f16", "bf16": "bf16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_k": "q4_K",
        "q5_k": "q5_K", "q6_k": "q6_K"}


# The tiny pair's Q6_K tensors in q4_k_m and q5_k_m, by llama.cpp's rule (the i-th of n attn_v / attn_qkv, and of
# n ffn_down, when i < n/8, i >= 7n/8 or (i - n/8) % 3 == 2): the target's 4 layers take ranks 2 and 3,
# the draft's 2 layers rank 1; the target's head as well (tests/integration/test_synth_mix.py
# checks the rule itself against llama.cpp's quantizer).
Q4_K_M_HIGH = {
    "target": {"output.weight", "blk.2.attn_qkv.weight", "blk.3.attn_v.weight", "blk.2.ffn_down.weight",
               "blk.3.ffn_down.weight"},
    "draft": {"blk.1.attn_v.weight", "blk.1.ffn_down.weight"},
}


def _wanted_type(type_: str, name: str, model: str) -> str:
    if type_ in ("q4_k_m", "q5_k_m"):
        return "q6_K" if name in Q4_K_M_HIGH[model] else type_[:2] + "_K"
    return GGML[type_]


def _expected_type(type_: str, name: str, ne0: int, model: str) -> str:
    want = _wanted_type(type_, name, model)
    return want if ne0 % BLOCK[want] == 0 else "q8_0"


@pytest.mark.parametrize("type_", ["f32", "f16", "q8_0", "q4_k", "bf16", "q4_0", "q5_k", "q6_k",
                                   "q4_k_m", "q5_k_m"])
def test_tiny_pair_opens_with_expected_types(tmp_path: Path, type_: str) -> None:
    tpath, dpath = tmp_path / "t.gguf", tmp_path / "d.gguf"
    ts = synth.write_target(tpath, "tiny", type=type_)
    ds = synth.write_draft(dpath, "tiny", type=type_)
    t = _core.TargetFile.open(str(tpath))
    d = _core.DraftFile.open(str(dpath))
    _core.validate_draft(t, d)

    assert ts["bytes"] == tpath.stat().st_size == t.file_size
    assert ds["bytes"] == dpath.stat().st_size
    assert ts["n_tensors"] == len(t.tensors) and ds["n_tensors"] == len(d.tensors)
    hp = t.hparams
    assert (hp.n_embd, hp.n_layer, hp.n_vocab, hp.n_ff) == (128, 4, 1024, 256)
    assert hp.is_recurrent == [True, True, True, False]
    assert (hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_rot) == (4, 2, 64, 16)
    assert list(hp.rope_sections) == [3, 3, 2, 0]
    assert (hp.ssm_d_conv, hp.ssm_d_state, hp.ssm_n_k_heads, hp.ssm_n_v_heads) == (4, 32, 2, 4)
    assert hp.conv_dim == 256 and hp.conv_dim % 128 == 0  # ggml CUDA ssm_conv needs channels % 128
    assert hp.has_output
    dh = d.hparams
    assert (dh.n_layer, dh.n_embd, dh.n_head, dh.n_head_kv) == (2, 128, 4, 2)
    assert (dh.head_dim, dh.n_rot) == (64, 64)
    assert list(dh.target_layers) == [1, 3] and dh.block_size == 16
    assert not dh.has_token_embd and not dh.has_output and dh.n_vocab == 0

    for model, f, summary, specs in (("target", t, ts, hp.tensor_specs()), ("draft", d, ds, dh.tensor_specs())):
        roles = _specs_roles(specs)
        fallback_names = set()
        for name, gtype, shape, nbytes in f.tensors:
            role = roles[name]
            if role in VECTOR_ROLES:
                assert gtype == "f32", name
            else:
                assert gtype == _expected_type(type_, name, shape[0], model), (name, shape)
                if gtype != _wanted_type(type_, name, model):
                    fallback_names.add(name)
        assert {fb["tensor"] for fb in summary["fallbacks"]} == fallback_names
        assert sum(summary["types"].values()) == len(f.tensors)
    if type_ in ("q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m"):
        # n_embd 128 is not a multiple of 256: those rows fall back; 256-long rows do not.
        types = dict((name, gtype) for name, gtype, _s, _n in t.tensors)
        assert types["blk.0.attn_qkv.weight"] == "q8_0"
        assert types["blk.0.ffn_down.weight"] in ("q4_K", "q5_K", "q6_K")
        assert ts["fallbacks"] and all(fb["used"] == "q8_0" for fb in ts["fallbacks"])
    else:
        assert ts["fallbacks"] == [] and ds["fallbacks"] == []


def test_q4_k_m_mix(tmp_path: Path) -> None:
    # n_embd 256 and value_dim 256 so that no row falls back; 16 layers (attention every 4th): the
    # attn_v / attn_qkv and the ffn_down of layers 0, 1, 4, 7, 10, 13, 14, 15 in Q6_K, the other
    # layers' in Q4_K (layer 3's attn_v, layer 2's attn_qkv)
    path = tmp_path / "t.gguf"
    s = synth.write_target(path, "tiny", type="q4_k_m", overrides={"n_embd": 256, "ssm_d_state": 64, "n_layer": 16})
    assert s["fallbacks"] == []
    types = {name: gtype for name, gtype, _s, _n in _core.TargetFile.open(str(path)).tensors}
    high = {0, 1, 4, 7, 10, 13, 14, 15}
    for i in range(16):
        want = "q6_K" if i in high else "q4_K"
        assert types[f"blk.{i}.ffn_down.weight"] == want
        assert types[f"blk.{i}.attn_v.weight" if i % 4 == 3 else f"blk.{i}.attn_qkv.weight"] == want
        assert types[f"blk.{i}.ffn_up.weight"] == "q4_K"
    assert types["output.weight"] == "q6_K"
    assert types["token_embd.weight"] == "q4_K"
    assert types["blk.3.attn_k.weight"] == "q4_K" and types["blk.0.attn_gate.weight"] == "q4_K"
    assert types["blk.0.ssm_a"] == "f32" and types["blk.0.ssm_conv1d.weight"] == "f32"
    # a tied head: the embeddings are the head, so they take the head's type
    tied = tmp_path / "tied.gguf"
    synth.write_target(tied, "tiny", type="q4_k_m", overrides={"n_embd": 256, "ssm_d_state": 64, "has_output": False})
    types = {name: gtype for name, gtype, _s, _n in _core.TargetFile.open(str(tied)).tensors}
    assert types["token_embd.weight"] == "q6_K" and "output.weight" not in types


def test_deterministic_for_a_seed(tmp_path: Path) -> None:
    for type_ in ("f16", "q4_k"):
        a, b, c = (tmp_path / f"{type_}-{n}.gguf" for n in "abc")
        synth.write_target(a, "tiny", type=type_, seed=7)
        synth.write_target(b, "tiny", type=type_, seed=7)
        synth.write_target(c, "tiny", type=type_, seed=8)
        assert _sha(a) == _sha(b)
        assert _sha(a) != _sha(c)
        da, db, dc = (tmp_path / f"d-{type_}-{n}.gguf" for n in "abc")
        synth.write_draft(da, "tiny", type=type_, seed=3)
        synth.write_draft(db, "tiny", type=type_, seed=3)
        synth.write_draft(dc, "tiny", type=type_, seed=4)
        assert _sha(da) == _sha(db)
        assert _sha(da) != _sha(dc)
    # Same seed, different tensors: different values (each tensor has its own generator).
    vals = _tensor_values(tmp_path / "f16-a.gguf")
    assert not np.array_equal(vals["blk.0.ffn_gate.weight"], vals["blk.0.ffn_up.weight"])
    assert not np.array_equal(vals["blk.0.ffn_gate.weight"], vals["blk.1.ffn_gate.weight"])


def test_values_follow_the_recipe(tmp_path: Path) -> None:
    path = tmp_path / "t.gguf"
    synth.write_target(path, "tiny", type="f32", seed=0)
    vals = _tensor_values(path)
    for name, v in vals.items():
        assert np.isfinite(v).all(), name
    for il in (0, 1, 2):
        a = vals[f"blk.{il}.ssm_a"]
        assert a.shape == (4,) and (a < 0).all()
        assert (a >= -np.exp(0.5)).all() and (a <= -np.exp(-2)).all()
        dt = vals[f"blk.{il}.ssm_dt.bias"]
        assert (np.abs(dt) <= 0.5).all() and np.abs(dt).max() > 0
        assert abs(float(vals[f"blk.{il}.ssm_norm.weight"].mean()) - 1.0) < 0.1
        conv = vals[f"blk.{il}.ssm_conv1d.weight"]
        assert conv.shape == (256, 4)
        assert 0.35 < float(conv.std()) < 0.65  # 1/sqrt(4)
    embd = vals["token_embd.weight"]
    assert embd.shape == (1024, 128) and 0.95 < float(embd.std()) < 1.05
    norm = vals["blk.0.attn_norm.weight"]
    assert abs(float(norm.mean()) - 1.0) < 0.05 and 0.05 < float(norm.std()) < 0.15
    for name, fan_in in (("blk.0.ffn_gate.weight", 128), ("blk.0.ffn_down.weight", 256),
                         ("blk.3.attn_q.weight", 128), ("output.weight", 128)):
        std = float(vals[name].std())
        assert abs(std * np.sqrt(fan_in) - 1.0) < 0.05, (name, std)
    # quantized types stay finite too
    for type_ in ("bf16", "q4_0", "q6_k"):
        p = tmp_path / f"{type_}.gguf"
        synth.write_target(p, "tiny", type=type_, overrides={"n_embd": 256})
        for name, v in _tensor_values(p).items():
            assert np.isfinite(v).all(), (type_, name)


def test_large_tensors_tile_a_row_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(synth, "POOL_ELEMENTS", 32 * 128)  # pool of 32 rows of 128
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    synth.write_target(a, "tiny", type="f32", seed=5)
    synth.write_target(b, "tiny", type="f32", seed=5)
    assert _sha(a) == _sha(b)
    _core.TargetFile.open(str(a))
    vals = _tensor_values(a)
    embd = vals["token_embd.weight"]  # 1024 rows of 128 > pool: tiled with period 32
    assert np.array_equal(embd[:-32], embd[32:])
    assert len({embd[i].tobytes() for i in range(32)}) == 32
    assert 0.9 < float(embd.std()) < 1.1  # embedding pool is N(0, 1)
    out = vals["output.weight"]  # same row length, matrix scale: a different pool
    assert abs(float(out.std()) * np.sqrt(128) - 1.0) < 0.15
    # tensors of one pool start at different rows
    g0, g1 = vals["blk.0.ffn_gate.weight"], vals["blk.1.ffn_gate.weight"]
    assert g0.shape == (256, 128) and np.array_equal(g0[:-32], g0[32:])
    assert not np.array_equal(g0, g1) or not np.array_equal(g0, vals["blk.2.ffn_gate.weight"])
    # small tensors are still fully random
    assert vals["blk.0.ssm_beta.weight"].shape == (4, 128)


# --------------------------------------------------------------------------------------------
# metadata keys
# --------------------------------------------------------------------------------------------

def test_metadata_keys(tmp_path: Path) -> None:
    tpath, dpath = tmp_path / "t.gguf", tmp_path / "d.gguf"
    synth.write_target(tpath, "tiny")
    synth.write_draft(dpath, "tiny")
    tm, dm = read_gguf_metadata(tpath), read_gguf_metadata(dpath)
    expected_t = {
        "general.architecture": "qwen35",
        "qwen35.context_length": 4096,
        "qwen35.embedding_length": 128,
        "qwen35.block_count": 4,
        "qwen35.feed_forward_length": 256,
        "qwen35.attention.head_count": 4,
        "qwen35.attention.head_count_kv": 2,
        "qwen35.attention.key_length": 64,
        "qwen35.attention.value_length": 64,
        "qwen35.rope.dimension_count": 16,
        "qwen35.rope.dimension_sections": [3, 3, 2, 0],
        "qwen35.ssm.conv_kernel": 4,
        "qwen35.ssm.inner_size": 128,
        "qwen35.ssm.state_size": 32,
        "qwen35.ssm.time_step_rank": 4,
        "qwen35.ssm.group_count": 2,
        "qwen35.full_attention_interval": 4,
    }
    for k, v in expected_t.items():
        assert tm[k] == v, k
    assert tm["qwen35.rope.freq_base"] == pytest.approx(1e7)
    assert tm["qwen35.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert "qwen35.attention.recurrent_layers" not in tm  # the interval rule gives the pattern
    assert "general.alignment" not in tm
    assert tm["general.name"]
    assert "tokenizer.ggml.mask_token_id" not in tm
    expected_d = {
        "general.architecture": "dflash",
        "dflash.block_count": 2,
        "dflash.context_length": 4096,
        "dflash.embedding_length": 128,
        "dflash.feed_forward_length": 256,
        "dflash.attention.head_count": 4,
        "dflash.attention.head_count_kv": 2,
        "dflash.attention.key_length": 64,
        "dflash.attention.value_length": 64,
        "dflash.rope.dimension_count": 64,
        "dflash.rope.dimension_sections": [32, 0, 0, 0],
        "dflash.target_layers": [1, 3],
        "dflash.block_size": 16,
    }
    for k, v in expected_d.items():
        assert dm[k] == v, k
    assert dm["dflash.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert dm["dflash.rope.freq_base"] == pytest.approx(1e7)
    assert dm["tokenizer.ggml.tokens"][dm["tokenizer.ggml.mask_token_id"]] == "<|mask|>"
    assert _core.DraftFile.open(str(dpath)).hparams.mask_token_id == dm["tokenizer.ggml.mask_token_id"]
    for k in ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
              "tokenizer.ggml.token_type", "tokenizer.ggml.eos_token_id", "tokenizer.chat_template"):
        assert tm[k] == dm[k], k
    assert len(tm["tokenizer.ggml.tokens"]) == 1024

    # value types as upstream reads them
    tf, df = _reader_fields(tpath), _reader_fields(dpath)
    assert _field_types(tf["qwen35.block_count"]) == [VT.UINT32]
    assert _field_types(tf["qwen35.rope.dimension_sections"]) == [VT.ARRAY, VT.INT32]
    assert _field_types(tf["qwen35.rope.freq_base"]) == [VT.FLOAT32]
    assert _field_types(df["dflash.target_layers"]) == [VT.ARRAY, VT.INT32]
    assert _field_types(df["dflash.block_size"]) == [VT.UINT32]
    assert _field_types(df["tokenizer.ggml.mask_token_id"]) == [VT.UINT32]


# --------------------------------------------------------------------------------------------
# the real Qwen3.6-27B shapes (sparse, all-zero data)
# --------------------------------------------------------------------------------------------

# ggml ne order, written down from the Qwen3.6-27B config (hidden 5120, 64 layers, attention
# 24 q / 4 kv heads x 256 with the gate interleaved into attn_q, GDN 16 k / 48 v heads x 128,
# conv kernel 4, ffn 17408, vocab 248320, untied head).
QWEN36_27B_GLOBAL = {
    "token_embd.weight": (5120, 248320),
    "output_norm.weight": (5120,),
    "output.weight": (5120, 248320),
}
QWEN36_27B_GDN = {
    "attn_norm.weight": (5120,),
    "attn_qkv.weight": (5120, 10240),
    "attn_gate.weight": (5120, 6144),
    "ssm_conv1d.weight": (4, 10240),
    "ssm_dt.bias": (48,),
    "ssm_a": (48,),
    "ssm_beta.weight": (5120, 48),
    "ssm_alpha.weight": (5120, 48),
    "ssm_norm.weight": (128,),
    "ssm_out.weight": (6144, 5120),
    "post_attention_norm.weight": (5120,),
    "ffn_gate.weight": (5120, 17408),
    "ffn_up.weight": (5120, 17408),
    "ffn_down.weight": (17408, 5120),
}
QWEN36_27B_ATTN = {
    "attn_norm.weight": (5120,),
    "attn_q.weight": (5120, 12288),
    "attn_k.weight": (5120, 1024),
    "attn_v.weight": (5120, 1024),
    "attn_output.weight": (6144, 5120),
    "attn_q_norm.weight": (256,),
    "attn_k_norm.weight": (256,),
    "post_attention_norm.weight": (5120,),
    "ffn_gate.weight": (5120, 17408),
    "ffn_up.weight": (5120, 17408),
    "ffn_down.weight": (17408, 5120),
}
QWEN36_27B_ATTN_LAYERS = set(range(3, 64, 4))
QWEN36_27B_DRAFT_GLOBAL = {
    "fc.weight": (25600, 5120),
    "enc.output_norm.weight": (5120,),
    "output_norm.weight": (5120,),
}
QWEN36_27B_DRAFT_LAYER = {
    "attn_norm.weight": (5120,),
    "attn_q.weight": (5120, 4096),
    "attn_k.weight": (5120, 1024),
    "attn_v.weight": (5120, 1024),
    "attn_output.weight": (4096, 5120),
    "attn_q_norm.weight": (128,),
    "attn_k_norm.weight": (128,),
    "ffn_norm.weight": (5120,),
    "ffn_gate.weight": (5120, 17408),
    "ffn_up.weight": (5120, 17408),
    "ffn_down.weight": (17408, 5120),
}


def _q8_0_bytes(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape[1:])) * shape[0] // 32 * 34


def test_qwen36_27b_shapes_sparse(tmp_path: Path) -> None:
    tpath, dpath = tmp_path / "t27.gguf", tmp_path / "d27.gguf"
    t0 = time.perf_counter()
    ts = synth.write_target(tpath, "qwen3.6-27b", type="q8_0", fill="zeros")
    ds = synth.write_draft(dpath, "qwen3.6-27b", type="q8_0", fill="zeros")
    elapsed = time.perf_counter() - t0
    assert elapsed < 30, elapsed

    st = os.stat(tpath)
    assert st.st_size == ts["bytes"]
    assert 28.5e9 < st.st_size < 28.7e9  # ~28.6 GB at q8_0
    assert st.st_blocks * 512 < st.st_size / 100  # sparse: the data were never written
    assert os.stat(dpath).st_blocks * 512 < os.stat(dpath).st_size / 20

    expected = dict(QWEN36_27B_GLOBAL)
    for il in range(64):
        layer = QWEN36_27B_ATTN if il in QWEN36_27B_ATTN_LAYERS else QWEN36_27B_GDN
        expected.update({f"blk.{il}.{k}": v for k, v in layer.items()})
    assert len(expected) == 3 + 48 * 14 + 16 * 11 == 851

    t = _core.TargetFile.open(str(tpath))
    got = {name: (gtype, tuple(shape), nbytes) for name, gtype, shape, nbytes in t.tensors}
    assert set(got) == set(expected)
    for name, shape in expected.items():
        gtype, gshape, nbytes = got[name]
        assert gshape == shape, name
        if len(shape) == 1 or name.endswith("ssm_conv1d.weight"):
            assert gtype == "f32", name
        else:
            assert gtype == "q8_0", name
            assert nbytes == _q8_0_bytes(shape), name
    hp = t.hparams
    assert (hp.n_layer, hp.n_embd, hp.n_vocab) == (64, 5120, 248320)
    assert (hp.n_ff, hp.n_ctx_train) == (17408, 262144)
    assert hp.n_attention_layers == 16 and hp.n_recurrent_layers == 48
    assert [i for i, r in enumerate(hp.is_recurrent) if not r] == sorted(QWEN36_27B_ATTN_LAYERS)
    assert hp.value_dim == 6144 and hp.key_dim == 2048 and hp.conv_dim == 10240
    assert (hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_rot) == (24, 4, 256, 64)
    assert list(hp.rope_sections) == [11, 11, 10, 0]
    assert (hp.ssm_d_conv, hp.ssm_d_state, hp.ssm_n_k_heads, hp.ssm_n_v_heads) == (4, 128, 16, 48)
    assert hp.has_output

    expected_d = dict(QWEN36_27B_DRAFT_GLOBAL)
    for il in range(5):
        expected_d.update({f"blk.{il}.{k}": v for k, v in QWEN36_27B_DRAFT_LAYER.items()})
    d = _core.DraftFile.open(str(dpath))
    got_d = {name: tuple(shape) for name, _g, shape, _n in d.tensors}
    assert got_d == expected_d
    assert len(got_d) == ds["n_tensors"] == 58
    dh = d.hparams
    assert list(dh.target_layers) == [2, 17, 32, 47, 62] and dh.n_layer == 5 and dh.block_size == 16
    assert (dh.n_head, dh.n_head_kv, dh.head_dim, dh.n_rot, dh.n_ff) == (32, 8, 128, 128, 17408)
    assert not dh.has_token_embd and not dh.has_output
    _core.validate_draft(t, d)
    assert 1.8e9 < os.stat(dpath).st_size < 1.9e9


def test_zeros_fill_is_valid_and_zero(tmp_path: Path) -> None:
    z, r = tmp_path / "z.gguf", tmp_path / "r.gguf"
    synth.write_target(z, "tiny", type="q8_0", fill="zeros")
    synth.write_target(r, "tiny", type="q8_0", fill="random")
    assert z.stat().st_size == r.stat().st_size
    _core.TargetFile.open(str(z))
    for t in gguf.GGUFReader(z).tensors:
        assert not np.asarray(t.data).any(), t.name


# --------------------------------------------------------------------------------------------
# overrides and layer patterns
# --------------------------------------------------------------------------------------------

def test_explicit_layer_pattern_round_trips(tmp_path: Path) -> None:
    pattern = [True, False, True, True, False, True]
    path = tmp_path / "t.gguf"
    synth.write_target(path, "tiny", type="f16", overrides={"n_layer": 6, "recurrent_layers": pattern})
    t = _core.TargetFile.open(str(path))
    assert t.hparams.n_layer == 6 and t.hparams.is_recurrent == pattern
    assert read_gguf_metadata(path)["qwen35.attention.recurrent_layers"] == pattern
    assert _field_types(_reader_fields(path)["qwen35.attention.recurrent_layers"]) == [VT.ARRAY, VT.BOOL]
    names = {n for n, *_ in t.tensors}
    assert "blk.1.attn_q.weight" in names and "blk.1.attn_qkv.weight" not in names
    assert "blk.2.attn_qkv.weight" in names and "blk.4.attn_k_norm.weight" in names
    # the same through command-line strings
    p2 = tmp_path / "t2.gguf"
    synth.write_target(p2, "tiny", type="f16",
                       overrides={"n_layer": "6", "recurrent_layers": "T,F,T,T,F,T"})
    assert _sha(path) == _sha(p2)
    d = tmp_path / "d.gguf"
    synth.write_draft(d, "tiny", overrides={"target_layers": "0,4,5"},
                      target_overrides={"n_layer": 6, "recurrent_layers": pattern})
    _core.validate_draft(t, _core.DraftFile.open(str(d)))


@pytest.mark.parametrize("overrides, attention_layers", [
    ({"n_layer": 8}, [3, 7]),
    ({"n_layer": 6, "full_attention_interval": 2}, [1, 3, 5]),
    ({"n_layer": 3, "full_attention_interval": 1}, [0, 1, 2]),
    ({"n_layer": 5, "recurrent_layers": [True] * 5}, []),
])
def test_other_shapes_round_trip(tmp_path: Path, overrides: dict, attention_layers: list[int]) -> None:
    path = tmp_path / "t.gguf"
    over = dict(overrides, n_embd=256, n_ff=512, n_head=8, n_head_kv=4, head_dim=32, n_rot=32,
                rope_sections="8,4,4,0", ssm_d_state=64, ssm_n_k_heads=1, ssm_n_v_heads=4, n_vocab=2000)
    synth.write_target(path, "tiny", type="q8_0", overrides=over)
    t = _core.TargetFile.open(str(path))
    hp = t.hparams
    assert [i for i, r in enumerate(hp.is_recurrent) if not r] == attention_layers
    assert (hp.n_embd, hp.n_ff, hp.n_vocab) == (256, 512, 2000)
    # the reader reads attention (ssm) keys only when the file has attention (GDN) layers
    if attention_layers:
        assert (hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_rot) == (8, 4, 32, 32)
    if hp.n_recurrent_layers:
        assert hp.conv_dim == 2 * 64 + 4 * 64
    specs = {name: tuple(ne) for name, ne, _r, req in hp.tensor_specs() if req}
    got = {name: tuple(shape) for name, _g, shape, _n in t.tensors}
    assert specs.items() <= got.items()


def test_draft_own_head(tmp_path: Path) -> None:
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    synth.write_target(t, "tiny", overrides={"has_output": False})
    s = synth.write_draft(d, "tiny", own_head=True, overrides={"block_size": 8, "causal": True})
    tf, df = _core.TargetFile.open(str(t)), _core.DraftFile.open(str(d))
    assert not tf.hparams.has_output
    assert "output.weight" not in {n for n, *_ in tf.tensors}
    dh = df.hparams
    assert dh.has_token_embd and dh.has_output and dh.n_vocab == 1024
    assert dh.block_size == 8 and dh.causal
    assert s["n_tensors"] == 27
    _core.validate_draft(tf, df)


BAD_TARGET = [
    {"n_layers": 8},                      # unknown field
    {"n_layer": "eight"},                 # not an integer
    {"n_layer": -1},                      # out of range
    {"n_layer": True},                    # a bool is not an integer
    {"rms_eps": "nan"},                   # not finite
    {"n_head": 3},                        # not a multiple of n_head_kv = 2
    {"n_rot": 65},                        # > head_dim
    {"ssm_n_v_heads": 3},                 # not a multiple of the k heads
    {"recurrent_layers": [True, False]},  # wrong length
    {"recurrent_layers": "T,F,maybe,T"},  # not a bool
    {"rope_sections": [1, 2, 3]},         # 3 entries
    {"n_vocab": 100},                     # below the synthetic minimum
    {"n_embd": 0},
]


@pytest.mark.parametrize("overrides", BAD_TARGET)
def test_bad_target_overrides_raise_and_leave_no_file(tmp_path: Path, overrides: dict) -> None:
    path = tmp_path / "t.gguf"
    with pytest.raises(ConfigError):
        synth.write_target(path, "tiny", overrides=overrides)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kwargs", [
    {"overrides": {"target_layers": [1, 4]}},        # layer 4 > n_layer 3 after the override below
    {"overrides": {"target_layers": [0, 3]}},        # id == n_layer: upstream llama.cpp aborts on it
    {"overrides": {"target_layers": [1, 1]}},        # duplicate
    {"overrides": {"target_layers": []}},            # empty
    {"overrides": {"n_embd": 256}},                  # must equal the target's hidden size
    {"overrides": {"mask_token_id": 1024}},          # outside the vocabulary
    {"overrides": {"block_size": 1}},
    {"overrides": {"n_head": 4, "n_head_kv": 3}},
    {"overrides": {"bogus": 1}},
    {"type": "q3_k"},
    {"fill": "ones"},
    {"seed": -1},
])
def test_bad_draft_arguments_raise_and_leave_no_file(tmp_path: Path, kwargs: dict) -> None:
    path = tmp_path / "d.gguf"
    with pytest.raises(ConfigError):
        synth.write_draft(path, "tiny", target_overrides={"n_layer": 3}, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_quantize_importance() -> None:
    """The i-quants that ggml quantizes only with an importance matrix are refused without one (an
    abort inside ggml otherwise) and take one value per column; other types are unchanged by none."""
    rows = np.random.default_rng(0).standard_normal((4, 256), dtype=np.float32)
    assert _core.quantize_needs_importance("iq2_xxs") and not _core.quantize_needs_importance("q4_K")
    with pytest.raises(ConfigError, match="needs an importance matrix"):
        _core.quantize(rows, "iq2_xxs")
    with pytest.raises(ConfigError, match="one value per column"):
        _core.quantize(rows, "iq2_xxs", importance=np.ones(255, np.float32))
    out = _core.quantize(rows, "iq2_xxs", importance=np.ones(256, np.float32))
    assert out.shape == (4, 66)  # one 66-byte block of 256 values a row
    back = gguf.quants.dequantize(out, gguf.GGMLQuantizationType.IQ2_XXS).reshape(4, 256)
    assert np.corrcoef(back.ravel(), rows.ravel())[0, 1] > 0.8  # a 2-bit code of these rows, not noise


@pytest.mark.parametrize("type_", ["q8_0", "q4_K", "iq4_xs", "mxfp4", "f16", "bf16", "f32"])
def test_dequantize_is_ggmls_decoding(type_: str) -> None:
    """_core.dequantize gives the values gguf's own decoder reads from the same bytes."""
    rows = np.random.default_rng(1).standard_normal((3, 512), dtype=np.float32)
    data = _core.quantize(rows, type_)
    back = _core.dequantize(data, type_, 512)
    assert back.shape == (3, 512) and back.dtype == np.float32
    qt = gguf.GGMLQuantizationType[type_.upper()]
    want = rows if type_ == "f32" else gguf.quants.dequantize(data, qt).reshape(3, 512)
    np.testing.assert_array_equal(back, want)


def test_dequantize_refuses_partial_rows() -> None:
    data = _core.quantize(np.ones((2, 256), np.float32), "q4_K")  # 144 bytes a row
    with pytest.raises(ConfigError, match="not whole rows of 256 q4_K values"):
        _core.dequantize(data.ravel()[:200], "q4_K", 256)
    with pytest.raises(ConfigError, match="block size"):
        _core.dequantize(data, "q4_K", 100)
    with pytest.raises(ConfigError, match="unknown ggml type"):
        _core.dequantize(data, "q9_z", 256)


def test_decoded_weights_rebuild_the_model_in_f32(tmp_path: Path) -> None:
    """decoded_weights + write_target(type="f32") give the float model the quantized file stands
    for: every tensor has the decoded values, and its logits are close to the quantized model's
    (which differs only by quantized activations on the CPU)."""
    import lucebox

    q, f = tmp_path / "q.gguf", tmp_path / "f.gguf"
    synth.write_target(q, "tiny", type="q4_k", seed=2)
    w = synth.decoded_weights(q)
    synth.write_target(f, "tiny", type="f32", weights=w)
    reader = gguf.GGUFReader(f)
    assert {gguf.GGMLQuantizationType(t.tensor_type) for t in reader.tensors} == {gguf.GGMLQuantizationType.F32}
    for t in reader.tensors:
        np.testing.assert_array_equal(np.asarray(t.data).reshape(w[t.name].shape), w[t.name])
    emb = gguf.GGUFReader(q).get_tensor(0)
    assert emb.name == "token_embd.weight"
    np.testing.assert_array_equal(w[emb.name].ravel(), gguf.quants.dequantize(emb.data, emb.tensor_type).ravel())
    ids = [5, 17, 99, 3, 250]
    a = lucebox.Engine(str(q), ctx=64, device="cpu").session().eval(ids)
    b = lucebox.Engine(str(f), ctx=64, device="cpu").session().eval(ids)
    scale = float(np.sqrt(np.mean(np.square(b))))
    assert 0 < np.sqrt(np.mean(np.square(a - b))) / scale < 0.1


def test_bad_preset_and_type(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="preset"):
        synth.write_target(tmp_path / "t.gguf", "huge")
    with pytest.raises(ConfigError, match="type"):
        synth.write_target(tmp_path / "t.gguf", "tiny", type="q2_0")
    with pytest.raises(ConfigError, match="fill"):
        synth.write_target(tmp_path / "t.gguf", "tiny", fill="ones")
    assert list(tmp_path.iterdir()) == []


def test_failed_write_removes_partial_file_and_keeps_old(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.gguf"
    path.write_bytes(b"old")
    calls = {"n": 0}
    real = synth._encode

    def failing(rows, ggml_type):
        calls["n"] += 1
        if calls["n"] == 10:
            raise OSError("disk full (simulated)")
        return real(rows, ggml_type)

    monkeypatch.setattr(synth, "_encode", failing)
    with pytest.raises(OSError, match="simulated"):
        synth.write_target(path, "tiny")
    assert calls["n"] == 10
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.gguf"]


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------

def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lucebox synth")
    synth.add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_writes_a_matching_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    args = _parse(["tiny", "-o", str(t), "--draft-out", str(d), "--type", "Q4_K", "--draft-type", "f16",
                   "--seed", "3", "--set", "n_layer=6", "--set", "recurrent_layers=T,F,T,T,F,T",
                   "--draft-set", "target_layers=1,4,5", "--draft-set", "n_layer=1"])
    assert synth.run(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and str(t) in out[0] and str(d) in out[1]
    tf, df = _core.TargetFile.open(str(t)), _core.DraftFile.open(str(d))
    _core.validate_draft(tf, df)
    assert tf.hparams.is_recurrent == [True, False, True, True, False, True]
    assert list(df.hparams.target_layers) == [1, 4, 5] and df.hparams.n_layer == 1
    assert {g for _n, g, _s, _b in df.tensors} == {"f16", "f32"}
    assert "q4_K" in {g for _n, g, _s, _b in tf.tensors}
    # same arguments through the API: identical bytes
    t2 = tmp_path / "t2.gguf"
    synth.write_target(t2, "tiny", type="q4_k", seed=3,
                       overrides={"n_layer": 6, "recurrent_layers": "T,F,T,T,F,T"})
    assert _sha(t) == _sha(t2)


@pytest.mark.parametrize("argv", [
    ["--set", "n_layer"],                       # no '='
    ["--set", "nope=1"],                        # unknown field
    ["--draft-out", "D", "--draft-set", "target_layers=9"],  # out of range: no file at all
    ["--draft-set", "n_layer=1"],               # --draft-set without --draft-out
])
def test_cli_bad_arguments_write_nothing(tmp_path: Path, argv: list[str]) -> None:
    argv = [str(tmp_path / a) if a == "D" else a for a in argv]
    args = _parse(["tiny", "-o", str(tmp_path / "t.gguf"), *argv])
    with pytest.raises(ConfigError):
        synth.run(args)
    assert list(tmp_path.iterdir()) == []


def test_cli_rejects_unknown_preset_and_type() -> None:
    with pytest.raises(SystemExit):
        _parse(["nope", "-o", "x.gguf"])
    with pytest.raises(SystemExit):
        _parse(["tiny", "-o", "x.gguf", "--type", "q8_k"])


# --------------------------------------------------------------------------------------------
# drafts in the original lucebox schema
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"schema": "lucebox", "own_head": True},                           # never an own head
    {"schema": "lucebox", "overrides": {"causal": True}},              # no causal flag in the schema
    {"schema": "lucebox", "overrides": {"n_rot": 32}},                 # whole-head rope only
    {"schema": "lucebox", "overrides": {"target_layers": [0, 3]}},     # output id -1
    {"schema": "lucebox", "overrides": {"target_layers": [1, 4]}},     # > n_layer 3
    {"target_layer_ids": False},                                       # upstream always stores ids
    {"schema": "gemma4"},
])
def test_bad_lucebox_draft_arguments(tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        synth.write_draft(tmp_path / "d.gguf", "tiny", target_overrides={"n_layer": 3}, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_lucebox_draft_keys_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    assert synth.run(_parse(["tiny", "-o", str(t), "--draft-out", str(d), "--draft-schema", "lucebox",
                             "--draft-set", "target_layers=1,4", "--draft-set", "sliding_window=8"])) == 0
    assert "qwen35-dflash-draft" in capsys.readouterr().out
    md = read_gguf_metadata(d)
    a = "qwen35-dflash-draft."
    assert md["general.architecture"] == "qwen35-dflash-draft"
    assert md[a + "dflash.target_layer_ids"] == [0, 3] and md[a + "dflash.n_target_layers"] == 2
    assert md[a + "dflash.mask_token_id"] == synth._vocab(1024).mask_id and md[a + "vocab_size"] == 1024
    assert md[a + "attention.sliding_window"] == 8 and md[a + "attention.sliding_window_pattern"] == [True, False]
    assert not any(k.startswith(("tokenizer.", "dflash.")) for k in md)
    df = _core.DraftFile.open(str(d))
    _core.validate_draft(_core.TargetFile.open(str(t)), df)
    assert df.hparams.schema == "lucebox" and list(df.hparams.target_layers) == [1, 4]  # 4 = the last output


def test_lucebox_27b_default_ids_sparse(tmp_path: Path) -> None:
    """The real shapes without target_layer_ids: the original default gives the preset's ids."""
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    synth.write_target(t, "qwen3.6-27b", fill="zeros")
    synth.write_draft(d, "qwen3.6-27b", fill="zeros", schema="lucebox", target_layer_ids=False)
    df = _core.DraftFile.open(str(d))
    assert df.hparams.n_deferred_target_layers == 5
    _core.validate_draft(_core.TargetFile.open(str(t)), df)
    assert list(df.hparams.target_layers) == list(synth.PRESETS["qwen3.6-27b"].draft.target_layers)
