"""DFlash drafts in the original lucebox GGUF schema (``qwen35-dflash-draft``) against the same
weights in upstream llama.cpp's ``dflash`` schema: identical tensors, identical draft proposals,
lossless speculative output; the original default target layer ids (derived from the target's
layer count when the file has none); and the lucebox SWA semantics (the last `sliding_window`
context positions for every block row, causal inside the block)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

import lucebox
from lucebox import _core, synth

UPSTREAM_TO_LUCEBOX = {"fc.weight": "dflash.fc.weight", "enc.output_norm.weight": "dflash.hidden_norm.weight"}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    t = tmp_path_factory.mktemp("formats") / "target.gguf"
    synth.write_target(t, "tiny", type="q8_0", seed=31)
    return str(t)


def prompts(n: int = 6) -> list[list[int]]:
    rng = np.random.default_rng(77)
    return [[int(x) for x in rng.integers(0, 1000, int(rng.integers(5, 90)))] for _ in range(n)]


def draft(tmp_path: Path, tag: str, **kw: object) -> str:
    p = tmp_path / f"draft-{tag}.gguf"
    kw.setdefault("type", "f32")
    kw.setdefault("seed", 32)
    synth.write_draft(p, "tiny", **kw)  # type: ignore[arg-type]
    return str(p)


def proposals(target: str, draft_path: str, ps: list[list[int]]) -> list[list[int]]:
    engine = lucebox.Engine(target, draft_path, ctx=256, device="cpu", spec="chain")
    out = []
    for p in ps:
        s = engine.session()
        s.append(p)
        out.append(list(s._core.draft_proposals(p[-1])))
    return out


def tensors(path: str) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    return {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape), bytes(t.data.tobytes()))
            for t in GGUFReader(path).tensors}


@pytest.mark.parametrize("type_", ["f32", "q8_0"])
def test_same_weights_same_proposals(target: str, tmp_path: Path, type_: str) -> None:
    up = draft(tmp_path, "up", type=type_)
    lb = draft(tmp_path, "lb", type=type_, schema="lucebox")
    # one seed, the same tensors under the lucebox names
    assert {UPSTREAM_TO_LUCEBOX.get(k, k): v for k, v in tensors(up).items()} == tensors(lb)
    r = GGUFReader(lb)
    assert r.fields["general.architecture"].contents() == "qwen35-dflash-draft"
    assert "tokenizer.ggml.tokens" not in r.fields  # the vocabulary is the target's
    assert r.fields["qwen35-dflash-draft.dflash.target_layer_ids"].contents() == [0, 2]  # output ids
    d = _core.DraftFile.open(lb)
    assert d.hparams.schema == "lucebox" and d.hparams.swa_kind == "last_context"
    assert list(d.hparams.target_layers) == [1, 3] and d.hparams.n_target_layers == 2
    ps = prompts()
    assert proposals(target, lb, ps) == proposals(target, up, ps)


def test_lucebox_draft_is_lossless(target: str, tmp_path: Path) -> None:
    up = draft(tmp_path, "up")
    lb = draft(tmp_path, "lb", schema="lucebox")
    plain = lucebox.Engine(target, ctx=512, device="cpu")
    spec_up = lucebox.Engine(target, up, ctx=512, device="cpu", spec="chain")
    spec_lb = lucebox.Engine(target, lb, ctx=512, device="cpu", spec="chain")
    for p in prompts():
        ref = plain.generate(p, max_tokens=40).tokens
        a, b = spec_lb.generate(p, max_tokens=40), spec_up.generate(p, max_tokens=40)
        assert a.tokens == ref == b.tokens
        assert a.stats.spec["speculative"] and a.stats.spec["accept_histogram"] == b.stats.spec["accept_histogram"]


def test_default_target_layers_from_the_target(target: str, tmp_path: Path) -> None:
    """Without dflash.target_layer_ids: the original 1 + k * (n_layer - 2) / (N - 1) (output ids),
    i.e. layer inputs [2, 4] for the 4-layer tiny target and N = 2."""
    derived = draft(tmp_path, "derived", schema="lucebox", target_layer_ids=False)
    explicit = draft(tmp_path, "explicit", schema="lucebox", overrides={"target_layers": (2, 4)})
    other = draft(tmp_path, "other", schema="lucebox")  # (1, 3)
    assert "dflash.target_layer_ids" not in "".join(GGUFReader(derived).fields)
    d = _core.DraftFile.open(derived)
    assert list(d.hparams.target_layers) == [] and d.hparams.n_deferred_target_layers == 2
    _core.validate_draft(_core.TargetFile.open(target), d)
    assert list(d.hparams.target_layers) == [2, 4] and d.hparams.n_deferred_target_layers == 0
    assert _core.dflash_default_target_layers(2, 4) == [2, 4]
    ps = prompts()
    base = proposals(target, derived, ps)
    assert base == proposals(target, explicit, ps)
    assert base != proposals(target, other, ps)
    plain = lucebox.Engine(target, ctx=256, device="cpu")
    spec = lucebox.Engine(target, derived, ctx=256, device="cpu", spec="chain")
    for p in ps:
        assert spec.generate(p, max_tokens=24).tokens == plain.generate(p, max_tokens=24).tokens


def test_lucebox_sliding_window_semantics(target: str, tmp_path: Path) -> None:
    """lucebox SWA layers are causal inside the block: with every layer SWA and a window wider than
    the context, the draft equals an upstream draft with a causal block. A short window changes the
    proposals, and speculative output stays lossless. (The exact rows each kind sees are checked by
    tests/cpp/test_dflash.cpp.)"""
    wide = draft(tmp_path, "lb-wide", schema="lucebox", overrides={"sliding_window": 100000, "swa_pattern": (True, True)})
    causal = draft(tmp_path, "up-causal", overrides={"causal": True})
    bidir = draft(tmp_path, "up")
    narrow = draft(tmp_path, "lb-narrow", schema="lucebox", overrides={"sliding_window": 4, "swa_pattern": (True, False)})
    hp = _core.DraftFile.open(narrow).hparams
    assert hp.n_swa == 4 and list(hp.is_swa) == [True, False] and hp.swa_kind == "last_context"
    ps = prompts()
    base = proposals(target, wide, ps)
    assert base == proposals(target, causal, ps)
    assert base != proposals(target, bidir, ps)
    assert proposals(target, narrow, ps) != proposals(target, draft(tmp_path, "lb"), ps)
    plain = lucebox.Engine(target, ctx=256, device="cpu")
    for d in (wide, narrow):
        spec = lucebox.Engine(target, d, ctx=256, device="cpu", spec="chain")
        for p in ps:
            assert spec.generate(p, max_tokens=24).tokens == plain.generate(p, max_tokens=24).tokens


def test_info_reports_the_schema(target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lucebox import cli

    lb = draft(tmp_path, "lb", schema="lucebox", target_layer_ids=False)
    assert cli.main(["info", target, "--draft", lb]) == 0
    out = capsys.readouterr().out
    assert "dflash, lucebox schema" in out and "target_layers=[2, 4]" in out
