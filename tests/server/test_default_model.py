"""The default model (the bundled demo pair), `lucebox serve` without --model, and the import boundary."""
from __future__ import annotations

import subprocess
import sys

import httpx

from lucebox import default_model


def test_default_model_is_the_bundled_demo_pair():
    target, draft = default_model.default_model_paths()
    assert target.parent == draft.parent == default_model.MODELS_DIR
    assert target.is_file() and draft.is_file()
    assert target.stat().st_size + draft.stat().st_size <= 20 * 1024 * 1024


def test_serve_without_model_uses_the_demo_pair(tmp_path):
    from server_helpers import ServerProcess

    srv = ServerProcess(["--ctx", "256"], tmp_path / "log.txt", env={"LUCEBOX_CACHE_DIR": str(tmp_path)})
    try:
        models = httpx.get(srv.base_url + "/v1/models").json()["data"]
        assert models[0]["id"] == "lucebox-demo" and models[0]["meta"]["draft"] is True
        # greedy: the demo pair was trained on Python, so its continuation of a def is code-like
        r = httpx.post(srv.base_url + "/v1/completions", json={
            "model": "lucebox-demo", "prompt": "def fibonacci(n):\n", "max_tokens": 24, "temperature": 0})
        assert r.status_code == 200
        text = r.json()["choices"][0]["text"]
        assert text.strip() and any(w in text for w in ("return", "if ", "=", "(", ":", "#", '"', "self")), text
        # sampled at the server's default temperature: a completion that ends as completions do (a
        # sample may be any text, even an end of text at once)
        r = httpx.post(srv.base_url + "/v1/completions", json={
            "model": "lucebox-demo", "prompt": "def fibonacci(n):\n", "max_tokens": 24})
        assert r.status_code == 200
        choice = r.json()["choices"][0]
        assert isinstance(choice["text"], str) and choice["finish_reason"] in ("length", "stop")
    finally:
        srv.stop()


def test_core_package_does_not_import_the_server():
    code = ("import sys, lucebox, lucebox.cli; lucebox.cli.build_parser(); "
            "bad = [m for m in ('fastapi', 'uvicorn', 'starlette', 'lucebox.server') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_serve_spec_ngram_without_model_takes_the_demo_target_alone():
    from lucebox.cli import build_parser
    from lucebox.server.main import config_from_args

    cfg = config_from_args(build_parser().parse_args(["serve", "--spec", "ngram"]))
    assert cfg.spec == "ngram" and cfg.draft is None and cfg.model.endswith("lucebox-demo.gguf")
    assert config_from_args(build_parser().parse_args(["serve"])).draft is not None
