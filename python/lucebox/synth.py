"""Synthetic GGUF models: random weights at any shape of the real architectures.

`write_target` writes a ``qwen35`` target (Qwen3.5/3.6 dense hybrid: Gated DeltaNet layers with a
gated full-attention layer every ``full_attention_interval`` layers) and `write_draft` a matching
DFlash draft (``dflash``), with the metadata keys upstream llama.cpp reads, a small but real
byte-level BPE vocabulary (`lucebox.vocab.synthetic_vocab`) and random weights. Which tensors a
file holds, and their shapes, come from `lucebox._core` (``Qwen35HParams.tensor_specs()`` /
``DFlashHParams.tensor_specs()``), the same tables the loader checks files against.
``write_draft(..., schema="lucebox")`` writes the draft in the original lucebox schema
(``qwen35-dflash-draft``) instead; random values are keyed by the upstream tensor names, so one seed
gives the same weights in both schemas.

Presets (`PRESETS`): ``tiny`` (seconds on a CPU; shapes that ggml's CUDA kernels also accept),
``small`` (a few hundred MB, for CPU benchmarks) and ``qwen3.6-27b`` (the real Qwen3.6-27B
shapes: ~28.7 GB at q8_0, and a 1.8 GB draft). Every shape field can be overridden.

Tensor types (``type=``, `TYPES`): f32, f16, bf16, every quantized type ggml stores weights in (q8_0,
q4_0, q4_k, q5_k, q6_k, the i-quants, tq1_0, mxfp4, ...), and the mixes q4_k_m and q5_k_m. Matrices and
embeddings get the type (the i-quants that ggml quantizes only with an importance matrix get a
uniform one); norms, vectors and the conv kernel are always F32. A matrix whose row
length (ggml ``ne[0]``) is not a multiple of the type's block size falls back to q8_0, else f16,
else f32; fallbacks are listed in the returned summary. ``q4_k_m`` / ``q5_k_m`` are the mixes that
llama.cpp's quantizer (the pinned version, ``LLAMA_FTYPE_MOSTLY_Q4_K_M`` / ``_Q5_K_M``) writes for
these tensors: Q6_K for ``output.weight`` (``token_embd.weight`` where the head is tied), for the
i-th of the n ``attn_v`` and ``attn_qkv`` matrices (one kind, counted in file order) and for the
i-th of the n ``ffn_down`` where llama.cpp's `use_more_bits` holds (i < n/8, i >= 7n/8, or
(i - n/8) % 3 == 2); Q4_K / Q5_K elsewhere. tests/integration/test_synth_mix.py checks them against
llama.cpp's quantizer, type and bytes.

Values are deterministic for a seed (each tensor has its own generator seeded from the seed and a
CRC32 of its name): matrices ~ N(0, 1/sqrt(ne[0])), embeddings ~ N(0, 1), norm gains
1 + 0.1 N(0, 1) (GGUF stores gains as 1+w), ``ssm_a`` = -exp(U(-2, 0.5)) (always negative),
``ssm_dt.bias`` = 0.5 U(-1, 1), conv kernel ~ N(0, 1/sqrt(d_conv)). Files are written as a
stream and never held in memory: tensors of up to `POOL_ELEMENTS` values are fully random; larger
ones are tiled from a pool of random rows (generated and quantized once per type, row length and
scale) starting at a random row per tensor, so writing is as fast as the disk.

``fill="zeros"`` writes a valid file whose tensor data are all zero without writing them: the
data region is skipped with a seek and the file extended with truncate, so on file systems with
sparse files the 27B shape takes a few MB of disk and seconds. Use it for shape and loader checks
of huge presets, never for numerics.

Command line (``lucebox synth``, see `add_arguments`)::

    lucebox synth tiny -o tiny.gguf --draft-out tiny-draft.gguf --type q8_0
    lucebox synth qwen3.6-27b -o t.gguf --draft-out d.gguf --fill zeros
    lucebox synth tiny -o t.gguf --set n_layer=6 --set recurrent_layers=T,F,T,T,F,T
    lucebox synth tiny -o t.gguf --draft-out d.gguf --draft-schema lucebox
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
import types
import typing
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError

__all__ = [
    "TargetShape",
    "DraftShape",
    "Preset",
    "PRESETS",
    "TYPES",
    "FILLS",
    "SCHEMAS",
    "POOL_ELEMENTS",
    "resolve_target",
    "resolve_draft",
    "write_target",
    "write_draft",
    "add_arguments",
    "run",
]

#: Tensor type choices (``type=`` / ``--type``).
TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m",
                          # the other weight types of ggml, one type for all matrices (not q2_0: the gguf
                          # package, 0.19, cannot write it yet; the loader reads it)
                          "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s",
                          "iq3_xxs", "iq3_s", "iq4_nl", "iq4_xs", "tq1_0", "tq2_0", "mxfp4", "nvfp4", "q1_0")
#: Fill modes: random weights, or all-zero data written as a sparse file.
FILLS: tuple[str, ...] = ("random", "zeros")
#: Draft GGUF schemas: upstream llama.cpp ``dflash``, or the original lucebox ``qwen35-dflash-draft``.
SCHEMAS: tuple[str, ...] = ("upstream", "lucebox")
#: general.architecture of a lucebox-schema draft.
LUCEBOX_DRAFT_ARCH = "qwen35-dflash-draft"
#: Tensors with at most this many values are fully random; larger ones are tiled from a pool of
#: random rows of (about) this many values.
POOL_ELEMENTS = 8 << 20

# The mixes' type for the tensors llama.cpp does not raise to q6_K.
_MIX_BASE = {"q4_k_m": "q4_K", "q5_k_m": "q5_K"}
# Per-tensor ggml type name (as ggml spells it) of each single-type --type choice; q4_k_m and
# q5_k_m are mixes (_wanted_types) of their base type and q6_K.
_GGML_NAME = {t: t[:-1] + "K" if t.endswith("_k") else t for t in TYPES if t not in _MIX_BASE}
# Fallback chain for a row length that is not a multiple of the block size.
_FALLBACKS = ("q8_0", "f16", "f32")
# general.file_type (llama_ftype) written for each choice.
_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k": 11,
              "q4_k": 14, "q4_k_m": 15, "q5_k": 16, "q5_k_m": 17, "q6_k": 18, "iq2_xxs": 19, "iq2_xs": 20,
              "iq3_xxs": 23, "iq1_s": 24, "iq4_nl": 25, "iq3_s": 26, "iq2_s": 28, "iq4_xs": 30, "iq1_m": 31,
              "bf16": 32, "tq1_0": 36, "tq2_0": 37, "mxfp4": 38, "nvfp4": 39, "q1_0": 40}
_QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION
_CHUNK_BYTES = 32 << 20  # largest single write


# --------------------------------------------------------------------------------------------
# Shapes and presets
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TargetShape:
    """Shape of a ``qwen35`` target. Field names follow `lucebox._core.Qwen35HParams`.

    The layer pattern is `recurrent_layers` when given (one bool per layer, True = Gated
    DeltaNet), else layer i is attention iff ``(i + 1) % full_attention_interval == 0``.
    """

    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    rope_sections: tuple[int, ...]
    rope_freq_base: float
    rms_eps: float
    ssm_d_conv: int
    ssm_d_state: int
    ssm_n_k_heads: int
    ssm_n_v_heads: int
    full_attention_interval: int = 4
    recurrent_layers: tuple[bool, ...] | None = None
    has_output: bool = True  # untied LM head (output.weight)

    def layer_pattern(self) -> list[bool]:
        """Per layer: True = Gated DeltaNet, False = full attention."""
        if self.recurrent_layers is not None:
            return list(self.recurrent_layers)
        interval = self.full_attention_interval
        return [(i + 1) % interval != 0 for i in range(self.n_layer)]


@dataclass(frozen=True)
class DraftShape:
    """Shape of a DFlash draft. Field names follow `lucebox._core.DFlashHParams`.

    `n_embd` and `n_ctx_train` default to the target's; `mask_token_id` to the vocabulary's
    ``<|mask|>`` token. `target_layers` are the ids as stored in ``dflash.target_layers`` (the
    target layers whose *input* hidden states feed the draft), each < the target's n_layer.
    """

    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    target_layers: tuple[int, ...]
    block_size: int = 16
    rope_freq_base: float = 10_000_000.0
    rms_eps: float = 1e-6
    n_embd: int | None = None
    n_ctx_train: int | None = None
    mask_token_id: int | None = None
    causal: bool = False
    sliding_window: int = 0  # > 0: the layers marked in swa_pattern see only this many context positions
    swa_pattern: tuple[bool, ...] = ()


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    target: TargetShape
    draft: DraftShape


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="tiny",
            description="4 layers (3 GDN + 1 attention), hidden 128, vocab 1024; seconds on a CPU, "
                        "valid for ggml's CUDA kernels (GDN head 32, conv channels 256)",
            target=TargetShape(
                n_vocab=1024, n_ctx_train=4096, n_embd=128, n_layer=4, n_ff=256,
                n_head=4, n_head_kv=2, head_dim=64, n_rot=16, rope_sections=(3, 3, 2, 0),
                rope_freq_base=10_000_000.0, rms_eps=1e-6,
                ssm_d_conv=4, ssm_d_state=32, ssm_n_k_heads=2, ssm_n_v_heads=4,
                full_attention_interval=4),
            draft=DraftShape(
                n_layer=2, n_ff=256, n_head=4, n_head_kv=2, head_dim=64, n_rot=64,
                target_layers=(1, 3), block_size=16, rope_freq_base=10_000_000.0, rms_eps=1e-6),
        ),
        Preset(
            name="small",
            description="8 layers, hidden 1024, vocab 8192: a few hundred MB, for CPU benchmarks",
            target=TargetShape(
                n_vocab=8192, n_ctx_train=32768, n_embd=1024, n_layer=8, n_ff=2816,
                n_head=8, n_head_kv=2, head_dim=256, n_rot=64, rope_sections=(11, 11, 10, 0),
                rope_freq_base=10_000_000.0, rms_eps=1e-6,
                ssm_d_conv=4, ssm_d_state=128, ssm_n_k_heads=8, ssm_n_v_heads=16,
                full_attention_interval=4),
            draft=DraftShape(
                n_layer=2, n_ff=2816, n_head=8, n_head_kv=2, head_dim=128, n_rot=128,
                target_layers=(1, 4, 7), block_size=16, rope_freq_base=10_000_000.0, rms_eps=1e-6),
        ),
        Preset(
            name="qwen3.6-27b",
            description="the real Qwen3.6-27B shapes: 64 layers (48 GDN + 16 attention), hidden "
                        "5120, vocab 248320, untied head; ~28.7 GB at q8_0 (draft 1.8 GB)",
            target=TargetShape(
                n_vocab=248320, n_ctx_train=262144, n_embd=5120, n_layer=64, n_ff=17408,
                n_head=24, n_head_kv=4, head_dim=256, n_rot=64, rope_sections=(11, 11, 10, 0),
                rope_freq_base=10_000_000.0, rms_eps=1e-6,
                ssm_d_conv=4, ssm_d_state=128, ssm_n_k_heads=16, ssm_n_v_heads=48,
                full_attention_interval=4, has_output=True),
            draft=DraftShape(
                n_layer=5, n_ff=17408, n_head=32, n_head_kv=8, head_dim=128, n_rot=128,
                target_layers=(2, 17, 32, 47, 62), block_size=16, rope_freq_base=10_000_000.0,
                rms_eps=1e-6),
        ),
    )
}


# --------------------------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------------------------

_UNION_TYPES = (typing.Union, getattr(types, "UnionType", typing.Union))
_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off"}


def _parse_bool(text: str, what: str) -> bool:
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ConfigError(f"{what}: expected a boolean (true/false, T/F, 1/0), got {text!r}")


def _split_list(text: str) -> list[str]:
    t = text.strip()
    if t.startswith(("[", "(")) and t.endswith(("]", ")")):
        t = t[1:-1]
    return [p for p in (s.strip() for s in t.replace(" ", ",").split(",")) if p]


def _coerce(value: Any, tp: Any, what: str) -> Any:
    """Convert `value` (a Python value or a command-line string) to the field type `tp`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in _UNION_TYPES and type(None) in args:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "")):
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(value, inner, what)
    if origin is tuple:
        item = args[0]
        if isinstance(value, str):
            items: list[Any] = _split_list(value)
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            raise ConfigError(f"{what}: expected a list, got {value!r}")
        return tuple(_coerce(v, item, what) for v in items)
    if tp is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if isinstance(value, str):
            return _parse_bool(value, what)
        raise ConfigError(f"{what}: expected a boolean, got {value!r}")
    if tp is int:
        if isinstance(value, str):
            try:
                value = int(value.strip(), 0)
            except ValueError:
                raise ConfigError(f"{what}: expected an integer, got {value!r}") from None
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise ConfigError(f"{what}: expected an integer, got {value!r}")
        value = int(value)
        if not 0 <= value <= 0xFFFFFFFF:
            raise ConfigError(f"{what}: {value} is out of range (0 .. 2^32-1)")
        return value
    if tp is float:
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise ConfigError(f"{what}: expected a number, got {value!r}") from None
        numeric = (int, float, np.integer, np.floating)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numeric):
            raise ConfigError(f"{what}: expected a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{what}: {value} is not finite")
        return value
    raise AssertionError(f"unhandled field type {tp!r}")  # pragma: no cover


def _apply_overrides(shape: Any, overrides: Mapping[str, Any] | None, kind: str) -> Any:
    if not overrides:
        return shape
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"{kind} overrides must be a mapping of field name to value, "
                          f"got {overrides!r}")
    hints = typing.get_type_hints(type(shape))
    names = [f.name for f in dataclasses.fields(shape)]
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in hints:
            raise ConfigError(f"unknown {kind} field {key!r}; valid fields: {', '.join(names)}")
        changes[key] = _coerce(value, hints[key], f"{kind} field {key!r}")
    return dataclasses.replace(shape, **changes)


def parse_assignments(items: list[str] | None, option: str = "--set") -> dict[str, str]:
    """Parse ``KEY=VALUE`` strings (a repeatable command-line option) into a dict."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{option} expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def _get_preset(preset: str | Preset) -> Preset:
    if isinstance(preset, Preset):
        return preset
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[preset]


# --------------------------------------------------------------------------------------------
# Resolution: shape -> validated hyperparameters, tensor list, vocabulary
# --------------------------------------------------------------------------------------------

def _core():
    from . import _core as core  # imported lazily: the extension is needed only to write files

    return core


def _vocab(n_vocab: int):
    from . import vocab as vocab_mod

    try:
        return vocab_mod.synthetic_vocab(n_vocab)
    except ValueError as e:
        raise ConfigError(f"n_vocab: {e}") from None


def resolve_target(preset: str | Preset = "tiny", overrides: Mapping[str, Any] | None = None):
    """Return ``(TargetShape, Qwen35HParams)`` of a preset with overrides, validated.

    Raises ConfigError naming the first bad value.
    """
    shape: TargetShape = _apply_overrides(_get_preset(preset).target, overrides, "target")
    if len(shape.rope_sections) != 4:
        raise ConfigError(f"target field 'rope_sections' needs 4 entries, "
                          f"got {list(shape.rope_sections)}")
    if shape.recurrent_layers is None and shape.full_attention_interval == 0:
        raise ConfigError("target field 'full_attention_interval' must be > 0")
    if shape.recurrent_layers is not None and len(shape.recurrent_layers) != shape.n_layer:
        raise ConfigError(f"target field 'recurrent_layers' has {len(shape.recurrent_layers)} entries, "
                          f"expected one per layer (n_layer = {shape.n_layer})")
    from . import vocab as vocab_mod

    if shape.n_vocab < vocab_mod.MIN_SYNTHETIC_VOCAB:
        raise ConfigError(f"target field 'n_vocab' = {shape.n_vocab} is below the smallest synthetic "
                          f"vocabulary ({vocab_mod.MIN_SYNTHETIC_VOCAB} tokens)")
    hp = _core().Qwen35HParams()
    hp.n_vocab = shape.n_vocab
    hp.n_ctx_train = shape.n_ctx_train
    hp.n_embd = shape.n_embd
    hp.n_layer = shape.n_layer
    hp.n_ff = shape.n_ff
    hp.n_head = shape.n_head
    hp.n_head_kv = shape.n_head_kv
    hp.head_dim = shape.head_dim
    hp.n_rot = shape.n_rot
    hp.rope_sections = list(shape.rope_sections)
    hp.rope_freq_base = shape.rope_freq_base
    hp.rms_eps = shape.rms_eps
    hp.ssm_d_conv = shape.ssm_d_conv
    hp.ssm_d_state = shape.ssm_d_state
    hp.ssm_n_k_heads = shape.ssm_n_k_heads
    hp.ssm_n_v_heads = shape.ssm_n_v_heads
    hp.is_recurrent = shape.layer_pattern()
    hp.has_output = shape.has_output
    hp.validate()  # raises ConfigError
    return shape, hp


def resolve_draft(preset: str | Preset = "tiny", overrides: Mapping[str, Any] | None = None,
                  target_overrides: Mapping[str, Any] | None = None, *, own_head: bool = False,
                  schema: str = "upstream"):
    """Return ``(DraftShape, DFlashHParams, TargetShape)`` for a draft matching its target.

    `schema` ``"lucebox"``: the original lucebox schema, which stores the *outputs* of target
    layers (ids = our `target_layers` - 1, so each id must be in [1, n_layer]; n_layer is the
    output of the last layer), ropes whole heads (n_rot == head_dim), has no causal flag and no
    embedding/head of its own.
    """
    schema = _check_choice(schema, SCHEMAS, "draft schema")
    tshape, thp = resolve_target(preset, target_overrides)
    shape: DraftShape = _apply_overrides(_get_preset(preset).draft, overrides, "draft")
    n_embd = tshape.n_embd if shape.n_embd is None else shape.n_embd
    if n_embd != tshape.n_embd:
        raise ConfigError(f"draft n_embd {n_embd} must equal the target's hidden size {tshape.n_embd}")
    mask = shape.mask_token_id
    if mask is None:
        mask = _vocab(tshape.n_vocab).mask_id
    if not 0 <= mask < tshape.n_vocab:
        raise ConfigError(f"draft field 'mask_token_id' = {mask} is outside the vocabulary of "
                          f"{tshape.n_vocab} tokens")
    seen: set[int] = set()
    for layer in shape.target_layers:
        if schema == "lucebox":
            # lucebox stores output ids (layer - 1 >= 0); the last layer's output (id n_layer) is fine
            if not 1 <= layer <= thp.n_layer:
                raise ConfigError(f"draft target layer {layer} is out of range [1, {thp.n_layer}] for a "
                                  f"lucebox-schema draft of a target with {thp.n_layer} layers (set draft "
                                  f"field 'target_layers')")
        # Upstream llama.cpp extracts the *input* of each listed layer and aborts on id == n_layer
        # (the output of the last layer is not wired for qwen35), so ids must be < n_layer.
        elif layer >= thp.n_layer:
            raise ConfigError(f"draft target layer {layer} is out of range [0, {thp.n_layer - 1}] for a "
                              f"target with {thp.n_layer} layers (set draft field 'target_layers')")
        if layer in seen:
            raise ConfigError(f"draft target layer {layer} is listed twice")
        seen.add(layer)
    if schema == "lucebox":
        if own_head:
            raise ConfigError("a lucebox-schema draft has no embedding or head of its own (own_head)")
        if shape.causal:
            raise ConfigError("the lucebox schema has no causal flag (draft field 'causal')")
        if shape.n_rot != shape.head_dim:
            raise ConfigError(f"the lucebox schema ropes whole heads: draft n_rot {shape.n_rot} must equal "
                              f"head_dim {shape.head_dim}")
    hp = _core().DFlashHParams()
    hp.schema = schema
    hp.n_embd = n_embd
    hp.n_layer = shape.n_layer
    hp.n_ff = shape.n_ff
    hp.n_head = shape.n_head
    hp.n_head_kv = shape.n_head_kv
    hp.head_dim = shape.head_dim
    hp.n_rot = shape.n_rot
    hp.rope_freq_base = shape.rope_freq_base
    hp.rms_eps = shape.rms_eps
    hp.block_size = shape.block_size
    hp.mask_token_id = mask
    hp.target_layers = list(shape.target_layers)
    hp.causal = shape.causal
    if shape.sliding_window < 0:
        raise ConfigError(f"draft sliding_window {shape.sliding_window} must be >= 0")
    if shape.sliding_window > 0:
        pattern = shape.swa_pattern or tuple([True] * (shape.n_layer - 1) + [False])
        if len(pattern) != shape.n_layer:
            raise ConfigError(f"draft swa_pattern has {len(pattern)} entries, expected n_layer = {shape.n_layer}")
        hp.n_swa = shape.sliding_window
        hp.is_swa = list(pattern)
    hp.n_vocab = tshape.n_vocab if own_head else 0
    hp.has_token_embd = own_head
    hp.has_output = own_head
    hp.validate()  # raises ConfigError
    return shape, hp, tshape


def _check_choice(value: str, choices: tuple[str, ...], what: str) -> str:
    v = str(value).lower()
    if v not in choices:
        raise ConfigError(f"unknown {what} {value!r}; choose one of: {', '.join(choices)}")
    return v


# --------------------------------------------------------------------------------------------
# Tensor plan
# --------------------------------------------------------------------------------------------

@dataclass
class _Tensor:
    name: str
    ne: tuple[int, ...]  # ggml order
    role: str
    ggml_type: str  # ggml's spelling, e.g. "q4_K"
    block: int
    type_size: int
    key: str = ""  # name that random values and given weights are keyed by (upstream schema name)

    def __post_init__(self) -> None:
        self.key = self.key or self.name

    @property
    def n_rows(self) -> int:
        return math.prod(self.ne[1:])

    @property
    def row_bytes(self) -> int:
        return self.ne[0] // self.block * self.type_size

    @property
    def nbytes(self) -> int:
        return self.n_rows * self.row_bytes


def _use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice (llama-quant.cpp) of the i-th of n attn_v-like or ffn_down tensors that a
    Q4_K_M / Q5_K_M file keeps in Q6_K: the first and last eighth, and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _wanted_types(type_: str, names: list[str]) -> list[str]:
    """The ggml type each tensor of `names` (file order, llama.cpp's names) asks for."""
    if type_ not in _MIX_BASE:
        return [_GGML_NAME[type_]] * len(names)
    # llama.cpp counts attn_v, attn_qkv (and attn_kv_b) tensors as one kind, and ffn_down apart
    wv = [i for i, n in enumerate(names) if n.endswith(("attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight"))]
    down = [i for i, n in enumerate(names) if "ffn_down" in n]
    more = {i for kind in (wv, down) for rank, i in enumerate(kind) if _use_more_bits(rank, len(kind))}
    # the LM head, or the embeddings where they are the head too (no output.weight)
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    return ["q6_K" if n == head or i in more else _MIX_BASE[type_] for i, n in enumerate(names)]


def _plan(specs: list, type_: str, include_optional: Callable[[str], bool], keys: list[str] | None = None):
    """Pick the tensors to write and their types; return (tensors, fallbacks).

    `keys[i]` is the name spec i's values are keyed by (default: its own name)."""
    core = _core()
    tensors: list[_Tensor] = []
    fallbacks: list[dict[str, str]] = []
    chosen = [i for i, (name, _, _, required) in enumerate(specs) if required or include_optional(name)]
    matrices = [i for i in chosen if specs[i][2] not in ("norm", "vector", "conv")]
    wanted_of = dict(zip(matrices, _wanted_types(type_, [keys[i] if keys else specs[i][0] for i in matrices])))
    for i in chosen:
        name, ne, role, _ = specs[i]
        ne = tuple(int(n) for n in ne)
        if role in ("norm", "vector", "conv"):
            gtype = "f32"
        else:
            wanted = wanted_of[i]
            gtype = wanted
            if ne[0] % core.ggml_type_traits(wanted)[1] != 0:
                for cand in _FALLBACKS:
                    if ne[0] % core.ggml_type_traits(cand)[1] == 0:
                        gtype = cand
                        break
                fallbacks.append({"tensor": name, "wanted": wanted, "used": gtype,
                                  "reason": f"row length {ne[0]} is not a multiple of the {wanted} "
                                            f"block size {core.ggml_type_traits(wanted)[1]}"})
        canonical, block, size = core.ggml_type_traits(gtype)
        tensors.append(_Tensor(name, ne, role, canonical, block, size, keys[i] if keys else name))
    return tensors, fallbacks


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------

def _rng(seed: int, *key: str) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF,
                                  *(zlib.crc32(k.encode()) for k in key)])


def _normal_scale(t: _Tensor, d_conv: int) -> float:
    if t.role == "embedding":
        return 1.0
    if t.role == "conv":
        return 1.0 / math.sqrt(d_conv)
    return 1.0 / math.sqrt(t.ne[0])  # matrix: fan_in = ne[0]


def _values(t: _Tensor, rng: np.random.Generator, d_conv: int) -> np.ndarray:
    """All values of a small tensor as float32 rows (n_rows, ne[0])."""
    shape = (t.n_rows, t.ne[0])
    if t.role == "norm":
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if t.role == "vector":
        if t.name.endswith("ssm_a"):
            return (-np.exp(rng.uniform(-2.0, 0.5, shape))).astype(np.float32)
        if t.name.endswith("ssm_dt.bias"):
            return (0.5 * rng.uniform(-1.0, 1.0, shape)).astype(np.float32)
        return (0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(_normal_scale(t, d_conv))


def _encode(rows: np.ndarray, ggml_type: str) -> np.ndarray:
    """float32 rows -> uint8 rows of `ggml_type`. The types ggml quantizes only with an importance
    matrix (IQ1_S, IQ2_XXS, IQ2_XS) get a uniform one: every column weighs alike, as nothing about a
    random model's activations says otherwise."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if ggml_type == "f32":
        return rows.view(np.uint8)
    core = _core()
    importance = np.ones(rows.shape[1], np.float32) if core.quantize_needs_importance(ggml_type) else None
    return core.quantize(rows, ggml_type, importance=importance)


def decoded_weights(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The float32 values every tensor of the GGUF at `path` stands for (ggml's dequantization),
    keyed by name, numpy shape = ggml ne reversed: `write_target(..., type="f32", weights=...)`
    with them writes the float model a quantized file approximates (tests measure each backend's
    quantized arithmetic against it)."""
    import gguf

    core = _core()
    out: dict[str, np.ndarray] = {}
    for t in gguf.GGUFReader(path).tensors:
        ne = [int(d) for d in t.shape]
        raw = np.ascontiguousarray(t.data).view(np.uint8)
        rows = core.dequantize(raw, gguf.GGMLQuantizationType(t.tensor_type).name.lower(), ne[0])
        out[t.name] = rows.reshape(list(reversed(ne)))
    return out


class _Pools:
    """Random rows per (type, row length, scale), generated and encoded once per file."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.pools: dict[tuple[str, int, float], np.ndarray] = {}

    def get(self, t: _Tensor, scale: float) -> np.ndarray:
        key = (t.ggml_type, t.ne[0], scale)
        pool = self.pools.get(key)
        if pool is None:
            n_rows = max(1, POOL_ELEMENTS // t.ne[0])
            rng = _rng(self.seed, "pool", t.ggml_type, str(t.ne[0]), repr(scale))
            rows = rng.standard_normal((n_rows, t.ne[0]), dtype=np.float32) * np.float32(scale)
            pool = _encode(rows, t.ggml_type)
            self.pools[key] = pool
        return pool


def _tensor_chunks(t: _Tensor, seed: int, d_conv: int, pools: _Pools) -> Iterator[memoryview]:
    """Yield the bytes of tensor `t` in chunks of at most about `_CHUNK_BYTES`."""
    rng = _rng(seed, t.key)
    if t.n_rows * t.ne[0] <= POOL_ELEMENTS or t.role not in ("matrix", "embedding", "conv"):
        data = _encode(_values(t, rng, d_conv), t.ggml_type)
        yield memoryview(data).cast("B")
        return
    pool = pools.get(t, _normal_scale(t, d_conv))
    n_pool = pool.shape[0]
    flat = memoryview(pool).cast("B")
    row_bytes = pool.shape[1]
    pos = int(rng.integers(n_pool))
    left = t.n_rows
    while left > 0:
        n = min(left, n_pool - pos, max(1, _CHUNK_BYTES // row_bytes))
        yield flat[pos * row_bytes:(pos + n) * row_bytes]
        left -= n
        pos = (pos + n) % n_pool


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

def _int32_array(writer, key: str, values) -> None:
    import gguf

    writer.add_key_value(key, [int(v) for v in values], gguf.GGUFValueType.ARRAY,
                         sub_type=gguf.GGUFValueType.INT32)


def _bool_array(writer, key: str, values) -> None:
    import gguf

    writer.add_key_value(key, [bool(v) for v in values], gguf.GGUFValueType.ARRAY,
                         sub_type=gguf.GGUFValueType.BOOL)


def _common_keys(writer, name: str, description: str, type_: str) -> None:
    writer.add_name(name)
    writer.add_description(description)
    writer.add_file_type(_FILE_TYPE[type_])
    writer.add_quantization_version(_QUANTIZATION_VERSION)


def _stream(path: Path, arch: str, add_keys: Callable[[Any], None], tensors: list[_Tensor], *,
            seed: int, fill: str, d_conv: int, progress: Callable[[int, int], None] | None,
            weights: Mapping[str, np.ndarray] | None = None) -> int:
    """Write the file at `path` (via a temporary name, renamed at the end); return its size.

    Tensor data: `weights` (already checked by `_check_weights`) when given, else `fill`."""
    import gguf

    tmp = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(tmp, arch)
    try:
        add_keys(writer)
        for t in tensors:
            writer.add_tensor_info(t.name, tuple(reversed(t.ne)), np.dtype(np.float32), t.nbytes,
                                   raw_dtype=gguf.GGMLQuantizationType[t.ggml_type.upper()])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None and len(writer.fout) == 1
        fout = writer.fout[0]
        align = writer.data_alignment
        data_start = gguf.GGUFWriter.ggml_pad(fout.tell(), align)
        total = sum(gguf.GGUFWriter.ggml_pad(t.nbytes, align) for t in tensors)
        end = data_start + total
        if fill == "zeros" and weights is None:
            fout.flush()
            fout.truncate(end)  # extends the file with a hole: all tensor data read as zero
            if progress is not None:
                progress(total, total)
        else:
            writer.write_padding(fout, fout.tell())
            pools = _Pools(seed)
            done = 0
            for t in tensors:
                written = 0
                chunks = (_tensor_chunks(t, seed, d_conv, pools) if weights is None
                          else [memoryview(_encode(weights[t.key].reshape(t.n_rows, t.ne[0]), t.ggml_type)).cast("B")])
                for chunk in chunks:
                    fout.write(chunk)
                    written += len(chunk)
                    if progress is not None:
                        progress(done + written, total)
                if written != t.nbytes:
                    raise AssertionError(f"{t.name}: wrote {written} bytes, expected {t.nbytes}")
                writer.write_padding(fout, t.nbytes)
                done += gguf.GGUFWriter.ggml_pad(t.nbytes, align)
        fout.flush()
        size = fout.seek(0, os.SEEK_END)
        if size != end:
            raise AssertionError(f"file size {size} != expected {end}")
        writer.close()
        os.replace(tmp, path)
        return size
    except BaseException:
        writer.close()
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _check_weights(weights: Mapping[str, Any], tensors: list[_Tensor], what: str) -> dict[str, np.ndarray]:
    """Trained values for every planned tensor, keyed by `_Tensor.key`; numpy shapes = ggml ne reversed."""
    names = {t.key for t in tensors}
    missing = sorted(names - set(weights))
    extra = sorted(set(weights) - names)
    if missing or extra:
        raise ConfigError(f"{what} weights do not match the tensor list: missing {missing[:5]}, "
                          f"unexpected {extra[:5]}")
    out: dict[str, np.ndarray] = {}
    for t in tensors:
        a = np.asarray(weights[t.key], dtype=np.float32)
        want = tuple(reversed(t.ne))
        if a.shape != want:
            raise ConfigError(f"{what} weight {t.key!r} has shape {a.shape}, expected {want}")
        if not np.isfinite(a).all():
            raise ConfigError(f"{what} weight {t.key!r} has non-finite values")
        out[t.key] = np.ascontiguousarray(a)
    return out


def _summary(path: Path, arch: str, preset: str, type_: str, fill: str, seed: int, size: int,
             tensors: list[_Tensor], fallbacks: list[dict[str, str]], seconds: float) -> dict:
    types: dict[str, int] = {}
    for t in tensors:
        types[t.ggml_type] = types.get(t.ggml_type, 0) + 1
    return {
        "path": str(path),
        "arch": arch,
        "preset": preset,
        "type": type_,
        "fill": fill,
        "seed": seed,
        "bytes": size,
        "data_bytes": sum(t.nbytes for t in tensors),
        "n_tensors": len(tensors),
        "types": types,
        "fallbacks": fallbacks,
        "seconds": seconds,
    }


def _size_keys(w, a: str, shape: TargetShape | DraftShape, n_embd: int, n_ctx: int) -> None:
    """The size, norm and rope-base keys every schema writes (target and both draft schemas),
    under the key prefix `a`."""
    w.add_uint32(a + "context_length", n_ctx)
    w.add_uint32(a + "embedding_length", n_embd)
    w.add_uint32(a + "block_count", shape.n_layer)
    w.add_uint32(a + "feed_forward_length", shape.n_ff)
    w.add_uint32(a + "attention.head_count", shape.n_head)
    w.add_uint32(a + "attention.head_count_kv", shape.n_head_kv)
    w.add_uint32(a + "attention.key_length", shape.head_dim)
    w.add_uint32(a + "attention.value_length", shape.head_dim)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", shape.rms_eps)
    w.add_float32(a + "rope.freq_base", shape.rope_freq_base)


def _check_common(type_: str, fill: str, seed: int) -> tuple[str, str]:
    type_ = _check_choice(type_, TYPES, "type")
    fill = _check_choice(fill, FILLS, "fill")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**64:
        raise ConfigError(f"seed must be an integer in [0, 2^64), got {seed!r}")
    return type_, fill


def write_target(path: str | os.PathLike[str], preset: str | Preset = "tiny", *, type: str = "q8_0",
                 seed: int = 0, fill: str = "random", overrides: Mapping[str, Any] | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 weights: Mapping[str, Any] | None = None, vocab: Any = None,
                 name: str | None = None, description: str | None = None) -> dict:
    """Write a synthetic ``qwen35`` target GGUF at `path`.

    `overrides` maps `TargetShape` field names to values (or command-line strings).
    `progress(done_bytes, total_bytes)` is called as tensor data is written. Returns a summary:
    path, arch, preset, type, fill, seed, bytes (file size), data_bytes, n_tensors, types
    (ggml type -> count), fallbacks (list of {tensor, wanted, used, reason}), seconds.
    Raises ConfigError (before creating any file) for a bad preset, type, fill or override.

    Trained models: `weights` maps every tensor name to its float values (numpy shape = ggml
    ``ne`` reversed; quantized to `type` here), `vocab` is their `lucebox.vocab.GGUFVocab`, and
    `name` / `description` replace the synthetic ones; `seed` and `fill` are then unused.
    """
    t0 = time.perf_counter()
    type_, fill = _check_common(type, fill, seed)
    p = _get_preset(preset)
    shape, hp = resolve_target(p, overrides)
    tensors, fallbacks = _plan(hp.tensor_specs(), type_,
                               lambda t: shape.has_output and t == "output.weight")
    given = None if weights is None else _check_weights(weights, tensors, "target")
    if vocab is None:
        vocab = _vocab(shape.n_vocab)
    elif vocab.n_vocab != shape.n_vocab:
        raise ConfigError(f"the vocabulary has {vocab.n_vocab} tokens, the target n_vocab is {shape.n_vocab}")
    vocab = dataclasses.replace(vocab, mask_id=None)  # the mask token is the draft's
    pattern = shape.layer_pattern()
    interval = shape.full_attention_interval
    interval_rule = interval > 0 and pattern == [(i + 1) % interval != 0 for i in range(shape.n_layer)]

    def add_keys(w) -> None:
        from .vocab import add_vocab_to_gguf

        a = "qwen35."
        _common_keys(w, name or f"lucebox-synth {p.name}",
                     description or f"synthetic random weights: lucebox synth preset={p.name} "
                                    f"type={type_} seed={int(seed)} fill={fill}", type_)
        _size_keys(w, a, shape, shape.n_embd, shape.n_ctx_train)
        w.add_uint32(a + "rope.dimension_count", shape.n_rot)
        _int32_array(w, a + "rope.dimension_sections", shape.rope_sections)
        w.add_uint32(a + "ssm.conv_kernel", shape.ssm_d_conv)
        w.add_uint32(a + "ssm.inner_size", shape.ssm_d_state * shape.ssm_n_v_heads)
        w.add_uint32(a + "ssm.state_size", shape.ssm_d_state)
        w.add_uint32(a + "ssm.time_step_rank", shape.ssm_n_v_heads)
        w.add_uint32(a + "ssm.group_count", shape.ssm_n_k_heads)
        if interval > 0:
            w.add_uint32(a + "full_attention_interval", interval)
        if not interval_rule:
            _bool_array(w, a + "attention.recurrent_layers", pattern)
        add_vocab_to_gguf(w, vocab)

    out = Path(path)
    size = _stream(out, "qwen35", add_keys, tensors, seed=int(seed), fill=fill, d_conv=shape.ssm_d_conv,
                   progress=progress, weights=given)
    return _summary(out, "qwen35", p.name, type_, fill, int(seed), size, tensors, fallbacks,
                    time.perf_counter() - t0)


def write_draft(path: str | os.PathLike[str], preset: str | Preset = "tiny", *, type: str = "q8_0",
                seed: int = 1, fill: str = "random", overrides: Mapping[str, Any] | None = None,
                target_overrides: Mapping[str, Any] | None = None, own_head: bool = False,
                progress: Callable[[int, int], None] | None = None,
                weights: Mapping[str, Any] | None = None, vocab: Any = None,
                name: str | None = None, description: str | None = None,
                schema: str = "upstream", target_layer_ids: bool = True) -> dict:
    """Write a synthetic DFlash draft GGUF at `path` matching the preset's target.

    `overrides` maps `DraftShape` field names to values; `target_overrides` are the overrides
    of the target it must serve (hidden size, vocabulary, layer count). The draft carries the
    target's vocabulary plus ``tokenizer.ggml.mask_token_id``; with `own_head` it also gets its
    own ``token_embd.weight`` and ``output.weight``, else it shares the target's. Returns a
    summary like `write_target`; `weights`, `vocab`, `name` and `description` as there (the
    vocabulary must be the target's). Raises ConfigError before creating any file.

    `schema` ``"lucebox"`` writes the original lucebox schema (arch ``qwen35-dflash-draft``,
    arch-prefixed keys, ``dflash.fc.weight`` / ``dflash.hidden_norm.weight``, target layer *output*
    ids in ``dflash.target_layer_ids``; no tokenizer, no own head): the same tensors as the upstream
    schema under other names, so `weights` are keyed by the upstream names in both schemas and a
    seed gives the same values. `target_layer_ids=False` (lucebox only) leaves the ids out; the
    loader then derives them from the target's layer count (the original lucebox default).
    """
    t0 = time.perf_counter()
    type_, fill = _check_common(type, fill, seed)
    p = _get_preset(preset)
    shape, hp, tshape = resolve_draft(p, overrides, target_overrides, own_head=bool(own_head), schema=schema)
    lucebox = hp.schema == "lucebox"
    if not lucebox and not target_layer_ids:
        raise ConfigError("target_layer_ids=False needs schema='lucebox' (the upstream schema always stores the ids)")
    specs = hp.tensor_specs()
    keys = None
    if lucebox:  # the same tensors under upstream names, in the same order (models.h dflash_tensor_specs)
        hp.schema = "upstream"
        upstream_specs = hp.tensor_specs()
        hp.schema = "lucebox"
        assert [tuple(x[1:]) for x in specs] == [tuple(x[1:]) for x in upstream_specs]
        keys = [x[0] for x in upstream_specs]
    tensors, fallbacks = _plan(specs, type_, lambda t: bool(own_head), keys)
    given = None if weights is None else _check_weights(weights, tensors, "draft")
    if vocab is None:
        vocab = _vocab(tshape.n_vocab)
    elif vocab.n_vocab != tshape.n_vocab:
        raise ConfigError(f"the vocabulary has {vocab.n_vocab} tokens, the target n_vocab is {tshape.n_vocab}")
    vocab = dataclasses.replace(vocab, mask_id=hp.mask_token_id)
    n_ctx = tshape.n_ctx_train if shape.n_ctx_train is None else shape.n_ctx_train

    def add_keys(w) -> None:
        from .vocab import add_vocab_to_gguf

        a = "dflash."
        _common_keys(w, name or f"lucebox-synth {p.name} dflash draft",
                     description or f"synthetic random weights: lucebox synth preset={p.name} "
                                    f"draft type={type_} seed={int(seed)} fill={fill}", type_)
        _size_keys(w, a, shape, hp.n_embd, n_ctx)
        w.add_uint32(a + "rope.dimension_count", shape.n_rot)
        # As the upstream converter writes for Qwen3.5 targets (M-RoPE): the temporal stream
        # only, which is numerically NeoX rope.
        _int32_array(w, a + "rope.dimension_sections", (shape.n_rot // 2, 0, 0, 0))
        _int32_array(w, a + "target_layers", shape.target_layers)
        w.add_uint32(a + "block_size", shape.block_size)
        if shape.causal:
            w.add_bool(a + "attention.causal", True)
        if hp.n_swa > 0:
            w.add_uint32(a + "attention.sliding_window", hp.n_swa)
            w.add_array(a + "attention.sliding_window_pattern", [bool(x) for x in hp.is_swa])
        add_vocab_to_gguf(w, vocab)

    def add_lucebox_keys(w) -> None:
        # what the original scripts/convert_dflash_to_gguf.py writes (no tokenizer: the target's)
        a = LUCEBOX_DRAFT_ARCH + "."
        _common_keys(w, name or f"lucebox-synth {p.name} qwen35-dflash-draft",
                     description or f"synthetic random weights: lucebox synth preset={p.name} "
                                    f"draft schema=lucebox type={type_} seed={int(seed)} fill={fill}", type_)
        _size_keys(w, a, shape, hp.n_embd, n_ctx)
        w.add_uint32(a + "vocab_size", tshape.n_vocab)
        w.add_uint32(a + "dflash.n_target_layers", len(shape.target_layers))
        w.add_uint32(a + "dflash.block_size", shape.block_size)
        w.add_uint32(a + "dflash.mask_token_id", hp.mask_token_id)
        if target_layer_ids:
            _int32_array(w, a + "dflash.target_layer_ids", [layer - 1 for layer in shape.target_layers])
        if hp.n_swa > 0:
            w.add_uint32(a + "attention.sliding_window", hp.n_swa)
            _bool_array(w, a + "attention.sliding_window_pattern", hp.is_swa)

    out = Path(path)
    arch = LUCEBOX_DRAFT_ARCH if lucebox else "dflash"
    d_conv = 4  # unused: a draft has no conv kernel
    size = _stream(out, arch, add_lucebox_keys if lucebox else add_keys, tensors, seed=int(seed), fill=fill,
                   d_conv=d_conv, progress=progress, weights=given)
    return _summary(out, arch, p.name, type_, fill, int(seed), size, tensors, fallbacks,
                    time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``lucebox synth`` to `parser` (see `run`)."""
    presets = "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values())
    parser.add_argument("preset", metavar="PRESET", choices=list(PRESETS),
                        help=f"model shape, one of: {presets}")
    parser.add_argument("-o", "--out", metavar="TARGET.gguf", required=True,
                        help="where to write the qwen35 target")
    parser.add_argument("--draft-out", metavar="DRAFT.gguf", default=None,
                        help="also write a matching DFlash draft here")
    parser.add_argument("--type", default="q8_0", type=str.lower, choices=TYPES,
                        help="tensor type of matrices and embeddings (norms/vectors stay f32); "
                             "q4_k_m / q5_k_m are llama.cpp's Q4_K_M / Q5_K_M mixes (default: q8_0)")
    parser.add_argument("--draft-type", default=None, type=str.lower, choices=TYPES,
                        help="tensor type of the draft (default: --type)")
    parser.add_argument("--seed", type=int, default=0,
                        help="random seed of the target; the draft uses seed+1 (default: 0)")
    parser.add_argument("--fill", default="random", choices=FILLS,
                        help="random weights, or zeros: a sparse file with all-zero tensor data, "
                             "written in seconds, for shape checks only (default: random)")
    parser.add_argument("--set", dest="set_", action="append", default=[], metavar="KEY=VALUE",
                        help="override a target shape field, e.g. n_layer=8 or "
                             "recurrent_layers=T,F,T,T (repeatable)")
    parser.add_argument("--draft-set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a draft shape field, e.g. target_layers=1,3 (repeatable)")
    parser.add_argument("--own-head", action="store_true",
                        help="give the draft its own token_embd and output (default: shared with "
                             "the target)")
    parser.add_argument("--draft-schema", default="upstream", type=str.lower, choices=SCHEMAS,
                        help="GGUF schema of the draft: upstream llama.cpp 'dflash' or the original "
                             "lucebox 'qwen35-dflash-draft' (default: upstream)")


_PROGRESS_MIN_BYTES = 256 << 20


def _progress_printer(label: str) -> Callable[[int, int], None]:
    """Percent of bytes written, to stderr: one updating line on a terminal, else every 10%."""
    last = [-1]
    tty = sys.stderr.isatty()
    step = 1 if tty else 10

    def report(done: int, total: int) -> None:
        if total < _PROGRESS_MIN_BYTES:
            return
        pct = 100 * done // total // step * step
        if pct != last[0]:
            last[0] = pct
            if tty:
                print(f"\r{label}: {pct:3d}%", end="\n" if done >= total else "", file=sys.stderr,
                      flush=True)
            else:
                print(f"{label}: {pct}%", file=sys.stderr, flush=True)

    return report


def _describe(s: dict) -> str:
    fb = ""
    if s["fallbacks"]:
        used = ", ".join(sorted({f["used"] for f in s["fallbacks"]}))
        fb = f", {len(s['fallbacks'])} fallback(s) to {used}"
    types = ", ".join(f"{k} x{v}" for k, v in sorted(s["types"].items()))
    return (f"wrote {s['path']}: {s['arch']} preset {s['preset']}, {s['n_tensors']} tensors "
            f"[{types}]{fb}, {s['bytes'] / 1e6:.1f} MB, fill {s['fill']}, in {s['seconds']:.1f} s")


def run(args: argparse.Namespace) -> int:
    """Write the files asked for by `args` (from `add_arguments`); return 0.

    Prints one summary line per file to stdout and, for files over 256 MiB, a percent progress
    indicator to stderr. Raises ConfigError for bad arguments before any file is created.
    """
    target_over = parse_assignments(getattr(args, "set_", None), "--set")
    draft_over = parse_assignments(getattr(args, "draft_set", None), "--draft-set")
    type_ = args.type
    draft_type = args.draft_type or args.type
    own_head = bool(getattr(args, "own_head", False))
    draft_schema = getattr(args, "draft_schema", "upstream")
    # Validate everything (both files) before writing anything.
    _check_common(type_, args.fill, args.seed)
    _check_common(draft_type, args.fill, args.seed + 1)
    resolve_target(args.preset, target_over)
    if args.draft_out:
        resolve_draft(args.preset, draft_over, target_over, own_head=own_head, schema=draft_schema)
        if os.path.abspath(args.draft_out) == os.path.abspath(args.out):
            raise ConfigError("--draft-out must differ from --out")
    elif draft_over:
        raise ConfigError("--draft-set needs --draft-out")

    s = write_target(args.out, args.preset, type=type_, seed=args.seed, fill=args.fill,
                     overrides=target_over, progress=_progress_printer(f"writing {args.out}"))
    print(_describe(s), flush=True)
    if args.draft_out:
        s = write_draft(args.draft_out, args.preset, type=draft_type, seed=args.seed + 1, fill=args.fill,
                        overrides=draft_over, target_overrides=target_over, own_head=own_head,
                        progress=_progress_printer(f"writing {args.draft_out}"), schema=draft_schema)
        print(_describe(s), flush=True)
    return 0
