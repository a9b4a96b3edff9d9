"""Shared by the tokenizer, vocab and chat-template tests: a GGUF holding only vocab metadata."""
from __future__ import annotations

from pathlib import Path

import gguf

from lucebox.vocab import GGUFVocab, add_vocab_to_gguf


def write_vocab_gguf(path: Path, vocab: GGUFVocab) -> Path:
    writer = gguf.GGUFWriter(path, "qwen35")
    add_vocab_to_gguf(writer, vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
