"""The reasoning splitter and the combined chat output (no model, no server)."""
from __future__ import annotations

import random

import pytest

from lucebox.chat_output import ChatOutput, finish_reason_for
from lucebox.reasoning import ReasoningSplitter, prompt_opens_reasoning


def split(text: str, in_reasoning: bool, sizes=(10_000,)) -> tuple[str, str]:
    s = ReasoningSplitter(in_reasoning)
    pieces = []
    i = 0
    k = 0
    while i < len(text):
        n = sizes[k % len(sizes)]
        pieces += s.feed(text[i:i + n])
        i += n
        k += 1
    pieces += s.finish()
    reasoning = "".join(t for kind, t in pieces if kind == "reasoning")
    content = "".join(t for kind, t in pieces if kind == "content")
    return reasoning, content


@pytest.mark.parametrize("sizes", [(10_000,), (1,), (2,), (3,), (1, 4, 2)])
def test_template_opened_block(sizes):
    assert split("Let me think.\nStep 2.\n</think>\n\nThe answer is 4.", True, sizes) == \
        ("Let me think.\nStep 2.", "The answer is 4.")


@pytest.mark.parametrize("sizes", [(10_000,), (1,), (3,)])
def test_model_opened_block(sizes):
    assert split("\n<think>\nhmm\n</think>\n\nHi!", False, sizes) == ("hmm", "Hi!")


def test_no_reasoning():
    assert split("Hello <b>world</b>", False) == ("", "Hello <b>world</b>")


def test_think_tag_after_content_is_content():
    assert split("Answer first <think>not reasoning</think>", False) == \
        ("", "Answer first <think>not reasoning</think>")


def test_unclosed_reasoning_stays_reasoning():
    assert split("thinking forever...\n", True) == ("thinking forever...", "")


def test_empty_think_block():
    assert split("<think>\n\n</think>\n\nHi", False) == ("", "Hi")
    assert split("\n\n</think>\n\nHi", True) == ("", "Hi")


def test_inner_whitespace_kept():
    assert split("a\n\n  b\n</think>\nc\n\nd\n", True) == ("a\n\n  b", "c\n\nd\n")


def test_random_splits_agree():
    rng = random.Random(3)
    text = "  step one <b>\n\nstep two </thi nk\n</think>\n\nfinal <think> answer\n"
    whole = split(text, True)
    for _ in range(50):
        assert split(text, True, tuple(rng.randint(1, 5) for _ in range(6))) == whole


def test_prompt_opens_reasoning():
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")


def test_chat_output_reasoning_then_tool_call():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}}}}]
    out = ChatOutput(think_open=True, tools=tools)
    text = ("I should call f.\n</think>\n\nSure.\n<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n"
            "</function>\n</tool_call>")
    deltas = []
    for ch in text:
        deltas += out.feed(ch)
    deltas += out.finish()
    assert out.reasoning == "I should call f."
    assert out.content == "Sure."
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("f", {"n": 3})]
    kinds = [d.kind for d in deltas]
    assert kinds.index("tool_start") > max(i for i, k in enumerate(kinds) if k == "reasoning")
    assert all("<" not in d.text for d in deltas if d.kind in ("content", "reasoning"))
    assert finish_reason_for("stop", True) == "tool_calls"
    assert finish_reason_for("length", True) == "length"
    assert finish_reason_for("stop", False) == "stop"


def test_tool_call_inside_reasoning_is_not_parsed():
    tools = [{"type": "function", "function": {"name": "f"}}]
    out = ChatOutput(think_open=True, tools=tools)
    out.feed("maybe <tool_call>\n<function=f>\n</function>\n</tool_call>\n</think>\nno call")
    out.finish()
    assert out.tool_calls == []
    assert "<tool_call>" in out.reasoning and out.content == "no call"


def test_without_tools_markup_stays_content():
    out = ChatOutput(think_open=False, tools=None)
    out.feed("<tool_call>\n<function=f>\n</function>\n</tool_call>")
    out.finish()
    assert out.tool_calls == [] and out.content.startswith("<tool_call>")
