"""Fixtures of the server tests: tiny synthetic models and real `lucebox serve` processes.

The tests import the *installed* `lucebox.server` (scripts/test.sh installs ``.[test,server]``).
When lucebox is imported from a source tree without the server (``PYTHONPATH=python``), the
source tree's server/ is mapped onto `lucebox.server` instead, as `lucebox serve` does.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

try:
    import lucebox.server  # noqa: F401
except ModuleNotFoundError as exc:  # source checkout: map server/ onto lucebox.server
    if exc.name != "lucebox.server":
        raise
    import lucebox

    _root = Path(lucebox.__file__).resolve().parents[2]
    if not (_root / "server" / "__init__.py").is_file():
        raise
    lucebox.__path__.append(str(_root))  # type: ignore[attr-defined]

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from server_helpers import XML_TEMPLATE, ServerProcess  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny synthetic qwen35 target and its DFlash draft (random weights, fixed seeds)."""
    from lucebox import synth

    d = tmp_path_factory.mktemp("models")
    target, draft = d / "tiny.gguf", d / "tiny-draft.gguf"
    synth.write_target(target, "tiny", seed=0)
    synth.write_draft(draft, "tiny", seed=1)
    return target, draft


@pytest.fixture(scope="session")
def xml_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("templates") / "qwen35_xml.jinja"
    p.write_text(XML_TEMPLATE, encoding="utf-8")
    return p


@pytest.fixture(scope="session")
def server(tiny_models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The main test server: the tiny pair with its draft, 2 slots, a queue of 16."""
    target, draft = tiny_models
    log = tmp_path_factory.mktemp("logs") / "server.log"
    srv = ServerProcess(["--model", str(target), "--draft", str(draft), "--ctx", "1024", "--slots", "2",
                         "--queue", "16", "--model-name", "tiny"], log)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def small_server(tiny_models: tuple[Path, Path], xml_template: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One slot, a queue of one, an XML (Qwen3.5-style) chat template and an API key."""
    target, _ = tiny_models
    log = tmp_path_factory.mktemp("logs") / "small_server.log"
    srv = ServerProcess(["--model", str(target), "--ctx", "4096", "--slots", "1", "--queue", "1",
                         "--chat-template-file", str(xml_template), "--api-key", "sekrit",
                         "--max-reasoning-tokens", "8"], log)
    yield srv
    srv.stop()


@pytest.fixture()
def client(server: ServerProcess):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture()
def small_client(small_server: ServerProcess):
    import openai

    return openai.OpenAI(base_url=small_server.base_url + "/v1", api_key="sekrit", max_retries=0, timeout=60)
