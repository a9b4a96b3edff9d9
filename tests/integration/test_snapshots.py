"""Session snapshots: a restored session continues token-identically to a cold run (plain and
speculative), on disk too; a snapshot of another layout, a truncated file or one that does not fit
the context is refused with a clear error."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import lucebox
from lucebox import synth


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("snap")
    t, dr = str(d / "t.gguf"), str(d / "d.gguf")
    synth.write_target(t, "tiny", type="q8_0", seed=31)
    synth.write_draft(dr, "tiny", type="q8_0", seed=32)
    return t, dr


def _prompt(n: int, seed: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, 1000, n)]


@pytest.mark.parametrize("with_draft", [False, True])
def test_warm_equals_cold(pair: tuple[str, str], with_draft: bool) -> None:
    target, draft = pair
    engine = lucebox.Engine(target, draft if with_draft else None, ctx=1024, device="cpu", ubatch=64)
    prefix, suffix = _prompt(300, 1), _prompt(20, 2)
    cold = engine.session().generate(prefix + suffix, max_tokens=40).tokens

    first = engine.session()
    first.append(prefix)
    snap = first.snapshot()
    assert snap.tokens == prefix and snap.nbytes > 0
    warm = engine.session()
    warm.restore(snap)
    assert warm.tokens == prefix
    assert warm.generate(suffix, max_tokens=40).tokens == cold
    # the snapshotted session itself is unchanged by taking the snapshot
    assert first.generate(suffix, max_tokens=40).tokens == cold


def test_snapshot_after_generation_keeps_the_pending_token(pair: tuple[str, str]) -> None:
    target, draft = pair
    engine = lucebox.Engine(target, draft, ctx=1024, device="cpu")
    p = _prompt(50, 3)
    a = engine.session()
    first = a.generate(p, max_tokens=10).tokens
    snap = a.snapshot()
    expected = a.generate([5, 6], max_tokens=15).tokens
    b = engine.session()
    b.restore(snap)
    assert b.tokens == p + first
    assert b.generate([5, 6], max_tokens=15).tokens == expected


def test_disk_round_trip_into_a_new_engine(pair: tuple[str, str], tmp_path: Path) -> None:
    target, draft = pair
    p, q = _prompt(200, 4), _prompt(10, 5)
    e1 = lucebox.Engine(target, draft, ctx=512, device="cpu")
    s = e1.session()
    s.append(p)
    path = tmp_path / "s.lbx"
    s.snapshot().save(str(path))
    expected = s.generate(q, max_tokens=30).tokens
    e2 = lucebox.Engine(target, draft, ctx=512, device="cpu")
    s2 = e2.session()
    s2.restore(lucebox.load_snapshot(path))
    assert s2.generate(q, max_tokens=30).tokens == expected


def test_mismatches_are_refused(pair: tuple[str, str], tmp_path: Path) -> None:
    target, draft = pair
    s = lucebox.Engine(target, ctx=512, device="cpu", kv_type="q8_0").session()
    s.append(_prompt(100, 6))
    snap = s.snapshot()
    with pytest.raises(lucebox.ConfigError, match="does not fit this engine"):
        lucebox.Engine(target, ctx=512, device="cpu", kv_type="f16").session().restore(snap)
    with pytest.raises(lucebox.ConfigError, match="does not fit this engine"):
        lucebox.Engine(target, draft, ctx=512, device="cpu", kv_type="q8_0").session().restore(snap)
    with pytest.raises(lucebox.ConfigError, match="more than this engine's context"):
        lucebox.Engine(target, ctx=64, device="cpu", kv_type="q8_0").session().restore(snap)
    path = tmp_path / "s.lbx"
    snap.save(str(path))
    data = path.read_bytes()
    (tmp_path / "cut.lbx").write_bytes(data[: len(data) // 2])
    with pytest.raises(lucebox.ConfigError, match="truncated or corrupt"):
        lucebox.load_snapshot(tmp_path / "cut.lbx")
    (tmp_path / "junk.lbx").write_bytes(b"not a snapshot at all")
    with pytest.raises(lucebox.ConfigError, match="not a lucebox snapshot"):
        lucebox.load_snapshot(tmp_path / "junk.lbx")
    with pytest.raises(lucebox.ConfigError, match="cannot open snapshot"):
        lucebox.load_snapshot(tmp_path / "missing.lbx")
