"""Placement over several devices: the configuration is validated with clear errors (Python
EngineConfig and the C++ engine_config), and a layer split produces the same greedy tokens as one
device, for plain decoding, DFlash chain speculation with fast rollback (real draft and forced
proposals of every accept length), replay rollback, and snapshots. CPU backend instances
(cpu:0, cpu:1, ...) are distinct backends, so each layer range really runs on its own backend and
the hidden state is copied between them."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import lucebox
from lucebox import _core, synth
from lucebox.config import EngineConfig
from lucebox.errors import ConfigError
from forcing import forced

BLOCK = 16


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("placement")
    out = {"tiny": str(d / "t.gguf"), "deep": str(d / "deep.gguf"), "draft": str(d / "d.gguf")}
    synth.write_target(out["tiny"], "tiny", type="q8_0", seed=5)
    # 8 layers, attention in two places, so three uneven ranges each hold both kinds or one
    synth.write_target(out["deep"], "tiny", type="q8_0", seed=9,
                       overrides={"n_layer": 8, "full_attention_interval": 3})
    synth.write_draft(out["draft"], "tiny", type="q8_0", seed=6)
    return out


def prompts(n: int, seed: int = 1234) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(0, 1000, int(rng.integers(5, 90)))] for _ in range(n)]


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------

BAD_PLACEMENTS: list[tuple[dict[str, Any], str]] = [
    (dict(split="layer", devices=("cpu:0",)), "at least 2 devices"),
    (dict(split="layer", devices=()), "at least 2 devices"),
    (dict(split="tensor", devices=("cuda:0",)), "at least 2 devices"),
    (dict(split="layer", devices=("cpu:0", "cpu")), "appears twice"),
    (dict(split="layer", devices=("cuda:1", "gpu:1")), "appears twice"),
    (dict(split="layer", devices=("cpu:0", "cpu:1"), layer_proportions=(1.0,)), "one per device"),
    (dict(split="layer", devices=("cpu:0", "cpu:1"), layer_proportions=(1.0, 0.0)), "layer_proportions"),
    (dict(split="layer", devices=("cpu:0", "cpu:1"), layer_proportions=(1.0, -2.0)), "layer_proportions"),
    (dict(split="layer", devices=("cpu:0", "cpu:1"), layer_proportions=(1.0, math.nan)), "layer_proportions"),
    (dict(split="layer", devices=tuple(f"cpu:{i}" for i in range(17))), "at most 16"),
    (dict(split="none", devices=("cpu:0", "cpu:1")), "split='layer' or split='tensor'"),
    (dict(split="none", layer_proportions=(1.0,)), "need split='layer'"),
    (dict(split="diagonal", devices=("cpu:0", "cpu:1")), "split"),
    (dict(split="layer", devices=("cpu:0", "auto")), "auto"),
    (dict(split="layer", devices=("cpu:0", "")), "non-empty"),
    (dict(device="cpu", devices=("cpu:0", "cpu:1"), split="layer"), "not both"),
    (dict(split="tensor", devices=("cuda:0", "cuda:1"), layer_proportions=(1.0, 1.0)), "split='layer' only"),
    (dict(split="tensor", devices=("cuda:0", "cpu:1")), "cannot mix CPU backend instances and GPUs"),
    (dict(split="tensor", devices=("cpu", "CUDA1", "cpu:2")), "cannot mix CPU backend instances and GPUs"),
    (dict(device="cpu", draft_device="cuda:0"), "needs split='layer'"),
    (dict(split="layer", devices=("cpu:x", "cpu:1")), "cpu:N"),
]


@pytest.mark.parametrize("kwargs,message", BAD_PLACEMENTS)
def test_python_config_rejects_bad_placement(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EngineConfig(**kwargs)


def _core_config(path: str, **kw: Any) -> Any:
    c = _core.EngineConfig()
    c.model_path = path
    for k, v in kw.items():
        setattr(c, k, list(v) if isinstance(v, tuple) else v)
    return c


@pytest.mark.parametrize("kwargs,message", BAD_PLACEMENTS)
def test_core_config_rejects_bad_placement(kwargs: dict[str, Any], message: str) -> None:
    """The same rules in C++ (engine_config::validate), for callers that bypass Python."""
    c = _core_config("model.gguf", **kwargs)
    with pytest.raises(lucebox.errors.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        c.validate()


def test_core_config_refuses_tree_on_a_split() -> None:
    c = _core_config("model.gguf", split="layer", devices=("cpu:0", "cpu:1"), spec="tree", draft_path="d.gguf")
    with pytest.raises(lucebox.errors.ConfigError, match="tree"):
        c.validate()


def test_core_config_draft_device_needs_a_draft() -> None:
    c = _core_config("model.gguf", split="layer", devices=("cpu:0", "cpu:1"), draft_device="cpu:0")
    with pytest.raises(lucebox.errors.ConfigError, match="no draft model"):
        c.validate()


def test_good_placements_validate() -> None:
    EngineConfig(split="layer", devices=("cpu:0", "cpu:1"), layer_proportions=(1, 2.5))
    EngineConfig(split="layer", devices=tuple(f"cpu:{i}" for i in range(16)))
    EngineConfig(devices=("cpu",))
    _core_config("m.gguf", split="layer", devices=("cpu:0", "cpu:1", "cpu:2"), layer_proportions=(1.0, 3.0, 1.0)).validate()


def test_missing_device_names_the_available_ones(files: dict[str, str]) -> None:
    if any(d["type"] == "gpu" for d in _core.devices()):
        pytest.skip("a GPU is visible: cuda:0 exists")
    with pytest.raises(ConfigError, match=r"cuda:1.*available: .*CPU"):
        lucebox.Engine(files["tiny"], devices=["cpu:0", "cuda:1"], split="layer")


def test_more_devices_than_layers_is_refused(files: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="at least as many layers"):
        lucebox.Engine(files["tiny"], devices=[f"cpu:{i}" for i in range(5)], split="layer")


def test_draft_device_without_draft_is_refused(files: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="no draft model"):
        lucebox.Engine(files["tiny"], devices=["cpu:0", "cpu:1"], split="layer", draft_device="cpu:0")


def test_devices_as_a_string_is_refused(files: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="sequence"):
        lucebox.Engine(files["tiny"], devices="cpu:0,cpu:1", split="layer")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------
# equivalence: single device vs layer split
# ------------------------------------------------------------------------------------------------

SPLITS = [
    ("tiny", ["cpu:0", "cpu:1"], ()),
    ("tiny", ["cpu:0", "cpu:1", "cpu:2"], (1.0, 3.0, 1.0)),
    ("deep", ["cpu:0", "cpu:1"], (3.0, 1.0)),
    ("deep", ["cpu:0", "cpu:1", "cpu:2"], (2.0, 1.0, 3.0)),
]


@pytest.mark.parametrize("model,devices,proportions", SPLITS)
def test_layer_split_plain_greedy_is_identical(files: dict[str, str], model: str, devices: list[str],
                                               proportions: tuple[float, ...]) -> None:
    single = lucebox.Engine(files[model], ctx=512, device="cpu", ubatch=32)
    split = lucebox.Engine(files[model], ctx=512, devices=devices, split="layer", layer_proportions=proportions,
                           ubatch=32)
    assert split.device.startswith("+".join(["CPU"] * len(devices)))
    for p in prompts(3):
        assert split.generate(p, max_tokens=32).tokens == single.generate(p, max_tokens=32).tokens
    # logits of every row, not only argmaxes (prefill across micro-batches)
    p = prompts(1, seed=7)[0] * 2
    a = single.session().eval(p, all_logits=True)
    b = split.session().eval(p, all_logits=True)
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)


@pytest.mark.parametrize("devices,proportions,draft_device", [
    (["cpu:0", "cpu:1"], (), ""),
    (["cpu:0", "cpu:1", "cpu:2"], (1.0, 3.0, 1.0), ""),       # captured layers on two devices
    (["cpu:0", "cpu:1", "cpu:2"], (1.0, 1.0, 2.0), "cpu:0"),  # the draft away from the LM head
    (["cpu:0", "cpu:1"], (), "cpu:5"),                        # the draft on a device of its own
])
def test_layer_split_chain_speculation_is_lossless(files: dict[str, str], devices: list[str],
                                                   proportions: tuple[float, ...], draft_device: str) -> None:
    plain = lucebox.Engine(files["tiny"], ctx=512, device="cpu", ubatch=32)
    spec = lucebox.Engine(files["tiny"], files["draft"], ctx=512, devices=devices, split="layer",
                          layer_proportions=proportions, draft_device=draft_device, ubatch=32, spec="chain")
    single_spec = lucebox.Engine(files["tiny"], files["draft"], ctx=512, device="cpu", ubatch=32, spec="chain")
    for p in prompts(3):
        ref = plain.generate(p, max_tokens=32)
        got = spec.generate(p, max_tokens=32)
        assert got.tokens == ref.tokens
        s = got.stats.spec
        assert s["speculative"] and s["steps"] > 0 and s["fast_rollbacks"] == s["steps"]
        # the draft sees the same features: the same proposals, so the same acceptance
        assert s["accept_histogram"] == single_spec.generate(p, max_tokens=32).stats.spec["accept_histogram"]
        s0 = spec.session()
        s0.append(p)
        s1 = single_spec.session()
        s1.append(p)
        assert s0._core.draft_proposals(ref.tokens[0]) == s1._core.draft_proposals(ref.tokens[0])


@pytest.mark.parametrize("rollback", ["fast", "replay"])
def test_layer_split_rollback_every_accept_length(files: dict[str, str], rollback: str) -> None:
    """Forced proposals accepting exactly k per step: the commit (fast: a per-device checkpoint
    copy; replay: per-device backup, restore and re-run) keeps every device's state in step."""
    single = lucebox.Engine(files["deep"], ctx=512, device="cpu")
    split = lucebox.Engine(files["deep"], ctx=512, devices=["cpu:0", "cpu:1", "cpu:2"], split="layer",
                           layer_proportions=(2.0, 1.0, 3.0), rollback=rollback)
    for p in prompts(1, seed=99):
        ref = single.generate(p, max_tokens=40).tokens
        for k in [0, 1, 5, 14, None]:
            got = split.session().generate(p, max_tokens=40, propose=forced(ref, len(p), k))
            assert got.tokens == ref, (k, rollback)
            if rollback == "fast":
                assert got.stats.spec["fast_rollbacks"] == got.stats.spec["steps"]


def test_layer_split_snapshot_restore(files: dict[str, str]) -> None:
    """A snapshot covers every device's state: a restored session continues like a cold one,
    also into a fresh session and after the source session moved on."""
    engine = lucebox.Engine(files["tiny"], files["draft"], ctx=512, devices=["cpu:0", "cpu:1", "cpu:2"],
                            split="layer", layer_proportions=(1.0, 3.0, 1.0), spec="chain")
    single = lucebox.Engine(files["tiny"], ctx=512, device="cpu")
    prefix, suffix = prompts(1, seed=3)[0], [5, 6, 7, 8]
    cold = single.session().generate(prefix + suffix, max_tokens=30).tokens
    for where in ["host", "device"]:
        s = engine.session()
        s.append(prefix)
        snap = s.snapshot(where)
        s.generate([1, 2, 3], max_tokens=20)  # the source moves on
        for target in (s, engine.session()):
            target.restore(snap)
            assert target.generate(suffix, max_tokens=30).tokens == cold, where


def test_layer_split_sessions_interleave(files: dict[str, str]) -> None:
    """Two sessions of one split engine alternate (each re-allocates its range graphs on the
    shared per-device schedulers): both match the same sequence on one device."""
    pa, pb = prompts(2, seed=11)

    def run(engine: lucebox.Engine) -> list[list[int]]:
        a, b = engine.session(), engine.session()
        out = [a.generate(pa, max_tokens=8).tokens, b.generate(pb, max_tokens=8).tokens]
        out += [a.generate([3, 4], max_tokens=8).tokens, b.generate([5, 6, 7], max_tokens=8).tokens]
        return out

    single = run(lucebox.Engine(files["deep"], ctx=512, device="cpu"))
    assert run(lucebox.Engine(files["deep"], ctx=512, devices=["cpu:0", "cpu:1"], split="layer")) == single


def test_cli_generate_with_a_layer_split(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    from lucebox import cli

    common = ["generate", files["tiny"], "hello world", "--max-tokens", "12", "--ctx", "256", "--temperature", "0"]
    assert cli.main(common + ["--device", "cpu"]) == 0
    single = capsys.readouterr().out
    assert cli.main(common + ["--devices", "cpu:0,cpu:1", "--split", "layer", "--layer-proportions", "1,3"]) == 0
    assert capsys.readouterr().out == single
    assert cli.main(common + ["--devices", "cpu:0,cpu:1", "--split", "layer", "--layer-proportions", "1,x"]) != 0
    assert "--layer-proportions" in capsys.readouterr().err
    assert cli.main(common + ["--devices", "cpu:0", "--split", "layer"]) != 0
    assert "at least 2 devices" in capsys.readouterr().err

