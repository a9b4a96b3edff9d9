"""Malformed, truncated and mismatched GGUF files: one test per case.

Each test writes a valid tiny synthetic file (lucebox.synth), changes one thing (a key, a tensor,
the length of the file) through gguf_mutations.GGUFModel or a cut at an offset found by parsing the
file, and checks that opening or validating it raises the documented exception type with a
message that names the file, the key or tensor, and what was expected (DESIGN.md "Configuration and
errors"). Cases that could abort the process run in a subprocess worker.
"""
from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf import GGUFValueType as VT

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import gguf_mutations as gm  # noqa: E402

import lucebox  # noqa: E402
from lucebox import _core, synth  # noqa: E402
from lucebox.errors import DraftMismatchError, GGUFError, LuceboxError, UnsupportedError  # noqa: E402

TINY = synth.PRESETS["tiny"]
N_EMBD = TINY.target.n_embd  # 128
N_LAYER = TINY.target.n_layer  # 4
N_FF = TINY.target.n_ff  # 256
N_VOCAB = TINY.target.n_vocab  # 1024
D_STATE = TINY.target.ssm_d_state  # 32
N_V_HEADS = TINY.target.ssm_n_v_heads  # 4


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("malformed-base")
    target, draft = d / "target.gguf", d / "draft.gguf"
    synth.write_target(target, "tiny", type="q8_0", seed=0)
    synth.write_draft(draft, "tiny", type="q8_0", seed=1)
    # The rewriter reproduces the synthetic files exactly, so every variant differs only in its edit.
    assert gm.GGUFModel.read(target).to_bytes() == target.read_bytes()
    assert gm.GGUFModel.read(draft).to_bytes() == draft.read_bytes()
    return {"target": target, "draft": draft}


def variant(src: Path, dst: Path, edit: Callable[[gm.GGUFModel], object]) -> Path:
    """Write `src` with `edit` applied to its metadata/tensors at `dst`."""
    m = gm.GGUFModel.read(src)
    edit(m)
    return m.write(dst)


def expect(exc_type: type[Exception], fn: Callable[[], object], *fragments: str) -> str:
    """`fn()` raises exactly `exc_type` with every fragment in its message; return the message."""
    with pytest.raises(Exception) as info:
        fn()
    msg = str(info.value)
    assert type(info.value) is exc_type, f"raised {type(info.value).__name__}: {msg}"
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in message {msg!r}"
    return msg


def open_target(path: Path) -> Callable[[], object]:
    return lambda: _core.TargetFile.open(str(path))


def open_draft(path: Path) -> Callable[[], object]:
    return lambda: _core.DraftFile.open(str(path))


def validate(target: Path, draft: Path) -> Callable[[], object]:
    return lambda: _core.validate_draft(_core.TargetFile.open(str(target)), _core.DraftFile.open(str(draft)))


def test_base_files_are_valid(base):
    t = _core.TargetFile.open(str(base["target"]))
    d = _core.DraftFile.open(str(base["draft"]))
    _core.validate_draft(t, d)
    assert (t.hparams.n_embd, t.hparams.n_layer, t.hparams.n_ff, t.hparams.n_vocab) == (N_EMBD, N_LAYER, N_FF, N_VOCAB)


# --------------------------------------------------------------------------------------------
# Unreadable, not GGUF, truncated
# --------------------------------------------------------------------------------------------

def test_nonexistent_path(tmp_path):
    p = tmp_path / "no-such-model.gguf"
    expect(GGUFError, open_target(p), f"'{p}'", "cannot open", "No such file")
    expect(GGUFError, open_draft(p), f"'{p}'", "cannot open")


def test_directory(tmp_path):
    expect(GGUFError, open_target(tmp_path), f"'{tmp_path}'", "not a regular file")
    expect(GGUFError, open_draft(tmp_path), f"'{tmp_path}'", "not a regular file")


def test_empty_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    expect(GGUFError, open_target(p), f"'{p}'", "truncated", "magic")


def test_random_bytes(tmp_path):
    p = tmp_path / "random.gguf"
    data = random.Random(0).randbytes(4096)
    assert not data.startswith(b"GGUF")
    p.write_bytes(data)
    expect(GGUFError, open_target(p), f"'{p}'", "magic", "expected 'GGUF'")


def test_wrong_magic(base, tmp_path):
    p = tmp_path / "magic.gguf"
    p.write_bytes(b"GGUX" + base["target"].read_bytes()[4:])
    expect(GGUFError, open_target(p), f"'{p}'", "invalid magic", "'GGUX'", "expected 'GGUF'")


def test_truncated_inside_header(base, tmp_path):
    # GGUF header: magic (4) + version (4) + n_tensors (8) + n_kv (8); cut inside n_tensors.
    p = tmp_path / "header.gguf"
    p.write_bytes(base["target"].read_bytes()[:12])
    expect(GGUFError, open_target(p), f"'{p}'", "truncated", "header")


def test_truncated_inside_metadata(base, tmp_path):
    data = base["target"].read_bytes()
    lay = gm.scan_layout(data)
    cut = lay.keys["tokenizer.ggml.tokens"] + 100  # inside the token strings
    assert lay.kv_start < cut < lay.ti_start
    p = tmp_path / "metadata.gguf"
    p.write_bytes(data[:cut])
    expect(GGUFError, open_target(p), f"'{p}'", "truncated", "key-value")


def test_truncated_inside_tensor_directory(base, tmp_path):
    data = base["draft"].read_bytes()
    lay = gm.scan_layout(data)
    cut = lay.infos["blk.0.attn_q.weight"] + 10
    p = tmp_path / "directory.gguf"
    p.write_bytes(data[:cut])
    expect(GGUFError, open_draft(p), f"'{p}'", "truncated", "tensor info")


def test_truncated_inside_tensor_data(base, tmp_path):
    data = base["target"].read_bytes()
    lay = gm.scan_layout(data)
    name, start, nbytes = next(t for t in lay.tensors if t[0] == "blk.1.ffn_up.weight")
    cut = start + nbytes // 2
    p = tmp_path / "data.gguf"
    p.write_bytes(data[:cut])
    expect(GGUFError, open_target(p), f"'{p}'", "truncated", f"tensor '{name}'",
           f"needs bytes [{start}, {start + nbytes})", f"the file has {cut} bytes")


def test_cut_exactly_at_data_start(base, tmp_path):
    data = base["draft"].read_bytes()
    lay = gm.scan_layout(data)
    first, start, nbytes = lay.tensors[0]
    assert start == lay.data_start and nbytes > 0
    p = tmp_path / "data-start.gguf"
    p.write_bytes(data[:lay.data_start])
    expect(GGUFError, open_draft(p), f"'{p}'", "truncated", f"tensor '{first}'",
           f"the file has {lay.data_start} bytes")


def test_cut_in_last_tensor_by_one_byte(base, tmp_path):
    data = base["target"].read_bytes()
    lay = gm.scan_layout(data)
    name, start, nbytes = max(lay.tensors, key=lambda t: t[1])
    p = tmp_path / "last-byte.gguf"
    p.write_bytes(data[:start + nbytes - 1])
    expect(GGUFError, open_target(p), f"'{p}'", "truncated", f"tensor '{name}'")


# --------------------------------------------------------------------------------------------
# Architecture
# --------------------------------------------------------------------------------------------

def test_wrong_architecture(base, tmp_path):
    p = variant(base["target"], tmp_path / "llama.gguf", lambda m: m.set_value("general.architecture", "llama"))
    expect(GGUFError, open_target(p), f"'{p}'", "architecture is 'llama'", "expected 'qwen35'")


def test_missing_architecture(base, tmp_path):
    p = variant(base["target"], tmp_path / "no-arch.gguf", lambda m: m.drop("general.architecture"))
    expect(GGUFError, open_target(p), f"'{p}'", "missing required key 'general.architecture'")


def test_qwen35moe_is_unsupported(base, tmp_path):
    p = variant(base["target"], tmp_path / "moe.gguf", lambda m: m.set_value("general.architecture", "qwen35moe"))
    expect(UnsupportedError, open_target(p), f"'{p}'", "qwen35moe", "not supported", "expected the dense 'qwen35'")


def test_draft_opened_as_target(base):
    p = base["draft"]
    expect(GGUFError, open_target(p), f"'{p}'", "architecture is 'dflash'", "expected 'qwen35'")


def test_target_opened_as_draft(base):
    p = base["target"]
    expect(GGUFError, open_draft(p), f"'{p}'", "architecture is 'qwen35'", "expected 'dflash'")


# --------------------------------------------------------------------------------------------
# Keys: missing, mistyped, out of range
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["qwen35.embedding_length", "qwen35.rope.dimension_sections", "qwen35.block_count",
                                 "qwen35.ssm.inner_size"])
def test_target_missing_required_key(base, tmp_path, key):
    p = variant(base["target"], tmp_path / "missing.gguf", lambda m: m.drop(key))
    expect(GGUFError, open_target(p), f"'{p}'", f"missing required key '{key}'")


@pytest.mark.parametrize("key", ["dflash.target_layers", "tokenizer.ggml.mask_token_id", "dflash.embedding_length"])
def test_draft_missing_required_key(base, tmp_path, key):
    p = variant(base["draft"], tmp_path / "missing.gguf", lambda m: m.drop(key))
    expect(GGUFError, open_draft(p), f"'{p}'", f"missing required key '{key}'")


def test_string_where_u32_expected(base, tmp_path):
    key = "qwen35.embedding_length"
    p = variant(base["target"], tmp_path / "str.gguf", lambda m: m.set(key, VT.STRING, str(N_EMBD)))
    expect(GGUFError, open_target(p), f"'{p}'", f"key '{key}' has type str", "expected an unsigned integer")


def test_draft_string_where_u32_expected(base, tmp_path):
    key = "tokenizer.ggml.mask_token_id"
    p = variant(base["draft"], tmp_path / "str.gguf", lambda m: m.set(key, VT.STRING, "1023"))
    expect(GGUFError, open_draft(p), f"'{p}'", f"key '{key}' has type str", "expected an unsigned integer")


def test_float_array_where_int_array_expected(base, tmp_path):
    key = "qwen35.rope.dimension_sections"
    p = variant(base["target"], tmp_path / "farr.gguf", lambda m: m.set(key, VT.ARRAY, [3.0, 3.0, 2.0, 0.0], VT.FLOAT32))
    expect(GGUFError, open_target(p), f"'{p}'", f"key '{key}' has type arr of f32", "expected an array of integers")


def test_draft_float_array_where_int_array_expected(base, tmp_path):
    key = "dflash.target_layers"
    p = variant(base["draft"], tmp_path / "farr.gguf", lambda m: m.set(key, VT.ARRAY, [1.0, 3.0], VT.FLOAT32))
    expect(GGUFError, open_draft(p), f"'{p}'", f"key '{key}'", "arr of f32", "expected an array of integers")


def test_negative_value_where_u32_expected(base, tmp_path):
    key = "qwen35.embedding_length"
    p = variant(base["target"], tmp_path / "neg.gguf", lambda m: m.set(key, VT.INT32, -1))
    expect(GGUFError, open_target(p), f"'{p}'", f"key '{key}' = -1 is out of range", "expected a value in [0, 4294967295]")


def test_u64_value_above_u32_range(base, tmp_path):
    key = "qwen35.context_length"
    p = variant(base["target"], tmp_path / "big.gguf", lambda m: m.set(key, VT.UINT64, 1 << 40))
    expect(GGUFError, open_target(p), f"'{p}'", f"key '{key}' = {1 << 40} is out of range")


def test_ssm_inner_size_inconsistent(base, tmp_path):
    key = "qwen35.ssm.inner_size"
    p = variant(base["target"], tmp_path / "inner.gguf", lambda m: m.set_value(key, 100))
    expect(GGUFError, open_target(p), f"'{p}'", f"key '{key}' = 100",
           f"expected state_size * time_step_rank = {D_STATE * N_V_HEADS}")


def test_time_step_rank_not_multiple_of_group_count(base, tmp_path):
    def edit(m: gm.GGUFModel) -> None:
        m.set_value("qwen35.ssm.time_step_rank", 3)  # 3 V heads over 2 K heads
        m.set_value("qwen35.ssm.inner_size", D_STATE * 3)  # consistent, so the ratio is what fails

    p = variant(base["target"], tmp_path / "tsr.gguf", edit)
    expect(GGUFError, open_target(p), f"'{p}'", "ssm.time_step_rank", "3", "must be a multiple of ssm.group_count",
           "2")


def test_head_count_not_multiple_of_head_count_kv(base, tmp_path):
    p = variant(base["target"], tmp_path / "heads.gguf", lambda m: m.set_value("qwen35.attention.head_count", 3))
    expect(GGUFError, open_target(p), f"'{p}'", "head_count (3) must be a multiple of head_count_kv (2)")


def test_draft_head_count_not_multiple_of_head_count_kv(base, tmp_path):
    p = variant(base["draft"], tmp_path / "heads.gguf", lambda m: m.set_value("dflash.attention.head_count", 3))
    expect(GGUFError, open_draft(p), f"'{p}'", "head_count (3) must be a multiple of head_count_kv (2)")


def test_block_count_not_above_nextn_predict_layers(base, tmp_path):
    p = variant(base["target"], tmp_path / "nextn.gguf",
                lambda m: m.set("qwen35.nextn_predict_layers", VT.UINT32, N_LAYER))
    expect(GGUFError, open_target(p), f"'{p}'", f"'qwen35.block_count' = {N_LAYER}",
           f"must exceed nextn_predict_layers = {N_LAYER}")


def test_recurrent_layers_wrong_length(base, tmp_path):
    key = "qwen35.attention.recurrent_layers"
    p = variant(base["target"], tmp_path / "rec.gguf", lambda m: m.set(key, VT.ARRAY, [True, True, True], VT.BOOL))
    expect(GGUFError, open_target(p), f"'{p}'", f"key '{key}' has 3 entries", f"expected block_count = {N_LAYER}")


def test_rope_sections_wrong_length(base, tmp_path):
    key = "qwen35.rope.dimension_sections"
    p = variant(base["target"], tmp_path / "sec.gguf", lambda m: m.set(key, VT.ARRAY, [3, 3], VT.INT32))
    expect(GGUFError, open_target(p), f"'{p}'", f"key '{key}' has 2 entries", "expected 4")


def test_rope_sections_wider_than_the_rotated_dims(base, tmp_path):
    """Found by a fuzz of the metadata: ggml's multi-section rope aborts the process (GGML_ASSERT
    sect_dims <= ne0) at the first attention layer when the sections sum to more than the rotated
    dimensions (16 in the tiny model)."""
    key = "qwen35.rope.dimension_sections"
    p = variant(base["target"], tmp_path / "sec.gguf", lambda m: m.set(key, VT.ARRAY, [8, 8, 8, 0], VT.INT32))
    expect(GGUFError, open_target(p), f"'{p}'", "rope.dimension_sections sum to 24",
           "more than rope.dimension_count = 16")


def test_draft_block_size_out_of_range(base, tmp_path):
    p = variant(base["draft"], tmp_path / "bs.gguf", lambda m: m.set_value("dflash.block_size", 1000))
    expect(GGUFError, open_draft(p), f"'{p}'", "block_size 1000", "must be in [2, 64]")


# --------------------------------------------------------------------------------------------
# Tensors: missing, wrong shape, unsupported type
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, shape", [("blk.1.ssm_a", f"[{N_V_HEADS}]"),
                                         ("blk.3.attn_k.weight", f"[{N_EMBD}, 128]"),
                                         ("token_embd.weight", None)])
def test_target_missing_tensor(base, tmp_path, name, shape):
    p = variant(base["target"], tmp_path / "missing.gguf", lambda m: m.drop_tensor(name))
    fragments = [f"'{p}'", f"missing tensor '{name}'"] + ([f"expected shape {shape}"] if shape else [])
    expect(GGUFError, open_target(p), *fragments)


def test_draft_missing_tensor(base, tmp_path):
    p = variant(base["draft"], tmp_path / "missing.gguf", lambda m: m.drop_tensor("fc.weight"))
    expect(GGUFError, open_draft(p), f"'{p}'", "missing tensor 'fc.weight'", f"expected shape [{2 * N_EMBD}, {N_EMBD}]")


def test_wrong_shape(base, tmp_path):
    name = "blk.0.ffn_up.weight"
    p = variant(base["target"], tmp_path / "shape.gguf", lambda m: m.retype_tensor(name, QT.Q8_0, (N_EMBD, N_EMBD)))
    expect(GGUFError, open_target(p), f"'{p}'", f"tensor '{name}' has shape [{N_EMBD}, {N_EMBD}]",
           f"expected [{N_EMBD}, {N_FF}]")


def test_draft_wrong_shape(base, tmp_path):
    name = "blk.1.attn_q.weight"
    p = variant(base["draft"], tmp_path / "shape.gguf", lambda m: m.retype_tensor(name, QT.Q8_0, (N_EMBD, 64)))
    expect(GGUFError, open_draft(p), f"'{p}'", f"tensor '{name}' has shape [{N_EMBD}, 64]", "expected [")


def test_norm_stored_as_f16(base, tmp_path):
    name = "blk.0.attn_norm.weight"
    p = variant(base["target"], tmp_path / "normf16.gguf", lambda m: m.retype_tensor(name, QT.F16))
    expect(GGUFError, open_target(p), f"'{p}'", f"tensor '{name}' has unsupported type f16", "norm",
           "(expected f32)")


@pytest.mark.parametrize("type_", [QT.I32, QT.Q8_K])  # Q8_K: the K-quants' activation partner, no weight type
def test_matrix_in_unsupported_type(base, tmp_path, type_):
    name = "blk.0.ffn_down.weight"  # rows of N_FF = 256 values: whole Q8_K blocks
    p = variant(base["target"], tmp_path / "bad.gguf", lambda m: m.retype_tensor(name, type_))
    expect(GGUFError, open_target(p), f"'{p}'", f"tensor '{name}' has unsupported type {type_.name.lower().replace('_k', '_K')}",
           "matrix", "expected f32, f16, bf16 or a quantized type")


def test_tokens_length_differs_from_embedding_rows(base, tmp_path):
    def edit(m: gm.GGUFModel) -> None:
        m.set_value("tokenizer.ggml.tokens", m.kv["tokenizer.ggml.tokens"].value[:-1])

    p = variant(base["target"], tmp_path / "tokens.gguf", edit)
    expect(GGUFError, open_target(p), f"'{p}'", f"'tokenizer.ggml.tokens' has {N_VOCAB - 1} tokens",
           f"token_embd.weight has {N_VOCAB} rows")


def test_tokens_not_an_array_in_target(base, tmp_path):
    p = variant(base["target"], tmp_path / "tokstr.gguf", lambda m: m.set("tokenizer.ggml.tokens", VT.STRING, "abc"))
    expect(GGUFError, open_target(p), f"'{p}'", "'tokenizer.ggml.tokens'", "expected an array")


def _broken_merge(m: gm.GGUFModel) -> None:
    merges = list(m.kv["tokenizer.ggml.merges"].value)
    merges[5] = "no-space-here"
    m.set_value("tokenizer.ggml.merges", merges)


@pytest.mark.parametrize("edit, fragment", [
    (lambda m: m.set("tokenizer.chat_template", VT.STRING, "{% if messages %}never closed"), "chat template"),
    (_broken_merge, "merge #5 'no-space-here'"),
])
def test_engine_names_the_file_of_a_broken_vocabulary_or_template(base, tmp_path, edit, fragment):
    """The tokenizer and chat template are built in Python when the Engine opens a file: their
    errors are GGUFErrors naming the file too (a mutation fuzz of the tiny file found both as plain
    ValueErrors without it)."""
    import lucebox

    p = variant(base["target"], tmp_path / "vocab.gguf", edit)
    expect(GGUFError, lambda: lucebox.Engine(str(p), ctx=64, device="cpu"), f"file '{p}'", fragment)


# --------------------------------------------------------------------------------------------
# Draft / target mismatches
# --------------------------------------------------------------------------------------------

def _both(target: Path, draft: Path) -> tuple[str, str]:
    return f"draft '{draft}'", f"target '{target}'"


def test_mismatch_hidden_size(base, tmp_path):
    d = tmp_path / "wide-draft.gguf"
    synth.write_draft(d, "tiny", type="q8_0", target_overrides={"n_embd": 2 * N_EMBD})
    _core.DraftFile.open(str(d))  # valid on its own
    expect(DraftMismatchError, validate(base["target"], d), *_both(base["target"], d),
           f"draft hidden size {2 * N_EMBD} != target hidden size {N_EMBD}")


def test_mismatch_target_layer_out_of_range(base, tmp_path):
    d = variant(base["draft"], tmp_path / "layers.gguf", lambda m: m.set_value("dflash.target_layers", [1, N_LAYER + 1]))
    expect(DraftMismatchError, validate(base["target"], d), *_both(base["target"], d),
           f"target layer id {N_LAYER + 1} is out of range", f"{N_LAYER} layers")


def test_mismatch_target_layer_duplicated(base, tmp_path):
    d = variant(base["draft"], tmp_path / "dup.gguf", lambda m: m.set_value("dflash.target_layers", [1, 1]))
    expect(DraftMismatchError, validate(base["target"], d), *_both(base["target"], d),
           "target layer id 1 is listed twice")


def test_mismatch_vocabulary_size(base, tmp_path):
    d = tmp_path / "vocab-draft.gguf"
    synth.write_draft(d, "tiny", type="q8_0", own_head=True, target_overrides={"n_vocab": 2 * N_VOCAB})
    expect(DraftMismatchError, validate(base["target"], d), *_both(base["target"], d),
           f"draft vocabulary has {2 * N_VOCAB} tokens, target has {N_VOCAB}")


def test_mismatch_mask_token_out_of_range(base, tmp_path):
    d = variant(base["draft"], tmp_path / "mask.gguf", lambda m: m.set_value("tokenizer.ggml.mask_token_id", 5000))
    expect(DraftMismatchError, validate(base["target"], d), *_both(base["target"], d),
           "mask token id 5000 is outside the target vocabulary", str(N_VOCAB))


def test_mismatch_token_strings(base, tmp_path):
    def edit(m: gm.GGUFModel) -> None:
        m.kv["tokenizer.ggml.tokens"].value[10] += "x"

    d = variant(base["draft"], tmp_path / "tokens.gguf", edit)
    expect(DraftMismatchError, validate(base["target"], d), *_both(base["target"], d),
           "tokenizers differ at token id 10")


def test_mismatch_token_count(base, tmp_path):
    def edit(m: gm.GGUFModel) -> None:
        m.set_value("tokenizer.ggml.tokens", m.kv["tokenizer.ggml.tokens"].value[:-1])

    d = variant(base["draft"], tmp_path / "tokens.gguf", edit)
    expect(DraftMismatchError, validate(base["target"], d), *_both(base["target"], d),
           f"{N_VOCAB - 1} draft tokens vs {N_VOCAB} target tokens")


def test_mismatch_draft_tokens_not_an_array(base, tmp_path):
    """A draft whose tokenizer.ggml.tokens is not an array must be rejected with an error, not
    abort the process (run in a subprocess worker so an abort fails only this test)."""
    d = variant(base["draft"], tmp_path / "tokstr.gguf", lambda m: m.set("tokenizer.ggml.tokens", VT.STRING, "abc"))
    report = gm.run_cases([("tokens-not-array", "validate", f"{base['target']}|{d}")], base["target"], base["draft"],
                          case_timeout=20.0, total_timeout=60.0, jobs=1)
    o = report.outcomes["tokens-not-array"]
    assert o.result in ("GGUFError", "DraftMismatchError"), f"{o.result}: {o.message}"
    assert str(d) in o.message and "tokenizer.ggml.tokens" in o.message, o.message


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lucebox", "info", *args], capture_output=True, text=True,
                          env=gm.subprocess_env(), timeout=120)


def _assert_cli_error(r: subprocess.CompletedProcess, *fragments: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lucebox: error: "), r.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_cli_truncated_target(base, tmp_path):
    data = base["target"].read_bytes()
    lay = gm.scan_layout(data)
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[:lay.data_start + 1000])
    _assert_cli_error(_cli(str(p)), f"file '{p}'", "truncated", "tensor 'token_embd.weight'")


def test_cli_missing_key(base, tmp_path):
    p = variant(base["target"], tmp_path / "missing.gguf", lambda m: m.drop("qwen35.embedding_length"))
    _assert_cli_error(_cli(str(p)), f"file '{p}'", "missing required key 'qwen35.embedding_length'")


def test_cli_draft_mismatch(base, tmp_path):
    d = variant(base["draft"], tmp_path / "dup.gguf", lambda m: m.set_value("dflash.target_layers", [1, 1]))
    _assert_cli_error(_cli(str(base["target"]), "--draft", str(d)), f"draft '{d}'", f"target '{base['target']}'",
                      "listed twice")


def test_cli_nonexistent_model(tmp_path):
    p = tmp_path / "nope.gguf"
    _assert_cli_error(_cli(str(p)), f"file '{p}'", "cannot open")


# --------------------------------------------------------------------------------------------
# Drafts in the original lucebox schema (qwen35-dflash-draft)
# --------------------------------------------------------------------------------------------

LB = "qwen35-dflash-draft."


@pytest.fixture(scope="module")
def lucebox_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("malformed-lucebox") / "draft.gguf"
    synth.write_draft(d, "tiny", type="q8_0", seed=1, schema="lucebox")
    assert gm.GGUFModel.read(d).to_bytes() == d.read_bytes()
    return d


def _f32(name: str, n: int = N_EMBD) -> gm.Tensor:
    return gm.Tensor(name, QT.F32, (n,), bytes(4 * n))


def test_lucebox_base_is_valid(base, lucebox_draft):
    d = _core.DraftFile.open(str(lucebox_draft))
    _core.validate_draft(_core.TargetFile.open(str(base["target"])), d)
    assert d.hparams.schema == "lucebox" and list(d.hparams.target_layers) == [1, 3]
    assert d.hparams.tensor_names == {"fc": "dflash.fc.weight", "enc_norm": "dflash.hidden_norm.weight",
                                      "ffn_norm": "ffn_norm.weight"}


@pytest.mark.parametrize("name, shape", [("dflash.hidden_norm.weight", f"[{N_EMBD}]"),
                                         ("output_norm.weight", f"[{N_EMBD}]"),
                                         ("blk.1.ffn_up.weight", f"[{N_EMBD}, {N_FF}]")])
def test_lucebox_missing_tensor(lucebox_draft, tmp_path, name, shape):
    p = variant(lucebox_draft, tmp_path / "missing.gguf", lambda m: m.drop_tensor(name))
    expect(GGUFError, open_draft(p), f"'{p}'", f"missing tensor '{name}'", f"expected shape {shape}")


def test_lucebox_missing_fc(lucebox_draft, tmp_path):
    p = variant(lucebox_draft, tmp_path / "nofc.gguf", lambda m: m.drop_tensor("dflash.fc.weight"))
    expect(GGUFError, open_draft(p), f"'{p}'", "missing tensor 'dflash.fc.weight'", "alias 'dflash_fc.weight'")


def test_lucebox_wrong_shape(lucebox_draft, tmp_path):
    name = "blk.1.attn_q.weight"
    p = variant(lucebox_draft, tmp_path / "shape.gguf", lambda m: m.retype_tensor(name, QT.Q8_0, (N_EMBD, 64)))
    expect(GGUFError, open_draft(p), f"'{p}'", f"tensor '{name}' has shape [{N_EMBD}, 64]", f"expected [{N_EMBD}, 256]")


def test_lucebox_fc_width_not_a_multiple_of_hidden(lucebox_draft, tmp_path):
    width = 2 * N_EMBD + 32
    p = variant(lucebox_draft, tmp_path / "fc.gguf",
                lambda m: m.retype_tensor("dflash.fc.weight", QT.Q8_0, (width, N_EMBD)))
    expect(GGUFError, open_draft(p), f"'{p}'", "tensor 'dflash.fc.weight'", f"input width {width}",
           f"not a multiple of the hidden size {N_EMBD}")


def test_lucebox_fc_width_disagrees_with_target_ids(lucebox_draft, tmp_path):
    p = variant(lucebox_draft, tmp_path / "fc3.gguf",
                lambda m: m.retype_tensor("dflash.fc.weight", QT.Q8_0, (3 * N_EMBD, N_EMBD)))
    expect(GGUFError, open_draft(p), f"'{p}'", f"key '{LB}dflash.target_layer_ids' has 2 ids",
           "'dflash.fc.weight' takes 3 captured layers")


def test_lucebox_fc_width_gives_the_layer_count(base, lucebox_draft, tmp_path):
    """Without ids the layer count is fc's width (not dflash.n_target_layers), and the ids come from
    the target; too many for the target's depth is a mismatch."""
    def edit(n: int):
        def f(m: gm.GGUFModel) -> None:
            m.drop(LB + "dflash.target_layer_ids")
            m.retype_tensor("dflash.fc.weight", QT.Q8_0, (n * N_EMBD, N_EMBD))
        return f

    three = variant(lucebox_draft, tmp_path / "three.gguf", edit(3))
    d = _core.DraftFile.open(str(three))
    assert d.hparams.n_target_layers == 3 and list(d.hparams.target_layers) == []
    _core.validate_draft(_core.TargetFile.open(str(base["target"])), d)
    assert list(d.hparams.target_layers) == [2, 3, 4]  # output ids 1, 2, 3: step (4 - 2) / 2
    four = variant(lucebox_draft, tmp_path / "four.gguf", edit(4))
    expect(DraftMismatchError, validate(base["target"], four), *_both(base["target"], four),
           "has no target_layer_ids", f"cannot derive 4 distinct captured layers from a target with {N_LAYER} layers")


@pytest.mark.parametrize("tensor, fragment", [
    ("dflash.aux_hidden_norm.0.weight", "aux_hidden_norm"),
    ("blk.1.attn_gate.weight", "attention output gate"),
    ("dflash.domino.start", "Domino"),
    ("dflash.dspark.markov.w1", "DSpark"),
])
def test_lucebox_unsupported_feature_tensor(lucebox_draft, tmp_path, tensor, fragment):
    p = variant(lucebox_draft, tmp_path / "aux.gguf", lambda m: m.tensors.append(_f32(tensor)))
    expect(UnsupportedError, open_draft(p), f"'{p}'", f"tensor '{tensor}'", fragment, "is not supported")


@pytest.mark.parametrize("key, vtype, value", [
    ("dflash.context_kv_layer_norm", VT.BOOL, True),
    ("dflash.context_kv_layer_norm", VT.UINT32, 1),
    ("dflash.domino.enabled", VT.UINT32, 1),
    ("dflash.dspark.enabled", VT.UINT32, 1),
])
def test_lucebox_unsupported_feature_key(lucebox_draft, tmp_path, key, vtype, value):
    p = variant(lucebox_draft, tmp_path / "key.gguf", lambda m: m.set(LB + key, vtype, value))
    expect(UnsupportedError, open_draft(p), f"'{p}'", f"key '{LB}{key}' is set", "is not supported")


def test_lucebox_feature_key_off_is_fine(lucebox_draft, tmp_path):
    p = variant(lucebox_draft, tmp_path / "off.gguf", lambda m: m.set(LB + "dflash.context_kv_layer_norm", VT.BOOL, False))
    _core.DraftFile.open(str(p))


@pytest.mark.parametrize("tensor", ["token_embd.weight", "blk.0.post_attention_norm.weight"])
def test_lucebox_unknown_tensor_is_refused(lucebox_draft, tmp_path, tensor):
    p = variant(lucebox_draft, tmp_path / "extra.gguf", lambda m: m.tensors.append(_f32(tensor)))
    expect(UnsupportedError, open_draft(p), f"'{p}'", f"tensor '{tensor}' is not part of the lucebox DFlash draft schema")


def test_lucebox_aliases(base, lucebox_draft, tmp_path):
    """dflash_fc / dflash_hidden_norm / post_attention_norm: the same draft."""
    def edit(m: gm.GGUFModel) -> None:
        m.tensor("dflash.fc.weight").name = "dflash_fc.weight"
        m.tensor("dflash.hidden_norm.weight").name = "dflash_hidden_norm.weight"
        for i in range(TINY.draft.n_layer):
            m.tensor(f"blk.{i}.ffn_norm.weight").name = f"blk.{i}.post_attention_norm.weight"

    p = variant(lucebox_draft, tmp_path / "alias.gguf", edit)
    d = _core.DraftFile.open(str(p))
    assert d.hparams.tensor_names == {"fc": "dflash_fc.weight", "enc_norm": "dflash_hidden_norm.weight",
                                      "ffn_norm": "post_attention_norm.weight"}
    import lucebox

    def proposals(draft: Path) -> list[int]:
        s = lucebox.Engine(str(base["target"]), str(draft), ctx=128, device="cpu").session()
        s.append([5, 6, 7, 8, 9])
        return list(s._core.draft_proposals(9))

    assert proposals(p) == proposals(lucebox_draft)


def test_lucebox_dflash_draft_arch(lucebox_draft, tmp_path):
    def edit(m: gm.GGUFModel) -> None:
        m.set_value("general.architecture", "dflash-draft")
        m.kv = {("dflash-draft." + k[len(LB):] if k.startswith(LB) else k): v for k, v in m.kv.items()}

    p = variant(lucebox_draft, tmp_path / "arch.gguf", edit)
    assert _core.DraftFile.open(str(p)).hparams.schema == "lucebox"


@pytest.mark.parametrize("ids, exc, fragments", [
    ([-1, 2], GGUFError, ["holds an invalid layer id -1"]),
    ([0, N_LAYER], DraftMismatchError, [f"target layer id {N_LAYER + 1} is out of range"]),
    ([2, 2], DraftMismatchError, ["target layer id 3 is listed twice"]),
])
def test_lucebox_bad_target_ids(base, lucebox_draft, tmp_path, ids, exc, fragments):
    p = variant(lucebox_draft, tmp_path / "ids.gguf", lambda m: m.set_value(LB + "dflash.target_layer_ids", ids))
    fn = open_draft(p) if exc is GGUFError else validate(base["target"], p)
    expect(exc, fn, f"'{p}'", *fragments)


def test_lucebox_target_ids_not_integers(lucebox_draft, tmp_path):
    key = LB + "dflash.target_layer_ids"
    p = variant(lucebox_draft, tmp_path / "fids.gguf", lambda m: m.set(key, VT.ARRAY, [0.0, 2.0], VT.FLOAT32))
    expect(GGUFError, open_draft(p), f"'{p}'", f"key '{key}'", "expected an array of integers")


@pytest.mark.parametrize("key", ["dflash.mask_token_id", "dflash.block_size", "rope.freq_base", "embedding_length",
                                 "attention.head_count_kv"])
def test_lucebox_missing_required_key(lucebox_draft, tmp_path, key):
    p = variant(lucebox_draft, tmp_path / "missing.gguf", lambda m: m.drop(LB + key))
    expect(GGUFError, open_draft(p), f"'{p}'", f"missing required key '{LB}{key}'")


def test_lucebox_vocab_size_mismatch(base, lucebox_draft, tmp_path):
    p = variant(lucebox_draft, tmp_path / "vocab.gguf", lambda m: m.set_value(LB + "vocab_size", 2 * N_VOCAB))
    expect(DraftMismatchError, validate(base["target"], p), *_both(base["target"], p),
           f"'{LB}vocab_size' = {2 * N_VOCAB} but the target has {N_VOCAB} tokens")


def test_lucebox_swa_pattern_without_window(lucebox_draft, tmp_path):
    key = LB + "attention.sliding_window_pattern"
    p = variant(lucebox_draft, tmp_path / "swa.gguf", lambda m: m.set(key, VT.ARRAY, [True, False], VT.BOOL))
    expect(UnsupportedError, open_draft(p), f"'{p}'", f"'{key}' marks sliding-window layers",
           f"'{LB}attention.sliding_window' is missing or 0")


def test_lucebox_swa_pattern_wrong_length(lucebox_draft, tmp_path):
    key = LB + "attention.sliding_window_pattern"

    def edit(m: gm.GGUFModel) -> None:
        m.set(LB + "attention.sliding_window", VT.UINT32, 8)
        m.set(key, VT.ARRAY, [True, True, False], VT.BOOL)

    p = variant(lucebox_draft, tmp_path / "swalen.gguf", edit)
    expect(GGUFError, open_draft(p), f"'{p}'", f"key '{key}' has 3 entries", "expected block_count = 2")


def _nan_output_norm(src: Path, dst: Path) -> Path:
    """`src` with every value of its output norm's weight NaN (a file whose numbers are broken, not
    its layout: it opens and validates; every forward pass makes NaN logits)."""
    shutil.copy(src, dst)
    reader = GGUFReader(str(dst), "r+")
    (norm,) = [t for t in reader.tensors if t.name == "output_norm.weight"]
    norm.data[...] = np.nan
    del reader  # (flushes the memory map)
    return dst


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("speculative", [False, True])
def test_nan_weights_are_an_error_not_tokens(base, tmp_path, temperature, speculative):
    # Greedy decoding takes the graph's argmax, which on the CPU turns a row of NaN logits into token 0
    # (and on CUDA into -1): it used to answer "\x00\x00..." without a word.
    p = _nan_output_norm(base["target"], tmp_path / "nan.gguf")
    engine = lucebox.Engine(str(p), draft=str(base["draft"]) if speculative else None)
    expect(LuceboxError, lambda: engine.generate("hello", max_tokens=4, temperature=temperature, seed=1),
           "not finite (NaN)" if temperature == 0.0 else "NaN")
