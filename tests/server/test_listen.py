"""`lucebox serve` binds its port before it loads the model: a busy port fails at once, with a
one-line error, not after the load (here the "model" is not even a valid GGUF: it is never read)."""
from __future__ import annotations

import socket
import time

import pytest

from lucebox import cli
from lucebox.errors import ConfigError


def test_busy_port_fails_before_the_model_loads(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    bogus = tmp_path / "never-read.gguf"
    bogus.write_bytes(b"GGUF")  # (a load would fail with a GGUF error, not the port's)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        t0 = time.monotonic()
        rc = cli.main(["serve", str(bogus), "--port", str(port), "--device", "cpu"])
        assert time.monotonic() - t0 < 30
    err = capsys.readouterr().err
    assert rc == 1
    assert f"lucebox: error: cannot listen on 127.0.0.1:{port}" in err and "GGUF" not in err, err


def test_listen_picks_a_port_for_zero_and_names_bad_addresses() -> None:
    from lucebox.server.main import listen

    with listen("127.0.0.1", 0) as sock:
        assert sock.getsockname()[1] > 0
    with pytest.raises(ConfigError, match="cannot listen on 203.0.113.7:"):
        listen("203.0.113.7", 0)  # (a documentation address: no machine has it)
