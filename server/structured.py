"""Structured outputs over HTTP: the request fields that ask for a grammar, as a lucebox.Grammar.

* OpenAI ``response_format`` (chat and completions): ``{"type": "text"}`` (no grammar),
  ``{"type": "json_object"}`` (any JSON object), ``{"type": "json_schema", "json_schema": {"name":
  ..., "schema": {...}, "strict": ...}}`` (JSON valid under the schema, enforced either way; a
  keyword llguidance does not implement, such as ``uniqueItems``, is a 400 with ``strict: true``
  and ignored otherwise, OpenAI's default);
* Responses ``text.format``: the same types, the schema's fields directly in ``format``;
* Anthropic ``output_config.format``: ``{"type": "json_schema", "schema": {...}}``;
* the ``structured_outputs`` extension (vLLM's field): exactly one of ``json`` (a schema),
  ``regex``, ``choice`` (a list of strings) or ``grammar`` (Lark, in llguidance's dialect).

A grammar constrains the answer: after the reasoning when the prompt opens a think block (the
service runs such a plan in two phases), and with tools offered under ``tool_choice: auto`` the
model may still call one instead (`allowing_tool_calls`); a forced call ignores it. Every malformed
field is a 400 naming it.
"""
from __future__ import annotations

from typing import Any, Mapping

from lucebox.errors import ConfigError
from lucebox.grammar import Grammar

from .errors import invalid

__all__ = ["grammar_from_response_format", "grammar_from_text_format", "grammar_from_output_format",
           "grammar_from_structured_outputs", "request_grammar"]


def _build(param: str, make: Any, *args: Any) -> Grammar:
    try:
        return make(*args)
    except ConfigError as exc:
        raise invalid(str(exc), param=param) from None


def _typed(fmt: Any, param: str) -> str:
    if not isinstance(fmt, Mapping):
        raise invalid(f"{param} must be an object with a 'type'", param=param)
    kind = fmt.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise invalid(f"{param}.type must be 'text', 'json_object' or 'json_schema' (got {kind!r})", param=param)
    return kind


def _schema_grammar(schema: Any, param: str, strict: Any = True) -> Grammar:
    """A schema's grammar; not strict (OpenAI's ``strict: false``, its default): keywords llguidance
    does not implement are ignored instead of refused."""
    if not isinstance(schema, (Mapping, bool)):
        raise invalid(f"{param}.schema must be a JSON schema object", param=param)
    try:
        return Grammar.json_schema(schema, lenient=strict is not True)
    except ConfigError as exc:
        raise invalid(str(exc), param=param) from None


def grammar_from_response_format(fmt: Any, param: str = "response_format") -> Grammar | None:
    """OpenAI chat / completions ``response_format``."""
    if fmt is None:
        return None
    kind = _typed(fmt, param)
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_object()
    spec = fmt.get("json_schema")
    if not isinstance(spec, Mapping):
        raise invalid(f"{param}.json_schema must be an object with a 'schema'", param=param)
    return _schema_grammar(spec.get("schema", {"type": "object"}), f"{param}.json_schema", spec.get("strict"))


def grammar_from_text_format(text: Any, param: str = "text") -> Grammar | None:
    """Responses ``text``: ``{"format": {...}}``."""
    if text is None:
        return None
    if not isinstance(text, Mapping):
        raise invalid(f"{param} must be an object", param=param)
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = _typed(fmt, f"{param}.format")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_object()
    return _schema_grammar(fmt.get("schema", {"type": "object"}), f"{param}.format", fmt.get("strict"))


def grammar_from_output_format(fmt: Any, param: str = "output_config.format") -> Grammar | None:
    """Anthropic ``output_config.format``."""
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema":
        raise invalid(f"{param} must be {{'type': 'json_schema', 'schema': {{...}}}}", param=param)
    return _schema_grammar(fmt.get("schema", {"type": "object"}), param)


def grammar_from_structured_outputs(so: Any, param: str = "structured_outputs") -> Grammar | None:
    """The ``structured_outputs`` extension."""
    if so is None:
        return None
    if not isinstance(so, Mapping):
        raise invalid(f"{param} must be an object", param=param)
    given = [k for k in ("json", "regex", "choice", "grammar") if so.get(k) is not None]
    if len(given) != 1:
        raise invalid(f"{param} needs exactly one of json, regex, choice, grammar (got {given or 'none'})",
                      param=param)
    key = given[0]
    value = so[key]
    where = f"{param}.{key}"
    if key == "json":
        if isinstance(value, str):
            return _build(where, Grammar.json_schema, value)
        return _schema_grammar(value, where)
    make = {"regex": Grammar.regex, "choice": Grammar.choice, "grammar": Grammar.lark}[key]
    return _build(where, make, value)


def request_grammar(**fields: tuple[Any, Any]) -> Grammar | None:
    """The grammar of a request from its structured-output fields, given as name=(parser, value);
    more than one set is a 400."""
    found = [(name, parse(value, name)) for name, (parse, value) in fields.items()]
    found = [(name, g) for name, g in found if g is not None]
    if len(found) > 1:
        raise invalid(f"pass one of {', '.join(n for n, _ in found)}, not several", param=found[1][0])
    return found[0][1] if found else None
