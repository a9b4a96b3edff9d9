"""GGUF tokenizer metadata, and a small but real byte-level BPE vocabulary for synthetic models.

`GGUFVocab` mirrors the ``tokenizer.ggml.*`` keys (plus ``tokenizer.chat_template``) that a
``qwen35`` GGUF carries. `read_vocab` loads them from a file, `add_vocab_to_gguf` writes them
with a `gguf.GGUFWriter`, and `synthetic_vocab` builds a deterministic vocabulary of any size by
training a byte-level BPE on the corpus shipped in ``lucebox/data/synth_corpus.txt``.

Token strings use the byte-to-unicode mapping of GPT-2 style byte-level BPE (what Qwen uses):
every byte is shown as one printable character, e.g. a space is ``"Ġ"`` and a newline ``"Ċ"``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import GGUFError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import gguf

# Token types, numbered as in llama.cpp (enum llama_token_type / gguf.TokenType).
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

# Pre-tokenizer regular expressions, keyed by the value of tokenizer.ggml.pre.
# "qwen35" differs from "qwen2" only in treating combining marks (\p{M}) as part of words.
PRE_TOKENIZER_PATTERNS: dict[str, str] = {
    "qwen35": (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
        r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+"
        r"|\p{N}"
        r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+"
        r"|\s+(?!\S)"
        r"|\s+"
    ),
    "qwen2": (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
        r"|[^\r\n\p{L}\p{N}]?\p{L}+"
        r"|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+"
        r"|\s+(?!\S)"
        r"|\s+"
    ),
}

# Special tokens of the synthetic vocabulary, in id order after the trained tokens.
CONTROL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")
USER_DEFINED_TOKENS: tuple[str, ...] = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)

# Fill-in-the-middle tokens (Qwen's names), control tokens placed first among the unused fill tokens
# of a synthetic vocabulary that has room for them (the tiny one has none).
FIM_TOKENS: tuple[str, ...] = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                               "<|repo_name|>", "<|file_sep|>")

#: Fewest merges a synthetic vocabulary may have; with the 256 byte tokens and the special
#: tokens this sets `MIN_SYNTHETIC_VOCAB`.
MIN_SYNTHETIC_MERGES = 64
MIN_SYNTHETIC_VOCAB = 256 + MIN_SYNTHETIC_MERGES + len(CONTROL_TOKENS) + len(USER_DEFINED_TOKENS)

_CORPUS_PATH = Path(__file__).resolve().parent / "data" / "synth_corpus.txt"


@functools.lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """Return the byte-level BPE mapping from each byte value to the character that shows it.

    Bytes that are printable Latin-1 characters (other than space and the soft hyphen) stand
    for themselves; the remaining 68 bytes are given the code points 256, 257, ... in byte
    order. The mapping is a bijection, so every byte string has exactly one token spelling.
    """
    printable = [
        b
        for b in range(256)
        if ord("!") <= b <= ord("~") or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@functools.lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    """Inverse of `byte_to_unicode`."""
    return {ch: b for b, ch in byte_to_unicode().items()}


@dataclass(frozen=True, kw_only=True)
class GGUFVocab:
    """Tokenizer metadata as stored in a GGUF file.

    Contract: ``len(tokens) == len(token_types)``; every id field is either None or a valid index
    into ``tokens``; ``merges`` holds ``"left right"`` strings in priority order (first = applied
    first). ``mask_id`` is the DFlash MASK token (``tokenizer.ggml.mask_token_id``).
    """

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    eos_id: int
    model: str = "gpt2"
    pre: str = "qwen35"
    bos_id: int | None = None
    pad_id: int | None = None
    mask_id: int | None = None
    chat_template: str | None = None
    add_bos: bool = False

    @property
    def n_vocab(self) -> int:
        """Number of tokens."""
        return len(self.tokens)


# --------------------------------------------------------------------------------------------
# Synthetic vocabulary
# --------------------------------------------------------------------------------------------


def train_bpe(texts: Iterable[str], vocab_size: int = 1 << 20) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Train a byte-level BPE (the ``qwen35`` pre-tokenizer) on `texts`.

    Returns ``(tokens, merges)``: the 256 byte tokens in byte order followed by every merged
    token in the order its merge was learned (at most `vocab_size` tokens in all), and the merges
    as ``"left right"`` strings. Merges stop when no pair occurs at least twice. Deterministic for
    the same texts: the `tokenizers` trainer breaks ties between equally frequent pairs by a fixed
    order.
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERNS["qwen35"]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(texts, trainer)
    raw_merges: list[Any] = json.loads(bpe.to_str())["model"]["merges"]

    byte_tokens = [byte_to_unicode()[b] for b in range(256)]
    tokens = list(byte_tokens)
    known = set(tokens)
    merges: list[str] = []
    for item in raw_merges:
        left, right = item if isinstance(item, list) else item.split(" ", 1)
        merges.append(f"{left} {right}")
        if left + right not in known:
            known.add(left + right)
            tokens.append(left + right)
    return tuple(tokens), tuple(merges)


@functools.lru_cache(maxsize=1)
def _trained_base() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`train_bpe` on the bundled corpus, once per process (every pair seen twice is merged)."""
    return train_bpe([_CORPUS_PATH.read_text(encoding="utf-8")])


def synthetic_vocab(n_vocab: int) -> GGUFVocab:
    """Return a byte-level BPE vocabulary of exactly `n_vocab` tokens.

    Layout: the 256 byte tokens (in byte order), the learned tokens in merge order (as many as
    fit), the control tokens ``<|endoftext|> <|im_start|> <|im_end|> <|mask|>``, the
    user-defined tokens ``<think> </think> <tool_call> </tool_call> <tool_response>
    </tool_response>``, then, where there is room, the control tokens of `FIM_TOKENS`
    (fill-in-the-middle), then ``<|extra_N|>`` unused tokens to fill up to `n_vocab`.
    eos = ``<|im_end|>``, pad = ``<|endoftext|>``, mask = ``<|mask|>``, no bos, and the chat
    template is `lucebox.chat_template.DEFAULT_CHAT_TEMPLATE`.

    The result is identical for the same `n_vocab` in every process. Raises ValueError if
    `n_vocab` is below `MIN_SYNTHETIC_VOCAB`.
    """
    return vocab_from_bpe(*_trained_base(), n_vocab)


def train_vocab(texts: Iterable[str], n_vocab: int) -> GGUFVocab:
    """A vocabulary of exactly `n_vocab` tokens, BPE-trained on `texts`, laid out as `synthetic_vocab`."""
    n_special = len(CONTROL_TOKENS) + len(USER_DEFINED_TOKENS)
    return vocab_from_bpe(*train_bpe(texts, vocab_size=n_vocab - n_special), n_vocab)


def vocab_from_bpe(base_tokens: Sequence[str], base_merges: Sequence[str], n_vocab: int) -> GGUFVocab:
    """Lay out a trained BPE (see `train_bpe`) as a GGUF vocabulary of exactly `n_vocab` tokens.

    The layout is the one `synthetic_vocab` documents. Raises ValueError if `n_vocab` is below
    `MIN_SYNTHETIC_VOCAB`.
    """
    from .chat_template import DEFAULT_CHAT_TEMPLATE

    if not isinstance(n_vocab, int) or isinstance(n_vocab, bool):
        raise TypeError(f"n_vocab must be an int, got {type(n_vocab).__name__}")
    if n_vocab < MIN_SYNTHETIC_VOCAB:
        raise ValueError(
            f"n_vocab={n_vocab} is too small for a synthetic vocabulary: the minimum is "
            f"{MIN_SYNTHETIC_VOCAB} (256 byte tokens + {MIN_SYNTHETIC_MERGES} merges + "
            f"{len(CONTROL_TOKENS) + len(USER_DEFINED_TOKENS)} special tokens)"
        )

    n_special = len(CONTROL_TOKENS) + len(USER_DEFINED_TOKENS)
    budget = n_vocab - n_special  # room for byte + learned tokens

    # Keep merges in order while their result fits in the budget. A merge whose result is
    # already a token (two pairs can spell the same string) costs nothing and is kept.
    tokens = list(base_tokens[:256])
    known = set(tokens)
    merges: list[str] = []
    for merge in base_merges:
        left, right = merge.split(" ", 1)
        joined = left + right
        if joined not in known:
            if len(tokens) >= budget:
                break
            known.add(joined)
            tokens.append(joined)
        merges.append(merge)

    token_types = [TOKEN_TYPE_NORMAL] * len(tokens)
    first_control = len(tokens)
    tokens.extend(CONTROL_TOKENS)
    token_types.extend([TOKEN_TYPE_CONTROL] * len(CONTROL_TOKENS))
    tokens.extend(USER_DEFINED_TOKENS)
    token_types.extend([TOKEN_TYPE_USER_DEFINED] * len(USER_DEFINED_TOKENS))
    if n_vocab - len(tokens) >= len(FIM_TOKENS):
        tokens.extend(FIM_TOKENS)
        token_types.extend([TOKEN_TYPE_CONTROL] * len(FIM_TOKENS))
    n_extra = n_vocab - len(tokens)
    tokens.extend(f"<|extra_{i}|>" for i in range(n_extra))
    token_types.extend([TOKEN_TYPE_UNUSED] * n_extra)
    assert len(tokens) == n_vocab == len(token_types)

    return GGUFVocab(
        tokens=tokens,
        token_types=token_types,
        merges=merges,
        model="gpt2",
        pre="qwen35",
        bos_id=None,
        eos_id=first_control + CONTROL_TOKENS.index("<|im_end|>"),
        pad_id=first_control + CONTROL_TOKENS.index("<|endoftext|>"),
        mask_id=first_control + CONTROL_TOKENS.index("<|mask|>"),
        chat_template=DEFAULT_CHAT_TEMPLATE,
        add_bos=False,
    )


# --------------------------------------------------------------------------------------------
# GGUF writing and reading
# --------------------------------------------------------------------------------------------

KEY_MODEL = "tokenizer.ggml.model"
KEY_PRE = "tokenizer.ggml.pre"
KEY_TOKENS = "tokenizer.ggml.tokens"
KEY_TOKEN_TYPE = "tokenizer.ggml.token_type"
KEY_MERGES = "tokenizer.ggml.merges"
KEY_BOS = "tokenizer.ggml.bos_token_id"
KEY_EOS = "tokenizer.ggml.eos_token_id"
KEY_PAD = "tokenizer.ggml.padding_token_id"
KEY_MASK = "tokenizer.ggml.mask_token_id"
KEY_ADD_BOS = "tokenizer.ggml.add_bos_token"
KEY_CHAT_TEMPLATE = "tokenizer.chat_template"


def add_vocab_to_gguf(writer: "gguf.GGUFWriter", vocab: GGUFVocab) -> None:
    """Add every ``tokenizer.ggml.*`` key of `vocab` (and ``tokenizer.chat_template``) to `writer`.

    Optional ids that are None and a None chat template are omitted. Raises ValueError if
    `vocab` is inconsistent (see `GGUFVocab`), so a bad vocabulary never reaches a file.
    """
    _check_consistent(vocab, where="vocabulary")
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_types(list(vocab.token_types))
    writer.add_token_merges(list(vocab.merges))
    if vocab.bos_id is not None:
        writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    if vocab.pad_id is not None:
        writer.add_pad_token_id(vocab.pad_id)
    if vocab.mask_id is not None:
        writer.add_mask_token_id(vocab.mask_id)
    writer.add_add_bos_token(vocab.add_bos)
    if vocab.chat_template is not None:
        writer.add_chat_template(vocab.chat_template)


def _check_consistent(
    vocab: GGUFVocab, *, where: str, error: type[ValueError] = ValueError
) -> None:
    """Raise `error` if the token types or an id do not fit the token list."""
    n = len(vocab.tokens)
    if n == 0:
        raise error(f"{where}: {KEY_TOKENS} is empty")
    if len(vocab.token_types) != n:
        raise error(
            f"{where}: {KEY_TOKEN_TYPE} has {len(vocab.token_types)} entries but "
            f"{KEY_TOKENS} has {n}"
        )
    for key, value in ((KEY_BOS, vocab.bos_id), (KEY_EOS, vocab.eos_id), (KEY_PAD, vocab.pad_id),
                       (KEY_MASK, vocab.mask_id)):
        if value is not None and not 0 <= value < n:
            raise error(f"{where}: {key}={value} is outside the vocabulary of {n} tokens")


# GGUF value types (the numbering of the GGUF format).
_T_UINT8, _T_INT8, _T_UINT16, _T_INT16, _T_UINT32, _T_INT32 = 0, 1, 2, 3, 4, 5
_T_FLOAT32, _T_BOOL, _T_STRING, _T_ARRAY, _T_UINT64, _T_INT64, _T_FLOAT64 = 6, 7, 8, 9, 10, 11, 12
_TYPE_NAMES = {
    _T_UINT8: "uint8", _T_INT8: "int8", _T_UINT16: "uint16", _T_INT16: "int16",
    _T_UINT32: "uint32", _T_INT32: "int32", _T_FLOAT32: "float32", _T_BOOL: "bool",
    _T_STRING: "string", _T_ARRAY: "array", _T_UINT64: "uint64", _T_INT64: "int64",
    _T_FLOAT64: "float64",
}
# Little-endian numpy dtype of each fixed-size type.
_DTYPES = {
    _T_UINT8: "<u1", _T_INT8: "<i1", _T_UINT16: "<u2", _T_INT16: "<i2", _T_UINT32: "<u4",
    _T_INT32: "<i4", _T_FLOAT32: "<f4", _T_BOOL: "<u1", _T_UINT64: "<u8", _T_INT64: "<i8",
    _T_FLOAT64: "<f8",
}
_INT_TYPES = frozenset({_T_UINT8, _T_INT8, _T_UINT16, _T_INT16, _T_UINT32, _T_INT32, _T_UINT64,
                        _T_INT64})


@dataclass(frozen=True)
class _Field:
    """One GGUF metadata value: ``types`` is (type,) or (ARRAY, item type)."""

    types: tuple[int, ...]
    value: Any


def read_gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Return every metadata key of the GGUF file at `path` with its decoded value.

    Strings become str, numbers int/float, bools bool, arrays lists. Only the header and the
    key/value section are read (the tensor data is never touched). Raises
    `lucebox.errors.GGUFError` (a ValueError) naming the file if it is not a little-endian
    GGUF v2/v3 file or its metadata is truncated.
    """
    return {key: field.value for key, field in _read_fields(path).items()}


def _read_fields(path: str | os.PathLike[str]) -> dict[str, _Field]:
    """Parse the key/value section of the GGUF file at `path`.

    This is a small reader of our own rather than gguf.GGUFReader, which builds a numpy view
    per array item and takes seconds on a 250k-token vocabulary; this one takes well under one.
    """
    import mmap
    import struct

    import numpy as np

    where = os.fspath(path)
    with open(path, "rb") as handle:
        try:
            mm = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # empty file
            raise GGUFError(f"{where}: not a GGUF file (empty)") from None
    try:
        size = len(mm)

        def need(off: int, n: int) -> None:
            if off + n > size:
                raise GGUFError(f"{where}: GGUF metadata is truncated at byte {off}")

        def u32(off: int) -> int:
            need(off, 4)
            return struct.unpack_from("<I", mm, off)[0]

        def u64(off: int) -> int:
            need(off, 8)
            return struct.unpack_from("<Q", mm, off)[0]

        def string(off: int) -> tuple[str, int]:
            n = u64(off)
            off += 8
            need(off, n)
            try:
                return mm[off:off + n].decode("utf-8"), off + n
            except UnicodeDecodeError:
                raise GGUFError(f"{where}: invalid UTF-8 string at byte {off}") from None

        def value(vtype: int, off: int) -> tuple[Any, tuple[int, ...], int]:
            if vtype == _T_STRING:
                text, off = string(off)
                return text, (vtype,), off
            if vtype in _DTYPES:
                dtype = np.dtype(_DTYPES[vtype])
                need(off, dtype.itemsize)
                item = np.frombuffer(mm[off:off + dtype.itemsize], dtype=dtype)[0].item()
                return (bool(item) if vtype == _T_BOOL else item), (vtype,), off + dtype.itemsize
            if vtype == _T_ARRAY:
                itype = u32(off)
                count = u64(off + 4)
                off += 12
                if itype in _DTYPES:
                    dtype = np.dtype(_DTYPES[itype])
                    nbytes = dtype.itemsize * count
                    need(off, nbytes)
                    arr = np.frombuffer(mm[off:off + nbytes], dtype=dtype)
                    items = arr.astype(bool).tolist() if itype == _T_BOOL else arr.tolist()
                    return items, (_T_ARRAY, itype), off + nbytes
                if itype == _T_STRING:
                    items = []
                    for _ in range(count):
                        text, off = string(off)
                        items.append(text)
                    return items, (_T_ARRAY, itype), off
                if itype == _T_ARRAY:
                    items = []
                    for _ in range(count):
                        item, _types, off = value(itype, off)
                        items.append(item)
                    return items, (_T_ARRAY, itype), off
                raise GGUFError(f"{where}: unknown GGUF array item type {itype} at byte {off}")
            raise GGUFError(f"{where}: unknown GGUF value type {vtype} at byte {off}")

        need(0, 24)
        if mm[:4] != b"GGUF":
            raise GGUFError(f"{where}: not a GGUF file (bad magic {bytes(mm[:4])!r})")
        version = u32(4)
        if version not in (2, 3):
            raise GGUFError(
                f"{where}: unsupported GGUF version {version} (supported: 2, 3; "
                "big-endian files are not supported)"
            )
        n_kv = u64(16)
        off = 24
        fields: dict[str, _Field] = {}
        for _ in range(n_kv):
            key, off = string(off)
            vtype = u32(off)
            item, types, off = value(vtype, off + 4)
            fields[key] = _Field(types, item)
        return fields
    finally:
        mm.close()


def _type_name(types: tuple[int, ...]) -> str:
    names = [_TYPE_NAMES.get(t, f"type {t}") for t in types]
    return names[0] if len(names) == 1 else f"array of {names[-1]}"


def _scalar(fields: dict[str, _Field], where: str, key: str, kind: str, *,
            required: bool) -> Any:
    """Return scalar `key` of kind "str", "int" or "bool"; None if absent and optional."""
    field = fields.get(key)
    if field is None:
        if required:
            raise GGUFError(f"{where}: missing GGUF key {key!r}")
        return None
    accepted = {"str": {_T_STRING}, "int": _INT_TYPES, "bool": {_T_BOOL}}[kind]
    if len(field.types) != 1 or field.types[0] not in accepted:
        raise GGUFError(
            f"{where}: GGUF key {key!r} has type {_type_name(field.types)}, expected {kind}"
        )
    return field.value


def _array(fields: dict[str, _Field], where: str, key: str, kind: str, *,
           required: bool) -> list[Any] | None:
    """Return array `key` whose items are of kind "str" or "int"; None if absent and optional."""
    field = fields.get(key)
    if field is None:
        if required:
            raise GGUFError(f"{where}: missing GGUF key {key!r}")
        return None
    accepted = {"str": {_T_STRING}, "int": _INT_TYPES}[kind]
    if len(field.types) != 2 or field.types[1] not in accepted:
        raise GGUFError(
            f"{where}: GGUF key {key!r} has type {_type_name(field.types)}, "
            f"expected array of {kind}"
        )
    return list(field.value)


def read_vocab(path: str | os.PathLike[str]) -> GGUFVocab:
    """Read the tokenizer metadata of the GGUF file at `path`.

    Required keys: ``tokenizer.ggml.model``, ``.tokens``, ``.token_type`` and
    ``.eos_token_id``; ``.merges`` is required when the model is ``"gpt2"``. Missing optional
    keys give: pre ``"default"``, ids None, add_bos False, chat_template None. Raises
    `lucebox.errors.GGUFError` (a ValueError) naming the file and the key when a key is
    missing, has the wrong type, or is inconsistent with the others, or when the file is not
    a readable GGUF file.
    """
    where = os.fspath(path)
    fields = _read_fields(path)
    model = _scalar(fields, where, KEY_MODEL, "str", required=True)
    pre = _scalar(fields, where, KEY_PRE, "str", required=False)
    tokens = _array(fields, where, KEY_TOKENS, "str", required=True)
    token_types = _array(fields, where, KEY_TOKEN_TYPE, "int", required=True)
    merges = _array(fields, where, KEY_MERGES, "str", required=model == "gpt2")
    vocab = GGUFVocab(
        tokens=tokens or [],
        token_types=token_types or [],
        merges=merges or [],
        model=model,
        pre=pre if pre is not None else "default",
        bos_id=_scalar(fields, where, KEY_BOS, "int", required=False),
        eos_id=_scalar(fields, where, KEY_EOS, "int", required=True),
        pad_id=_scalar(fields, where, KEY_PAD, "int", required=False),
        mask_id=_scalar(fields, where, KEY_MASK, "int", required=False),
        chat_template=_scalar(fields, where, KEY_CHAT_TEMPLATE, "str", required=False),
        add_bos=bool(_scalar(fields, where, KEY_ADD_BOS, "bool", required=False)),
    )
    _check_consistent(vocab, where=where, error=GGUFError)
    return vocab


def read_chat_template(path: str | os.PathLike[str]) -> str | None:
    """Return the ``tokenizer.chat_template`` of the GGUF file at `path`, or None if absent.

    Raises `lucebox.errors.GGUFError` (a ValueError) naming the file if the file is not a
    readable GGUF file or the key exists but is not a string.
    """
    where = os.fspath(path)
    return _scalar(_read_fields(path), where, KEY_CHAT_TEMPLATE, "str", required=False)
