"""The server's configuration checks a placement with the engine's rules before loading."""
from __future__ import annotations

import pytest

from lucebox.errors import ConfigError


def test_server_config_checks_the_placement(tmp_path) -> None:
    from lucebox.server import ServerConfig

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match="appears twice"):
        ServerConfig(model=str(model), devices=("cpu:0", "cpu:0"), split="layer")
    with pytest.raises(ConfigError, match="at least 2 devices"):
        ServerConfig(model=str(model), devices=("cuda:0",), split="layer")
    ServerConfig(model=str(model), devices=("cpu:0", "cpu:1"), split="layer", layer_proportions=(1.0, 2.0))


def test_server_config_accepts_spec_tree(tmp_path) -> None:
    """Tree verification samples exactly (spec::accept_tree_sampled), so the server allows it;
    unknown modes are still refused."""
    from lucebox.server import ServerConfig

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert ServerConfig(model=str(model), spec="tree").spec == "tree"
    with pytest.raises(ConfigError, match="must be one of"):
        ServerConfig(model=str(model), spec="forest")
