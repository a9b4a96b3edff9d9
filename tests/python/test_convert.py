"""`lucebox convert-draft`: z-lab DFlash safetensors drafts -> upstream-schema dflash GGUF.

The tests write a tiny z-lab-style draft directory themselves (config.json + model.safetensors with
random weights at the tiny preset's shapes, z-lab tensor names), convert it, and check that the
result holds exactly the tensors `synth.write_draft` writes from the same arrays and proposes the
same tokens; then malformed inputs, each with its error type and message.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFReader

import lucebox
from lucebox import _core, cli, convert, synth
from lucebox.errors import ConfigError, DraftMismatchError, UnsupportedError

TINY = synth.PRESETS["tiny"]
E = TINY.target.n_embd  # 128

# upstream GGUF name -> z-lab name (the converter's table, written out independently)
ZLAB = {"fc.weight": "fc.weight", "enc.output_norm.weight": "hidden_norm.weight", "output_norm.weight": "norm.weight"}
LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
         "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
         "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj",
         "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def zlab_name(upstream: str) -> str:
    if upstream in ZLAB:
        return ZLAB[upstream]
    _, i, rest = upstream.split(".", 2)
    return f"layers.{i}.{LAYER[rest[:-len('.weight')]]}.weight"


def to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (round to nearest even), as uint16 bits."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str = "BF16",
                      header_edit: Any = None) -> None:
    """A safetensors file: u64 LE header length, JSON header, raw little-endian data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, a in tensors.items():
        raw = (to_bf16(a) if dtype == "BF16" else a.astype({"F16": "<f2", "F32": "<f4"}[dtype])).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if header_edit is not None:
        header_edit(header)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def upstream_weights(seed: int = 3) -> dict[str, np.ndarray]:
    """Random float32 weights at the tiny draft's shapes, keyed by upstream name, bf16-exact."""
    _, hp, _ = synth.resolve_draft("tiny")
    rng = np.random.default_rng(seed)
    out = {}
    for name, ne, role, required in hp.tensor_specs():
        if not required:
            continue
        shape = tuple(reversed(ne))
        a = (1 + 0.1 * rng.standard_normal(shape)) if role == "norm" else rng.standard_normal(shape) / np.sqrt(ne[0])
        out[name] = from_bf16(to_bf16(a.astype(np.float32)))
    return out


def zlab_config(**changes: Any) -> dict[str, Any]:
    d = TINY.draft
    cfg: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": E,
        "num_hidden_layers": d.n_layer, "intermediate_size": d.n_ff, "num_attention_heads": d.n_head,
        "num_key_value_heads": d.n_head_kv, "head_dim": d.head_dim, "rms_norm_eps": 1e-6,
        "rope_theta": d.rope_freq_base, "max_position_embeddings": 4096, "vocab_size": TINY.target.n_vocab,
        "block_size": 16, "num_target_layers": TINY.target.n_layer, "tie_word_embeddings": False,
        "dflash_config": {"mask_token_id": 5, "target_layer_ids": [t - 1 for t in d.target_layers]},
    }
    cfg.update(changes)
    return cfg


def write_zlab(d: Path, weights: dict[str, np.ndarray], cfg: dict[str, Any] | None = None,
               dtype: str = "BF16", prefix: str = "") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg or zlab_config()))
    write_safetensors(d / "model.safetensors", {prefix + zlab_name(k): v for k, v in weights.items()}, dtype)
    return d


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("convert") / "target.gguf"
    synth.write_target(t, "tiny", type="f32", seed=9)
    return t


def tensor_data(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    r = GGUFReader(path)
    return {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape), bytes(t.data.tobytes())) for t in r.tensors}


# --------------------------------------------------------------------------------------------
# Conversion equals writing the same arrays directly
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("type_", ["f32", "q8_0"])
def test_converted_equals_direct(tmp_path, target, type_):
    w = upstream_weights()
    src = write_zlab(tmp_path / "zlab", w)
    out = tmp_path / "converted.gguf"
    s = convert.convert_draft(src, out, target, type=type_)
    assert s["arch"] == "dflash" and s["ignored"] == []
    direct = tmp_path / "direct.gguf"
    synth.write_draft(direct, "tiny", type=type_, weights=w, overrides={"mask_token_id": 5})
    assert tensor_data(out) == tensor_data(direct)
    d = _core.DraftFile.open(str(out))
    _core.validate_draft(_core.TargetFile.open(str(target)), d)
    assert list(d.hparams.target_layers) == list(TINY.draft.target_layers)  # z-lab output ids + 1
    assert d.hparams.mask_token_id == 5 and d.hparams.block_size == 16 and d.hparams.schema == "upstream"

    prompt = [int(x) for x in np.random.default_rng(4).integers(0, 1000, 40)]

    def proposals(draft: Path) -> list[int]:
        sess = lucebox.Engine(str(target), str(draft), ctx=256, device="cpu").session()
        sess.append(prompt)
        return list(sess._core.draft_proposals(prompt[-1]))

    assert proposals(out) == proposals(direct)


@pytest.mark.parametrize("dtype", ["F16", "F32"])
def test_other_dtypes_and_model_prefix(tmp_path, target, dtype):
    w = upstream_weights()
    src = write_zlab(tmp_path / "zlab", w, dtype=dtype, prefix="model.")
    out = tmp_path / "c.gguf"
    convert.convert_draft(src, out, target, type="f32")
    direct = tmp_path / "d.gguf"
    cast = {k: v.astype(np.float16).astype(np.float32) if dtype == "F16" else v for k, v in w.items()}
    synth.write_draft(direct, "tiny", type="f32", weights=cast, overrides={"mask_token_id": 5})
    assert tensor_data(out) == tensor_data(direct)


def test_sharded_and_sliding_window(tmp_path, target):
    """Shards listed in model.safetensors.index.json; SWA from layer_types, as upstream reads it."""
    w = upstream_weights()
    src = tmp_path / "zlab"
    src.mkdir()
    cfg = zlab_config(use_sliding_window=True, sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    (src / "config.json").write_text(json.dumps(cfg))
    names = sorted(w)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for fname, part in halves.items():
        write_safetensors(src / fname, {zlab_name(k): w[k] for k in part})
        weight_map.update({zlab_name(k): fname for k in part})
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    out = tmp_path / "c.gguf"
    convert.convert_draft(src, out, target, type="f32")
    hp = _core.DraftFile.open(str(out)).hparams
    assert hp.n_swa == 8 and list(hp.is_swa) == [True, False] and not hp.causal


def test_cli(tmp_path, target, capsys):
    src = write_zlab(tmp_path / "zlab", upstream_weights(), cfg=zlab_config(rope_scaling={"rope_type": "yarn"}))
    out = tmp_path / "cli.gguf"
    assert cli.main(["convert-draft", str(src), "-o", str(out), "--target", str(target), "--type", "bf16"]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}" in text and "note: ignored rope scaling 'yarn'" in text
    assert _core.DraftFile.open(str(out)).bytes_by_type.keys() == {"bf16", "f32"}


# --------------------------------------------------------------------------------------------
# Malformed inputs
# --------------------------------------------------------------------------------------------

def expect(exc_type: type[Exception], fn, *fragments: str) -> None:
    with pytest.raises(Exception) as info:
        fn()
    msg = str(info.value)
    assert type(info.value) is exc_type, f"raised {type(info.value).__name__}: {msg}"
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"


def _convert(src: Path, target: Path, out: Path):
    return lambda: convert.convert_draft(src, out, target, type="f32")


@pytest.mark.parametrize("change, exc, fragments", [
    ({"dflash_config": {"target_layer_ids": [0, 2]}}, ConfigError, ["'dflash_config.mask_token_id' is missing"]),
    ({"dflash_config": {"mask_token_id": 5}}, ConfigError, ["'dflash_config.target_layer_ids' must be"]),
    ({"rope_theta": None}, ConfigError, ["'rope_theta'", "is missing"]),
    ({"architectures": ["DFlash2DraftModel"]}, UnsupportedError, ["DFlashDraftModel only"]),
    ({"dflash_config": {"mask_token_id": 5, "target_layer_ids": [0, 2], "conv_kernel_size": 4}},
     UnsupportedError, ["'dflash_config.conv_kernel_size' = 4", "DFlash2"]),
    ({"output_multiplier": 0.5}, UnsupportedError, ["'output_multiplier' = 0.5"]),
    ({"rope_is_neox_style": False}, UnsupportedError, ["interleaved rope"]),
    ({"hidden_size": 2 * E}, DraftMismatchError, [f"draft hidden size {2 * E} != target hidden size {E}"]),
    ({"vocab_size": 7}, DraftMismatchError, ["draft vocab_size 7"]),
    ({"num_hidden_layers": 3}, ConfigError, ["the safetensors hold layers [0, 1]", "num_hidden_layers = 3"]),
    ({"dflash_config": {"mask_token_id": 5, "target_layer_ids": [0, 1, 2]}}, ConfigError,
     ["weight 'fc.weight' has shape", f"expected ({E}, {3 * E})"]),
    ({"dflash_config": {"mask_token_id": 5000, "target_layer_ids": [0, 2]}}, DraftMismatchError,
     ["mask token id 5000 is outside the target vocabulary of 1024"]),
    ({"dflash_config": {"mask_token_id": 5, "target_layer_ids": [0, 3]}}, DraftMismatchError,
     ["target layer id 3", "layer input 4 < 4"]),
    ({"dflash_config": {"mask_token_id": 5, "target_layer_ids": [0, 0]}}, ConfigError, ["listed twice"]),
])
def test_bad_config(tmp_path, target, change, exc, fragments):
    cfg = zlab_config(**change)
    if cfg.get("rope_theta") is None:
        del cfg["rope_theta"]
    src = write_zlab(tmp_path / "zlab", upstream_weights(), cfg=cfg)
    out = tmp_path / "out.gguf"
    expect(exc, _convert(src, target, out), *fragments)
    assert not out.exists()


def test_missing_and_unknown_tensors(tmp_path, target):
    w = upstream_weights()
    src = write_zlab(tmp_path / "a", {k: v for k, v in w.items() if k != "blk.1.ffn_up.weight"})
    expect(ConfigError, _convert(src, target, tmp_path / "o.gguf"), "missing ['blk.1.ffn_up.weight']")
    src = write_zlab(tmp_path / "b", w)
    tensors = {zlab_name(k): v for k, v in w.items()} | {"embed_tokens.weight": np.zeros((1024, E), np.float32)}
    write_safetensors(src / "model.safetensors", tensors)
    expect(UnsupportedError, _convert(src, target, tmp_path / "o.gguf"), "'embed_tokens.weight'", "own embedding")
    src = write_zlab(tmp_path / "c", w)
    (src / "mask_embedding.pt").write_bytes(b"")
    expect(UnsupportedError, _convert(src, target, tmp_path / "o.gguf"), "mask embedding")


def test_wrong_tensor_shape(tmp_path, target):
    w = upstream_weights()
    w["blk.0.attn_q.weight"] = w["blk.0.attn_q.weight"][:, :64]
    src = write_zlab(tmp_path / "z", w)
    expect(ConfigError, _convert(src, target, tmp_path / "o.gguf"), "'blk.0.attn_q.weight' has shape (256, 64)",
           f"expected (256, {E})")


@pytest.mark.parametrize("edit, exc, fragments", [
    (lambda h: h["fc.weight"].update(dtype="I8"), UnsupportedError, ["tensor 'fc.weight'", "dtype 'I8'"]),
    (lambda h: h["norm.weight"].update(data_offsets=[0, 10**9]), ConfigError,
     ["tensor 'norm.weight'", "data_offsets [0, 1000000000]"]),
    (lambda h: h["norm.weight"].update(shape=[E, 2]), ConfigError, ["do not hold BF16 [128, 2]"]),
    (lambda h: h["norm.weight"].pop("dtype"), ConfigError, ["needs dtype, shape and data_offsets"]),
])
def test_malformed_safetensors(tmp_path, target, edit, exc, fragments):
    src = write_zlab(tmp_path / "z", upstream_weights())
    write_safetensors(src / "model.safetensors", {zlab_name(k): v for k, v in upstream_weights().items()},
                      header_edit=edit)
    expect(exc, _convert(src, target, tmp_path / "o.gguf"), f"'{src / 'model.safetensors'}'", *fragments)


def test_truncated_and_garbage_safetensors(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"\x01\x02")
    expect(ConfigError, lambda: convert.read_safetensors(p), "truncated")
    p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    expect(ConfigError, lambda: convert.read_safetensors(p), "header length 1099511627776 exceeds")
    p.write_bytes(struct.pack("<Q", 3) + b"{x}")
    expect(ConfigError, lambda: convert.read_safetensors(p), "not valid JSON")
    write_safetensors(p, {"a": np.ones((2, 3), np.float32)}, dtype="F32")
    p.write_bytes(p.read_bytes()[:-4])  # last value cut off
    expect(ConfigError, lambda: convert.read_safetensors(p), "tensor 'a'", "do not hold F32 [2, 3]")


def test_no_config_or_weights(tmp_path, target):
    (tmp_path / "empty").mkdir()
    expect(ConfigError, _convert(tmp_path / "empty", target, tmp_path / "o.gguf"), "config.json", "cannot read")
    (tmp_path / "empty" / "config.json").write_text(json.dumps(zlab_config()))
    expect(ConfigError, _convert(tmp_path / "empty", target, tmp_path / "o.gguf"), "no model.safetensors")
