"""Tests for lucebox.tokenizer: byte-level BPE encode/decode built from GGUF metadata."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from lucebox import vocab as V
from lucebox.tokenizer import IncrementalDecoder, Tokenizer
from lucebox.vocab import synthetic_vocab
from vocab_files import write_vocab_gguf

TEXTS = [
    "Hello, world!",
    "The model reads a sequence of tokens and predicts the next one.",
    "def f(x: int) -> int:\n    return x * 2  # double\n\n\tprint(f(21))\n",
    "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v.size(); }\r\n",
    '{"name": "get_weather", "arguments": {"city": "Lisbon"}}',
    "Numbers: 3.14159, 1,048,576 and 0x3f2a9c1d.",
    "   leading spaces, trailing spaces   ",
    "\n\n\nnewlines\n\n",
    "Emoji 🙂🚀 and 👩‍💻 (a joined sequence) 🇵🇹",
    "中文文本：模型一次生成一个词元。日本語のテキスト。한국어",
    "Café naïve résumé Zürich; Ελληνικά; привет",
    "e\u0301 (combining accent) a\u0308 \u200b zero-width",
    "it's we'LL they've I'M you'd",
    "",
    " ",
    "\x00\x01\x7f control bytes",
]


_write_vocab = write_vocab_gguf


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = _write_vocab(tmp_path_factory.mktemp("tok") / "vocab.gguf", synthetic_vocab(4096))
    return Tokenizer.from_gguf(path)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_is_exact(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert all(0 <= i < tok.n_vocab for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text, parse_special=False)) == text


def test_round_trip_with_full_size_vocab(tmp_path: Path) -> None:
    tok = Tokenizer.from_gguf(_write_vocab(tmp_path / "big.gguf", synthetic_vocab(248320)))
    assert tok.n_vocab == 248320
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text


def test_bpe_compresses_common_text(tok: Tokenizer) -> None:
    for word in ["the", "model", "function", "tokens", "memory", "return"]:
        ids = tok.encode(" " + word)
        assert len(ids) < len(word) + 1, (word, [tok.id_to_token(i) for i in ids])
    sentence = "The model reads a sequence of tokens and predicts the next one."
    assert len(tok.encode(sentence)) * 3 < len(sentence.encode("utf-8"))
    assert [tok.id_to_token(i) for i in tok.encode(" the function")] == ["Ġthe", "Ġfunction"]


def test_pre_tokenizer_splits_digits_and_words(tok: Tokenizer) -> None:
    # The Qwen pattern gives every digit its own piece, so a number is one token per digit.
    assert [tok.decode([i]) for i in tok.encode("2048")] == ["2", "0", "4", "8"]
    # A letter never merges with the digit before it.
    assert [tok.decode([i]) for i in tok.encode("7the")][0] == "7"


def test_qwen35_keeps_combining_marks_in_words() -> None:
    # Add a merge of "e" with the first byte of U+0301 (a combining acute accent, bytes CC 81)
    # and a merge completing "e\u0301". qwen35 treats letter+mark as one word, so BPE can use
    # the merged token; qwen2 splits the mark into the next piece, so it cannot.
    base = synthetic_vocab(4096)
    b2u = V.byte_to_unicode()
    e_cc = "e" + b2u[0xCC]
    e_acute = e_cc + b2u[0x81]
    vocab = dataclasses.replace(
        base,
        tokens=base.tokens + [e_cc, e_acute],
        token_types=base.token_types + [1, 1],
        merges=[f"e {b2u[0xCC]}", f"{e_cc} {b2u[0x81]}"] + base.merges,
    )
    text = "e\u0301x"
    q35 = Tokenizer.from_vocab(vocab)
    q2 = Tokenizer.from_vocab(dataclasses.replace(vocab, pre="qwen2"))
    acute_id = q35.token_to_id(e_acute)
    assert q35.encode(text)[0] == acute_id
    assert acute_id not in q2.encode(text)
    assert q35.decode(q35.encode(text)) == text == q2.decode(q2.encode(text))


@pytest.mark.parametrize("special", V.CONTROL_TOKENS + V.USER_DEFINED_TOKENS)
def test_special_tokens_parse_only_when_asked(tok: Tokenizer, special: str) -> None:
    sid = tok.token_to_id(special)
    assert sid is not None and sid in tok.special_ids
    assert tok.encode(special) == [sid]
    plain = tok.encode(special, parse_special=False)
    assert len(plain) > 1 and not set(plain) & tok.special_ids
    assert tok.decode(plain) == special


def test_special_tokens_inside_text(tok: Tokenizer) -> None:
    text = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\nok</think>"
    ids = tok.encode(text)
    start, end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    assert ids.count(start) == 2 and ids.count(end) == 1
    assert ids[0] == start and tok.token_to_id("<think>") in ids
    assert tok.decode(ids) == text
    assert tok.encode("<|im_start|><|im_start|>") == [start, start]


def test_skip_special_drops_control_tokens_only(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHi<|im_end|>")
    assert tok.decode(ids, skip_special=True) == "assistant\n<think>\nhmm\n</think>\n\nHi"


def test_ids_and_lookup(tok: Tokenizer) -> None:
    assert tok.eos_id == tok.token_to_id("<|im_end|>")
    assert tok.eos_ids == frozenset({tok.token_to_id("<|im_end|>"),
                                     tok.token_to_id("<|endoftext|>")})
    assert tok.mask_id == tok.token_to_id("<|mask|>") and tok.bos_id is None
    assert tok.id_to_token(tok.eos_id) == "<|im_end|>"
    assert tok.token_to_id("no such token") is None
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.id_to_token(tok.n_vocab)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([0, -1])


def test_add_special_prepends_bos_only_when_vocab_asks() -> None:
    base = synthetic_vocab(1000)
    assert Tokenizer.from_vocab(base).encode("hi", add_special=True) == \
        Tokenizer.from_vocab(base).encode("hi")
    with_bos = Tokenizer.from_vocab(dataclasses.replace(base, bos_id=base.pad_id, add_bos=True))
    ids = with_bos.encode("hi", add_special=True)
    assert ids[0] == base.pad_id and ids[1:] == with_bos.encode("hi")


def test_incremental_decoder_never_splits_characters(tok: Tokenizer) -> None:
    text = "ok 🙂 中文 café 👩‍💻!"
    ids = tok.encode(text)
    dec = tok.incremental_decoder()
    pieces = [dec.feed(i) for i in ids]
    assert "".join(pieces) + dec.flush() == text == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)
    # The emoji is not in the vocabulary as one token, so some pieces must have been held back.
    emoji_ids = tok.encode("🙂")
    assert len(emoji_ids) > 1
    dec2 = IncrementalDecoder(tok)
    assert dec2.feed(emoji_ids[0]) == "" and dec2.pending
    assert "".join(dec2.feed(i) for i in emoji_ids[1:]) == "🙂" and not dec2.pending


def test_incremental_decoder_matches_decode_on_broken_utf8(tok: Tokenizer) -> None:
    lead = tok.token_to_id(V.byte_to_unicode()[0xF0])  # a 4-byte lead with nothing after it
    ids = tok.encode("a") + [lead] + tok.encode("b") + [lead]
    dec = tok.incremental_decoder()
    streamed = "".join(dec.feed(i) for i in ids) + dec.flush()
    assert streamed == tok.decode(ids) == "a\ufffdb\ufffd"


def test_incremental_decoder_skip_special(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>hi<|im_end|>")
    dec = tok.incremental_decoder(skip_special=True)
    assert dec.feed_many(ids) + dec.flush() == "hi" == tok.decode(ids, skip_special=True)


def test_unsupported_model_and_pre_raise() -> None:
    base = synthetic_vocab(1000)
    with pytest.raises(ValueError, match="'llama'"):
        Tokenizer.from_vocab(dataclasses.replace(base, model="llama"))
    with pytest.raises(ValueError, match="'deepseek-v3'"):
        Tokenizer.from_vocab(dataclasses.replace(base, pre="deepseek-v3"))


def test_bad_vocabularies_raise() -> None:
    base = synthetic_vocab(1000)
    missing_byte = list(base.tokens)
    missing_byte[0x41] = "<|gone|>"
    with pytest.raises(ValueError, match="byte tokens"):
        Tokenizer.from_vocab(dataclasses.replace(base, tokens=missing_byte))
    with pytest.raises(ValueError, match="merge #0"):
        Tokenizer.from_vocab(dataclasses.replace(base, merges=["a b c"] + base.merges))
    with pytest.raises(ValueError, match="not in the vocabulary"):
        Tokenizer.from_vocab(dataclasses.replace(base, merges=base.merges + ["Ġzzq Ġzzq"]))


def test_layout_is_not_assumed(tok: Tokenizer) -> None:
    # A vocabulary with specials first and the byte tokens shuffled still works.
    base = synthetic_vocab(1000)
    order = [i for i, t in enumerate(base.token_types) if t != 1]
    order += [i for i, t in enumerate(base.token_types) if t == 1][::-1]
    shuffled = dataclasses.replace(
        base,
        tokens=[base.tokens[i] for i in order],
        token_types=[base.token_types[i] for i in order],
        eos_id=order.index(base.eos_id),
        pad_id=order.index(base.pad_id),
        mask_id=order.index(base.mask_id),
    )
    a, b = Tokenizer.from_vocab(base), Tokenizer.from_vocab(shuffled)
    for text in TEXTS:
        ids_b = b.encode(text)
        assert b.decode(ids_b) == text
        assert [b.id_to_token(i) for i in ids_b] == [a.id_to_token(i) for i in a.encode(text)]
    assert b.eos_ids == frozenset({b.token_to_id("<|im_end|>"), b.token_to_id("<|endoftext|>")})
