"""Engine failures mapped to HTTP: out of memory at prefill -> 503, other engine errors -> 500,
a failure mid-stream -> an error event (never a silent 200). The app runs in-process (uvicorn
in a thread) over the real tiny engine wrapped to fail on demand."""
from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import httpx
import openai
import pytest

from lucebox.errors import LuceboxError, OutOfMemoryError

FAIL: dict[str, str | None] = {"mode": None}


class FaultySession:
    """A real session whose stream() fails as FAIL["mode"] says."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def stream(self, prompt: Any, **kw: Any) -> Iterator[Any]:
        mode = FAIL["mode"]
        if mode == "oom":
            raise OutOfMemoryError("simulated: prefill needs 2.00 GiB, 1.00 GiB free")
        if mode == "crash":
            raise RuntimeError("simulated backend crash")
        it = self._real.stream(prompt, **kw)
        if mode != "midstream":
            return it

        def failing() -> Iterator[Any]:
            try:
                for i, chunk in enumerate(it):
                    if i == 3:
                        raise LuceboxError("simulated device failure during decode")
                    yield chunk
            finally:
                it.close()
        return failing()


class FaultyEngine:
    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def session(self) -> FaultySession:
        return FaultySession(self._real.session())


@pytest.fixture(scope="module")
def faulty_url(tiny_models):
    import uvicorn

    import lucebox
    from lucebox.server import ServerConfig, create_app
    from server_helpers import free_port

    target, _ = tiny_models
    engine = FaultyEngine(lucebox.Engine(target, ctx=512, device="cpu", threads=2))
    config = ServerConfig(model=str(target), ctx=512, device="cpu", slots=1, queue=4, model_name="faulty")
    app = create_app(config, engine)
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


@pytest.fixture()
def fclient(faulty_url):
    FAIL["mode"] = None
    yield openai.OpenAI(base_url=faulty_url + "/v1", api_key="x", max_retries=0, timeout=30)
    FAIL["mode"] = None


MSG = [{"role": "user", "content": "hi"}]


def test_oom_at_prefill_is_503(fclient, faulty_url):
    FAIL["mode"] = "oom"
    with pytest.raises(openai.InternalServerError) as e:
        fclient.chat.completions.create(model="faulty", messages=MSG, max_tokens=4)
    assert e.value.status_code == 503 and e.value.code == "out_of_memory"
    # streaming: the error arrives before the first token, so it is still an HTTP 503
    r = httpx.post(faulty_url + "/v1/chat/completions", json={"messages": MSG, "max_tokens": 4, "stream": True})
    assert r.status_code == 503 and r.json()["error"]["code"] == "out_of_memory"
    assert r.headers.get("retry-after")


def test_other_engine_failure_is_500(fclient):
    FAIL["mode"] = "crash"
    with pytest.raises(openai.InternalServerError) as e:
        fclient.completions.create(model="faulty", prompt="x", max_tokens=4)
    assert e.value.status_code == 500 and e.value.code == "internal_error"


def test_failure_mid_stream_is_an_error_event(fclient, faulty_url):
    FAIL["mode"] = "midstream"
    with pytest.raises(openai.APIError) as e:
        for _ in fclient.chat.completions.create(model="faulty", messages=MSG, max_tokens=30, temperature=0,
                                                 stream=True):
            pass
    assert "simulated device failure" in str(e.value)
    with httpx.stream("POST", faulty_url + "/v1/chat/completions", json={
            "messages": MSG, "max_tokens": 30, "temperature": 0, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert '"error"' in lines[-1] and "[DONE]" not in lines[-1]
    # non-streaming: a 500, never a 200 with partial or empty content
    with pytest.raises(openai.InternalServerError):
        fclient.chat.completions.create(model="faulty", messages=MSG, max_tokens=30, temperature=0)


def test_server_keeps_serving_after_failures(fclient, faulty_url):
    FAIL["mode"] = None
    r = fclient.chat.completions.create(model="faulty", messages=MSG, max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop")
    h = httpx.get(faulty_url + "/health").json()
    assert h["slots_active"] == 0
    m = httpx.get(faulty_url + "/metrics").text
    assert 'lucebox_errors_total{type="server_error",code="out_of_memory"}' in m
    assert 'status="503"' in m
