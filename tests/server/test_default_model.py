"""The default (placeholder) model, `lucebox serve` without --model, and the import boundary."""
from __future__ import annotations

import subprocess
import sys

import httpx

from lucebox import default_model


def test_default_model_written_once_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("LUCEBOX_CACHE_DIR", str(tmp_path))
    target, draft = default_model.default_model_paths()
    assert target.parent == tmp_path / "models"
    assert target.is_file() and draft.is_file()
    stamp = (target.stat().st_mtime_ns, draft.stat().st_mtime_ns)
    again = default_model.default_model_paths()
    assert again == (target, draft)
    assert (target.stat().st_mtime_ns, draft.stat().st_mtime_ns) == stamp
    assert not [p for p in (tmp_path / "models").iterdir() if p.name.endswith(".tmp")]


def test_serve_without_model_uses_placeholder(tmp_path):
    from server_helpers import ServerProcess

    srv = ServerProcess(["--ctx", "256"], tmp_path / "log.txt", env={"LUCEBOX_CACHE_DIR": str(tmp_path)})
    try:
        models = httpx.get(srv.base_url + "/v1/models").json()["data"]
        assert models[0]["id"] == "lucebox-default" and models[0]["meta"]["placeholder"] is True
        assert httpx.get(srv.base_url + "/health").json()["placeholder"] is True
        r = httpx.post(srv.base_url + "/v1/chat/completions", json={
            "model": "lucebox-default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 200
        assert "PLACEHOLDER" in srv.log() and "RANDOM weights" in srv.log()
    finally:
        srv.stop()


def test_core_package_does_not_import_the_server():
    code = ("import sys, lucebox, lucebox.cli; lucebox.cli.build_parser(); "
            "bad = [m for m in ('fastapi', 'uvicorn', 'starlette', 'lucebox.server') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
