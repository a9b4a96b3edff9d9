"""The server's prefix cache: requests sharing a long system prompt (or repeating a prompt) start
from a snapshot, shown in /metrics, and answer exactly as a server without the cache does."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pytest

from server_helpers import ServerProcess

SYSTEM = " ".join(f"rule {i}: answer briefly and never mention the number {i * 7}." for i in range(40))


def _metric(srv: ServerProcess, name: str) -> float:
    import httpx

    text = httpx.get(srv.base_url + "/metrics", timeout=10).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m is not None, f"{name} missing from /metrics"
    return float(m.group(1))


@pytest.fixture(scope="module")
def device_server(tiny_models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The cache with --prefix-cache-location device (on this CPU build: the CPU's own memory)."""
    target, _ = tiny_models
    log = tmp_path_factory.mktemp("logs") / "device.log"
    srv = ServerProcess(["--model", str(target), "--ctx", "2048", "--model-name", "tiny", "--prefix-cache-mb", "64",
                         "--prefix-cache-location", "device"], log)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def servers(tiny_models: tuple[Path, Path],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    target, _ = tiny_models
    logs = tmp_path_factory.mktemp("logs")
    args = ["--model", str(target), "--ctx", "2048", "--slots", "2", "--model-name", "tiny"]
    cached = ServerProcess([*args, "--prefix-cache-mb", "64"], logs / "cached.log")
    try:
        plain = ServerProcess([*args, "--prefix-cache-mb", "0"], logs / "plain.log")
    except BaseException:
        cached.stop()
        raise
    yield cached, plain
    cached.stop()
    plain.stop()


def _chat(srv: ServerProcess, messages: list[dict]) -> tuple[str, int]:
    import openai

    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    r = client.chat.completions.create(model="tiny", temperature=0, max_tokens=12, messages=messages)
    return r.choices[0].message.content or "", r.usage.prompt_tokens


def _ask(srv: ServerProcess, user: str) -> tuple[str, int]:
    return _chat(srv, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])


def test_shared_system_prompt_hits_the_cache_and_answers_the_same(servers) -> None:
    cached, plain = servers
    assert _metric(cached, "lucebox_prefix_cache_hits_total") == 0

    first, n_prompt = _ask(cached, "What is the first rule?")
    assert n_prompt > 200
    assert _metric(cached, "lucebox_prefix_cache_hits_total") == 0
    assert _metric(cached, "lucebox_prefix_cache_misses_total") == 1
    assert _metric(cached, "lucebox_prefix_cache_entries") >= 2  # the system prompt and the whole prompt
    assert _metric(cached, "lucebox_prefix_cache_bytes") > 0
    assert _metric(cached, "lucebox_prefix_cache_too_large_total") == 0
    assert _metric(cached, "lucebox_prefix_cache_out_of_memory_total") == 0

    second, _ = _ask(cached, "And the last one?")
    assert _metric(cached, "lucebox_prefix_cache_hits_total") == 1
    hit_tokens = _metric(cached, "lucebox_prefix_cache_hit_tokens_total")
    assert 200 < hit_tokens < n_prompt

    again, _ = _ask(cached, "What is the first rule?")  # the whole prompt but its last token
    assert _metric(cached, "lucebox_prefix_cache_hits_total") == 2
    assert _metric(cached, "lucebox_prefix_cache_hit_tokens_total") == hit_tokens + n_prompt - 1
    assert again == first

    # the same answers as without the cache (temperature 0)
    assert _ask(plain, "What is the first rule?")[0] == first
    assert _ask(plain, "And the last one?")[0] == second
    import httpx

    assert "lucebox_prefix_cache_hits_total" not in httpx.get(plain.base_url + "/metrics", timeout=10).text
    assert cached.alive() and plain.alive()


def test_next_chat_turn_hits_the_cache(servers) -> None:
    cached, plain = servers
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a rule."}]
    a1, n1 = _chat(cached, turn1)
    hits, hit_tokens = (_metric(cached, "lucebox_prefix_cache_hits_total"),
                        _metric(cached, "lucebox_prefix_cache_hit_tokens_total"))
    turn2 = turn1 + [{"role": "assistant", "content": a1}, {"role": "user", "content": "Another one."}]
    a2, _ = _chat(cached, turn2)
    assert _metric(cached, "lucebox_prefix_cache_hits_total") == hits + 1
    assert _metric(cached, "lucebox_prefix_cache_hit_tokens_total") - hit_tokens > 200
    assert _chat(plain, turn2)[0] == a2
    assert cached.alive()


def test_concurrent_requests_sharing_a_prefix_agree(servers) -> None:
    cached, plain = servers
    # requests sharing the prefix at once (two slots): each answers as without the cache
    from concurrent.futures import ThreadPoolExecutor

    questions = [f"Question {i}: which rule mentions {i * 7}?" for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda q: _ask(cached, q)[0], questions))
    assert all(answers) and _metric(cached, "lucebox_prefix_cache_bytes") <= 64 << 20
    assert cached.alive()
    assert answers == [_ask(plain, q)[0] for q in questions]


def test_device_location_hits_and_answers_the_same(device_server, servers) -> None:
    _, plain = servers
    first, _ = _ask(device_server, "What is the first rule?")
    assert _metric(device_server, "lucebox_prefix_cache_entries") >= 2
    second, _ = _ask(device_server, "And the last one?")
    assert _metric(device_server, "lucebox_prefix_cache_hits_total") == 1
    assert _metric(device_server, "lucebox_prefix_cache_too_large_total") == 0
    assert _ask(plain, "What is the first rule?")[0] == first
    assert _ask(plain, "And the last one?")[0] == second
    assert "prefix cache: 64 MiB of device memory" in device_server.log_path.read_text()


def test_snapshots_larger_than_the_budget_are_counted(tiny_models: tuple[Path, Path]) -> None:
    """In process: a cache whose budget is smaller than one snapshot stores nothing, says so in
    /metrics (lucebox_prefix_cache_too_large_total), and the request answers as without it."""
    import lucebox
    from lucebox.server import ServerConfig, create_app
    from lucebox.prefix_cache import start_session

    target, _ = tiny_models
    engine = lucebox.Engine(target, ctx=1024, device="cpu", threads=2)
    for location in ("host", "device"):
        config = ServerConfig(model=str(target), ctx=1024, device="cpu", model_name="tiny", prefix_cache_mb=1,
                              prefix_cache_location=location)
        svc = create_app(config, engine).state.service
        cache = svc.prefix_cache
        assert cache is not None and cache.location == location
        cache.budget_bytes = 10_000  # smaller than any snapshot of this model
        prompt = [int(t) for t in range(3, 303)]
        session = engine.session()
        rest, _ = start_session(session, prompt, cache)
        assert rest == prompt[-1:] and session.n_past == len(prompt) - 1  # prefilled, not stored
        assert cache.entries == 0 and cache.stats().too_large == 1
        metrics = svc.metrics.render()
        assert "lucebox_prefix_cache_too_large_total 1" in metrics
        assert "lucebox_prefix_cache_out_of_memory_total 0" in metrics
        assert f"in {location} memory" in metrics
        assert session.generate(rest, max_tokens=8).tokens == engine.session().generate(prompt, max_tokens=8).tokens


def test_prefix_cache_location_is_validated(tiny_models: tuple[Path, Path]) -> None:
    from lucebox.errors import ConfigError
    from lucebox.server import ServerConfig

    target, _ = tiny_models
    with pytest.raises(ConfigError, match="prefix_cache_location"):
        ServerConfig(model=str(target), prefix_cache_location="gpu")
    with pytest.raises(ConfigError, match="prefix_cache_dir needs"):
        ServerConfig(model=str(target), prefix_cache_mb=0, prefix_cache_dir="/tmp/x")
    with pytest.raises(ConfigError, match="prefix_cache_disk_mb"):
        ServerConfig(model=str(target), prefix_cache_disk_mb=0)


def test_an_unusable_cache_directory_is_a_clear_error(tiny_models: tuple[Path, Path], tmp_path: Path) -> None:
    import lucebox
    from lucebox.errors import ConfigError
    from lucebox.server import ServerConfig, create_app

    target, _ = tiny_models
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    engine = lucebox.Engine(target, ctx=256, device="cpu", threads=2)
    config = ServerConfig(model=str(target), ctx=256, device="cpu", prefix_cache_dir=str(blocker / "cache"))
    with pytest.raises(ConfigError, match="prefix_cache_dir"):
        create_app(config, engine)


def test_disk_tier_resumes_after_a_restart(tiny_models: tuple[Path, Path], tmp_path: Path) -> None:
    """--prefix-cache-dir: a restarted server starts a repeated long prompt from the snapshot
    on disk (shown in /metrics) and answers as before."""
    target, _ = tiny_models
    args = ["--model", str(target), "--ctx", "2048", "--model-name", "tiny", "--prefix-cache-mb", "64",
            "--prefix-cache-dir", str(tmp_path / "cache")]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]
    first = ServerProcess(args, tmp_path / "first.log")
    try:
        answer, n_prompt = _chat(first, messages)
        assert n_prompt > 300
        assert _metric(first, "lucebox_prefix_cache_disk_hits_total") == 0
    finally:
        first.stop()  # waits for the queued snapshots to reach the disk
    second = ServerProcess(args, tmp_path / "second.log")
    try:
        assert _metric(second, "lucebox_prefix_cache_disk_entries") >= 1
        again, _ = _chat(second, messages)
        assert again == answer
        assert _metric(second, "lucebox_prefix_cache_disk_hits_total") == 1
        assert _metric(second, "lucebox_prefix_cache_hit_tokens_total") >= n_prompt - 16
    finally:
        second.stop()
