"""/v1/messages with the official `anthropic` client, /v1/responses with `openai`, and the chat
page (served, and streaming in headless Chromium when one is installed)."""
from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse

import httpx
import pytest

anthropic = pytest.importorskip("anthropic")

TOOLS = [{"name": "get_weather", "description": "Weather for a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}]


@pytest.fixture()
def aclient(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture()
def small_aclient(small_server):
    return anthropic.Anthropic(base_url=small_server.base_url, api_key="sekrit", max_retries=0, timeout=60)


def test_messages_non_stream(aclient):
    m = aclient.messages.create(model="tiny", max_tokens=10, system="Be brief.", extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": "Hello"}])
    assert m.type == "message" and m.role == "assistant" and m.model == "tiny"
    assert m.stop_reason in ("max_tokens", "end_turn")
    assert m.usage.input_tokens > 0 and 1 <= m.usage.output_tokens <= 10
    assert m.content and m.content[0].type == "text"


def test_messages_stream_matches(aclient):
    kw = dict(model="tiny", max_tokens=12, extra_body={"temperature": 0}, messages=[{"role": "user", "content": "Hello"}])
    whole = aclient.messages.create(**kw)
    with aclient.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_messages_stop_sequence(aclient):
    kw = dict(model="tiny", max_tokens=40, extra_body={"temperature": 0}, messages=[{"role": "user", "content": "Hello"}])
    text = aclient.messages.create(**kw).content[0].text
    stop = next((text[i:i + 3] for i in range(6, len(text) - 3)
                 if text.find(text[i:i + 3]) == i and text[i:i + 3].strip()), None)
    if stop is None:
        pytest.skip("output too short")
    m = aclient.messages.create(**kw, stop_sequences=[stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop


def test_messages_forced_tool_use_and_thinking(small_aclient):
    m = small_aclient.messages.create(
        model="tiny", max_tokens=30, extra_body={"temperature": 0}, tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"}, thinking={"type": "enabled", "budget_tokens": 4}, messages=[{"role": "user", "content": "Paris?"}])
    kinds = [b.type for b in m.content]
    assert "thinking" in kinds and "tool_use" in kinds
    tool = next(b for b in m.content if b.type == "tool_use")
    assert tool.name == "get_weather" and isinstance(tool.input, dict) and tool.id.startswith("toolu_")
    assert m.stop_reason in ("tool_use", "max_tokens")
    with small_aclient.messages.stream(
            model="tiny", max_tokens=30, extra_body={"temperature": 0}, tools=TOOLS,
            tool_choice={"type": "tool", "name": "get_weather"}, thinking={"type": "disabled"},
            messages=[{"role": "user", "content": "Paris?"}]) as stream:
        final = stream.get_final_message()
    tool = next(b for b in final.content if b.type == "tool_use")
    assert tool.name == "get_weather" and isinstance(tool.input, dict)


def test_messages_tool_history(small_aclient):
    m = small_aclient.messages.create(model="tiny", max_tokens=4, tools=TOOLS, messages=[
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}])
    assert m.usage.input_tokens > 0


def test_messages_errors_use_anthropic_body(server, aclient):
    r = httpx.post(server.base_url + "/v1/messages", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        aclient.messages.create(model="claude-opus", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    n = aclient.messages.count_tokens(model="tiny", messages=[{"role": "user", "content": "Hello"}])
    assert n.input_tokens > 0


def test_responses_non_stream_and_stream(client):
    r = client.responses.create(model="tiny", input="Hello", instructions="Be brief.", max_output_tokens=10,
                                temperature=0)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output[0].type == "message"
    text = r.output_text
    events = list(client.responses.create(model="tiny", input="Hello", instructions="Be brief.",
                                          max_output_tokens=10, temperature=0, stream=True))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] in ("response.completed", "response.incomplete")
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_forced_function_call(small_client):
    tools = [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["input_schema"]}]
    r = small_client.responses.create(model="tiny", input=[{"role": "user", "content": "Paris?"}], tools=tools,
                                      tool_choice={"type": "function", "name": "get_weather"},
                                      max_output_tokens=30, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and isinstance(json.loads(calls[0].arguments), dict)
    events = list(small_client.responses.create(
        model="tiny", tools=tools, tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=30,
        temperature=0, stream=True, input=[
            {"role": "user", "content": "Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"role": "user", "content": "And Rome?"}]))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert isinstance(json.loads(args), dict)


def test_responses_rejects_previous_response_id(client):
    import openai

    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny", input="x", previous_response_id="resp_123")


def test_responses_logprobs(client):
    """include message.output_text.logprobs (+ top_logprobs): chat-style entries on the output_text,
    the same streamed (on the text deltas and in the final response) as not; other includes are taken."""
    import openai

    kw = dict(model="tiny", input="Hello", max_output_tokens=8, temperature=0, top_logprobs=2,
              include=["message.output_text.logprobs"])
    r = client.responses.create(**kw)
    part = r.output[-1].content[0]
    assert len(part.logprobs) == r.usage.output_tokens
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in part.logprobs)
    events = list(client.responses.create(stream=True, **kw))
    final = [e for e in events if e.type in ("response.completed", "response.incomplete")][-1].response
    assert [e.model_dump() for e in final.output[-1].content[0].logprobs] == [e.model_dump() for e in part.logprobs]
    streamed = [x for e in events if e.type == "response.output_text.delta" for x in e.logprobs]
    assert 0 < len(streamed) <= len(part.logprobs)
    assert client.responses.create(model="tiny", input="x", max_output_tokens=2).output[-1].content[0].logprobs in (None, [])
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.responses.create(model="tiny", input="x", max_output_tokens=2, top_logprobs=21)
    r = client.responses.create(model="tiny", input="x", max_output_tokens=2, include=["reasoning.encrypted_content"])
    assert r.output


def test_responses_rejects_an_empty_input(client):
    import openai

    for kw in (dict(input=[]), dict(input=[{"type": "reasoning", "summary": []}])):
        with pytest.raises(openai.BadRequestError, match="input is empty"):
            client.responses.create(model="tiny", **kw)
    # instructions alone are something to answer
    assert client.responses.create(model="tiny", input=[], instructions="Say hi.", max_output_tokens=2).output


def test_chat_page_served(server):
    r = httpx.get(server.base_url + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'data-model="tiny"' in r.text and "/v1/chat/completions" in r.text


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class _DevTools:
    """Chrome DevTools Protocol over --remote-debugging-pipe (fd 3: commands in, fd 4: replies out)."""

    def __init__(self, binary: str, profile: str) -> None:
        import fcntl
        import os

        def high(fd: int) -> int:  # out of the way of 3 and 4, which the child's dup2 writes
            new = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
            os.close(fd)
            return new

        cmd_r, self._cmd_w = (high(fd) for fd in os.pipe())
        self._out_r, out_w = (high(fd) for fd in os.pipe())
        # the child sees cmd_r as fd 3 and out_w as fd 4
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(3, 4), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: (os.dup2(cmd_r, 3), os.dup2(out_w, 4)) and None)
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._id = 0

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        import os

        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._out_r, 65536)
                if not chunk:
                    raise RuntimeError("chromium closed the pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(reply["error"])
                return reply["result"]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.mark.skipif(_chromium() is None, reason="no Chromium installed")
def test_chat_page_streams_in_headless_chromium(server, tmp_path):
    """The page at / sends a message (?q=...), streams the answer from the API and shows it."""
    import time

    url = server.base_url + "/?" + urllib.parse.urlencode({"q": "Hello from the browser"})
    dt = _DevTools(_chromium(), str(tmp_path))
    try:
        target = dt.call("Target.createTarget", {"url": url})["targetId"]
        session = dt.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        deadline = time.monotonic() + 60
        state = None
        while time.monotonic() < deadline:
            state = dt.call("Runtime.evaluate", {"returnByValue": True, "expression": """(() => {
                const a = document.querySelector('.msg.assistant');
                return a ? {done: a.dataset.done === '1', error: a.classList.contains('error'),
                            user: document.querySelector('.msg.user').textContent,
                            stats: a.querySelector('.stats').textContent, text: a.textContent} : null;
            })()"""}, session)["result"].get("value")
            if state and (state["done"] or state["error"]):
                break
            time.sleep(0.2)
    finally:
        dt.close()
    assert state is not None, "the page did not send the message"
    assert not state["error"], state["text"]
    assert state["done"] and state["user"] == "Hello from the browser"
    assert "tokens in" in state["stats"]  # written from the usage chunk at the end of the stream
