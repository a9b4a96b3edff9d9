"""KV cache types: `lucebox serve --kv-type T [--kv-type-k TK] [--kv-type-v TV]` and `lucebox.Engine` take one
type for both caches or each its own, by one rule (`lucebox.config.kv_cache_types`)."""
from __future__ import annotations

import pytest

from lucebox import synth
from lucebox.cli import build_parser
from lucebox.errors import ConfigError


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("kv") / "tiny.gguf"
    synth.write_target(str(path), "tiny", type="q8_0", seed=0)
    return str(path)


@pytest.mark.parametrize("argv, k, v", [
    ([], "f16", "f16"),
    (["--kv-type", "q8_0"], "q8_0", "q8_0"),
    (["--kv-type", "q8_0", "--kv-type-v", "f16"], "q8_0", "f16"),
    (["--kv-type-k", "q4_0"], "q4_0", "f16"),
])
def test_serve_kv_types_reach_the_engine(model: str, argv: list[str], k: str, v: str) -> None:
    from lucebox.server.app import load_engine
    from lucebox.server.main import config_from_args

    config = config_from_args(build_parser().parse_args(["serve", model, "--device", "cpu", "--ctx", "64", *argv]))
    engine = load_engine(config)
    assert (engine.config.kv_type_k, engine.config.kv_type_v) == (k, v)


def test_server_config_refuses_unknown_kv_types(model: str) -> None:
    from lucebox.server import ServerConfig

    with pytest.raises(ConfigError, match="kv_type_v='q3_0' must be one of"):
        ServerConfig(model=model, kv_type_v="q3_0")
    with pytest.raises(ConfigError, match="kv_type='fp8' must be one of"):
        ServerConfig(model=model, kv_type="fp8")
    assert ServerConfig(model=model, kv_type_k="q8_0").kv_type_v is None  # (the V cache takes kv_type)


@pytest.mark.parametrize("kw, k, v", [
    ({}, "f16", "f16"),
    ({"kv_type": "q8_0"}, "q8_0", "q8_0"),
    ({"kv_type": "q8_0", "kv_type_k": "f16"}, "f16", "q8_0"),  # a cache's own type over kv_type
    ({"kv_type_v": "q4_0"}, "f16", "q4_0"),
])
def test_engine_takes_the_same_kv_rule(model: str, kw: dict, k: str, v: str) -> None:
    import lucebox

    engine = lucebox.Engine(model, ctx=64, device="cpu", **kw)
    assert (engine.config.kv_type_k, engine.config.kv_type_v) == (k, v)
