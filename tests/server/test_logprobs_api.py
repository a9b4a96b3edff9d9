"""Token logprobs over the OpenAI API: chat (``logprobs`` + ``top_logprobs``) and completions
(``logprobs: N``), streamed and not, equal to what `lucebox.Engine.generate(logprobs=N)` reports for
the same tokens (whose values tests/integration/test_logprobs.py checks against the exact
log-softmax), in OpenAI's formats."""
from __future__ import annotations

import json
import math

import httpx
import pytest

import lucebox

MSG = [{"role": "user", "content": "Tell me something"}]
PROMPT = [5, 17, 300, 42, 8, 99, 1000, 3]


@pytest.fixture(scope="module")
def engine(tiny_models):
    return lucebox.Engine(tiny_models[0], ctx=1024, device="cpu")


def post(server, path: str, body: dict) -> dict:
    r = httpx.post(server.base_url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def stream(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", server.base_url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def token_text(engine, tid: int) -> str:
    return engine.tokenizer.token_bytes(tid).decode("utf-8", errors="replace")


@pytest.mark.parametrize("n_top", [0, 3])
def test_completions_logprobs_match_the_engine(server, engine, n_top):
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": n_top}
    got = post(server, "/v1/completions", body)["choices"][0]["logprobs"]
    ref = engine.generate(PROMPT, max_tokens=12, logprobs=n_top)
    assert got["tokens"] == [token_text(engine, t) for t in ref.tokens]
    assert len(got["token_logprobs"]) == len(ref.tokens)
    for g, r in zip(got["token_logprobs"], ref.logprobs):
        assert g == pytest.approx(r.logprob, abs=1e-5) and g <= 0
    for g, r in zip(got["top_logprobs"], ref.logprobs):
        assert g == pytest.approx({token_text(engine, t): v for t, v in r.top}, abs=1e-5)
        assert len(r.top) == n_top
    offsets = [0]
    for t in got["tokens"][:-1]:
        offsets.append(offsets[-1] + len(t))
    assert got["text_offset"] == offsets
    parts = stream(server, "/v1/completions", body)
    streamed = {k: [v for p in parts if p["choices"] and p["choices"][0]["logprobs"]
                    for v in p["choices"][0]["logprobs"][k]] for k in got}
    assert streamed == got


def test_chat_logprobs_with_the_openai_client(client, server):
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=16, temperature=0,
                                       logprobs=True, top_logprobs=4)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 4
        assert bytes(e.bytes).decode("utf-8", errors="replace") == e.token
        assert e.top_logprobs[0].logprob >= e.logprob - 1e-6  # the best alternative is at least as likely
        assert [a.logprob for a in e.top_logprobs] == sorted((a.logprob for a in e.top_logprobs), reverse=True)
        assert sum(math.exp(a.logprob) for a in e.top_logprobs) <= 1 + 1e-5
    assert r.choices[0].logprobs.refusal is None
    # greedy: the top alternative is the token itself
    assert all(e.top_logprobs[0].token == e.token for e in content)
    body = {"messages": MSG, "max_tokens": 16, "temperature": 0, "logprobs": True, "top_logprobs": 4}
    parts = stream(server, "/v1/chat/completions", body)
    streamed = [e for p in parts if p["choices"] and p["choices"][0]["logprobs"]
                for e in p["choices"][0]["logprobs"]["content"]]
    assert streamed == json.loads(r.model_dump_json())["choices"][0]["logprobs"]["content"]


def test_no_logprobs_unless_asked(client):
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=4, temperature=0)
    assert r.choices[0].logprobs is None
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=4, temperature=0, logprobs=False)
    assert r.choices[0].logprobs is None


@pytest.mark.parametrize("body", [{"logprobs": 21}, {"logprobs": -1}, {"logprobs": "3"}, {"logprobs": 2, "top_logprobs": 2}])
def test_completions_refuse_bad_logprobs(server, body):
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, **body}, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["param"] in ("logprobs", "top_logprobs")


@pytest.mark.parametrize("stream_it", [False, True])
def test_completions_echo_scores_the_prompt(server, engine, stream_it):
    """echo + logprobs, as evaluation harnesses send it: the prompt's text and tokens first, the
    first token unscored, the rest equal to Session.score, then the generated tokens."""
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logprobs": 2, "echo": True}
    if stream_it:
        parts = stream(server, "/v1/completions", body)
        text = "".join(p["choices"][0]["text"] for p in parts if p["choices"])
        got = {k: [v for p in parts if p["choices"] and p["choices"][0]["logprobs"]
                   for v in p["choices"][0]["logprobs"][k]] for k in ("tokens", "token_logprobs", "top_logprobs")}
    else:
        choice = post(server, "/v1/completions", body)["choices"][0]
        text, got = choice["text"], choice["logprobs"]
    prompt_text = engine.tokenizer.decode(PROMPT)
    gen = engine.generate(PROMPT, max_tokens=3)
    assert text == prompt_text + gen.text
    scored = engine.session().score(PROMPT, top_logprobs=2)
    assert got["tokens"] == [token_text(engine, t) for t in PROMPT + gen.tokens]
    assert got["token_logprobs"][0] is None and got["top_logprobs"][0] is None
    for g, e in zip(got["token_logprobs"][1:len(PROMPT)], scored):
        assert g == pytest.approx(e.logprob, abs=1e-5)
    for g, e in zip(got["top_logprobs"][1:len(PROMPT)], scored):
        assert g == pytest.approx({token_text(engine, t): v for t, v in e.top}, abs=1e-5)
    assert len(got["token_logprobs"]) == len(PROMPT) + 3


def test_completions_echo_without_logprobs(server, engine):
    choice = post(server, "/v1/completions", {"prompt": "def f(x):", "max_tokens": 4, "temperature": 0,
                                               "echo": True})["choices"][0]
    assert choice["text"].startswith("def f(x):") and choice["logprobs"] is None
    plain = post(server, "/v1/completions", {"prompt": "def f(x):", "max_tokens": 4, "temperature": 0})
    assert choice["text"] == "def f(x):" + plain["choices"][0]["text"]


def test_logit_bias_bans_the_greedy_tokens(server, engine):
    """OpenAI's logit_bias ({"token id": bias}): -100 bans; the answer is the engine's with the same bias."""
    plain = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 0})
    first = plain["choices"][0]["logprobs"]["tokens"][0]
    ref = engine.generate(PROMPT, max_tokens=6)
    assert first == token_text(engine, ref.tokens[0])
    bias = {str(ref.tokens[0]): -100, str(ref.tokens[1]): -100}
    got = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logit_bias": bias})
    want = engine.generate(PROMPT, max_tokens=6, logit_bias={ref.tokens[0]: -100.0, ref.tokens[1]: -100.0})
    assert got["choices"][0]["text"] == want.text and want.tokens[0] != ref.tokens[0]


def test_completions_best_of_returns_the_most_likely_candidates(server, engine):
    """best_of=3, n=2: three seeded candidates (seeds seed, seed+1, seed+2), the two of highest mean
    logprob per token returned, in that order; usage counts all three; best_of > n cannot stream."""
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 40, "best_of": 3, "n": 2}
    got = post(server, "/v1/completions", body)
    cands = [engine.generate(PROMPT, max_tokens=8, temperature=1.0, seed=40 + i, logprobs=0) for i in range(3)]
    mean = [sum(e.logprob for e in c.logprobs) / len(c.logprobs) for c in cands]
    order = sorted(range(3), key=lambda i: (-mean[i], i))[:2]
    assert [c["text"] for c in got["choices"]] == [cands[i].text for i in order]
    assert [c["index"] for c in got["choices"]] == [0, 1] and all(c["logprobs"] is None for c in got["choices"])
    assert got["usage"]["completion_tokens"] == sum(len(c.tokens) for c in cands)
    for bad in ({"best_of": 1, "n": 2}, {"best_of": 3, "stream": True}, {"best_of": 1000}):
        r = httpx.post(server.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, **bad}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "best_of", bad
