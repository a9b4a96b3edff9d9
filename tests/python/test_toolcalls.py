"""The tool-call parser on crafted model outputs (no model, no server)."""
from __future__ import annotations

import itertools
import json
import random

import pytest

from lucebox.toolcalls import (
    TextDelta,
    ToolCallArgsDelta,
    ToolCallParser,
    ToolCallStart,
    coerce_arguments,
    coerce_value,
    forced_call_prefix,
    parse_tool_calls,
    template_tool_format,
)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "threshold": {"type": "number"},
        "hours": {"type": "array", "items": {"type": "integer"}},
        "options": {"type": "object"},
        "note": {"type": ["string", "null"]},
        "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "unit": {"enum": ["c", "f"]},
        "zip": {"type": "string"},
    }}}},
    {"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
        "cmd": {"type": "string"}, "timeout": {"type": "number"}}}}},
]

XML_ONE = """<tool_call>
<function=get_weather>
<parameter=city>
Paris
</parameter>
<parameter=days>
3
</parameter>
</function>
</tool_call>"""


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def run_stream(text: str, pieces: list[int] | None = None, tools=TOOLS):
    """Feed `text` split at the given sizes; return (events, parser)."""
    p = ToolCallParser(tools, id_factory=ids())
    events = []
    i = 0
    sizes = pieces or [len(text)]
    for n in itertools.cycle(sizes):
        if i >= len(text):
            break
        events += p.feed(text[i:i + n])
        i += n
    events += p.finish()
    return events, p


def content_of(events) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def args_text(events, index: int) -> str:
    return "".join(e.text for e in events if isinstance(e, ToolCallArgsDelta) and e.index == index)


# ---- XML form ------------------------------------------------------------------------------

def test_xml_single_call_typed():
    content, calls = parse_tool_calls(XML_ONE, TOOLS)
    assert content == ""
    assert len(calls) == 1
    assert calls[0].name == "get_weather"
    assert calls[0].arguments == {"city": "Paris", "days": 3}
    assert json.loads(calls[0].arguments_json()) == {"city": "Paris", "days": 3}


def test_xml_types_by_schema():
    text = """<tool_call>
<function=get_weather>
<parameter=city>
123
</parameter>
<parameter=days>
7
</parameter>
<parameter=metric>
False
</parameter>
<parameter=threshold>
2.5
</parameter>
<parameter=hours>
[1, 2, 3]
</parameter>
<parameter=options>
{"a": {"b": [true, null]}}
</parameter>
<parameter=note>
null
</parameter>
<parameter=limit>
10
</parameter>
<parameter=unit>
c
</parameter>
<parameter=zip>
00123
</parameter>
</function>
</tool_call>"""
    _, calls = parse_tool_calls(text, TOOLS)
    args = calls[0].arguments
    assert args == {"city": "123", "days": 7, "metric": False, "threshold": 2.5, "hours": [1, 2, 3],
                    "options": {"a": {"b": [True, None]}}, "note": None, "limit": 10, "unit": "c", "zip": "00123"}
    # strings stay strings (never double encoded), objects stay objects
    decoded = json.loads(calls[0].arguments_json())
    assert decoded["city"] == "123" and isinstance(decoded["options"], dict)


def test_xml_string_value_kept_verbatim():
    code = 'def f(x):\n    return "<b>" + x\n\n'
    text = f"<tool_call>\n<function=run>\n<parameter=cmd>\n{code}\n</parameter>\n</function>\n</tool_call>"
    _, calls = parse_tool_calls(text, TOOLS)
    assert calls[0].arguments["cmd"] == code


def test_xml_multiline_value_and_unicode():
    text = "<tool_call>\n<function=run>\n<parameter=cmd>\nécho 'héllo'\nls -la | grep ü\n</parameter>\n</function>\n</tool_call>"
    _, calls = parse_tool_calls(text, TOOLS)
    assert calls[0].arguments["cmd"] == "écho 'héllo'\nls -la | grep ü"
    assert "ü" in calls[0].arguments_json()  # not \\u escaped


def test_xml_parallel_calls_and_content_before():
    text = "Let me check both.\n\n" + XML_ONE + "\n" + XML_ONE.replace("Paris", "Rome").replace("3", "5")
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == "Let me check both."
    assert [c.index for c in calls] == [0, 1]
    assert [c.arguments for c in calls] == [{"city": "Paris", "days": 3}, {"city": "Rome", "days": 5}]
    assert calls[0].id != calls[1].id


def test_xml_two_functions_in_one_block():
    text = ("<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n</function>\n"
            "<function=run>\n<parameter=cmd>\npwd\n</parameter>\n</function>\n</tool_call>")
    _, calls = parse_tool_calls(text, TOOLS)
    assert [c.arguments["cmd"] for c in calls] == ["ls", "pwd"]


def test_xml_bare_function_without_wrapper():
    text = "<function=run>\n<parameter=cmd>\nls\n</parameter>\n</function>"
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == "" and calls[0].arguments == {"cmd": "ls"}


def test_xml_missing_parameter_close_tag():
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n4\n</function>\n</tool_call>"
    _, calls = parse_tool_calls(text, TOOLS)
    assert calls[0].arguments == {"city": "Paris", "days": 4}


def test_xml_no_parameters():
    _, calls = parse_tool_calls("<tool_call>\n<function=run>\n</function>\n</tool_call>", TOOLS)
    assert calls[0].arguments == {} and calls[0].arguments_json() == "{}"


def test_xml_truncated_call_is_closed_at_finish():
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n1"
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == ""
    assert calls[0].arguments == {"city": "Paris", "days": 1}


def test_xml_stop_string_cut_the_closing_tag():
    # generation stopped on "</tool_call>" (a stop string): the close never reaches the parser
    _, calls = parse_tool_calls(XML_ONE[: -len("</tool_call>")], TOOLS)
    assert calls[0].arguments == {"city": "Paris", "days": 3}


def test_unknown_tool_and_parameter_without_schema_are_guessed():
    text = "<tool_call>\n<function=other>\n<parameter=n>\n5\n</parameter>\n<parameter=s>\nhello\n</parameter>\n</function>\n</tool_call>"
    _, calls = parse_tool_calls(text, TOOLS)
    assert calls[0].name == "other" and calls[0].arguments == {"n": 5, "s": "hello"}


def test_duplicate_parameter_keeps_first_and_json_stays_consistent():
    text = "<tool_call>\n<function=run>\n<parameter=cmd>\na\n</parameter>\n<parameter=cmd>\nb\n</parameter>\n</function>\n</tool_call>"
    events, p = run_stream(text)
    assert p.calls[0].arguments == {"cmd": "a"}
    assert json.loads(args_text(events, 0)) == {"cmd": "a"}


# ---- JSON form -----------------------------------------------------------------------------

def test_json_form():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": "2", "metric": "true"}}\n</tool_call>'
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == ""
    assert calls[0].arguments == {"city": "Oslo", "days": 2, "metric": True}


def test_json_form_double_encoded_arguments_are_decoded():
    inner = json.dumps({"city": "Oslo", "hours": [1, 2]})
    text = '<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(inner) + '}\n</tool_call>'
    _, calls = parse_tool_calls(text, TOOLS)
    assert calls[0].arguments == {"city": "Oslo", "hours": [1, 2]}
    assert json.loads(calls[0].arguments_json())["hours"] == [1, 2]


def test_json_form_non_string_for_string_parameter_becomes_text():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": 42, "zip": 12345}}\n</tool_call>'
    _, calls = parse_tool_calls(text, TOOLS)
    assert calls[0].arguments == {"city": "42", "zip": "12345"}


def test_json_form_parallel_and_parameters_alias():
    text = ('<tool_call>\n{"name": "run", "arguments": {"cmd": "ls"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "run", "parameters": {"cmd": "pwd", "timeout": "1.5"}}\n</tool_call>')
    _, calls = parse_tool_calls(text, TOOLS)
    assert [c.arguments for c in calls] == [{"cmd": "ls"}, {"cmd": "pwd", "timeout": 1.5}]


def test_json_form_invalid_json_is_given_back_as_content():
    text = 'Hi <tool_call>\n{"name": "run", "arguments": {oops}\n</tool_call> bye'
    content, calls = parse_tool_calls(text, TOOLS)
    assert calls == []
    assert content == text


def test_json_form_truncated_without_close_tag():
    _, calls = parse_tool_calls('<tool_call>\n{"name": "run", "arguments": {"cmd": "ls"}}', TOOLS)
    assert calls[0].arguments == {"cmd": "ls"}


# ---- prose that looks like markup ----------------------------------------------------------

def test_plain_text_untouched():
    text = "if a < b and c > d: print('<tool')  # <func"
    content, calls = parse_tool_calls(text, TOOLS)
    assert calls == [] and content == text


def test_function_tag_in_prose_without_name_is_content():
    text = "use <function=> tags\nlike this"
    content, calls = parse_tool_calls(text, TOOLS)
    assert calls == [] and content == text


def test_garbage_inside_tool_call_is_given_back():
    text = "<tool_call>\nnot a call\n</tool_call>"
    content, calls = parse_tool_calls(text, TOOLS)
    assert calls == [] and content == text


def test_unclosed_garbage_block_is_given_back_at_finish():
    text = "<tool_call>\nnothing here"
    content, calls = parse_tool_calls(text, TOOLS)
    assert calls == [] and content == text


def test_content_after_calls():
    content, calls = parse_tool_calls(XML_ONE + "\n\nDone.", TOOLS)
    assert len(calls) == 1 and content == "Done."


def test_trailing_whitespace_kept_without_calls():
    content, _ = parse_tool_calls("Hello\n", TOOLS)
    assert content == "Hello\n"


# ---- streaming -----------------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13, 1000])
def test_streaming_equals_whole_and_never_leaks_markup(size):
    text = "Checking.\n" + XML_ONE + "\n" + XML_ONE.replace("Paris", "Lyon") + "\nok"
    events, p = run_stream(text, [size])
    content = content_of(events)
    assert content == "Checking.ok" or content == "Checking.\nok" or content == "Checking.ok"
    for e in events:
        if isinstance(e, TextDelta):
            assert "<tool_call" not in e.text and "<function" not in e.text and "<parameter" not in e.text
    assert [c.arguments for c in p.calls] == [{"city": "Paris", "days": 3}, {"city": "Lyon", "days": 3}]
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [(s.index, s.name) for s in starts] == [(0, "get_weather"), (1, "get_weather")]
    for i in (0, 1):
        assert json.loads(args_text(events, i)) == p.calls[i].arguments
        assert args_text(events, i) == p.calls[i].arguments_json()


def test_streaming_random_splits_agree_with_whole_parse():
    rng = random.Random(7)
    texts = [
        XML_ONE,
        "pre " + XML_ONE + " post",
        '<tool_call>\n{"name": "run", "arguments": {"cmd": "ls -l"}}\n</tool_call>',
        "a <tool_c b <function= c <tool_call>\njunk\n</tool_call>",
        "<tool_call>\n<function=run>\n<parameter=cmd>\necho </param\n</parameter>\n</function>\n</tool_call>",
    ]
    for text in texts:
        whole_content, whole_calls = parse_tool_calls(text, TOOLS, id_factory=ids())
        for _ in range(30):
            sizes = [rng.randint(1, 6) for _ in range(8)]
            events, p = run_stream(text, sizes)
            assert content_of(events) == whole_content
            assert [(c.name, c.arguments) for c in p.calls] == [(c.name, c.arguments) for c in whole_calls]


def test_name_is_announced_before_arguments_complete():
    p = ToolCallParser(TOOLS, id_factory=ids())
    ev = p.feed("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar")
    assert [type(e) for e in ev] == [ToolCallStart]
    ev = p.feed("is\n</parameter>\n")
    assert [e.text for e in ev] == ['{"city": "Paris"']
    ev = p.feed("</function>\n</tool_call>")
    assert [e.text for e in ev] == ["}"]


def test_held_back_marker_prefix_released_when_not_a_marker():
    p = ToolCallParser(TOOLS)
    assert content_of(p.feed("x <tool")) == "x"
    assert content_of(p.feed("box")) == " <toolbox"


# ---- coercion helpers ----------------------------------------------------------------------

@pytest.mark.parametrize("text,schema,expected", [
    ("5", {"type": "integer"}, 5),
    ("5.0", {"type": "integer"}, 5),
    ("5.5", {"type": "integer"}, "5.5"),
    ("-3", {"type": "number"}, -3),
    ("1e3", {"type": "number"}, 1000.0),
    ("nan", {"type": "number"}, "nan"),
    ("TRUE", {"type": "boolean"}, True),
    ("yes", {"type": "boolean"}, "yes"),
    ("[1,2]", {"type": "array"}, [1, 2]),
    ("['a', 'b']", {"type": "array"}, ["a", "b"]),
    ("{'k': 1}", {"type": "object"}, {"k": 1}),
    ("not json", {"type": "object"}, "not json"),
    ("12", {"type": "string"}, "12"),
    ("null", {"type": ["integer", "null"]}, None),
    ("7", {"anyOf": [{"type": "string"}, {"type": "integer"}]}, 7),
    ("x", {"anyOf": [{"type": "string"}, {"type": "integer"}]}, "x"),
    ("2", {"enum": [1, 2, 3]}, 2),
    ("{\"a\": 1}", {}, {"a": 1}),
    ("hello", None, "hello"),
    (" 42 ", {"type": "integer"}, 42),
])
def test_coerce_value(text, schema, expected):
    assert coerce_value(text, schema) == expected


def test_coerce_arguments_garbage_is_empty_object():
    assert coerce_arguments("not json", {}) == {}
    assert coerce_arguments([1, 2], {}) == {}
    assert coerce_arguments("", {}) == {}


def test_template_format_and_prefixes():
    assert template_tool_format("... <function=example> ...") == "xml"
    assert template_tool_format('{"name": <function name>}') == "json"
    assert forced_call_prefix("xml", "run") == "<tool_call>\n<function=run>\n"
    assert forced_call_prefix("xml", None) == "<tool_call>\n<function="
    assert forced_call_prefix("json", "run") == '<tool_call>\n{"name": "run", "arguments": '
    # a forced prefix followed by what the model writes parses as one call
    _, calls = parse_tool_calls(forced_call_prefix("xml", "run") + "<parameter=cmd>\nls\n</parameter>\n</function>",
                                TOOLS)
    assert calls[0].name == "run" and calls[0].arguments == {"cmd": "ls"}
    _, calls = parse_tool_calls(forced_call_prefix("json", "run") + '{"cmd": "ls"}}\n</tool_call>', TOOLS)
    assert calls[0].name == "run" and calls[0].arguments == {"cmd": "ls"}
    # a forced XML prefix followed by noise (a model that does not know the format) is still a call
    _, calls = parse_tool_calls(forced_call_prefix("xml", "run") + "blah blah", TOOLS)
    assert calls[0].name == "run" and calls[0].arguments == {}
