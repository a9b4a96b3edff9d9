"""Tool calls in model output, parsed incrementally into OpenAI-style calls with typed arguments.

Two formats are recognised in the assistant's *content* (reasoning text is never parsed):

XML (Qwen3.5 / Qwen3.6 / Qwen3-Coder chat templates)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

JSON (Qwen2.5 / Qwen3 / Hermes templates, and lucebox's default template)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}
    </tool_call>

A bare ``<function=NAME>...</function>`` block without the ``<tool_call>`` wrapper is accepted
too, several ``<function=...>`` blocks inside one ``<tool_call>`` become several calls, and any
number of calls may follow each other (parallel calls).

Contracts of `ToolCallParser` (the streaming parser):

* Text fed to it comes back as `TextDelta` events, except tool-call markup: a suffix that could
  be the start of a marker (``<tool_call>``, ``<function=``) is held back until the next piece
  decides, so no content delta ever contains a raw ``<tool_call>`` or ``<function=`` tag of a
  call that is then parsed. Markup that turns out not to be a valid call (unparseable JSON, a
  missing function name) is given back verbatim as content when that is known, never dropped.
* A call is announced with `ToolCallStart` (index, id, name) as soon as its name is known;
  its arguments follow as `ToolCallArgsDelta` fragments (XML: one per completed parameter;
  JSON: the whole object once the call is complete). The concatenated fragments of a call are
  exactly ``json.dumps(call.arguments, ensure_ascii=False)``: a JSON object, never a string
  holding JSON.
* Argument values are typed by the tool's JSON schema (`coerce_value`): integer, number,
  boolean, null, array and object values are parsed; string parameters stay strings verbatim.
* `finish()` flushes held text and closes a call cut short (a stop string or max_tokens):
  parameters parsed so far are kept, the call is still reported.

Whitespace between or after calls is dropped; other text after a call is content.
`parse_tool_calls` is the same parser over a complete text.
"""
from __future__ import annotations

import ast
import json
import math
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

__all__ = [
    "ToolCall",
    "TextDelta",
    "ToolCallStart",
    "ToolCallArgsDelta",
    "ToolEvent",
    "ToolCallParser",
    "parse_tool_calls",
    "coerce_value",
    "coerce_arguments",
    "tool_schemas",
    "template_tool_format",
    "forced_call_prefix",
    "new_call_id",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"

_START_MARKERS = (TOOL_CALL_OPEN, FUNCTION_OPEN)
# A parameter value ends at its closing tag; a missing closing tag is tolerated when the next
# parameter or the end of the function follows on a new line (as the format writes them).
_VALUE_ENDS = (PARAMETER_CLOSE, "\n" + PARAMETER_OPEN, "\n" + FUNCTION_CLOSE, "\n" + TOOL_CALL_CLOSE)
_MAX_NAME_CHARS = 256  # a "<function=" without ">" this long is prose, not a call


def new_call_id() -> str:
    """A fresh OpenAI-style tool call id (``call_`` + 24 hex digits)."""
    return "call_" + secrets.token_hex(12)


@dataclass
class ToolCall:
    """One parsed call: its position among the calls of the message, id, name and arguments."""

    index: int
    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def arguments_json(self) -> str:
        """The arguments as the JSON object text OpenAI clients expect in ``function.arguments``."""
        return json.dumps(self.arguments, ensure_ascii=False)

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments_json()}}


@dataclass
class TextDelta:
    """Plain content text."""

    text: str


@dataclass
class ToolCallStart:
    """A call begins; its name is known."""

    index: int
    id: str
    name: str


@dataclass
class ToolCallArgsDelta:
    """A fragment of the JSON text of a call's arguments."""

    index: int
    text: str


ToolEvent = Union[TextDelta, ToolCallStart, ToolCallArgsDelta]


# ---------------------------------------------------------------------------------------------
# Schemas and typing of argument values
# ---------------------------------------------------------------------------------------------

def tool_schemas(tools: Iterable[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Map each function name to the JSON schemas of its parameters (``properties``).

    Accepts OpenAI tools (``{"type": "function", "function": {"name", "parameters"}}``) and
    bare function definitions (``{"name", "parameters"}``); anything else is skipped."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        if not isinstance(tool, Mapping):
            continue
        fn = tool.get("function", tool)
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters") or fn.get("input_schema") or {}
        props = params.get("properties") if isinstance(params, Mapping) else None
        out[fn["name"]] = dict(props) if isinstance(props, Mapping) else {}
    return out


_JSON_TYPES = ("string", "integer", "number", "boolean", "null", "array", "object")


def _schema_types(schema: Any) -> list[str]:
    """The JSON types a schema admits, in the order given; [] when it does not say."""
    if not isinstance(schema, Mapping):
        return []
    types: list[str] = []

    def add(t: str) -> None:
        if t in _JSON_TYPES and t not in types:
            types.append(t)

    declared = schema.get("type")
    if isinstance(declared, str):
        add(declared)
    elif isinstance(declared, list):
        for t in declared:
            if isinstance(t, str):
                add(t)
    for key in ("anyOf", "oneOf", "allOf"):
        subs = schema.get(key)
        if isinstance(subs, list):
            for sub in subs:
                for t in _schema_types(sub):
                    add(t)
    if not types and isinstance(schema.get("enum"), list):
        for v in schema["enum"]:
            add(_json_type_of(v))
    if not types and "const" in schema:
        add(_json_type_of(schema["const"]))
    if not types and isinstance(schema.get("properties"), Mapping):
        add("object")
    if not types and "items" in schema:
        add("array")
    return types


def _json_type_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


_INT_RE = re.compile(r"[-+]?\d+")
_NUM_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_MISSING = object()


def _parse_as(text: str, t: str) -> Any:
    """`text` read as JSON type `t`, or _MISSING when it is not one."""
    s = text.strip()
    if t == "integer":
        if _INT_RE.fullmatch(s):
            return int(s)
        if _NUM_RE.fullmatch(s):
            f = float(s)
            if math.isfinite(f) and f.is_integer():
                return int(f)
        return _MISSING
    if t == "number":
        if _INT_RE.fullmatch(s):
            return int(s)
        if _NUM_RE.fullmatch(s):
            f = float(s)
            return f if math.isfinite(f) else _MISSING
        return _MISSING
    if t == "boolean":
        low = s.lower()
        return True if low == "true" else False if low == "false" else _MISSING
    if t == "null":
        return None if s.lower() in ("null", "none") else _MISSING
    if t in ("array", "object"):
        want = list if t == "array" else dict
        for loader in (json.loads, ast.literal_eval):
            try:
                value = loader(s)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(value, want):
                return value
        return _MISSING
    if t == "string":
        return text
    return _MISSING


def _guess(text: str) -> Any:
    """A value with no schema: JSON when the whole text is a JSON literal, else the string."""
    s = text.strip()
    if s and (s[0] in "[{-0123456789" or s in ("true", "false", "null")):
        try:
            return json.loads(s)
        except ValueError:
            pass
    return text


def coerce_value(text: str, schema: Any) -> Any:
    """Type a raw parameter value (as written in the XML form) by its JSON schema.

    A schema admitting only strings keeps the text verbatim. Otherwise the non-string types the
    schema admits are tried in order (integer, number, boolean, null, array, object; anyOf /
    oneOf / type lists / enum / const are understood); the first that parses wins; when none
    does, the text is kept as a string. Without a schema, a text that is entirely a JSON
    literal becomes that value, anything else stays a string."""
    types = _schema_types(schema)
    if not types:
        return _guess(text)
    if types == ["string"]:
        return text
    for t in types:
        if t == "string":
            continue
        value = _parse_as(text, t)
        if value is not _MISSING:
            return value
    return text


def _coerce_json_value(value: Any, schema: Any) -> Any:
    """Fix a value of the JSON form against its schema: strings holding another declared type
    are parsed; a non-string where only strings are allowed is written as JSON text."""
    types = _schema_types(schema)
    if not types:
        return value
    if isinstance(value, str):
        if "string" in types and types[0] == "string":
            return value
        return coerce_value(value, schema)
    if types == ["string"]:
        return json.dumps(value, ensure_ascii=False)
    return value


def coerce_arguments(arguments: Any, properties: Mapping[str, Any] | None) -> dict[str, Any]:
    """Arguments of a JSON-form call as a dict typed by the parameter schemas.

    A string holding a JSON object (double-encoded arguments) is decoded first; anything that
    is not an object becomes ``{}``."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return {}
    if not isinstance(arguments, Mapping):
        return {}
    props = properties or {}
    return {str(k): _coerce_json_value(v, props.get(k)) for k, v in arguments.items()}


# ---------------------------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------------------------

def template_tool_format(template_source: str) -> str:
    """Which call format a chat template teaches the model: "xml" when it mentions
    ``<function=`` (Qwen3.5/3.6), else "json"."""
    return "xml" if FUNCTION_OPEN in template_source else "json"


def forced_call_prefix(fmt: str, name: str | None) -> str:
    """The text that starts an assistant turn when a call is forced.

    With a name, the call's opening up to where the model writes the arguments; without one
    (``tool_choice="required"``), the opening up to where it writes the function name."""
    if fmt == "xml":
        return f"{TOOL_CALL_OPEN}\n{FUNCTION_OPEN}{name}>\n" if name else f"{TOOL_CALL_OPEN}\n{FUNCTION_OPEN}"
    if name:
        return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '
    return f'{TOOL_CALL_OPEN}\n{{"name": "'


# ---------------------------------------------------------------------------------------------
# The streaming parser
# ---------------------------------------------------------------------------------------------

_TEXT, _OPEN, _NAME, _PARAMS, _VALUE, _AFTER_FUNCTION, _JSON = range(7)


def _held_prefix_len(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


class ToolCallParser:
    """Incremental parser of tool calls in assistant content (see the module docstring).

    `feed(text)` returns the events the new text completes; `finish()` those left at the end.
    `calls` lists the calls completed so far. Not thread-safe; one parser per choice."""

    def __init__(self, tools: Iterable[Mapping[str, Any]] | None = None, *,
                 id_factory: Callable[[], str] = new_call_id) -> None:
        self._schemas = tool_schemas(tools)
        self._new_id = id_factory
        self.calls: list[ToolCall] = []
        self._mode = _TEXT
        self._buf = ""            # unconsumed text
        self._raw = ""            # text of the call being parsed, from its first marker
        self._wrapped = False     # the current call began with <tool_call>
        self._held_ws = ""        # trailing whitespace of content, emitted only if text follows
        self._ws_before_call = ""
        self._content_started = False
        self._current: ToolCall | None = None
        self._arg_count = 0

    # -- public ---------------------------------------------------------------------------
    def feed(self, text: str) -> list[ToolEvent]:
        """Consume `text`; return the events it completes."""
        if not text:
            return []
        self._buf += text
        out: list[ToolEvent] = []
        self._run(out, final=False)
        return out

    def finish(self) -> list[ToolEvent]:
        """End of output: flush held text, close or give back an unfinished call."""
        out: list[ToolEvent] = []
        self._run(out, final=True)
        mode = self._mode
        if mode == _TEXT:
            if self._buf:
                self._content(out, self._buf, final=True)
            if self._held_ws and not self.calls:
                out.append(TextDelta(self._held_ws))
            self._held_ws = ""
        elif mode in (_OPEN, _NAME):
            self._give_back(out, self._raw + self._buf)
        elif mode == _JSON:
            body = self._buf
            if not self._emit_json_call(out, body):
                self._give_back(out, self._raw + body)
        elif mode == _VALUE:
            value = self._buf
            cut = _held_prefix_len(value, _VALUE_ENDS)
            value = value[: len(value) - cut]
            self._emit_param(out, self._param_name, value)
            self._close_call(out)
        elif mode in (_PARAMS, _AFTER_FUNCTION):
            if self._current is not None:
                self._close_call(out)
        self._buf = ""
        self._raw = ""
        self._mode = _TEXT
        return out

    # -- state machine --------------------------------------------------------------------
    def _run(self, out: list[ToolEvent], final: bool) -> None:
        while True:
            before = (self._mode, len(self._buf))
            step = {_TEXT: self._step_text, _OPEN: self._step_open, _NAME: self._step_name,
                    _PARAMS: self._step_params, _VALUE: self._step_value,
                    _AFTER_FUNCTION: self._step_after_function, _JSON: self._step_json}[self._mode]
            if not step(out, final):
                return
            if (self._mode, len(self._buf)) == before:
                return

    def _consume(self, n: int) -> str:
        taken, self._buf = self._buf[:n], self._buf[n:]
        self._raw += taken
        return taken

    def _step_text(self, out: list[ToolEvent], final: bool) -> bool:
        buf = self._buf
        hits = [(buf.find(m), m) for m in _START_MARKERS]
        hits = [(i, m) for i, m in hits if i >= 0]
        if hits:
            i, marker = min(hits)
            self._content(out, buf[:i], final=False)
            # whitespace right before a call is dropped, unless the markup is given back
            self._ws_before_call, self._held_ws = self._held_ws, ""
            self._buf = buf[i:]
            self._raw = ""
            if marker == TOOL_CALL_OPEN:
                self._consume(len(TOOL_CALL_OPEN))
                self._wrapped = True
                self._mode = _OPEN
            else:
                self._wrapped = False
                self._mode = _NAME
            return True
        if final:
            return False
        keep = _held_prefix_len(buf, _START_MARKERS)
        self._content(out, buf[: len(buf) - keep], final=False)
        self._buf = buf[len(buf) - keep:]
        return False

    def _step_open(self, out: list[ToolEvent], final: bool) -> bool:
        stripped = self._buf.lstrip()
        self._consume(len(self._buf) - len(stripped))
        if not stripped:
            return False
        if stripped.startswith(FUNCTION_OPEN):
            self._mode = _NAME
            return True
        if FUNCTION_OPEN.startswith(stripped):
            return False  # could still become <function=
        if stripped[0] in "{[":
            self._mode = _JSON
            return True
        # Not a call: give the markup back as content once the block ends.
        end = self._buf.find(TOOL_CALL_CLOSE)
        if end < 0:
            return False
        self._consume(end + len(TOOL_CALL_CLOSE))
        self._give_back(out, self._raw)
        return True

    def _step_name(self, out: list[ToolEvent], final: bool) -> bool:
        buf = self._buf
        end = buf.find(">")
        if end < 0:
            if len(buf) > _MAX_NAME_CHARS + len(FUNCTION_OPEN):
                self._consume(len(buf))
                self._give_back(out, self._raw)
                return True
            return False
        name = buf[len(FUNCTION_OPEN):end].strip()
        if not name or len(name) > _MAX_NAME_CHARS or "\n" in name or "<" in name:
            self._consume(end + 1)
            self._give_back(out, self._raw)
            return True
        self._consume(end + 1)
        call = ToolCall(index=len(self.calls), id=self._new_id(), name=name)
        self._current = call
        self._arg_count = 0
        self._param_name = ""
        out.append(ToolCallStart(call.index, call.id, call.name))
        self._mode = _PARAMS
        return True

    def _step_params(self, out: list[ToolEvent], final: bool) -> bool:
        stripped = self._buf.lstrip()
        self._consume(len(self._buf) - len(stripped))
        if not stripped:
            return False
        if stripped.startswith(PARAMETER_OPEN):
            end = stripped.find(">")
            if end < 0:
                return False
            self._param_name = stripped[len(PARAMETER_OPEN):end].strip()
            self._consume(end + 1)
            self._mode = _VALUE
            return True
        if stripped.startswith(FUNCTION_CLOSE):
            self._consume(len(FUNCTION_CLOSE))
            self._close_call(out)
            self._mode = _AFTER_FUNCTION if self._wrapped else _TEXT
            return True
        if stripped.startswith(TOOL_CALL_CLOSE):  # </function> forgotten
            self._consume(len(TOOL_CALL_CLOSE))
            self._close_call(out)
            self._mode = _TEXT
            return True
        if any(m.startswith(stripped) for m in (PARAMETER_OPEN, FUNCTION_CLOSE, TOOL_CALL_CLOSE)):
            return False
        # stray text inside the function: skip to the next tag
        nxt = stripped.find("<", 1)
        self._consume(nxt if nxt > 0 else len(stripped))
        return True

    def _step_value(self, out: list[ToolEvent], final: bool) -> bool:
        buf = self._buf
        hits = [(buf.find(e), e) for e in _VALUE_ENDS]
        hits = [(i, e) for i, e in hits if i >= 0]
        if not hits:
            return False
        i, end = min(hits)
        value = buf[:i]
        self._consume(i + (len(PARAMETER_CLOSE) if end == PARAMETER_CLOSE else 0))
        self._emit_param(out, self._param_name, value)
        self._mode = _PARAMS
        return True

    def _step_after_function(self, out: list[ToolEvent], final: bool) -> bool:
        stripped = self._buf.lstrip()
        self._consume(len(self._buf) - len(stripped))
        if not stripped:
            return False
        if stripped.startswith(TOOL_CALL_CLOSE):
            self._consume(len(TOOL_CALL_CLOSE))
            self._mode = _TEXT
            return True
        if stripped.startswith(FUNCTION_OPEN):  # another function inside the same block
            self._mode = _NAME
            return True
        if any(m.startswith(stripped) for m in (TOOL_CALL_CLOSE, FUNCTION_OPEN)):
            return False
        nxt = stripped.find("<", 1)
        self._consume(nxt if nxt > 0 else len(stripped))
        return True

    def _step_json(self, out: list[ToolEvent], final: bool) -> bool:
        end = self._buf.find(TOOL_CALL_CLOSE)
        if end < 0:
            return False
        body = self._buf[:end]
        self._consume(end + len(TOOL_CALL_CLOSE))
        if not self._emit_json_call(out, body):
            self._give_back(out, self._raw)
        self._mode = _TEXT
        return True

    # -- emitters -------------------------------------------------------------------------
    def _content(self, out: list[ToolEvent], text: str, final: bool) -> None:
        """Emit content text, holding trailing whitespace and dropping whitespace after calls."""
        if not text:
            return
        text = self._held_ws + text
        self._held_ws = ""
        body = text.rstrip()
        tail = text[len(body):]
        if body:
            if self.calls and not self._content_started:
                body = body.lstrip()
            self._content_started = True
            out.append(TextDelta(body))
        self._held_ws = tail

    def _give_back(self, out: list[ToolEvent], raw: str) -> None:
        """Markup that is not a call goes back to content, verbatim."""
        self._raw = ""
        self._mode = _TEXT
        raw, self._ws_before_call = self._ws_before_call + raw, ""
        if raw:
            self._content(out, raw, final=False)

    def _emit_param(self, out: list[ToolEvent], name: str, raw_value: str) -> None:
        call = self._current
        if call is None or not name or name in call.arguments:
            return
        value = raw_value[1:] if raw_value.startswith("\n") else raw_value
        value = value[:-1] if value.endswith("\n") else value
        typed = coerce_value(value, self._schemas.get(call.name, {}).get(name))
        call.arguments[name] = typed
        frag = json.dumps(name, ensure_ascii=False) + ": " + json.dumps(typed, ensure_ascii=False)
        out.append(ToolCallArgsDelta(call.index, ("{" if self._arg_count == 0 else ", ") + frag))
        self._arg_count += 1

    def _close_call(self, out: list[ToolEvent]) -> None:
        call = self._current
        if call is None:
            return
        out.append(ToolCallArgsDelta(call.index, "}" if self._arg_count else "{}"))
        self.calls.append(call)
        self._current = None
        self._raw = ""

    def _emit_json_call(self, out: list[ToolEvent], body: str) -> bool:
        try:
            obj = json.loads(body.strip())
        except ValueError:
            return False
        items = obj if isinstance(obj, list) else [obj]
        parsed: list[tuple[str, Any]] = []
        for item in items:
            if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) or not item["name"]:
                return False
            args = item.get("arguments", item.get("parameters", {}))
            parsed.append((item["name"], args))
        for name, args in parsed:
            call = ToolCall(index=len(self.calls), id=self._new_id(), name=name,
                            arguments=coerce_arguments(args, self._schemas.get(name)))
            out.append(ToolCallStart(call.index, call.id, call.name))
            out.append(ToolCallArgsDelta(call.index, call.arguments_json()))
            self.calls.append(call)
        self._raw = ""
        return True


def parse_tool_calls(text: str, tools: Iterable[Mapping[str, Any]] | None = None, *,
                     id_factory: Callable[[], str] = new_call_id) -> tuple[str, list[ToolCall]]:
    """Parse a complete assistant content text: (content without call markup, calls)."""
    parser = ToolCallParser(tools, id_factory=id_factory)
    events = parser.feed(text) + parser.finish()
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    return content, parser.calls
