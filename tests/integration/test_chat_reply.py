"""Engine.generate on chat messages splits the reply: `result.message` holds the reasoning, the
content without tool-call markup and the tool calls with typed arguments (the same ChatOutput the
server's endpoints use). The tiny random model is steered by grammars (what it writes is decided
by the mask) and a bias on </think>."""
from __future__ import annotations

import pytest

import lucebox
from lucebox.chat_output import ChatMessage
from templates import thinking_template

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather forecast of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
# a call in the Qwen3.5 XML format without the <tool_call> wrapper (plain text for the tiny vocabulary)
CALL = "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>"
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def engine(pair: tuple[str, str]) -> lucebox.Engine:
    return lucebox.Engine(pair[0], ctx=1024, device="cpu")


def test_a_tool_call_is_parsed_with_typed_arguments(engine: lucebox.Engine) -> None:
    grammar = lucebox.Grammar.choice(["I will check. " + CALL])
    res = engine.generate(MESSAGES, tools=TOOLS, max_tokens=200, grammar=grammar)
    assert res.finish_reason == "stop", res.text
    assert res.text == "I will check. " + CALL
    msg = res.message
    assert isinstance(msg, ChatMessage)
    assert msg.content.strip() == "I will check."
    assert msg.reasoning == ""
    assert [(c.name, c.arguments) for c in msg.tool_calls] == [("get_weather", {"city": "Paris", "days": 3})]
    turn = msg.to_dict()
    assert turn["role"] == "assistant" and turn["tool_calls"][0]["function"]["name"] == "get_weather"
    assert turn["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris", "days": 3}'
    # the reply goes back into the conversation: the next prompt renders the call and its result
    follow = MESSAGES + [turn, {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "sunny"}]
    text = engine.tokenizer.decode(engine.encode_prompt(follow, tools=TOOLS))
    assert '"name": "get_weather"' in text and "sunny" in text


def test_without_tools_the_markup_stays_content(engine: lucebox.Engine) -> None:
    res = engine.generate(MESSAGES, max_tokens=200, grammar=lucebox.Grammar.choice([CALL]))
    assert res.message is not None
    assert res.message.content == CALL and res.message.tool_calls == []


def test_text_and_id_prompts_have_no_message(engine: lucebox.Engine) -> None:
    assert engine.generate("Weather in Paris?", max_tokens=4).message is None
    assert engine.generate([1, 2, 3], max_tokens=4).message is None
    chunks = list(engine.generate("Weather", max_tokens=4, stream=True))
    assert all(c.message is None for c in chunks)


def test_reasoning_then_a_call_streamed_and_not(engine: lucebox.Engine) -> None:
    """A prompt that opens a think block: the model reasons (a bias on </think> closes it), then the
    grammar (applied after </think>) writes the call. Streamed, the last chunk carries the same
    message as the whole result."""
    thinking = lucebox.Engine(engine.model_path, ctx=1024, device="cpu")
    thinking.chat_template = thinking_template()
    close_id = thinking.tokenizer.encode("</think>", parse_special=True)
    assert len(close_id) == 1
    kwargs = dict(tools=TOOLS, max_tokens=300, grammar=lucebox.Grammar.choice([CALL]), temperature=1.0, seed=3,
                  logit_bias={close_id[0]: 4.0})
    res = thinking.generate(MESSAGES, **kwargs)
    assert res.finish_reason == "stop", res.text
    msg = res.message
    assert msg is not None and msg.reasoning.strip() != ""
    assert "</think>" not in msg.content and "</think>" not in msg.reasoning
    assert [(c.name, c.arguments) for c in msg.tool_calls] == [("get_weather", {"city": "Paris", "days": 3})]
    chunks = list(thinking.generate(MESSAGES, stream=True, **kwargs))
    assert [c.message for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    last = chunks[-1].message
    assert last is not None and "".join(c.text for c in chunks) == res.text
    assert (last.reasoning, last.content) == (msg.reasoning, msg.content)
    assert [(c.name, c.arguments) for c in last.tool_calls] == [(c.name, c.arguments) for c in msg.tool_calls]
