"""Byte-level BPE tokenizer built from GGUF tokenizer metadata.

`Tokenizer` encodes with the `tokenizers` library (BPE model, the pre-tokenizer named by
``tokenizer.ggml.pre``, byte-level mapping) and decodes with its own byte table, so decoding
and streaming (`IncrementalDecoder`) share one definition of the bytes behind every token.

Special tokens are the tokens of type control (3) and user_defined (4). With
``parse_special=True`` their exact text in the input encodes to their single id; with
``parse_special=False`` the input is treated as plain text and split by BPE like anything else.
No Unicode normalisation is applied, so ``decode(encode(text)) == text`` for every string.
"""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import Iterable, Sequence

from .errors import GGUFError
from .vocab import (
    PRE_TOKENIZER_PATTERNS,
    TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_UNUSED,
    TOKEN_TYPE_USER_DEFINED,
    GGUFVocab,
    byte_to_unicode,
    read_vocab,
    unicode_to_byte,
)

__all__ = ["IncrementalDecoder", "Tokenizer"]

_STOP_TOKEN_TEXTS = ("<|endoftext|>", "<|im_end|>")
# Token types whose string is literal text rather than byte-level characters.
_TEXT_TYPES = frozenset({TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED, TOKEN_TYPE_UNUSED})


class Tokenizer:
    """Encoder/decoder for one ``gpt2`` (byte-level BPE) GGUF vocabulary.

    Attributes (read-only by convention):
      n_vocab: number of tokens.
      eos_id: the end-of-sequence id of the vocabulary.
      bos_id, pad_id, mask_id: optional ids (None when the vocabulary has none).
      eos_ids: ids that end generation: eos plus ``<|endoftext|>`` and ``<|im_end|>`` if present.
      special_ids: ids of control and user-defined tokens.
      control_ids: ids of control tokens (what ``decode(skip_special=True)`` drops).

    Instances are immutable after construction and safe to share between threads.
    """

    def __init__(self, vocab: GGUFVocab) -> None:
        """Build from `vocab`; prefer `from_vocab`/`from_gguf`.

        Raises ValueError if the model is not ``"gpt2"``, the pre-tokenizer is unknown, or a
        merge is malformed or refers to a token that is not in the vocabulary.
        """
        from tokenizers import Regex, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        if vocab.model != "gpt2":
            raise ValueError(
                f"unsupported tokenizer model {vocab.model!r}: only 'gpt2' (byte-level BPE) "
                "is supported"
            )
        pattern = PRE_TOKENIZER_PATTERNS.get(vocab.pre)
        if pattern is None:
            known = ", ".join(sorted(PRE_TOKENIZER_PATTERNS))
            raise ValueError(f"unsupported pre-tokenizer {vocab.pre!r} (supported: {known})")
        if len(vocab.token_types) != len(vocab.tokens):
            raise ValueError(
                f"vocabulary has {len(vocab.tokens)} tokens but {len(vocab.token_types)} types"
            )

        self._vocab = vocab
        self._tokens: list[str] = list(vocab.tokens)
        self._types: list[int] = list(vocab.token_types)
        # First id wins if a string occurs twice, so token_to_id is stable.
        self._ids: dict[str, int] = {}
        for i, tok in enumerate(self._tokens):
            self._ids.setdefault(tok, i)

        missing = [b for b, ch in sorted(byte_to_unicode().items()) if ch not in self._ids]
        if missing:
            raise ValueError(
                f"vocabulary lacks {len(missing)} of the 256 byte tokens (first: byte "
                f"0x{missing[0]:02x}, spelled {byte_to_unicode()[missing[0]]!r}); a byte-level "
                "BPE vocabulary must contain all of them"
            )

        merges: list[tuple[str, str]] = []
        for n, merge in enumerate(vocab.merges):
            parts = merge.split(" ")
            if len(parts) != 2 or not parts[0] or not parts[1]:
                raise ValueError(f"merge #{n} {merge!r} is not of the form 'left right'")
            left, right = parts
            for piece in (left, right, left + right):
                if piece not in self._ids:
                    raise ValueError(f"merge #{n} {merge!r}: {piece!r} is not in the vocabulary")
            merges.append((left, right))

        core = HFTokenizer(models.BPE(vocab=dict(self._ids), merges=merges, fuse_unk=False))
        core.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        self._core = core

        self.n_vocab: int = len(self._tokens)
        self.eos_id: int = vocab.eos_id
        self.bos_id: int | None = vocab.bos_id
        self.pad_id: int | None = vocab.pad_id
        self.mask_id: int | None = vocab.mask_id
        self.add_bos: bool = vocab.add_bos
        self.control_ids: frozenset[int] = frozenset(
            i for i, t in enumerate(self._types) if t == TOKEN_TYPE_CONTROL
        )
        self.special_ids: frozenset[int] = frozenset(
            i for i, t in enumerate(self._types)
            if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
        )
        stops = {vocab.eos_id}
        for text in _STOP_TOKEN_TEXTS:
            if text in self._ids:
                stops.add(self._ids[text])
        self.eos_ids: frozenset[int] = frozenset(stops)

        # Longest first, so a special token that is a prefix of another never wins.
        special_texts = sorted(
            {self._tokens[i] for i in self.special_ids}, key=lambda s: (-len(s), s)
        )
        self._special_re: re.Pattern[str] | None = (
            re.compile("|".join(re.escape(s) for s in special_texts)) if special_texts else None
        )
        self._bytes_cache: dict[int, bytes] = {}

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def from_vocab(cls, vocab: GGUFVocab) -> "Tokenizer":
        """Build a tokenizer for `vocab` (see `__init__` for the errors raised)."""
        return cls(vocab)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> "Tokenizer":
        """Build a tokenizer from the tokenizer metadata of the GGUF file at `path`; a vocabulary the
        tokenizer cannot be built from (a broken merge list, say) is a GGUFError naming the file."""
        vocab = read_vocab(path)
        try:
            return cls(vocab)
        except ValueError as e:
            raise GGUFError(f"file '{os.fspath(path)}': {e}") from e

    @property
    def vocab(self) -> GGUFVocab:
        """The vocabulary this tokenizer was built from."""
        return self._vocab

    # ---- encoding ----------------------------------------------------------------------------

    def encode(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        """Return the token ids of `text`.

        add_special: prepend bos when the vocabulary asks for it (``add_bos`` and a bos id).
        parse_special: match the exact text of control/user-defined tokens to their ids;
        when False every character is ordinary text.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        ids: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:
            ids.append(self.bos_id)
        if not parse_special or self._special_re is None:
            ids.extend(self._encode_plain([text]))
            return ids
        # Split into plain segments and special ids, encode all segments in one batch, then
        # put the pieces back in order.
        items: list[str | int] = []
        pos = 0
        for match in self._special_re.finditer(text):
            if match.start() > pos:
                items.append(text[pos:match.start()])
            items.append(self._ids[match.group()])
            pos = match.end()
        if pos < len(text):
            items.append(text[pos:])
        segments = [item for item in items if isinstance(item, str)]
        encoded = iter(self._encode_segments(segments))
        for item in items:
            if isinstance(item, str):
                ids.extend(next(encoded))
            else:
                ids.append(item)
        return ids

    def _encode_plain(self, pieces: list[str]) -> list[int]:
        return [i for seg in self._encode_segments(pieces) for i in seg]

    def _encode_segments(self, segments: list[str]) -> list[list[int]]:
        """BPE-encode each segment as plain text (no special-token matching)."""
        if not segments:
            return []
        if len(segments) == 1:
            return [list(self._core.encode(segments[0], add_special_tokens=False).ids)]
        return [list(e.ids) for e in self._core.encode_batch(segments, add_special_tokens=False)]

    # ---- decoding ----------------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """Return the bytes that token `token_id` stands for.

        Byte-level tokens map each character back to its byte; control, user-defined and unused
        tokens stand for their text in UTF-8. Raises ValueError for an id outside the vocabulary.
        """
        cached = self._bytes_cache.get(token_id)
        if cached is not None:
            return cached
        if not isinstance(token_id, int) or not 0 <= token_id < self.n_vocab:
            raise ValueError(f"token id {token_id!r} is outside the vocabulary of {self.n_vocab}")
        text = self._tokens[token_id]
        if self._types[token_id] in _TEXT_TYPES:
            data = text.encode("utf-8")
        else:
            table = unicode_to_byte()
            buf = bytearray()
            for ch in text:
                b = table.get(ch)
                if b is None:  # not a byte-level character: keep it as its UTF-8 text
                    buf.extend(ch.encode("utf-8"))
                else:
                    buf.append(b)
            data = bytes(buf)
        self._bytes_cache[token_id] = data
        return data

    def decode_bytes(self, ids: Iterable[int], *, skip_special: bool = False) -> bytes:
        """Return the concatenated bytes of `ids`; control tokens dropped if `skip_special`."""
        parts = []
        for i in ids:
            i = int(i)
            if skip_special and i in self.control_ids:
                continue
            parts.append(self.token_bytes(i))
        return b"".join(parts)

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Return the text of `ids`.

        skip_special: drop control tokens (e.g. ``<|im_end|>``); user-defined tokens such as
        ``<think>`` are part of the text and always kept. Invalid UTF-8 (a sequence cut in the
        middle of a character) becomes U+FFFD.
        """
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", errors="replace")

    def incremental_decoder(self, *, skip_special: bool = False) -> "IncrementalDecoder":
        """Return a fresh `IncrementalDecoder` for streaming output."""
        return IncrementalDecoder(self, skip_special=skip_special)

    # ---- lookup ------------------------------------------------------------------------------

    def token_to_id(self, s: str) -> int | None:
        """Return the id of the token spelled `s` (GGUF spelling), or None."""
        return self._ids.get(s)

    def fill_in_the_middle(self, prefix: str | list[int], suffix: str) -> list[int]:
        """The prompt asking the model for the text between `prefix` (text or ids) and `suffix`:
        ``<|fim_prefix|>`` prefix ``<|fim_suffix|>`` suffix ``<|fim_middle|>`` (Qwen's order; the
        texts as plain text). Raises ValueError when the vocabulary has no such tokens."""
        names = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
        ids = [self.token_to_id(n) for n in names]
        if any(i is None for i in ids):
            raise ValueError(f"this model's vocabulary has no fill-in-the-middle tokens ({', '.join(names)})")
        pre, suf, mid = ids
        head = self.encode(prefix, parse_special=False) if isinstance(prefix, str) else list(prefix)
        return [pre, *head, suf, *self.encode(suffix, parse_special=False), mid]

    def id_to_token(self, i: int) -> str:
        """Return the GGUF spelling of token `i`; raises ValueError if out of range."""
        if not isinstance(i, int) or not 0 <= i < self.n_vocab:
            raise ValueError(f"token id {i!r} is outside the vocabulary of {self.n_vocab}")
        return self._tokens[i]

    def is_special(self, i: int) -> bool:
        """True for control and user-defined tokens."""
        return i in self.special_ids

    def __len__(self) -> int:
        return self.n_vocab

    def __repr__(self) -> str:
        return f"Tokenizer(n_vocab={self.n_vocab}, pre={self._vocab.pre!r}, eos_id={self.eos_id})"


class IncrementalDecoder:
    """Streaming decoder: feed token ids one at a time, get text that never splits a character.

    Bytes of an incomplete UTF-8 sequence are held back until the rest arrives. Contract: for
    any ids, ``"".join(d.feed(i) for i in ids) + d.flush()`` equals
    ``tokenizer.decode(ids, skip_special=...)``.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """Add one token; return the text that is now complete (possibly "")."""
        if self._skip_special and token_id in self._tokenizer.control_ids:
            return ""
        return self._utf8.decode(self._tokenizer.token_bytes(int(token_id)))

    def feed_many(self, ids: Iterable[int]) -> str:
        """Add several tokens; return the text that is now complete."""
        return "".join(self.feed(i) for i in ids)

    def flush(self) -> str:
        """End the stream: return held-back bytes (as U+FFFD if incomplete) and reset."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text

    @property
    def pending(self) -> bool:
        """True while bytes of an incomplete character are held back."""
        return bool(self._utf8.getstate()[0])
