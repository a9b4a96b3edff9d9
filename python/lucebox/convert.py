"""Convert z-lab DFlash drafts (Hugging Face safetensors) to lucebox's draft GGUF.

A z-lab draft directory holds ``config.json`` and ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``) with the tensors::

    fc.weight                  [hidden, n_captured * hidden]   (PyTorch [out, in])
    hidden_norm.weight         [hidden]
    norm.weight                [hidden]
    layers.{i}.input_layernorm.weight, layers.{i}.post_attention_layernorm.weight
    layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm.weight
    layers.{i}.mlp.{gate,up,down}_proj.weight

(an optional ``model.`` prefix is accepted). `convert_draft` maps them onto upstream llama.cpp's
``dflash`` schema and writes the file with `lucebox.synth.write_draft` (trained weights, the
target's vocabulary), so the result is exactly what the loader expects. Facts taken from
config.json, as upstream's converter reads them: ``dflash_config.mask_token_id``,
``dflash_config.target_layer_ids`` (0-based ids of the layers whose *output* the draft reads;
stored +1, as layer inputs), ``block_size``, ``rope_theta`` (or ``rope_parameters.rope_theta``),
``partial_rotary_factor``, ``rms_norm_eps``, ``is_causal`` / ``dflash_config.causal`` and the
sliding window (``use_sliding_window`` / ``dflash_config.use_swa``, ``sliding_window`` /
``dflash_config.swa_window_size``, ``layer_types``). Variants whose math lucebox does not implement
(DFlash2 convolutions, value/logit/embedding scales, interleaved rope, a draft's own embedding or
head, any unknown tensor) are refused with UnsupportedError.

Safetensors are parsed here with numpy (8-byte little-endian header length, JSON header, raw
little-endian data; BF16, F16 and F32). Every tensor is held as float32 while writing (about 7 GB
for the 1.7B-parameter Qwen3.5/3.6-27B draft).

Command line: ``lucebox convert-draft SRC_DIR -o OUT.gguf --target TARGET.gguf [--type f16]``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError, DraftMismatchError, UnsupportedError

__all__ = ["TYPES", "read_safetensors", "draft_tensor_name", "convert_draft", "add_arguments", "run"]

#: Tensor types the converter writes (norms stay F32).
TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0")
#: Largest safetensors JSON header accepted (the format's own limit is 100 MB).
MAX_HEADER_BYTES = 100 << 20

_DTYPES: dict[str, tuple[np.dtype, int]] = {
    "BF16": (np.dtype("<u2"), 2),
    "F16": (np.dtype("<f2"), 2),
    "F32": (np.dtype("<f4"), 4),
}

# z-lab name (after "layers.{i}.") -> upstream GGUF name (after "blk.{i}.")
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
}
_LAYER_RE = re.compile(r"layers\.(\d+)\.(.+)")

# config.json entries that change the draft's math in ways lucebox's graph does not implement
_UNSUPPORTED_DFLASH_KEYS = {
    "conv_kernel_size": "DFlash2 dynamic convolutions",
    "attention_value_scale": "an attention value scale",
    "output_multiplier": "a logit multiplier",
    "final_logit_softcapping": "final logit soft-capping",
    "input_embedding_scale": "an input embedding scale",
}


# --------------------------------------------------------------------------------------------
# safetensors
# --------------------------------------------------------------------------------------------

def read_safetensors(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """All tensors of a safetensors file as float32 arrays (PyTorch shapes).

    Raises ConfigError naming the file (and the tensor) for a truncated or malformed file, and
    UnsupportedError for a dtype other than BF16, F16 and F32.
    """
    p = Path(path)
    where = f"safetensors file '{p}'"
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ConfigError(f"{where}: truncated (no 8-byte header length)")
            n = int.from_bytes(head, "little")
            if n > min(MAX_HEADER_BYTES, size - 8):
                raise ConfigError(f"{where}: header length {n} exceeds the file ({size} bytes) or "
                                  f"{MAX_HEADER_BYTES} bytes")
            raw = f.read(n)
    except OSError as e:
        raise ConfigError(f"{where}: cannot read: {e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{where}: header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{where}: header is not a JSON object")
    data_start = 8 + n
    data_size = size - data_start
    out: dict[str, np.ndarray] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        what = f"{where}: tensor '{name}'"
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
            raise ConfigError(f"{what}: entry needs dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in _DTYPES:
            raise UnsupportedError(f"{what}: dtype {dtype!r} is not supported (BF16, F16, F32)")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets)):
            raise ConfigError(f"{what}: malformed shape {shape!r} or data_offsets {offsets!r}")
        begin, end = offsets
        np_dtype, item = _DTYPES[dtype]
        count = math.prod(shape)
        if not 0 <= begin <= end <= data_size or end - begin != count * item:
            raise ConfigError(f"{what}: data_offsets [{begin}, {end}] do not hold {dtype} {shape} "
                              f"({count * item} bytes) inside the {data_size} data bytes")
        a = np.fromfile(p, dtype=np_dtype, count=count, offset=data_start + begin).reshape(shape)
        if dtype == "BF16":  # bfloat16 = the high half of a float32
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.astype(np.float32, copy=False)
    return out


def _read_draft_tensors(src: Path) -> dict[str, np.ndarray]:
    single = src / "model.safetensors"
    index = src / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"'{index}': not a safetensors index with a weight_map: {e}") from None
        files = [src / f for f in sorted(set(weight_map.values()))]
    else:
        files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"'{src}': no model.safetensors (or shards) found")
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        for name, a in read_safetensors(f).items():
            if name in tensors:
                raise ConfigError(f"'{src}': tensor '{name}' appears in more than one safetensors file")
            tensors[name] = a
    return tensors


def draft_tensor_name(name: str) -> str | None:
    """The upstream GGUF name of a z-lab draft tensor; None for non-weights to skip (rotary
    inverse frequencies). Raises UnsupportedError for anything else."""
    n = name[len("model."):] if name.startswith("model.") else name
    if n.endswith("rotary_emb.inv_freq"):
        return None
    if n in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[n]
    m = _LAYER_RE.fullmatch(n)
    if m and m.group(2) in _LAYER_NAMES:
        return f"blk.{int(m.group(1))}.{_LAYER_NAMES[m.group(2)]}"
    what = {"embed_tokens.weight": " (a draft with its own embedding)",
            "lm_head.weight": " (a draft with its own LM head)"}.get(n, "")
    raise UnsupportedError(f"draft tensor '{name}'{what} is not supported by lucebox's DFlash graph")


# --------------------------------------------------------------------------------------------
# config.json
# --------------------------------------------------------------------------------------------

def _cfg_int(cfg: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise ConfigError(f"{where}: '{key}' is missing")
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError(f"{where}: '{key}' must be a non-negative integer, got {v!r}")
    return v


def _draft_shape(cfg: Mapping[str, Any], where: str, ignored: list[str]):
    from . import synth

    archs = cfg.get("architectures") or []
    if archs and "DFlashDraftModel" not in archs:
        raise UnsupportedError(f"{where}: architectures {archs} are not supported (DFlashDraftModel only)")
    dcfg = cfg.get("dflash_config") or {}
    if not isinstance(dcfg, dict):
        raise ConfigError(f"{where}: 'dflash_config' must be an object")
    for k, what in _UNSUPPORTED_DFLASH_KEYS.items():
        for scope, c in (("dflash_config.", dcfg), ("", cfg)):
            v = c.get(k)
            neutral = v is None or (k != "conv_kernel_size" and v == (0 if k == "final_logit_softcapping" else 1))
            if not neutral:
                raise UnsupportedError(f"{where}: '{scope}{k}' = {v!r} ({what}) is not supported")
    if cfg.get("rope_is_neox_style", True) is False:
        raise UnsupportedError(f"{where}: 'rope_is_neox_style' false (interleaved rope) is not supported")
    rope = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    for r in (rope, scaling):
        kind = r.get("rope_type", r.get("type"))
        if kind not in (None, "default"):
            ignored.append(f"rope scaling {kind!r} (the draft graph ropes plainly, as upstream's and the "
                           f"original lucebox's)")

    n_embd = _cfg_int(cfg, "hidden_size", where)
    n_layer = _cfg_int(cfg, "num_hidden_layers", where)
    n_head = _cfg_int(cfg, "num_attention_heads", where)
    n_head_kv = _cfg_int(cfg, "num_key_value_heads", where, n_head)
    head_dim = _cfg_int(cfg, "head_dim", where, n_embd // n_head if n_head else None)
    factor = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    theta = cfg.get("rope_theta", rope.get("rope_theta"))
    if theta is None:
        raise ConfigError(f"{where}: 'rope_theta' (or 'rope_parameters.rope_theta') is missing")
    mask = dcfg.get("mask_token_id")
    if mask is None:
        raise ConfigError(f"{where}: 'dflash_config.mask_token_id' is missing")
    ids = dcfg.get("target_layer_ids", cfg.get("target_layer_ids"))
    if not ids or not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                      for i in ids):
        raise ConfigError(f"{where}: 'dflash_config.target_layer_ids' must be a non-empty list of "
                          f"non-negative layer ids, got {ids!r}")
    causal = cfg.get("is_causal")
    if causal is None:
        causal = dcfg.get("causal", False)

    window, pattern = 0, ()
    use_swa = bool(cfg.get("use_sliding_window", False) or dcfg.get("use_swa", False))
    sw = dcfg.get("swa_window_size") or cfg.get("sliding_window")
    if use_swa and sw:
        layer_types = cfg.get("layer_types") or []
        pattern = tuple([True] * n_layer if dcfg.get("use_swa", False)
                        else [t == "sliding_attention" for t in layer_types])
        if len(pattern) != n_layer:
            raise ConfigError(f"{where}: 'layer_types' has {len(pattern)} entries, expected num_hidden_layers "
                              f"= {n_layer}")
        if any(pattern):
            window = int(sw)
        else:
            pattern = ()
    try:
        return synth.DraftShape(
            n_layer=n_layer, n_ff=_cfg_int(cfg, "intermediate_size", where), n_head=n_head, n_head_kv=n_head_kv,
            head_dim=head_dim, n_rot=int(head_dim * float(factor)), target_layers=tuple(i + 1 for i in ids),
            block_size=_cfg_int(dcfg, "block_size", where, cfg.get("block_size", 16)),
            rope_freq_base=float(theta), rms_eps=float(cfg.get("rms_norm_eps", 1e-6)), n_embd=n_embd,
            n_ctx_train=cfg.get("max_position_embeddings"), mask_token_id=int(mask), causal=bool(causal),
            sliding_window=window, swa_pattern=pattern)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _target_shape(thp) -> Any:
    from . import synth

    return synth.TargetShape(
        n_vocab=thp.n_vocab, n_ctx_train=thp.n_ctx_train, n_embd=thp.n_embd, n_layer=thp.n_layer, n_ff=thp.n_ff,
        n_head=thp.n_head, n_head_kv=thp.n_head_kv, head_dim=thp.head_dim, n_rot=thp.n_rot,
        rope_sections=tuple(thp.rope_sections), rope_freq_base=thp.rope_freq_base, rms_eps=thp.rms_eps,
        ssm_d_conv=thp.ssm_d_conv, ssm_d_state=thp.ssm_d_state, ssm_n_k_heads=thp.ssm_n_k_heads,
        ssm_n_v_heads=thp.ssm_n_v_heads, recurrent_layers=tuple(thp.is_recurrent), has_output=thp.has_output)


# --------------------------------------------------------------------------------------------
# Conversion
# --------------------------------------------------------------------------------------------

def convert_draft(src: str | os.PathLike[str], out: str | os.PathLike[str], target: str | os.PathLike[str], *,
                  type: str = "f16", name: str | None = None,
                  progress: Callable[[int, int], None] | None = None) -> dict:
    """Convert the z-lab DFlash draft in directory `src` to an upstream-schema ``dflash`` GGUF at
    `out` for the qwen35 target GGUF `target` (its vocabulary and shapes).

    Returns `lucebox.synth.write_draft`'s summary plus ``source`` and ``ignored`` (config entries
    without effect on lucebox's graph). Raises ConfigError (missing/malformed config.json or
    safetensors, shapes that disagree with the config), UnsupportedError (draft variants lucebox
    cannot run) or DraftMismatchError (hidden size or vocabulary differ from the target), before
    writing anything.
    """
    from . import _core, synth
    from .vocab import read_vocab

    t0 = time.perf_counter()
    type_ = str(type).lower()
    if type_ not in TYPES:
        raise ConfigError(f"unknown type {type!r}; choose one of: {', '.join(TYPES)}")
    src_dir = Path(src)
    config_path = src_dir / "config.json"
    try:
        cfg = json.loads(config_path.read_text())
    except OSError as e:
        raise ConfigError(f"'{config_path}': cannot read the draft's config: {e}") from None
    except ValueError as e:
        raise ConfigError(f"'{config_path}': not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"'{config_path}': expected a JSON object")
    where = f"'{config_path}'"
    ignored: list[str] = []
    dshape = _draft_shape(cfg, where, ignored)
    if (src_dir / "mask_embedding.pt").exists():
        raise UnsupportedError(f"'{src_dir / 'mask_embedding.pt'}': a draft-specific mask embedding is not supported")

    tfile = _core.TargetFile.open(os.fspath(target))
    thp = tfile.hparams
    if dshape.n_embd != thp.n_embd:
        raise DraftMismatchError(f"draft '{src_dir}' does not match target '{target}': draft hidden size "
                                 f"{dshape.n_embd} != target hidden size {thp.n_embd}")
    pair = f"draft '{src_dir}' does not match target '{target}': "
    n_vocab = cfg.get("vocab_size")
    if n_vocab is not None and n_vocab != thp.n_vocab:
        raise DraftMismatchError(f"{pair}draft vocab_size {n_vocab} != target vocabulary of {thp.n_vocab} tokens")
    if dshape.mask_token_id is not None and dshape.mask_token_id >= thp.n_vocab:
        raise DraftMismatchError(f"{pair}mask token id {dshape.mask_token_id} is outside the target vocabulary "
                                 f"of {thp.n_vocab} tokens")
    for layer in dshape.target_layers:
        if layer >= thp.n_layer:  # the upstream schema stores layer inputs; llama.cpp aborts on n_layer
            raise DraftMismatchError(f"{pair}target layer id {layer - 1} (the output of layer {layer - 1}) needs "
                                     f"layer input {layer} < {thp.n_layer}, the target's layer count")
    preset = synth.Preset(name="convert", description=f"converted from {src_dir}",
                          target=_target_shape(thp), draft=dshape)

    weights: dict[str, np.ndarray] = {}
    for tname, a in _read_draft_tensors(src_dir).items():
        gname = draft_tensor_name(tname)
        if gname is None:
            continue
        if gname in weights:
            raise ConfigError(f"'{src_dir}': tensor '{tname}' is given twice (with and without 'model.')")
        weights[gname] = a
    layers = {int(m.group(1)) for n in weights if (m := re.fullmatch(r"blk\.(\d+)\..+", n))}
    if layers != set(range(dshape.n_layer)):
        raise ConfigError(f"'{src_dir}': the safetensors hold layers {sorted(layers)}, config.json "
                          f"num_hidden_layers = {dshape.n_layer}")

    title = name or cfg.get("_name_or_path") or src_dir.resolve().name
    summary = synth.write_draft(out, preset, type=type_, weights=weights, vocab=read_vocab(os.fspath(target)),
                                name=str(title), progress=progress,
                                description=f"DFlash draft converted from Hugging Face safetensors ({src_dir.name}) "
                                            f"by lucebox convert-draft")
    summary.update(source=str(src_dir), ignored=ignored, seconds=time.perf_counter() - t0)
    return summary


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``lucebox convert-draft`` to `parser` (see `run`)."""
    parser.add_argument("src", metavar="SRC_DIR",
                        help="z-lab DFlash draft directory (config.json + model.safetensors)")
    parser.add_argument("-o", "--out", metavar="OUT.gguf", required=True, help="where to write the draft GGUF")
    parser.add_argument("--target", metavar="TARGET.gguf", required=True,
                        help="the qwen35 target GGUF the draft serves (vocabulary and shapes)")
    parser.add_argument("--type", default="f16", type=str.lower, choices=TYPES,
                        help="tensor type of the matrices (norms stay f32; default: f16)")
    parser.add_argument("--name", default=None, help="general.name of the GGUF (default: from config.json)")


def run(args: argparse.Namespace) -> int:
    """Convert as asked by `args` (from `add_arguments`); print one summary line; return 0."""
    s = convert_draft(args.src, args.out, args.target, type=args.type, name=args.name)
    types = ", ".join(f"{k} x{v}" for k, v in sorted(s["types"].items()))
    print(f"wrote {s['path']}: dflash draft from {s['source']}, {s['n_tensors']} tensors [{types}], "
          f"{s['bytes'] / 1e6:.1f} MB, in {s['seconds']:.1f} s", flush=True)
    for item in s["ignored"]:
        print(f"note: ignored {item}", flush=True)
    return 0
