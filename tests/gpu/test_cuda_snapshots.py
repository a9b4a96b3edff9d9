"""Session snapshots on CUDA: device snapshots (data in GPU memory, restored device-to-device)
and host snapshots (pinned memory) continue exactly as the snapshotted session does, with and
without a draft; a device snapshot saves to disk and loads back (plain, pinned or on the device);
device memory that cannot hold a snapshot gives OutOfMemoryError naming the bytes. Timing is
not asserted here (bench/bench_prefix.py measures it)."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import lucebox
from lucebox import synth

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("gpu-snap")
    t, dr = str(d / "t.gguf"), str(d / "d.gguf")
    synth.write_target(t, "tiny", type="q8_0", seed=51)
    synth.write_draft(dr, "tiny", type="q8_0", seed=52)
    return t, dr


def _prompt(n: int, seed: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, 1000, n)]


@pytest.mark.parametrize("with_draft", [False, True])
def test_device_and_host_snapshots_continue_identically(pair: tuple[str, str], with_draft: bool) -> None:
    target, draft = pair
    # spec "chain": the step sequence then depends only on the state; under "auto" it also depends on
    # measured step times, and on CUDA a 16-token verify and a 1-token step round differently
    engine = lucebox.Engine(target, draft if with_draft else None, ctx=2048, device="cuda", ubatch=64,
                            spec="chain" if with_draft else "off")
    prefix, suffix = _prompt(700, 1), _prompt(20, 2)
    first = engine.session()
    first.append(prefix)
    dev = first.snapshot("device")
    host = first.snapshot("host")
    assert (dev.location, host.location) == ("device", "host")
    assert dev.nbytes == host.nbytes == first.snapshot_nbytes
    # the reference: the snapshotted session itself continues (same batches, so bit-identical)
    expected = first.generate(suffix, max_tokens=40).tokens
    dirty = engine.session()
    dirty.generate(_prompt(900, 3), max_tokens=8)  # a session holding other, longer state
    for snap in (dev, host, dev.to_host(), engine.copy_snapshot(host, "device"), dev):
        dirty.restore(snap)
        assert dirty.tokens == prefix
        assert dirty.generate(suffix, max_tokens=40).tokens == expected


def test_device_snapshot_disk_round_trip(pair: tuple[str, str], tmp_path: Path) -> None:
    target, draft = pair
    engine = lucebox.Engine(target, draft, ctx=1024, device="cuda", spec="chain")  # see above
    s = engine.session()
    s.append(_prompt(300, 4))
    dev = s.snapshot("device")
    dev.save(str(tmp_path / "dev.lbx"))
    s.snapshot().save(str(tmp_path / "host.lbx"))
    assert (tmp_path / "dev.lbx").read_bytes() == (tmp_path / "host.lbx").read_bytes()
    expected = s.generate(_prompt(10, 5), max_tokens=30).tokens
    for snap in (lucebox.load_snapshot(tmp_path / "dev.lbx"),
                 lucebox.load_snapshot(tmp_path / "dev.lbx", engine=engine),
                 lucebox.load_snapshot(tmp_path / "dev.lbx", engine=engine, location="device")):
        s2 = engine.session()
        s2.restore(snap)
        assert s2.generate(_prompt(10, 5), max_tokens=30).tokens == expected


def test_device_out_of_memory_names_the_bytes(pair: tuple[str, str], tmp_path: Path) -> None:
    target, _ = pair
    engine = lucebox.Engine(target, ctx=512, device="cuda")
    path = tmp_path / "huge.lbx"  # one region claiming 8 TiB (sparse: no disk used)
    header = b"LBXSNAP1" + struct.pack("<QQqQQ", 0, 0, -1, 1, 1 << 43)
    with open(path, "wb") as f:
        f.write(header)
        try:
            f.truncate(len(header) + (1 << 43))
        except OSError:
            pytest.skip("the file system cannot hold an 8 TiB sparse file")
    with pytest.raises(lucebox.OutOfMemoryError,
                       match=r"device snapshot: it needs 8192\.00 GiB \(8796093022208 bytes\)"):
        lucebox.load_snapshot(path, engine=engine, location="device")
    # the engine is still usable
    s = engine.session()
    s.append(_prompt(50, 6))
    snap = s.snapshot("device")
    expected = s.generate([1, 2], max_tokens=10).tokens
    s2 = engine.session()
    s2.restore(snap)
    assert s2.generate([1, 2], max_tokens=10).tokens == expected


@pytest.mark.parametrize("location", ["host", "device"])
def test_prefix_cache_disk_tier_on_cuda(pair: tuple[str, str], tmp_path: Path, location: str) -> None:
    """The prefix cache's disk tier with CUDA snapshots: written in the background (device ones
    through host memory), read back by a new cache (a restart) into `location`, and the restored
    session continues as the session that was snapshotted would."""
    from lucebox.prefix_cache import DiskStore, PrefixCache, disk_namespace

    target, draft = pair
    engine = lucebox.Engine(target, draft, ctx=2048, device="cuda", ubatch=64, spec="chain")
    prompt = _prompt(600, 7)
    ref = engine.session()  # the restored session's op path: the prefix as a prefill, then the last token
    ref.append(prompt[:-1])
    cold = ref.generate(prompt[-1:], max_tokens=24).tokens
    ns = disk_namespace(engine.session().snapshot().fingerprint, engine.model_path, engine.draft_path)

    def cache() -> tuple[PrefixCache, DiskStore]:
        disk = DiskStore(tmp_path, 1 << 30, ns, block_tokens=64)
        return PrefixCache(1 << 30, block_tokens=64, location=location, disk=disk,
                           load=lambda p: lucebox.load_snapshot(p, engine=engine, location=location)), disk

    first, disk = cache()
    s = engine.session()
    s.append(prompt[:-1])
    assert first.snapshot_session(s)
    disk.close()
    again, disk2 = cache()
    hit = again.lookup(prompt[:-1])
    assert hit is not None and hit[1] == len(prompt) - 1 and hit[0].location == location
    warm = engine.session()
    warm.restore(hit[0])
    assert warm.generate(prompt[-1:], max_tokens=24).tokens == cold
    assert again.stats().disk_hits == 1
    disk2.close()
