"""Tests for lucebox.chat_template: the default ChatML template and the sandboxed renderer."""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path
from typing import Any

import pytest

from lucebox.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplate, normalize_messages
from lucebox.tokenizer import Tokenizer
from lucebox.vocab import synthetic_vocab
from vocab_files import write_vocab_gguf

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo for one city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

TOOLS_BLOCK = (
    "# Tools\n\n"
    "You can call the functions below. Each is described by a JSON signature, all of them "
    "inside <tools></tools>:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Météo for one '
    'city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, '
    '"required": ["city"]}}}\n'
    "</tools>\n\n"
    "To call a function, answer with a JSON object that gives its name and its arguments, "
    "inside <tool_call></tool_call> tags:\n"
    "<tool_call>\n"
    '{"name": <function name>, "arguments": <arguments as a JSON object>}\n'
    "</tool_call>"
)

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What's the weather in Lisbon?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "The user wants the weather. I should call get_weather.\n",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21.5}'},
]

EXPECTED = (
    "<|im_start|>system\nYou are a concise assistant.\n\n" + TOOLS_BLOCK + "<|im_end|>\n"
    "<|im_start|>user\nWhat's the weather in Lisbon?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<think>\nThe user wants the weather. I should call get_weather.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n</tool_call>'
    "<|im_end|>\n"
    '<|im_start|>user\n<tool_response>\n{"temperature": 21.5}\n</tool_response><|im_end|>\n'
    "<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def tpl() -> ChatTemplate:
    return ChatTemplate(DEFAULT_CHAT_TEMPLATE)


def test_full_conversation_renders_exactly(tpl: ChatTemplate) -> None:
    assert tpl.render(CONVERSATION, tools=[WEATHER_TOOL]) == EXPECTED


def test_enable_thinking_false_adds_empty_think_block(tpl: ChatTemplate) -> None:
    assert tpl.render(CONVERSATION, tools=[WEATHER_TOOL], enable_thinking=False) == (
        EXPECTED + "<think>\n\n</think>\n\n"
    )
    assert tpl.render(CONVERSATION, tools=[WEATHER_TOOL], enable_thinking=True) == EXPECTED


def test_simple_chat_without_tools(tpl: ChatTemplate) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": [{"type": "text", "text": "Part one."},
                                     {"type": "text", "text": "Part two."}]},
    ]
    assert tpl.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nPart one.\nPart two.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tpl.render(messages[1:2], add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n"
    )


def test_tools_without_system_message(tpl: ChatTemplate) -> None:
    out = tpl.render([{"role": "user", "content": "x"}], tools=[WEATHER_TOOL])
    assert out.startswith("<|im_start|>system\n" + TOOLS_BLOCK + "<|im_end|>\n")
    assert tpl.render([{"role": "user", "content": "x"}], tools=[]) == (
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tool_calls_with_content_dict_arguments_and_grouped_results(tpl: ChatTemplate) -> None:
    messages = [
        {"role": "user", "content": "Two cities"},
        {
            "role": "assistant",
            "content": "Checking both.",
            "tool_calls": [
                {"name": "get_weather", "arguments": {"city": "Porto"}},
                {"function": {"name": "get_weather", "arguments": {"city": "Faro"}}},
            ],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "windy"},
        {"role": "assistant", "content": "Sunny in Porto, windy in Faro."},
    ]
    assert tpl.render(messages, add_generation_prompt=False) == (
        "<|im_start|>user\nTwo cities<|im_end|>\n"
        "<|im_start|>assistant\nChecking both.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Porto"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Faro"}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nwindy\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nSunny in Porto, windy in Faro.<|im_end|>\n"
    )


def test_rendered_prompt_tokenizes_with_single_special_ids(tpl: ChatTemplate) -> None:
    tok = Tokenizer.from_vocab(synthetic_vocab(4096))
    ids = tok.encode(tpl.render(CONVERSATION, tools=[WEATHER_TOOL], enable_thinking=False))
    assert ids.count(tok.token_to_id("<|im_start|>")) == 5
    assert ids.count(tok.token_to_id("<|im_end|>")) == 4
    # Twice in the instruction (the tag pair and the example), once in the call itself.
    assert ids.count(tok.token_to_id("<tool_call>")) == 3
    assert ids.count(tok.token_to_id("<think>")) == 2


@pytest.mark.parametrize(
    "messages, problem",
    [
        ("hello", "messages must be a list"),
        ([["user", "hi"]], r"messages\[0\] must be a dict"),
        ([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}],
         r"messages\[1\] has role 'robot'"),
        ([{"content": "no role"}], r"messages\[0\] has role None"),
        ([{"role": "user", "content": 42}], r"messages\[0\]\.content must be a string"),
        ([{"role": "user"}], r"messages\[0\] \(user\) has no content"),
        ([{"role": "user", "content": None}], r"messages\[0\]\.content must be a string"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
         r"messages\[0\]\.content\[0\] has type 'image_url'"),
        ([{"role": "user", "content": [{"type": "text", "text": 3}]}],
         r"messages\[0\]\.content\[0\]\.text must be a string"),
        ([{"role": "user", "content": "x", "tool_calls": [{"name": "f"}]}],
         r"messages\[0\]: only assistant messages may have tool_calls"),
        ([{"role": "assistant", "content": "", "tool_calls": {"name": "f"}}],
         r"messages\[0\]\.tool_calls must be a list"),
        ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}],
         r"messages\[0\]\.tool_calls\[0\] has no function name"),
        ([{"role": "assistant", "content": "", "reasoning_content": 1}],
         r"messages\[0\]\.reasoning_content must be a string"),
    ],
)
def test_bad_messages_raise(tpl: ChatTemplate, messages: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        tpl.render(messages)


def test_bad_tools_raise(tpl: ChatTemplate) -> None:
    with pytest.raises(ValueError, match=r"tools\[1\] must be a dict"):
        tpl.render([{"role": "user", "content": "x"}], tools=[WEATHER_TOOL, "nope"])


def test_normalize_messages_does_not_mutate_input() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}]}]
    out = normalize_messages(messages)
    assert out == [{"role": "user", "content": "a"}]
    assert messages == [{"role": "user", "content": [{"type": "text", "text": "a"}]}]


def test_syntax_error_names_the_line() -> None:
    with pytest.raises(ValueError, match="line 3"):
        ChatTemplate("ok\n{{ fine }}\n{% if %}\n")


def test_template_helpers_and_sandbox() -> None:
    tpl = ChatTemplate(
        "{{ strftime_now('%Y') }}|{{ {'k': 'ü<&>'} | tojson }}|{{ extra_var }}"
        "{% if messages | length > 1 %}{{ raise_exception('only one message please') }}{% endif %}"
    )
    one = [{"role": "user", "content": "x"}]
    year = str(datetime.datetime.now().year)
    assert tpl.render(one, extra_var="E") == year + '|{"k": "ü<&>"}|E'
    with pytest.raises(ValueError, match="only one message please"):
        tpl.render(one * 2)
    unsafe = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ValueError, match="chat template error"):
        unsafe.render(one)
    immutable = ChatTemplate("{{ messages.append(1) }}")
    with pytest.raises(ValueError, match="chat template error"):
        immutable.render(one)


def _write(path: Path, chat_template: str | None) -> Path:
    vocab = dataclasses.replace(synthetic_vocab(1000), chat_template=chat_template)
    return write_vocab_gguf(path, vocab)


def test_from_gguf_uses_file_template_or_default(tmp_path: Path) -> None:
    custom = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
    from_file = ChatTemplate.from_gguf(_write(tmp_path / "a.gguf", custom))
    assert from_file.source == custom
    assert from_file.render([{"role": "user", "content": "hi"}]) == "[user:hi]"
    fallback = ChatTemplate.from_gguf(_write(tmp_path / "b.gguf", None))
    assert fallback.source == DEFAULT_CHAT_TEMPLATE
