"""Every error mapping of the HTTP API, on the real server process; it keeps serving after each."""
from __future__ import annotations

import concurrent.futures as cf

import httpx
import openai
import pytest

MSG = [{"role": "user", "content": "Hi"}]


def post(server, body, path="/v1/chat/completions", **kw):
    return httpx.post(server.base_url + path, timeout=30, **kw, **({"json": body} if not isinstance(body, bytes)
                                                                   else {"content": body}))


def assert_error(r: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    assert err["type"] == ("invalid_request_error" if status == 400 else err["type"])
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return err


def test_invalid_json(server):
    assert_error(post(server, b'{"messages": [', headers={"content-type": "application/json"}), 400,
                 code="invalid_json")


@pytest.mark.parametrize("path,body", [
    # inside free-form objects that the Responses API echoes (found by fuzz_server, case 49459: a 500)
    ("/v1/responses", b'{"input": "hi", "max_output_tokens": 4, "reasoning": {"effort": "low", "x": NaN}}'),
    ("/v1/responses", b'{"input": "hi", "max_output_tokens": 4, "tools": [{"type": "function", "name": "g", '
                      b'"parameters": {"type": "object", "properties": {"n": {"maximum": Infinity}}}}]}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "Hi"}], "metadata": {"x": -Infinity}}'),
    ("/v1/messages", b'{"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}], "metadata": {"x": NaN}}'),
])
def test_non_finite_json_constants_are_invalid_json(server, path, body):
    r = post(server, body, path=path, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    message = err["message"]
    assert "not valid JSON" in message and "not a JSON value" in message, message
    if path != "/v1/messages":
        assert err["code"] == "invalid_json"


@pytest.mark.parametrize("body,param", [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": MSG, "max_tokens": -5}, "max_tokens"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens"),
    ({"messages": MSG, "temperature": -0.5}, "temperature"),
    ({"messages": MSG, "top_p": 0}, "top_p"),
    ({"messages": MSG, "top_p": 1.5}, "top_p"),
    ({"messages": MSG, "presence_penalty": 3}, "presence_penalty"),
    ({"messages": MSG, "n": 0}, "n"),
    ({"messages": MSG, "n": 1000}, "n"),
    ({"messages": MSG, "stop": [""]}, "stop"),
    ({"messages": MSG, "stream": "maybe"}, "stream"),
    ({"messages": MSG, "tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": MSG, "logprobs": "yes"}, "logprobs"),
    ({"messages": MSG, "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"messages": MSG, "logit_bias": {"5": 200}}, "logit_bias"),
    ({"messages": MSG, "logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": MSG, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"messages": MSG, "response_format": {"type": "yaml"}}, "response_format"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
])
def test_invalid_fields(server, body, param):
    assert_error(post(server, body), 400, param=param)


def test_unknown_model(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="gpt-4o", messages=MSG, max_tokens=2)
    assert e.value.code == "model_not_found"


def test_context_overflow(server, client):
    long = "word " * 3000  # far more than the 1024-token context
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": long}], max_tokens=2)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=long, max_tokens=2)
    assert e.value.code == "context_length_exceeded"
    # streaming requests get the same status before any event
    assert_error(post(server, {"messages": [{"role": "user", "content": long}], "stream": True}), 400,
                 code="context_length_exceeded")


def test_tool_choice_errors(server):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert_error(post(server, {"messages": MSG, "tools": tools,
                               "tool_choice": {"type": "function", "function": {"name": "g"}}}), 400,
                 param="tool_choice")
    assert_error(post(server, {"messages": MSG, "tool_choice": "required"}), 400, param="tool_choice")


def test_completions_errors(server):
    assert_error(post(server, {"prompt": "x", "suffix": "y"}, "/v1/completions"), 400, param="suffix")
    assert_error(post(server, {"prompt": [5000000]}, "/v1/completions"), 400, param="prompt")
    assert_error(post(server, {"prompt": []}, "/v1/completions"), 400, param="prompt")
    assert_error(post(server, {}, "/v1/completions"), 400, param="prompt")


def test_not_found_and_method(server):
    assert_error(httpx.get(server.base_url + "/v1/nothing"), 404, code="not_found")
    assert_error(httpx.get(server.base_url + "/v1/chat/completions"), 405)
    assert_error(httpx.get(server.base_url + "/v1/models/other"), 404)


def test_server_alive_after_errors(server, client):
    assert server.alive()
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2, temperature=0)
    assert r.choices[0].message is not None


def test_api_key(small_server):
    r = httpx.post(small_server.base_url + "/v1/chat/completions", json={"messages": MSG, "max_tokens": 1})
    assert_error(r, 401, code="invalid_api_key")
    r = httpx.post(small_server.base_url + "/v1/chat/completions", json={"messages": MSG, "max_tokens": 1},
                   headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert httpx.get(small_server.base_url + "/health").status_code == 200  # open


def test_queue_full_429(small_server):
    """One slot and a queue of one: of 8 simultaneous long requests at least one gets 429 with
    Retry-After and the OpenAI error body; none gets a 5xx."""
    def one(i: int) -> tuple[int, dict, str | None]:
        with httpx.stream("POST", small_server.base_url + "/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": f"count {i}"}], "max_tokens": 200, "temperature": 0,
                "stream": True, "chat_template_kwargs": {"enable_thinking": False}},
                headers={"Authorization": "Bearer sekrit"}) as r:
            if r.status_code != 200:
                r.read()
                return r.status_code, r.json(), r.headers.get("retry-after")
            for _ in r.iter_lines():
                pass
            return 200, {}, None

    with cf.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    statuses = [s for s, _, _ in results]
    assert all(s in (200, 429) for s in statuses), statuses
    assert 429 in statuses and 200 in statuses
    for status, body, retry in results:
        if status == 429:
            assert body["error"]["code"] == "queue_full" and body["error"]["type"] == "rate_limit_error"
            assert retry is not None and int(retry) >= 1
    health = httpx.get(small_server.base_url + "/health").json()
    assert health["slots_active"] == 0 and health["queue_depth"] == 0
    metrics = httpx.get(small_server.base_url + "/metrics").text
    assert 'lucebox_requests_total{endpoint="/v1/chat/completions",status="429"}' in metrics
