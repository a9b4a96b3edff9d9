"""A model as deep as the real Qwen3.6-27B (64 layers: 48 Gated DeltaNet + 16 attention) with tiny
widths runs every step graph (prefill, decode, chain verify + fast-rollback commit, the replay
rollback's state backup and restore, tree verify + commit) and gives plain decoding's tokens.
Graph sizes that grow with the layer count once overflowed only at the 27B's depth (a chain commit
of 48 DeltaNet layers); the 4- and 8-layer test models never reached them."""
from __future__ import annotations

import pytest

import lucebox
from forcing import forced, forced_tree
from lucebox import synth

DEEP = {"n_layer": 64, "full_attention_interval": 4}


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("deep") / "deep.gguf"
    synth.write_target(path, "tiny", type="f32", seed=4, overrides=DEEP)
    return str(path)


@pytest.mark.parametrize("rollback", ["fast", "replay"])
def test_chain_verify_and_commit_of_a_deep_model(deep_target: str, rollback: str) -> None:
    engine = lucebox.Engine(deep_target, ctx=256, rollback=rollback)
    assert engine.hparams.n_layer == 64
    prompt = list(range(10, 40))
    reference = engine.generate(prompt, max_tokens=40).tokens
    for right in (0, 3, 15):
        got = engine.session().generate(prompt, max_tokens=40, propose=forced(reference, len(prompt), right))
        assert got.tokens == reference, (rollback, right)
        assert got.stats.spec["steps"] > 0


def test_tree_verify_and_commit_of_a_deep_model(deep_target: str) -> None:
    engine = lucebox.Engine(deep_target, ctx=256)
    prompt = list(range(50, 70))
    reference = engine.generate(prompt, max_tokens=32).tokens
    got = engine.session().generate(prompt, max_tokens=32, propose_tree=forced_tree(reference, len(prompt), 4))
    assert got.tokens == reference
