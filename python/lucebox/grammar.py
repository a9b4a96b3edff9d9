"""Structured outputs: a `Grammar` restricts what a generation may emit.

A grammar is a JSON schema (OpenAI's ``response_format``), any JSON object, a regular expression,
a choice among strings, or a Lark grammar. `Engine.generate(..., grammar=g)` and the server's
``response_format`` compile it against the model's vocabulary with llguidance and give the core a
token constraint (``token_constraint`` in cpp/include/lucebox/sampling.h): before every token the
core chooses, plain or speculative, the ids the grammar does not allow are masked (-inf), and the
choice is fed back to the grammar's parser. So the output is in the language, speculative decoding
still emits exactly what plain decoding emits (at temperature 0 and, with a seed, above it), and the
generation ends (a stop token) once the grammar is complete. A generation cut by max_tokens or a
stop string ends where it is cut.

Costs: compiling the vocabulary once per engine (0.7-1.5 s for a 248k vocabulary; docs/benchmarks.md),
a parser per generation, and a mask (tens of microseconds) per chosen token. Rows whose allowed ids are not
among the device's top candidates read their full logits row.
"""
from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import llguidance
import numpy as np

from lucebox.errors import ConfigError, GrammarError
from lucebox.tokenizer import Tokenizer

__all__ = ["Grammar", "GrammarConstraint", "compiled_vocabulary", "JSON_OPTIONS"]

# llguidance's JSON options: output may be laid out by the model (newlines, indentation) as it was
# trained to, but a run of whitespace is bounded so that a model cannot fill max_tokens with it.
JSON_OPTIONS = {"whitespace_flexible": True, "whitespace_pattern": r"(?:[\x20\x09]{0,4}|\r?\n[\x20\x09]{0,64})"}


@dataclass(frozen=True)
class Grammar:
    """The language a generation must stay in: valid UTF-8 text (so no control tokens, and no
    token that would leave a broken byte sequence). Build one with a class method (each checks its
    input and raises ConfigError naming the problem); `source` is llguidance's grammar text.

    >>> lucebox.Grammar.json_schema({"type": "object", "properties": {"n": {"type": "integer"}}})
    """

    kind: str    # "json_schema" | "regex" | "choice" | "lark"
    source: str

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str | bool, *, lenient: bool = False) -> "Grammar":
        """JSON text valid under `schema` (a dict or its JSON text). Keywords llguidance does not
        implement (uniqueItems, say) are refused, or with lenient=True ignored (the output then
        follows the rest of the schema)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise ConfigError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, (Mapping, bool)):
            raise ConfigError(f"a JSON schema must be an object or a boolean, not {type(schema).__name__}")
        try:
            options = {**JSON_OPTIONS, "lenient": bool(lenient)}
            source = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=options)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"invalid JSON schema: {exc}") from None
        return cls._checked("json_schema", source)

    @classmethod
    def json_object(cls) -> "Grammar":
        """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return cls.json_schema({"type": "object"})

    @classmethod
    def regex(cls, pattern: str) -> "Grammar":
        """Text that `pattern` matches in full (Rust regex syntax, no lookaround or backreferences)."""
        if not isinstance(pattern, str):
            raise ConfigError(f"a regex must be a string, not {type(pattern).__name__}")
        return cls._checked("regex", llguidance.LLMatcher.grammar_from_regex(pattern))

    @classmethod
    def choice(cls, options: Sequence[str]) -> "Grammar":
        """Exactly one of `options` (non-empty strings)."""
        if isinstance(options, str) or not isinstance(options, Sequence) or not options:
            raise ConfigError("choice needs a non-empty list of strings")
        if not all(isinstance(o, str) and o for o in options):
            raise ConfigError("every choice must be a non-empty string")
        rule = " | ".join(json.dumps(o, ensure_ascii=False) for o in dict.fromkeys(options))
        return cls._checked("choice", llguidance.LLMatcher.grammar_from_lark(f"start: {rule}\n"))

    @classmethod
    def lark(cls, source: str) -> "Grammar":
        """A Lark grammar in llguidance's dialect (``start`` is the top rule; ``%json {...}`` embeds
        a JSON schema; ``<|name|>`` names a special token)."""
        if not isinstance(source, str) or not source.strip():
            raise ConfigError("a Lark grammar must be a non-empty string")
        return cls._checked("lark", llguidance.LLMatcher.grammar_from_lark(source))

    def or_(self, other: "Grammar") -> "Grammar":
        """This language or `other`'s (the server lets a model answer in a response format or
        call a tool instead). The result keeps this grammar's kind."""
        if not isinstance(other, Grammar):
            raise ConfigError(f"a grammar can only be combined with a Grammar, not {type(other).__name__}")
        return self._composed(lambda n: f"start: @{n[0]} | @{n[1]}\n", self.source, other.source)

    def after(self, closing: str) -> "Grammar":
        """Any text through the first `closing`, optional whitespace, then this language: with a
        prompt that opened a think block, the model reasons freely, closes the block (``</think>``)
        and answers in this grammar (`Engine.generate` does this for such chat prompts)."""
        if not isinstance(closing, str) or not closing:
            raise ConfigError("the closing text must be a non-empty string")
        prelude = f"prelude[suffix={json.dumps(closing, ensure_ascii=False)}]: /(?s:.*)/\nWS: /[ \\t\\r\\n]+/\n"
        return self._composed(lambda n: f"start: prelude WS? @{n[0]}\n" + prelude, self.source)

    def _composed(self, top: Callable[[list[str]], str], *sources: str) -> "Grammar":
        """A grammar of this kind whose top Lark rules, top(names), refer to the grammars of
        `sources` by name (``@name``): each source's top grammar gets a name no other uses."""
        parts = [_named_grammars(src) for src in sources]
        used = {g.get("name") for part in parts for g in part}
        names = [n for n in (f"part{i}" for i in range(len(used) + len(parts))) if n not in used][:len(parts)]
        for part, name in zip(parts, names):
            part[0]["name"] = name
        grammars = [{"lark_grammar": top(names)}] + [g for part in parts for g in part]
        return self._checked(self.kind, json.dumps({"grammars": grammars}))

    @classmethod
    def _checked(cls, kind: str, source: str) -> "Grammar":
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(source)
        if failed:
            raise ConfigError(f"invalid {_KIND_NAMES[kind]}: {messages[0] if messages else 'rejected'}")
        return cls(kind, source)


def _named_grammars(source: str) -> list[dict[str, Any]]:
    """The grammars of llguidance grammar text (JSON with a "grammars" list, or Lark text), as
    fresh dicts whose first is the top grammar."""
    if source.lstrip().startswith("{"):
        return [dict(g) for g in json.loads(source)["grammars"]]
    return [{"lark_grammar": source}]


_KIND_NAMES = {"json_schema": "JSON schema", "regex": "regex", "choice": "choice", "lark": "Lark grammar"}


class _TokenSource:
    """What llguidance reads of a vocabulary (its TokenizerWrapper protocol): each token's bytes,
    the control tokens (special: they never spell text), and an encoder of plain text."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.n_vocab)]
        self.special_token_ids = sorted(tokenizer.control_ids)
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, parse_special=False)


_compiled: "weakref.WeakKeyDictionary[Tokenizer, dict[int, Any]]" = weakref.WeakKeyDictionary()
_compiled_lock = threading.Lock()


def compiled_vocabulary(tokenizer: Tokenizer, n_vocab: int) -> Any:
    """llguidance's view of `tokenizer` for logits rows of n_vocab ids (>= the tokenizer's size;
    ids past it are never allowed), built once and shared."""
    if n_vocab < tokenizer.n_vocab:
        raise ConfigError(f"the model's {n_vocab} logits cannot cover the tokenizer's {tokenizer.n_vocab} tokens")
    with _compiled_lock:
        per_size = _compiled.setdefault(tokenizer, {})
        if n_vocab not in per_size:
            per_size[n_vocab] = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_TokenSource(tokenizer)),
                                                       n_vocab=n_vocab, eos_token=sorted(tokenizer.eos_ids))
        return per_size[n_vocab]


class GrammarConstraint:
    """The token constraint of one generation: `allowed(words)` sets the bits of the ids the
    grammar allows next (the core's contract), `accept(token)` advances its parser. A stop token
    (allowed once the grammar is complete) ends it; a parser failure allows only stop tokens (the
    generation ends) and is kept in `error`, which the caller raises as GrammarError."""

    def __init__(self, grammar: Grammar, tokenizer: Tokenizer, n_vocab: int, stop_ids: Sequence[int]) -> None:
        self._matcher = llguidance.LLMatcher(compiled_vocabulary(tokenizer, n_vocab), grammar.source, log_level=0)
        if self._matcher.is_error():
            raise ConfigError(f"invalid {_KIND_NAMES[grammar.kind]}: {self._matcher.get_error()}")
        self._stop_ids = frozenset(int(t) for t in stop_ids)
        self._stopped = False
        self.error: str | None = None

    def allowed(self, words: np.ndarray) -> None:
        if self._stopped or self.error is not None:
            self._allow_stops(words)
            return
        self._matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        if self._matcher.is_error():
            self.error = self._matcher.get_error()
            words[:] = 0
            self._allow_stops(words)

    def accept(self, token: int) -> None:
        if self._stopped or self.error is not None:
            return
        if token in self._stop_ids:
            self._stopped = True
            return
        if not self._matcher.consume_token(int(token)):
            self.error = self._matcher.get_error() or f"the grammar refused token {token}"

    def _allow_stops(self, words: np.ndarray) -> None:
        for t in self._stop_ids:
            if t < words.size * 32:
                words[t >> 5] |= np.uint32(1 << (t & 31))

    def check(self) -> None:
        """Raises GrammarError if the parser failed during the generation."""
        if self.error is not None:
            raise GrammarError(f"the grammar's parser failed: {self.error}")
