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
model may still call them instead (`Grammar.or_`). Every tool call is generated under a grammar of
the tools' schemas (`tool_call_grammar`): a forced one (``required`` or a named function) from its
prefix on, one the model opens itself from its ``<tool_call>`` on. Every malformed field is a 400
naming it.
"""
from __future__ import annotations

import functools
import json
import logging
from typing import Any, Mapping, Sequence

from lucebox.errors import ConfigError
from lucebox.grammar import JSON_OPTIONS, Grammar

from .errors import invalid
from lucebox.toolcalls import forced_call_prefix

log = logging.getLogger("lucebox.server")

__all__ = ["grammar_from_response_format", "grammar_from_text_format", "grammar_from_output_format",
           "grammar_from_structured_outputs", "request_grammar", "tool_call_grammar"]


def _build(param: str, make: Any, *args: Any, **kwargs: Any) -> Grammar:
    """make(*args, **kwargs), a Grammar constructor; its ConfigError as a 400 naming `param`."""
    try:
        return make(*args, **kwargs)
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
    """A schema's grammar (a dict or its JSON text); not strict (OpenAI's ``strict: false``, its
    default): keywords llguidance does not implement are ignored instead of refused."""
    return _build(param, Grammar.json_schema, schema, lenient=strict is not True)


def _format_grammar(fmt: Any, param: str, schema_key: str | None) -> Grammar | None:
    """An OpenAI format object: type text (None), json_object, or json_schema with its schema and
    strict in fmt[schema_key] (chat, completions) or in fmt itself (Responses)."""
    kind = _typed(fmt, param)
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_object()
    spec = fmt.get(schema_key) if schema_key else fmt
    where = f"{param}.{schema_key}" if schema_key else param
    if not isinstance(spec, Mapping):
        raise invalid(f"{where} must be an object with a 'schema'", param=param)
    return _schema_grammar(spec.get("schema", {"type": "object"}), where, spec.get("strict"))


def grammar_from_response_format(fmt: Any, param: str = "response_format") -> Grammar | None:
    """OpenAI chat / completions ``response_format``."""
    return None if fmt is None else _format_grammar(fmt, param, "json_schema")


def grammar_from_text_format(text: Any, param: str = "text") -> Grammar | None:
    """Responses ``text``: ``{"format": {...}}``."""
    if text is None:
        return None
    if not isinstance(text, Mapping):
        raise invalid(f"{param} must be an object", param=param)
    fmt = text.get("format")
    return None if fmt is None else _format_grammar(fmt, f"{param}.format", None)


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
        return _schema_grammar(value, where)
    make = {"regex": Grammar.regex, "choice": Grammar.choice, "grammar": Grammar.lark}[key]
    return _build(where, make, value)


# ---------------------------------------------------------------------------------------------
# Tool calls: a call's rest after its opening (toolcalls.forced_call_prefix), typed by the tools' schemas
# ---------------------------------------------------------------------------------------------

_INT = r"/-?(0|[1-9][0-9]*)/"
_NUM = r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/"


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


_DEFS_KEYS = ("$defs", "definitions")


def _inline_json(schema: Any, root: Mapping[str, Any] | None = None) -> str:
    """A Lark ``%json`` of `schema` under the answer grammar's layout options (lenient: a tool's
    schema is the client's, not a request to refuse), with the definitions of `root` (the tool's
    parameters schema) that its local ``$ref``s may point to."""
    body = dict(schema) if isinstance(schema, Mapping) else {}
    for key in _DEFS_KEYS:
        if root is not None and isinstance(root.get(key), Mapping) and key not in body:
            body[key] = root[key]
    body["x-guidance"] = {**JSON_OPTIONS, "lenient": True}
    return "%json " + json.dumps(body, ensure_ascii=False)


def _resolved(schema: Any, root: Mapping[str, Any]) -> Any:
    """`schema` with a local ``$ref`` (``#/$defs/X``, ``#/definitions/X``) into `root` followed
    (a few levels: refs of refs); anything else as it is."""
    for _ in range(8):
        ref = schema.get("$ref") if isinstance(schema, Mapping) else None
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return schema
        target: Any = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, Mapping) else None
        if not isinstance(target, Mapping):
            return schema
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def _xml_typed(schema: Any, root: Mapping[str, Any]) -> str | None:
    """The Lark expression of an XML parameter's value when the schema admits no string (values
    of other types are written as JSON): integers, numbers, booleans, null, JSON arrays and
    objects under their schemas, and unions of them (a list of types, anyOf / oneOf). None
    when a string (verbatim text) or an unstated type is admitted."""
    schema = _resolved(schema, root)
    if not isinstance(schema, Mapping):
        return None
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list) and options:
        base = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
        parts = [_xml_typed({**base, **o} if isinstance(o, Mapping) else o, root) for o in options]
        return None if any(p is None for p in parts) else " | ".join(f"({p})" for p in dict.fromkeys(parts))
    declared = schema.get("type")
    if isinstance(declared, list) and declared:
        parts = [_xml_typed({**schema, "type": t}, root) for t in declared]
        return None if any(p is None for p in parts) else " | ".join(f"({p})" for p in dict.fromkeys(parts))
    if not isinstance(declared, str):
        return None
    if declared in ("array", "object"):
        return _inline_json(schema, root)
    return {"integer": _INT, "number": _NUM, "boolean": '"true" | "false"', "null": '"null"'}.get(declared)


def _xml_value(rule: str, schema: Any, root: Mapping[str, Any]) -> list[str]:
    """Lark rules for an XML parameter's value (as the Qwen3.5/3.6 templates write it: strings
    verbatim, other types as JSON) and its closing line; the first rule is named `rule`."""
    close = _lit("\n</parameter>\n")
    schema = _resolved(schema, root)
    enum = schema.get("enum") if isinstance(schema, Mapping) else None
    if isinstance(enum, list) and enum and all(isinstance(v, str) and v for v in enum):
        return [f"{rule}: ({' | '.join(_lit(v) for v in dict.fromkeys(enum))}) {close}"]
    typed = _xml_typed(schema, root)
    if typed is not None:
        return [f"{rule}: ({typed}) {close}"]
    # a string (at most maxLength characters, at least minLength), or a type the schema leaves open
    lo = schema.get("minLength") if isinstance(schema, Mapping) else None
    hi = schema.get("maxLength") if isinstance(schema, Mapping) else None
    lo = lo if isinstance(lo, int) and not isinstance(lo, bool) and lo >= 0 else 0
    hi = hi if isinstance(hi, int) and not isinstance(hi, bool) and hi >= lo else None
    body = "/(?s:.*)/" if hi is None and lo == 0 else f"/(?s:.{{{lo},{'' if hi is None else hi}}})/"
    return [f"{rule}[suffix={close}]: {body}"]


_XML_CALL_END = _lit("</function>\n</tool_call>")


def _xml_call(idx: int, params: Mapping[str, Any]) -> list[str]:
    """Rules `call{idx}` for one function's parameters and the call's end (XML format)."""
    schema = params if isinstance(params, Mapping) else {}
    props = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
    required = set(schema.get("required") or []) if isinstance(schema.get("required"), list) else set()
    rules, parts = [], []
    for k, (name, sub) in enumerate(props.items()):
        rule = f"p{idx}_{k}"
        rules.append(f"{rule}: {_lit(f'<parameter={name}>' + chr(10))} v{idx}_{k}")
        rules += _xml_value(f"v{idx}_{k}", sub, schema)
        parts.append(rule if name in required else f"{rule}?")
    if not props:  # parameters the schema does not name: any, with free values
        rules.append(f"p{idx}_any: \"<parameter=\" /[A-Za-z0-9_.-]+/ \">\\n\" v{idx}_any")
        rules += _xml_value(f"v{idx}_any", None, schema)
        parts.append(f"p{idx}_any*")
    rules.insert(0, f"call{idx}: {' '.join(parts)} {_XML_CALL_END}")
    return rules


def _json_call(idx: int, params: Mapping[str, Any]) -> list[str]:
    """The rule `call{idx}`: one function's arguments object and the call's end (JSON format)."""
    args = dict(params) if isinstance(params, Mapping) else {}
    if isinstance(args.get("properties"), Mapping) and "additionalProperties" not in args:
        args["additionalProperties"] = False  # the parameters it names, as in the XML format
    return [f"call{idx}: {_inline_json(args)} WS? \"}}\" WS? {_lit('</tool_call>')}"]


def _untyped_call(fmt: str, idx: int) -> list[str]:
    """The rule `call{idx}` of a function whose schema the compiler cannot take: any parameters."""
    if fmt == "xml":
        return [f"call{idx}[suffix={_XML_CALL_END}]: /(?s:.*)/"]
    return _json_call(idx, {"type": "object"})


def _typed_calls(fmt: str, fns: Sequence[tuple[str, Any]]) -> list[list[str]]:
    """The rules of each function's call, `_untyped_call`'s (logged) for those whose rules alone
    do not compile (a schema the compiler cannot take)."""
    per_call = [_call(fmt, i, params) for i, (_, params) in enumerate(fns)]
    for i, (fn, _) in enumerate(fns):
        try:
            Grammar.lark(f"start: call{i}\n{_WS}" + "\n".join(per_call[i]) + "\n")
        except ConfigError as exc:
            log.warning("calls to %s are not typed: its schema does not compile: %s", fn, exc)
            per_call[i] = _untyped_call(fmt, i)
    return per_call


def _call(fmt: str, idx: int, params: Any) -> list[str]:
    return (_xml_call if fmt == "xml" else _json_call)(idx, params)


_WS = "WS: /[ \\t\\n]+/\n"


def tool_call_grammar(fmt: str, tools: Sequence[Mapping[str, Any]], opened: str, *, name: str | None = None,
                      more: bool = False) -> Grammar | None:
    """The rest of an assistant turn whose text so far ends with `opened`, a prefix of a call's
    opening (toolcalls.forced_call_prefix(fmt, name): the whole prefix for a forced call, "" or
    "<tool_call>" when the model opens one itself): one call, to `name` or to one of the tools,
    and with `more` (parallel tool calls) further calls, each on a new line; then the turn ends.
    XML: parameters in the schema's order, the required ones present, values of their declared
    types (strings within min/maxLength, enums of strings, unions, local $refs); JSON: the
    arguments object valid under the schema (with only the parameters it names, unless it sets
    additionalProperties). A function whose schema the compiler cannot take is called with any
    parameters (logged). None (logged) when `opened` is not such a prefix: the call is then
    generated unconstrained."""
    opening = forced_call_prefix(fmt, name)
    if not opening.startswith(opened):
        log.warning("a tool call opened as %r is not constrained (expected a prefix of %r)", opened, opening)
        return None
    # (the tools as JSON text: hashable, and their keys in order, which is the parameters' order)
    return _tool_call_grammar(fmt, json.dumps(list(tools)), opened, name, more)


@functools.lru_cache(maxsize=32)  # an agent sends the same tools with every request (8-12 ms each for 20)
def _tool_call_grammar(fmt: str, tools_json: str, opened: str, name: str | None, more: bool) -> Grammar | None:
    fns = [(t["function"]["name"], t["function"].get("parameters") or {}) for t in json.loads(tools_json)]
    if name is not None:
        fns = [f for f in fns if f[0] == name]
    after_name = ">\n" if fmt == "xml" else '", "arguments": '
    calls = " | ".join(f"call{i}" if name is not None else f"{_lit(fn + after_name)} call{i}"
                       for i, (fn, _) in enumerate(fns))
    opening = forced_call_prefix(fmt, name)
    first = f"{_lit(opening[len(opened):])} calls" if opening != opened else "calls"
    again = f" (\"\\n\" {_lit(opening)} calls)*" if more else ""

    def source(per_call: Sequence[Sequence[str]]) -> str:
        return f"start: {first}{again}\ncalls: {calls}\n{_WS}" + "\n".join(r for rs in per_call for r in rs) + "\n"

    try:
        return Grammar.lark(source([_call(fmt, i, params) for i, (_, params) in enumerate(fns)]))
    except ConfigError:  # some schema the compiler cannot take: type the other functions' calls
        try:
            return Grammar.lark(source(_typed_calls(fmt, fns)))
        except ConfigError as exc:
            log.warning("tool calls are not constrained: %s", exc)
            return None


def request_grammar(**fields: tuple[Any, Any]) -> Grammar | None:
    """The grammar of a request from its structured-output fields, given as name=(parser, value);
    more than one set is a 400."""
    found = [(name, parse(value, name)) for name, (parse, value) in fields.items()]
    found = [(name, g) for name, g in found if g is not None]
    if len(found) > 1:
        raise invalid(f"pass one of {', '.join(n for n, _ in found)}, not several", param=found[1][0])
    return found[0][1] if found else None
