"""Tests for lucebox.vocab: the synthetic BPE vocabulary and GGUF tokenizer metadata I/O."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gguf
import pytest
from gguf import GGUFValueType as T

from lucebox import vocab as V
from lucebox.errors import GGUFError
from lucebox.chat_template import DEFAULT_CHAT_TEMPLATE
from lucebox.vocab import GGUFVocab, add_vocab_to_gguf, read_vocab, synthetic_vocab
from vocab_files import write_vocab_gguf

N_SPECIAL = len(V.CONTROL_TOKENS) + len(V.USER_DEFINED_TOKENS)


def _digest(vocab: GGUFVocab) -> str:
    blob = json.dumps([vocab.tokens, vocab.token_types, vocab.merges], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


_write_vocab = write_vocab_gguf


def _write_kv(path: Path, kv: dict[str, tuple[Any, T, T | None]]) -> Path:
    """Write a GGUF holding exactly the given keys: key -> (value, type, item type)."""
    writer = gguf.GGUFWriter(path, "qwen35")
    for key, (value, vtype, sub) in kv.items():
        writer.add_key_value(key, value, vtype, sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _standard_kv(vocab: GGUFVocab) -> dict[str, tuple[Any, T, T | None]]:
    return {
        V.KEY_MODEL: (vocab.model, T.STRING, None),
        V.KEY_PRE: (vocab.pre, T.STRING, None),
        V.KEY_TOKENS: (vocab.tokens, T.ARRAY, T.STRING),
        V.KEY_TOKEN_TYPE: (vocab.token_types, T.ARRAY, T.INT32),
        V.KEY_MERGES: (vocab.merges, T.ARRAY, T.STRING),
        V.KEY_EOS: (vocab.eos_id, T.UINT32, None),
        V.KEY_PAD: (vocab.pad_id, T.UINT32, None),
        V.KEY_MASK: (vocab.mask_id, T.UINT32, None),
        V.KEY_ADD_BOS: (vocab.add_bos, T.BOOL, None),
    }


# ---- byte mapping ---------------------------------------------------------------------------


def test_byte_to_unicode_is_a_printable_bijection() -> None:
    table = V.byte_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert all(ch.isprintable() and not ch.isspace() for ch in table.values())
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("a")] == "a"
    assert V.unicode_to_byte() == {ch: b for b, ch in table.items()}


# ---- synthetic vocabulary -------------------------------------------------------------------


@pytest.mark.parametrize("n_vocab", [V.MIN_SYNTHETIC_VOCAB, 512, 1000, 4096, 32000, 248320])
def test_synthetic_vocab_has_exact_length_and_valid_layout(n_vocab: int) -> None:
    vocab = synthetic_vocab(n_vocab)
    assert len(vocab.tokens) == n_vocab == len(vocab.token_types) == vocab.n_vocab
    assert len(set(vocab.tokens)) == n_vocab, "token strings must be unique"
    assert set(vocab.token_types) <= {1, 3, 4, 5}
    # Types appear in blocks: normal, control, user-defined, then (with room) the fill-in-the-middle
    # control tokens and unused ones.
    runs = [t for i, t in enumerate(vocab.token_types) if i == 0 or vocab.token_types[i - 1] != t]
    assert runs in ([1, 3, 4], [1, 3, 4, 3], [1, 3, 4, 3, 5])
    has_fim = runs[3:4] == [3]
    assert has_fim == (n_vocab - vocab.token_types.index(4) - len(V.USER_DEFINED_TOKENS) >= len(V.FIM_TOKENS))
    if has_fim:
        start = vocab.tokens.index(V.FIM_TOKENS[0])
        assert tuple(vocab.tokens[start:start + len(V.FIM_TOKENS)]) == V.FIM_TOKENS
    # Every merge is made of tokens, and every merged token is reachable from a merge.
    token_set = set(vocab.tokens)
    joined = set()
    for merge in vocab.merges:
        left, right = merge.split(" ")
        assert left in token_set and right in token_set and left + right in token_set
        joined.add(left + right)
    normal = [t for t, ty in zip(vocab.tokens, vocab.token_types) if ty == 1]
    assert set(normal[256:]) == joined
    assert len(vocab.merges) >= V.MIN_SYNTHETIC_MERGES
    assert vocab.model == "gpt2" and vocab.pre == "qwen35"


def test_all_256_bytes_are_the_first_tokens() -> None:
    vocab = synthetic_vocab(4096)
    table = V.byte_to_unicode()
    assert vocab.tokens[:256] == [table[b] for b in range(256)]
    assert vocab.token_types[:256] == [V.TOKEN_TYPE_NORMAL] * 256


def test_special_ids_and_types() -> None:
    vocab = synthetic_vocab(4096)
    assert vocab.tokens[vocab.eos_id] == "<|im_end|>"
    assert vocab.tokens[vocab.pad_id] == "<|endoftext|>"
    assert vocab.tokens[vocab.mask_id] == "<|mask|>"
    assert vocab.bos_id is None and vocab.add_bos is False
    for text in V.CONTROL_TOKENS:
        assert vocab.token_types[vocab.tokens.index(text)] == V.TOKEN_TYPE_CONTROL
    for text in V.USER_DEFINED_TOKENS:
        assert vocab.token_types[vocab.tokens.index(text)] == V.TOKEN_TYPE_USER_DEFINED
    assert vocab.tokens[-1] == f"<|extra_{vocab.token_types.count(V.TOKEN_TYPE_UNUSED) - 1}|>"
    assert vocab.chat_template == DEFAULT_CHAT_TEMPLATE


def test_small_vocab_truncates_merges_and_has_no_padding() -> None:
    small, large = synthetic_vocab(512), synthetic_vocab(4096)
    assert V.TOKEN_TYPE_UNUSED not in small.token_types
    assert small.token_types.count(V.TOKEN_TYPE_NORMAL) == 512 - N_SPECIAL
    # Truncation keeps the earliest (most frequent) merges, in order.
    assert large.merges[: len(small.merges)] == small.merges
    assert len(large.merges) > len(small.merges)


def test_synthetic_vocab_is_deterministic_in_process() -> None:
    first = synthetic_vocab(4096)
    V._trained_base.cache_clear()  # force a second training run
    second = synthetic_vocab(4096)
    assert first == second
    assert _digest(first) == _digest(second)


def test_synthetic_vocab_is_deterministic_across_processes() -> None:
    code = (
        "import hashlib, json\n"
        "from lucebox.vocab import synthetic_vocab\n"
        "v = synthetic_vocab(4096)\n"
        "blob = json.dumps([v.tokens, v.token_types, v.merges], ensure_ascii=False)\n"
        "print(hashlib.sha256(blob.encode('utf-8')).hexdigest())\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(Path(V.__file__).parents[1]),
                                                    env.get("PYTHONPATH", "")] if p)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip() == _digest(synthetic_vocab(4096))


def test_big_vocab_is_fast_even_when_training() -> None:
    V._trained_base.cache_clear()
    start = time.perf_counter()
    vocab = synthetic_vocab(248320)
    assert time.perf_counter() - start < 5.0
    assert len(vocab.tokens) == 248320


@pytest.mark.parametrize("n_vocab", [0, 256, V.MIN_SYNTHETIC_VOCAB - 1])
def test_too_small_vocab_raises_with_minimum(n_vocab: int) -> None:
    with pytest.raises(ValueError, match=f"minimum is {V.MIN_SYNTHETIC_VOCAB}"):
        synthetic_vocab(n_vocab)


# ---- GGUF round trip ------------------------------------------------------------------------


@pytest.mark.parametrize("n_vocab", [1000, 248320])
def test_gguf_round_trip(tmp_path: Path, n_vocab: int) -> None:
    vocab = synthetic_vocab(n_vocab)
    path = _write_vocab(tmp_path / "vocab.gguf", vocab)
    assert read_vocab(path) == vocab


def test_round_trip_keeps_optional_fields(tmp_path: Path) -> None:
    import dataclasses

    base = synthetic_vocab(1000)
    vocab = dataclasses.replace(base, bos_id=base.pad_id, add_bos=True, pre="qwen2",
                                chat_template=None, mask_id=None)
    back = read_vocab(_write_vocab(tmp_path / "v.gguf", vocab))
    assert back == vocab
    assert back.bos_id == base.pad_id and back.add_bos is True and back.mask_id is None


def test_metadata_reader_agrees_with_gguf_reader(tmp_path: Path) -> None:
    path = _write_vocab(tmp_path / "v.gguf", synthetic_vocab(1000))
    ours = V.read_gguf_metadata(path)
    theirs = {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items()
              if not k.startswith("GGUF.")}
    assert ours == theirs
    assert ours["general.architecture"] == "qwen35"


@pytest.mark.parametrize(
    "key", [V.KEY_MODEL, V.KEY_TOKENS, V.KEY_TOKEN_TYPE, V.KEY_MERGES, V.KEY_EOS]
)
def test_missing_required_key_raises_naming_it(tmp_path: Path, key: str) -> None:
    kv = _standard_kv(synthetic_vocab(1000))
    del kv[key]
    path = _write_kv(tmp_path / "v.gguf", kv)
    with pytest.raises(GGUFError, match=f"missing GGUF key '{key}'") as info:
        read_vocab(path)
    assert str(path) in str(info.value)


def test_standard_kv_helper_is_readable(tmp_path: Path) -> None:
    # Guards the test above: the same keys without deletion must load.
    vocab = synthetic_vocab(1000)
    back = read_vocab(_write_kv(tmp_path / "v.gguf", _standard_kv(vocab)))
    assert back.tokens == vocab.tokens and back.eos_id == vocab.eos_id


@pytest.mark.parametrize(
    "key, value, vtype, sub, expected",
    [
        (V.KEY_MODEL, 7, T.UINT32, None, "expected str"),
        (V.KEY_TOKENS, [1, 2, 3], T.ARRAY, T.INT32, "expected array of str"),
        (V.KEY_TOKENS, "abc", T.STRING, None, "expected array of str"),
        (V.KEY_TOKEN_TYPE, ["1"], T.ARRAY, T.STRING, "expected array of int"),
        (V.KEY_EOS, "<|im_end|>", T.STRING, None, "expected int"),
        (V.KEY_ADD_BOS, 1, T.UINT32, None, "expected bool"),
        (V.KEY_CHAT_TEMPLATE, 3, T.INT32, None, "expected str"),
    ],
)
def test_wrong_typed_key_raises_naming_it(
    tmp_path: Path, key: str, value: Any, vtype: T, sub: T | None, expected: str
) -> None:
    kv = _standard_kv(synthetic_vocab(1000))
    kv[key] = (value, vtype, sub)
    path = _write_kv(tmp_path / "v.gguf", kv)
    with pytest.raises(GGUFError, match=f"key '{key}' has type .*{expected}"):
        read_vocab(path)


def test_inconsistent_keys_raise(tmp_path: Path) -> None:
    vocab = synthetic_vocab(1000)
    kv = _standard_kv(vocab)
    kv[V.KEY_TOKEN_TYPE] = (vocab.token_types[:-1], T.ARRAY, T.INT32)
    with pytest.raises(ValueError, match=V.KEY_TOKEN_TYPE):
        read_vocab(_write_kv(tmp_path / "a.gguf", kv))
    kv = _standard_kv(vocab)
    kv[V.KEY_EOS] = (len(vocab.tokens), T.UINT32, None)
    with pytest.raises(ValueError, match=V.KEY_EOS):
        read_vocab(_write_kv(tmp_path / "b.gguf", kv))


def test_non_gguf_and_truncated_files_raise(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty.gguf"):
        read_vocab(empty)
    text = tmp_path / "text.gguf"
    text.write_bytes(b"this is not a gguf file at all")
    with pytest.raises(ValueError, match="bad magic"):
        read_vocab(text)
    full = _write_vocab(tmp_path / "full.gguf", synthetic_vocab(1000)).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full[: len(full) // 2])
    with pytest.raises(ValueError, match="truncated"):
        read_vocab(cut)


def test_add_vocab_to_gguf_rejects_inconsistent_vocab(tmp_path: Path) -> None:
    import dataclasses

    vocab = dataclasses.replace(synthetic_vocab(1000), eos_id=5000)
    writer = gguf.GGUFWriter(tmp_path / "x.gguf", "qwen35")
    with pytest.raises(ValueError, match="eos_token_id=5000"):
        add_vocab_to_gguf(writer, vocab)
