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


# -- snapshot locations (host / device); on a CPU engine "device" is the CPU's own memory ---------
@pytest.mark.parametrize("with_draft", [False, True])
def test_device_snapshot_warm_equals_cold(pair: tuple[str, str], with_draft: bool) -> None:
    target, draft = pair
    engine = lucebox.Engine(target, draft if with_draft else None, ctx=1024, device="cpu", ubatch=64)
    prefix, suffix = _prompt(300, 11), _prompt(20, 12)
    cold = engine.session().generate(prefix + suffix, max_tokens=40).tokens

    first = engine.session()
    first.append(prefix)
    host = first.snapshot()
    dev = first.snapshot("device")
    assert (host.location, dev.location) == ("host", "device")
    assert dev.nbytes == host.nbytes == first.snapshot_nbytes
    assert dev.region_sizes == host.region_sizes and dev.tokens == prefix
    for snap in (dev, dev.to_host(), engine.copy_snapshot(host, "device")):
        warm = engine.session()
        warm.restore(snap)
        assert warm.generate(suffix, max_tokens=40).tokens == cold
    assert dev.to_host().location == "host" and host.to_host() is not None
    # the same snapshot restores any number of times, into the session it came from too
    first.generate(suffix, max_tokens=5)
    first.restore(dev)
    assert first.generate(suffix, max_tokens=40).tokens == cold


def test_device_snapshot_after_generation_and_restore_in_place(pair: tuple[str, str]) -> None:
    target, draft = pair
    engine = lucebox.Engine(target, draft, ctx=1024, device="cpu")
    a = engine.session()
    first = a.generate(_prompt(60, 13), max_tokens=10).tokens
    snap = a.snapshot(location="device")
    assert snap.pending == first[-1]
    expected = a.generate([5, 6], max_tokens=15).tokens
    b = engine.session()
    b.restore(snap)
    assert b.generate([5, 6], max_tokens=15).tokens == expected


def test_device_snapshot_disk_round_trip(pair: tuple[str, str], tmp_path: Path) -> None:
    target, draft = pair
    p, q = _prompt(200, 14), _prompt(10, 15)
    e1 = lucebox.Engine(target, draft, ctx=512, device="cpu")
    s = e1.session()
    s.append(p)
    dev = s.snapshot("device")
    dev.save(str(tmp_path / "dev.lbx"))
    s.snapshot("host").save(str(tmp_path / "host.lbx"))
    # the file does not depend on where the snapshot lived
    assert (tmp_path / "dev.lbx").read_bytes() == (tmp_path / "host.lbx").read_bytes()
    expected = s.generate(q, max_tokens=30).tokens
    e2 = lucebox.Engine(target, draft, ctx=512, device="cpu")
    plain = lucebox.load_snapshot(tmp_path / "dev.lbx")
    on_dev = lucebox.load_snapshot(tmp_path / "dev.lbx", engine=e2, location="device")
    pinned = lucebox.load_snapshot(tmp_path / "dev.lbx", engine=e2)
    assert (plain.location, on_dev.location, pinned.location) == ("host", "device", "host")
    for snap in (plain, on_dev, pinned):
        assert snap.nbytes == dev.nbytes and snap.tokens == p
        s2 = e2.session()
        s2.restore(snap)
        assert s2.generate(q, max_tokens=30).tokens == expected


def test_bad_locations_and_foreign_device_snapshots_are_refused(pair: tuple[str, str], tmp_path: Path) -> None:
    target, draft = pair
    engine = lucebox.Engine(target, ctx=512, device="cpu", kv_type="q8_0")
    s = engine.session()
    s.append(_prompt(100, 16))
    for bad in ("gpu", "Device", "", "cuda"):
        with pytest.raises(lucebox.ConfigError, match="must be one of host, device"):
            s.snapshot(bad)
        with pytest.raises(ValueError):  # the core validates too
            s._core.snapshot(bad)
    with pytest.raises(lucebox.ConfigError):
        s.snapshot(None)  # type: ignore[arg-type]
    dev = s.snapshot("device")
    with pytest.raises(lucebox.ConfigError, match="must be one of host, device"):
        engine.copy_snapshot(dev, "vram")
    with pytest.raises(lucebox.ConfigError, match="needs the engine"):
        lucebox.load_snapshot(tmp_path / "x.lbx", location="device")
    with pytest.raises(lucebox.ConfigError, match="does not fit this engine"):
        lucebox.Engine(target, ctx=512, device="cpu", kv_type="f16").session().restore(dev)
    with pytest.raises(lucebox.ConfigError, match="does not fit this engine"):
        lucebox.Engine(target, draft, ctx=512, device="cpu", kv_type="q8_0").session().restore(dev)
    with pytest.raises(lucebox.ConfigError, match="more than this engine's context"):
        lucebox.Engine(target, ctx=64, device="cpu", kv_type="q8_0").session().restore(dev)
    # a refused restore leaves the target session as it was
    other = engine.session()
    other.append([1, 2, 3])
    with pytest.raises(lucebox.ConfigError):
        lucebox.Engine(target, ctx=512, device="cpu", kv_type="f16").session().restore(dev)
    assert other.tokens == [1, 2, 3]


def _sparse_snapshot_file(path: Path, region_bytes: int) -> bool:
    """An LBXSNAP1 file whose one region claims `region_bytes` (a sparse file: no disk used).
    False where the file system cannot hold a file that large."""
    import struct

    header = b"LBXSNAP1" + struct.pack("<QQqQQ", 0, 0, -1, 1, region_bytes)
    with open(path, "wb") as f:
        f.write(header)
        try:
            f.truncate(len(header) + region_bytes)
        except OSError:
            return False
    return True


def test_out_of_memory_for_snapshot_data_names_the_bytes(tmp_path: Path) -> None:
    """Snapshot data that cannot be allocated raises OutOfMemoryError naming the bytes (the same
    allocation serves session.snapshot, to_host, copy_snapshot and load)."""
    try:
        overcommit = Path("/proc/sys/vm/overcommit_memory").read_text().strip()
    except OSError:
        overcommit = "?"
    if overcommit not in ("0", "2"):
        pytest.skip("needs the kernel to refuse an 8 TiB allocation (vm.overcommit_memory 0 or 2)")
    path = tmp_path / "huge.lbx"
    if not _sparse_snapshot_file(path, 1 << 43):
        pytest.skip("the file system cannot hold an 8 TiB sparse file")
    with pytest.raises(lucebox.OutOfMemoryError, match=r"host snapshot: it needs 8192\.00 GiB \(8796093022208 bytes\)"):
        lucebox.load_snapshot(path)


@pytest.mark.parametrize("ubatch", [512, 64])
def test_a_restore_anywhere_gives_a_cold_prefills_bits(pair: tuple[str, str], ubatch: int) -> None:
    """The prefix cache's contract on the CPU: a prompt evaluated as a restored prefix plus the rest
    gives the same logits, bit for bit, as one cold evaluation, wherever the restore point is. The
    points cross ggml's CPU attention thresholds that lucebox turns off (configure_cpu_backend): a
    tiled path from 64 query rows on (suffixes of 63 / 64 / 65 rows) and a KV split over the threads
    for one row over >= 512 cache rows (the 1- and 2-token suffixes over ~700 rows)."""
    target, _ = pair
    engine = lucebox.Engine(target, ctx=2048, device="cpu", ubatch=ubatch, threads=2)
    prompt = _prompt(700, 5)
    cold = np.asarray(engine.session().eval(prompt, all_logits=False))
    for k in (1, 100, 511, 512, 513, 635, 636, 637, 650, 698, 699):
        first = engine.session()
        first.eval(prompt[:k])
        warm = engine.session()
        warm.restore(first.snapshot())
        got = np.asarray(warm.eval(prompt[k:], all_logits=False))
        assert np.array_equal(got, cold), f"restore at {k}: max |diff| {np.abs(got - cold).max()}"


def test_a_tokens_logits_do_not_depend_on_its_batch(pair: tuple[str, str]) -> None:
    """A token's logits on the CPU are the same bits whether it is evaluated alone (one query row
    over > 512 cache rows) or inside a batch of 16 or 100 (what makes a decode step and a verify of
    the same token agree, and a restore agree with a cold prefill)."""
    target, _ = pair
    engine = lucebox.Engine(target, ctx=2048, device="cpu", threads=2)
    prompt, more = _prompt(600, 6), _prompt(100, 7)

    def first_16_rows(batch: int) -> np.ndarray:
        """Logits of more[:16] after the prompt, evaluated `batch` tokens at a time."""
        s = engine.session()
        s.eval(prompt)
        rows = [np.asarray(s.eval(more[i:i + batch], all_logits=True)) for i in range(0, 16, batch)]  # [batch, V] each
        return np.concatenate(rows)[:16]

    alone = first_16_rows(1)
    assert np.array_equal(alone, first_16_rows(16)) and np.array_equal(alone, first_16_rows(100))
