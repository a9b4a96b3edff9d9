"""The real server process driven by the official `openai` client: chat, completions, models,
health and metrics on the tiny synthetic model (random weights: the text is noise, the
protocol is what is tested)."""
from __future__ import annotations

import json

import httpx
import pytest

MSG = [{"role": "user", "content": "Hello there"}]


def test_health(server):
    body = httpx.get(server.base_url + "/health").json()
    assert body["status"] == "ok"
    assert body["model"] == "tiny"
    assert body["slots"] == 2 and body["slots_active"] == 0


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].owned_by == "lucebox"
    assert client.models.retrieve("tiny").id == "tiny"


def test_chat_non_stream(client):
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=12, temperature=0)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == "tiny"
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("length", "stop")
    assert r.usage.prompt_tokens > 0
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 12 and choice.message.content


def test_chat_greedy_is_deterministic_and_stream_matches(client):
    a = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=16, temperature=0)
    b = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=16, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    stream = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == a.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [a.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == a.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_usage_has_done_marker(server):
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json={
            "messages": MSG, "max_tokens": 4, "temperature": 0, "stream": True}, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    payloads = [json.loads(line[6:]) for line in lines[:-1]]
    assert all("usage" not in p for p in payloads)


def test_stop_sequence(client):
    full = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=40, temperature=0)
    text = full.choices[0].message.content
    # a 3-character stop string first occurring well inside the text
    for start in range(8, len(text) - 3):
        stop = text[start:start + 3]
        if text.find(stop) == start and stop.strip():
            break
    else:
        pytest.skip("greedy output too short to pick a stop string")
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=40, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[:start].lstrip()
    chunks = list(client.chat.completions.create(model="tiny", messages=MSG, max_tokens=40, temperature=0,
                                                 stop=stop, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == r.choices[0].message.content
    assert stop not in streamed


def test_n_choices_and_max_tokens(client):
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=5, temperature=0.9, seed=1, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens <= 15
    chunks = list(client.chat.completions.create(model="tiny", messages=MSG, max_tokens=5, temperature=0.9,
                                                 seed=1, n=2, stream=True))
    indexes = {c.choices[0].index for c in chunks if c.choices}
    assert indexes == {0, 1}
    assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason) == 2


def test_seeded_sampling_is_reproducible(client):
    kw = dict(model="tiny", messages=MSG, max_tokens=10, temperature=1.0, top_p=0.9, seed=1234,
              extra_body={"top_k": 50})
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_max_tokens_defaults_to_rest_of_context(client):
    # no max_tokens: the reply may use the whole remaining context; it ends by EOS or context
    r = client.chat.completions.create(model="tiny", messages=MSG, temperature=1.0, seed=3,
                                       extra_body={"top_k": 1})
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.total_tokens <= 1024


def test_max_tokens_capped_by_context(client):
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=100_000, temperature=0)
    assert r.usage.total_tokens <= 1024


def test_chat_template_kwargs_and_content_parts(client):
    r = client.chat.completions.create(
        model="tiny", max_tokens=4, temperature=0,
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "again"}]},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "42"}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].finish_reason in ("length", "stop")


def test_completions(client):
    r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason in ("length", "stop") and r.usage.completion_tokens <= 8
    chunks = list(client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=8, temperature=0,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    by_ids = client.completions.create(model="tiny", prompt=[10, 20, 30, 40], max_tokens=3, temperature=0)
    assert by_ids.usage.prompt_tokens == 4
    two = client.completions.create(model="tiny", prompt=["a", "b"], max_tokens=2, temperature=0)
    assert [c.index for c in two.choices] == [0, 1]


def test_metrics(server, client):
    client.chat.completions.create(model="tiny", messages=MSG, max_tokens=3, temperature=0)
    text = httpx.get(server.base_url + "/metrics").text
    for name in ("lucebox_requests_total", "lucebox_prompt_tokens_total", "lucebox_completion_tokens_total",
                 "lucebox_decode_tokens_per_second", "lucebox_spec_acceptance_length", "lucebox_queue_depth",
                 "lucebox_slots_active", "lucebox_errors_total", "lucebox_requests_cancelled_total"):
        assert f"# TYPE {name} " in text, name
    assert 'lucebox_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["lucebox_completion_tokens_total"] >= 3
    # the draft is loaded: speculative steps are counted (acceptance of a random draft is ~1)
    assert values["lucebox_spec_steps_total"] > 0
    assert values["lucebox_spec_acceptance_length"] >= 1.0


def test_unknown_fields_are_ignored(server):
    r = httpx.post(server.base_url + "/v1/chat/completions", json={
        "messages": MSG, "max_tokens": 2, "temperature": 0, "some_vendor_field": {"x": 1}, "user": "u"})
    assert r.status_code == 200


def test_json_body_without_json_content_type(server):
    """`curl -d` sends form encoding by default; the body is still read as JSON."""
    r = httpx.post(server.base_url + "/v1/chat/completions",
                   content=json.dumps({"messages": MSG, "max_tokens": 2, "temperature": 0}),
                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"


def test_tokenize_and_detokenize(server, client):
    """/tokenize counts what the generation endpoints see: a text as /v1/completions parses it,
    messages as /v1/chat/completions renders them (its usage.prompt_tokens); /detokenize inverts."""
    text = "def add(a, b):\n    return a + b"
    r = httpx.post(server.base_url + "/tokenize", json={"prompt": text}, timeout=30).json()
    assert r["count"] == len(r["tokens"]) > 0 and r["max_model_len"] == 1024
    assert httpx.post(server.base_url + "/tokenize", json={"content": text}, timeout=30).json()["tokens"] == r["tokens"]
    back = httpx.post(server.base_url + "/detokenize", json={"tokens": r["tokens"]}, timeout=30).json()
    assert back["prompt"] == back["content"] == text
    comp = client.completions.create(model="tiny", prompt=text, max_tokens=1, temperature=0)
    assert comp.usage.prompt_tokens == r["count"]
    chat = httpx.post(server.base_url + "/tokenize", json={"messages": MSG}, timeout=30).json()
    r2 = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=1, temperature=0)
    assert chat["count"] == r2.usage.prompt_tokens
    for path, body, param in (("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": "a", "messages": MSG}, "prompt"),
                              ("/detokenize", {"tokens": [10**8]}, "tokens"), ("/detokenize", {}, "tokens")):
        bad = httpx.post(server.base_url + path, json=body, timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, (path, body, bad.text)


def test_predicted_outputs(client):
    """OpenAI's predicted outputs: the prediction is a source of speculative proposals, so the answer
    is the one without it; usage reports its tokens accepted and rejected; streaming too; a
    malformed prediction is a 400 naming it."""
    import httpx

    kw = dict(model="tiny", messages=[{"role": "user", "content": "Write it again"}], max_tokens=60, temperature=0)
    plain = client.chat.completions.create(**kw)
    text = plain.choices[0].message.content
    assert plain.usage.completion_tokens_details is None or not plain.usage.completion_tokens_details.accepted_prediction_tokens
    for prediction in (text, [{"type": "text", "text": text[:20]}, {"type": "text", "text": text[20:]}],
                       text[:30] + " an edit " + text[30:]):
        got = client.chat.completions.create(**kw, prediction={"type": "content", "content": prediction})
        assert got.choices[0].message.content == text
        details = got.usage.completion_tokens_details
        assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens >= 0
    def predicted_total() -> float:
        page = httpx.get(str(client.base_url).removesuffix("v1/") + "metrics", timeout=60).text
        return float(next(line.split()[-1] for line in page.splitlines()
                          if line.startswith("lucebox_predicted_accepted_tokens_total")))

    before = predicted_total()
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True},
                                                 prediction={"type": "content", "content": text}))
    assert predicted_total() >= before + chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens > 0
    for content in (5, "word " * 5000):  # not text; longer than the context
        bad = httpx.post(str(client.base_url) + "chat/completions", timeout=60,
                         json={**kw, "prediction": {"type": "content", "content": content}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prediction", bad.text


def test_completions_suffix_fills_in_the_middle(tmp_path_factory):
    """Completions' suffix on a model whose vocabulary has fill-in-the-middle tokens: the prompt is
    <|fim_prefix|> prompt <|fim_suffix|> suffix <|fim_middle|> (the answer equals the engine's on
    that prompt); on the tiny model (no such tokens) and with echo, a 400 naming suffix."""
    import httpx

    import lucebox
    from lucebox import synth
    from server_helpers import ServerProcess

    d = tmp_path_factory.mktemp("fim")
    target = d / "fim.gguf"
    synth.write_target(target, "tiny", seed=0, overrides={"n_vocab": 2048})  # room for the FIM tokens
    engine = lucebox.Engine(target, ctx=512, device="cpu")
    tok = engine.tokenizer
    ids = [tok.token_to_id("<|fim_prefix|>"), *tok.encode("def add(a, b):\n", parse_special=False),
           tok.token_to_id("<|fim_suffix|>"), *tok.encode("\n\nprint(add(1, 2))\n", parse_special=False),
           tok.token_to_id("<|fim_middle|>")]
    assert tok.fill_in_the_middle("def add(a, b):\n", "\n\nprint(add(1, 2))\n") == ids
    want = engine.generate(ids, max_tokens=12).text
    srv = ServerProcess(["--model", str(target), "--ctx", "512", "--model-name", "fim"], d / "server.log")
    try:
        body = {"model": "fim", "prompt": "def add(a, b):\n", "suffix": "\n\nprint(add(1, 2))\n", "max_tokens": 12,
                "temperature": 0}
        r = httpx.post(srv.base_url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want
        assert r.json()["usage"]["prompt_tokens"] == len(ids)
        bad = httpx.post(srv.base_url + "/v1/completions", json={**body, "echo": True}, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "suffix"
    finally:
        srv.stop()


def test_suffix_without_fim_tokens_is_a_400(server):
    import httpx

    r = httpx.post(server.base_url + "/v1/completions", timeout=60,
                   json={"model": "tiny", "prompt": "a", "suffix": "b", "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    assert "fill-in-the-middle" in r.json()["error"]["message"]
    ok = httpx.post(server.base_url + "/v1/completions", timeout=60,
                    json={"model": "tiny", "prompt": "a", "suffix": "", "max_tokens": 4})  # "" is no suffix
    assert ok.status_code == 200, ok.text
