"""`lucebox.prefix_cache.PrefixCache` with fake snapshots (objects with tokens, nbytes, pending),
and with the real engine (tiny synthetic target): a restored prefix continues token-identically."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import pytest

from lucebox.prefix_cache import PrefixCache


@dataclass
class FakeSnap:
    tokens: list[int]
    nbytes: int = 100
    pending: int = -1
    tag: str = field(default="", compare=False)


def _toks(n: int, seed: int = 0) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, 50_000, n)]


def test_longest_prefix_match() -> None:
    cache = PrefixCache(10_000, block_tokens=8)
    base = _toks(100)
    for n in (5, 8, 20, 37, 64):
        assert cache.insert(FakeSnap(base[:n]))
    assert cache.entries == 5
    for query_len, expected in [(100, 64), (64, 64), (63, 37), (37, 37), (36, 20), (9, 8), (8, 8), (6, 5)]:
        hit = cache.lookup(base[:query_len])
        assert hit is not None and hit[1] == expected
        assert hit[0].tokens == base[:expected]
    assert cache.lookup(base[:4]) is None
    assert cache.lookup(_toks(100, seed=9)) is None
    s = cache.stats()
    assert (s.hits, s.misses, s.hit_tokens) == (8, 2, 64 + 64 + 37 + 37 + 20 + 8 + 8 + 5)


def test_changed_early_token_is_no_hit() -> None:
    cache = PrefixCache(10_000, block_tokens=4)
    base = _toks(40, seed=1)
    cache.insert(FakeSnap(base[:30]))
    for pos in (0, 3, 4, 17, 29):
        changed = list(base)
        changed[pos] += 1
        assert cache.lookup(changed) is None, pos
    # the same block contents after a different first block: the chain hash differs
    other = [base[0] + 1] + base[1:]
    cache.insert(FakeSnap(other[:12]))
    assert cache.lookup(base)[1] == 30
    assert cache.lookup(other)[1] == 12
    # a change after the cached prefix still hits
    later = list(base)
    later[35] += 1
    assert cache.lookup(later)[1] == 30


def test_pending_and_empty_snapshots_are_not_stored() -> None:
    cache = PrefixCache(10_000)
    assert not cache.insert(FakeSnap(_toks(10), pending=7))
    assert not cache.insert(FakeSnap([]))
    assert cache.entries == 0 and cache.bytes == 0


def test_lru_eviction_under_the_budget() -> None:
    cache = PrefixCache(300, block_tokens=4)
    a, b, c, d = (_toks(20, seed=s) for s in range(4))
    for t in (a, b, c):
        assert cache.insert(FakeSnap(t, nbytes=100))
    assert cache.bytes == 300 and cache.entries == 3
    assert cache.lookup(a) is not None  # a is now the most recently used
    cache.insert(FakeSnap(d, nbytes=100))
    assert cache.bytes <= 300 and cache.entries == 3 and cache.evictions == 1
    assert cache.lookup(b) is None  # b was the least recently used
    assert cache.lookup(a) is not None and cache.lookup(c) is not None and cache.lookup(d) is not None
    # a big entry evicts several
    cache.insert(FakeSnap(_toks(20, seed=9), nbytes=250))
    assert cache.bytes <= 300 and cache.entries == 1 and cache.evictions == 4


def test_entry_larger_than_the_budget_is_not_stored() -> None:
    cache = PrefixCache(1000)
    keep = FakeSnap(_toks(10), nbytes=500)
    cache.insert(keep)
    assert not cache.insert(FakeSnap(_toks(10, seed=3), nbytes=1001))
    assert cache.entries == 1 and cache.bytes == 500 and cache.evictions == 0
    assert PrefixCache(0).insert(FakeSnap(_toks(10))) is False


def test_too_large_refusals_are_counted() -> None:
    cache = PrefixCache(1000)
    assert not cache.insert(FakeSnap(_toks(10), nbytes=1001))
    assert not cache.insert(FakeSnap(_toks(10, seed=1), nbytes=5000))
    assert cache.insert(FakeSnap(_toks(10, seed=2), nbytes=1000))  # exactly the budget fits
    assert not cache.insert(FakeSnap(_toks(10, seed=3), pending=4))  # not a size refusal
    s = cache.stats()
    assert (s.too_large, s.out_of_memory, s.entries, s.evictions) == (2, 0, 1, 0)


def test_location_is_validated() -> None:
    from lucebox.errors import ConfigError

    assert PrefixCache(10).location == "host"
    assert PrefixCache(10, location="device").location == "device"
    for bad in ("gpu", "HOST", "", None):
        with pytest.raises(ConfigError, match="must be one of host, device"):
            PrefixCache(10, location=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # ConfigError is a ValueError
        PrefixCache(10, location="vram")


class FakeSession:
    """A session whose snapshot fails with OutOfMemoryError `oom` times first."""

    def __init__(self, tokens: list[int], nbytes: int = 100, oom: int = 0) -> None:
        self.tokens, self.snapshot_nbytes, self.oom, self.taken = tokens, nbytes, oom, []

    def snapshot(self, location: str = "host") -> FakeSnap:
        from lucebox.errors import OutOfMemoryError

        self.taken.append(location)
        if self.oom > 0:
            self.oom -= 1
            raise OutOfMemoryError("out of memory for a device snapshot: it needs 100 bytes")
        return FakeSnap(list(self.tokens), nbytes=self.snapshot_nbytes, tag=location)


def test_snapshot_session_takes_it_at_the_cache_location() -> None:
    cache = PrefixCache(1000, block_tokens=4, location="device")
    s = FakeSession(_toks(20))
    assert cache.snapshot_session(s)
    assert s.taken == ["device"] and cache.lookup(s.tokens)[0].tag == "device"
    # a prefix already held is not snapshotted again
    assert cache.snapshot_session(s) and s.taken == ["device"]
    # too large for the whole budget: refused before any copy
    big = FakeSession(_toks(20, seed=1), nbytes=1001)
    assert not cache.snapshot_session(big)
    assert big.taken == [] and cache.stats().too_large == 1 and cache.entries == 1


def test_snapshot_session_makes_room_first_and_evicts_on_out_of_memory() -> None:
    cache = PrefixCache(300, block_tokens=4)
    for seed in range(3):
        assert cache.insert(FakeSnap(_toks(20, seed=seed), nbytes=100))
    # room is made in the budget before the snapshot is allocated
    assert cache.snapshot_session(FakeSession(_toks(20, seed=10), nbytes=150))
    assert cache.entries == 2 and cache.evictions == 2 and cache.bytes == 250
    # out of memory: evict one more entry per failure and retry
    s = FakeSession(_toks(20, seed=11), nbytes=50, oom=1)
    assert cache.snapshot_session(s)
    assert len(s.taken) == 2 and cache.evictions == 3 and cache.stats().out_of_memory == 0
    # out of memory with nothing left to evict: counted, nothing stored, no exception
    cache.clear()
    s = FakeSession(_toks(20, seed=12), nbytes=50, oom=5)
    assert not cache.snapshot_session(s)
    assert len(s.taken) == 1 and cache.entries == 0
    st = cache.stats()
    assert (st.out_of_memory, st.too_large) == (1, 0)


def test_reinsert_replaces_and_same_block_lengths_are_tracked() -> None:
    cache = PrefixCache(10_000, block_tokens=8)
    base = _toks(30, seed=4)
    cache.insert(FakeSnap(base[:20], nbytes=100, tag="old"))
    cache.insert(FakeSnap(base[:20], nbytes=150, tag="new"))
    assert cache.entries == 1 and cache.bytes == 150
    assert cache.lookup(base)[0].tag == "new"
    # two entries with the same full blocks and length but different tails
    other = base[:16] + [1, 2, 3, 4]
    cache.insert(FakeSnap(other, nbytes=100))
    cache.clear()
    assert cache.entries == 0 and cache.lookup(base) is None
    small = PrefixCache(200, block_tokens=8)
    small.insert(FakeSnap(base[:20], nbytes=100))
    small.insert(FakeSnap(other, nbytes=100))
    small.insert(FakeSnap(_toks(5, seed=8), nbytes=100))  # evicts base[:20] only
    assert small.lookup(base) is None
    assert small.lookup(other + [9])[1] == 20


def test_boundaries() -> None:
    cache = PrefixCache(1000, min_tokens=64)
    assert cache.boundaries(10) == []
    assert cache.boundaries(65) == [64]
    assert cache.boundaries(1000) == [999]


def test_thread_safety_smoke() -> None:
    cache = PrefixCache(50 * 100, block_tokens=4)
    prompts = [_toks(40, seed=s) for s in range(16)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            rng = np.random.default_rng(i)
            for _ in range(300):
                p = prompts[int(rng.integers(len(prompts)))]
                n = int(rng.integers(1, 40))
                if rng.random() < 0.5:
                    cache.insert(FakeSnap(p[:n], nbytes=int(rng.integers(50, 300))))
                else:
                    hit = cache.lookup(p)
                    if hit is not None:
                        assert hit[0].tokens == p[:hit[1]]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = cache.stats()
    assert s.bytes <= cache.budget_bytes
    assert s.bytes == sum(e.nbytes for e in cache._entries.values())
    assert s.entries == sum(sum(c.values()) for c in cache._by_block.values())


# -- with the real engine ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    import lucebox
    from lucebox import synth

    path = tmp_path_factory.mktemp("pc") / "t.gguf"
    synth.write_target(path, "tiny", type="q8_0", seed=41)
    return lucebox.Engine(path, ctx=1024, device="cpu", ubatch=64)


def test_cold_and_warm_through_the_cache_are_identical(engine) -> None:
    prompt = [int(x) for x in np.random.default_rng(5).integers(0, 1000, 300)]
    cold = engine.session().generate(prompt, max_tokens=40).tokens

    cache = PrefixCache(1 << 30, block_tokens=64)
    first = engine.session()
    first.append(prompt[:-1])
    snap = first.snapshot()
    assert snap.pending == -1
    assert cache.insert(snap)
    # append all but the last token, then generate from the last: the same tokens as cold
    assert first.generate([prompt[-1]], max_tokens=40).tokens == cold

    hit = cache.lookup(prompt[:-1])
    assert hit is not None and hit[1] == len(prompt) - 1
    warm = engine.session()
    warm.restore(hit[0])
    assert warm.generate(prompt[hit[1]:], max_tokens=40).tokens == cold

    # a longer prompt sharing the prefix continues from it too
    longer = prompt + [7, 8, 9]
    hit = cache.lookup(longer[:-1])
    assert hit is not None and hit[1] == len(prompt) - 1
    s = engine.session()
    s.restore(hit[0])
    assert s.generate(longer[hit[1]:], max_tokens=20).tokens == engine.session().generate(longer, max_tokens=20).tokens
    # a snapshot taken after generating holds a pending token: not stored
    assert not cache.insert(warm.snapshot())


def test_device_cache_through_snapshot_session(engine) -> None:
    prompt = [int(x) for x in np.random.default_rng(6).integers(0, 1000, 200)]
    cold = engine.session().generate(prompt, max_tokens=30).tokens
    cache = PrefixCache(1 << 30, block_tokens=64, location="device")
    first = engine.session()
    first.append(prompt[:-1])
    assert cache.snapshot_session(first)
    hit = cache.lookup(prompt[:-1])
    assert hit is not None and hit[0].location == "device" and hit[1] == len(prompt) - 1
    assert cache.bytes == hit[0].nbytes == first.snapshot_nbytes
    warm = engine.session()
    warm.restore(hit[0])
    assert warm.generate(prompt[hit[1]:], max_tokens=30).tokens == cold
    # a budget smaller than one snapshot: refused and counted, before any copy
    small = PrefixCache(first.snapshot_nbytes - 1, block_tokens=64, location="device")
    assert not small.snapshot_session(first)
    assert small.stats().too_large == 1 and small.entries == 0
    # a session holding a pending token is not stored
    assert not cache.snapshot_session(warm) and cache.entries == 1


def test_interval_boundaries():
    from lucebox.prefix_cache import PrefixCache

    assert PrefixCache(1 << 20, min_tokens=64).boundaries(10_000) == [9_999]
    cache = PrefixCache(1 << 20, min_tokens=64, interval_tokens=4096)
    assert cache.boundaries(10_000) == [4096, 8192, 9_999]
    assert cache.boundaries(8193) == [4096, 8192]  # the end (8192) is also an interval point
    assert cache.boundaries(50) == []               # below min_tokens: nothing
    with pytest.raises(ValueError):
        PrefixCache(1 << 20, interval_tokens=-1)


def _disk_cache(engine, directory, budget=1 << 30, disk_budget=1 << 30, block=64):
    from lucebox import load_snapshot
    from lucebox.prefix_cache import DiskStore, disk_namespace

    ns = disk_namespace(engine.session().snapshot().fingerprint, engine.model_path, engine.draft_path)
    disk = DiskStore(directory, disk_budget, ns, block_tokens=block)
    return PrefixCache(budget, block_tokens=block, disk=disk,
                       load=lambda p: load_snapshot(p, engine=engine, location="host")), disk


def test_disk_tier_survives_a_restart(engine, tmp_path) -> None:
    """Snapshots written in the background; a new cache on the same directory (a restarted server)
    resumes from disk, token-identically, and loads it into memory for the next hit."""
    prompt = [int(x) for x in np.random.default_rng(7).integers(0, 1000, 260)]
    cold = engine.session().generate(prompt, max_tokens=30).tokens
    cache, disk = _disk_cache(engine, tmp_path)
    s = engine.session()
    s.append(prompt[:100])
    assert cache.snapshot_session(s)
    s.append(prompt[100:-1])
    assert cache.snapshot_session(s)
    disk.flush()
    assert cache.stats().disk_writes == 2 and cache.stats().disk_entries == 2
    disk.close()

    again, disk2 = _disk_cache(engine, tmp_path)  # the restart: nothing in memory
    assert again.entries == 0 and disk2.counters()["disk_entries"] == 2
    hit = again.lookup(prompt[:-1])
    assert hit is not None and hit[1] == len(prompt) - 1 and list(hit[0].tokens) == prompt[:-1]
    warm = engine.session()
    warm.restore(hit[0])
    assert warm.generate(prompt[-1:], max_tokens=30).tokens == cold
    st = again.stats()
    assert st.disk_hits == 1 and st.hits == 1 and again.entries == 1  # now in memory too
    assert again.lookup(prompt[:-1])[1] == len(prompt) - 1 and again.stats().disk_hits == 1
    # a prefix shorter than memory's best is not read from disk; a diverging prompt takes the shorter entry
    other = prompt[:100] + [5, 6, 7]
    assert again.lookup(other)[1] == 100 and again.stats().disk_hits == 2
    disk2.flush()
    assert disk2.counters()["disk_writes"] == 0  # entries loaded from disk are not written back
    disk2.close()


def test_disk_tier_is_per_model_and_cleans_up(engine, tmp_path) -> None:
    import lucebox
    from lucebox import synth
    from lucebox.prefix_cache import DiskStore, disk_namespace

    prompt = [int(x) for x in np.random.default_rng(8).integers(0, 1000, 150)]
    cache, disk = _disk_cache(engine, tmp_path, disk_budget=1 << 30)
    s = engine.session()
    s.append(prompt[:-1])
    cache.snapshot_session(s)
    disk.flush()
    disk.close()
    # the same shapes, other weights: another namespace, no hit
    other_path = tmp_path / "other.gguf"
    synth.write_target(other_path, "tiny", type="q8_0", seed=99)
    other = lucebox.Engine(other_path, ctx=1024, device="cpu", ubatch=64)
    assert other.session().snapshot().fingerprint == engine.session().snapshot().fingerprint
    cache_o, disk_o = _disk_cache(other, tmp_path)
    assert cache_o.lookup(prompt[:-1]) is None and disk_o.counters()["disk_entries"] == 0
    disk_o.close()
    # an interrupted write (a .snap without its .ids, a .tmp) is removed at start; a corrupt
    # .snap is dropped when it fails to load, and the lookup falls back to a miss
    ns = disk_namespace(engine.session().snapshot().fingerprint, engine.model_path, engine.draft_path)
    d = tmp_path / ns
    (d / "00ff.snap").write_bytes(b"partial")
    (d / "abc.snap.tmp").write_bytes(b"partial")
    snap_file = next(f for f in d.glob("*.snap") if f.name != "00ff.snap")
    snap_file.write_bytes(b"LBXSNAP1 but truncated")
    cache2, disk2 = _disk_cache(engine, tmp_path)
    assert not (d / "00ff.snap").exists() and not (d / "abc.snap.tmp").exists()
    assert disk2.counters()["disk_entries"] == 1
    assert cache2.lookup(prompt[:-1]) is None
    c = disk2.counters()
    assert c["disk_errors"] == 1 and c["disk_entries"] == 0 and not snap_file.exists()
    disk2.close()


def test_disk_tier_budget_keeps_the_most_recent(engine, tmp_path) -> None:
    prompts = [[int(x) for x in np.random.default_rng(20 + i).integers(0, 1000, 120)] for i in range(3)]
    s = engine.session()
    s.append(prompts[0][:-1])
    one = s.snapshot_nbytes
    cache, disk = _disk_cache(engine, tmp_path, disk_budget=int(2.5 * one))
    for p in prompts:
        s = engine.session()
        s.append(p[:-1])
        cache.snapshot_session(s)
        disk.flush()
    c = disk.counters()
    assert c["disk_writes"] == 3 and c["disk_entries"] == 2 and c["disk_bytes"] <= 2.5 * one
    disk.close()
    again, disk2 = _disk_cache(engine, tmp_path, disk_budget=int(2.5 * one))
    assert again.lookup(prompts[0][:-1]) is None  # the oldest went
    assert again.lookup(prompts[2][:-1])[1] == 119
    # a snapshot larger than the whole disk budget is not written (counted)
    small, disk3 = _disk_cache(engine, tmp_path / "small", disk_budget=one // 2)
    s = engine.session()
    s.append(prompts[1][:-1])
    small.snapshot_session(s)
    disk3.flush()
    assert disk3.counters()["disk_dropped"] == 1 and disk3.counters()["disk_entries"] == 0
    disk2.close()
    disk3.close()
