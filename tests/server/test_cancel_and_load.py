"""Client disconnects cancel generation and free the slot; a bounded load test."""
from __future__ import annotations

import concurrent.futures as cf
import random
import time

import httpx


def metric(server, name: str) -> float:
    for line in httpx.get(server.base_url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split(" ")[1])
    raise KeyError(name)


def wait_idle(server, timeout: float = 5.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        h = httpx.get(server.base_url + "/health").json()
        if h["slots_active"] == 0 and h["queue_depth"] == 0:
            return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError(f"server not idle after {timeout} s: {h}")


def test_disconnect_cancels_generation(server, capsys):
    wait_idle(server)
    before = metric(server, "lucebox_requests_cancelled_total")
    for attempt in range(6):  # a random model may end by itself within the first tokens: retry
        tokens_before = metric(server, "lucebox_completion_tokens_total")
        decode_before = metric(server, "lucebox_decode_seconds_total")
        with httpx.stream("POST", server.base_url + "/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": f"tell me a long story {attempt}"}],
                "max_tokens": 900, "temperature": 1.0, "seed": attempt, "top_k": 1000, "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            for _ in range(4):
                next(lines)
        # closed after a few events
        t0 = time.monotonic()
        freed = wait_idle(server, 10.0)
        if metric(server, "lucebox_requests_cancelled_total") > before:
            with capsys.disabled():
                print(f"\ndisconnect: slot freed {freed * 1000:.0f} ms after the client went away")
            assert time.monotonic() - t0 < 3.0
            # the tokens it streamed before the client left, and their time, are counted
            assert metric(server, "lucebox_completion_tokens_total") > tokens_before
            assert metric(server, "lucebox_decode_seconds_total") > decode_before
            return
    raise AssertionError("no generation was cancelled by a disconnect")


def test_disconnect_cancels_non_streaming_generation(server):
    wait_idle(server)
    before = metric(server, "lucebox_requests_cancelled_total")
    # n = 8 choices of up to 900 tokens: the request outlasts the 0.3 s client timeout even when
    # the random model ends some choices early and the machine decodes thousands of tokens/s
    for attempt in range(6):
        try:
            httpx.post(server.base_url + "/v1/chat/completions", timeout=0.3, json={
                "messages": [{"role": "user", "content": f"a long answer please {attempt}"}],
                "max_tokens": 900, "temperature": 1.0, "seed": 100 + attempt, "top_k": 1000, "n": 8})
        except httpx.TimeoutException:
            pass
        wait_idle(server, 10.0)
        if metric(server, "lucebox_requests_cancelled_total") > before:
            return
    raise AssertionError("no non-streaming generation was cancelled by a disconnect")


def test_disconnect_while_queued_frees_queue(small_server):
    """A client that leaves while waiting for a slot is removed from the queue."""
    h = {"Authorization": "Bearer sekrit"}
    body = {"messages": [{"role": "user", "content": "q"}], "max_tokens": 400, "temperature": 1.0, "seed": 1,
            "stream": True, "chat_template_kwargs": {"enable_thinking": False}}
    with httpx.stream("POST", small_server.base_url + "/v1/chat/completions", json=body, headers=h,
                      timeout=60) as first:
        assert first.status_code == 200
        try:
            httpx.post(small_server.base_url + "/v1/chat/completions", json=body, headers=h, timeout=0.3)
        except httpx.TimeoutException:
            pass  # gave up while queued (or while streaming headers were pending)
    wait_idle(small_server, 10.0)


def test_load_200_requests_concurrency_8(server, capsys):
    """200 requests, 8 at a time, half streaming: no 5xx, no 429, no leaked slots."""
    wait_idle(server)
    rss_before = server.rss_kib()
    rng = random.Random(0)
    plan = [(i, rng.random() < 0.5, rng.randint(4, 16)) for i in range(200)]

    def one(item: tuple[int, bool, int]) -> int:
        i, stream, max_tokens = item
        body = {"messages": [{"role": "user", "content": f"request {i}"}], "max_tokens": max_tokens,
                "temperature": 0.7, "seed": i, "stream": stream}
        if i % 10 == 0:
            body = {"prompt": f"request {i}", "max_tokens": max_tokens, "stream": stream}
            path = "/v1/completions"
        else:
            path = "/v1/chat/completions"
        if stream:
            with httpx.stream("POST", server.base_url + path, json=body, timeout=120) as r:
                lines = [line for line in r.iter_lines() if line]
                if r.status_code == 200:
                    assert lines[-1] == "data: [DONE]", lines[-3:]
                return r.status_code
        return httpx.post(server.base_url + path, json=body, timeout=120).status_code

    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(one, plan))
    elapsed = time.monotonic() - t0
    wait_idle(server, 10.0)
    rss_after = server.rss_kib()
    counts = {s: statuses.count(s) for s in set(statuses)}
    with capsys.disabled():
        print(f"\nload: 200 requests in {elapsed:.1f} s, statuses {counts}, server RSS "
              f"{rss_before / 1024:.1f} MiB before, {rss_after / 1024:.1f} MiB after")
    assert counts == {200: 200}
    assert metric(server, "lucebox_slots_active") == 0
    assert metric(server, "lucebox_queue_depth") == 0
    assert server.alive()
