"""`PrefixCache`: session snapshots keyed by their token prefix, for reusing long prompts.

A recurrent (Gated DeltaNet) state cannot be truncated like a KV cache, so a session can only
be resumed from a point where it was snapshotted. The cache keeps snapshots
(`Session.snapshot(location)`, in host memory or on the engine's device: `location`) and finds,
for a new prompt, the longest cached prefix of it: restore that snapshot into a session and
evaluate only the rest of the prompt. Device snapshots restore fastest (a device-to-device copy)
but take device memory; host snapshots use pinned memory where the device offers it.

Keys are a hash chain over token blocks of `block_tokens` tokens: the hash of block i covers
block i's int32 tokens and the hash of block i-1 (blake2b), so equal chain hashes mean equal
prefixes, not merely equal blocks. An entry of any length n is keyed by the chain hash of its
``n // block_tokens`` full blocks plus its partial tail; a lookup walks the prompt's chain from
the longest prefix down and checks only entries whose full blocks match. A hit is also checked
token by token (a hash collision can never return a wrong state).

Policy (what the server does): snapshot where the session is, which is the end of the prompt
after prefill, before generation; more precisely after all but the last prompt token, since a
session that generated holds a pending token and a snapshot must have none (the last prompt
token is then evaluated by `generate`). `boundaries(n)` says which prefix lengths are worth
snapshotting. Only snapshots without a pending token are stored.

Disk (optional second tier, `DiskStore`): every stored snapshot is also written, by a background
thread, to a directory that outlives the process; a lookup that the memory tier answers with a
shorter prefix than the disk holds (after a restart: with nothing) loads the longer one from disk
into the memory tier. Files live under a namespace of the model files' identity (path, size,
modification time) and the snapshot layout, so another model never reads them.

Memory: the sum of the entries' `nbytes` stays <= `budget_bytes`; the least recently used
entries are evicted first; an entry larger than the whole budget is not stored and counted in
`too_large` (an operator then sees that the budget is too small, not merely no hits).
`snapshot_session` takes the snapshot itself: it refuses a too-large one before copying anything,
makes room first (so evicted device snapshots free their memory before the new one is allocated),
and when the memory at `location` is still short (OutOfMemoryError) evicts more and retries, and
finally gives up counting `out_of_memory` (the session is unchanged). All methods are thread-safe
(one lock, not held while copying); snapshots are immutable, so a snapshot returned by `lookup`
stays valid after its entry is evicted (its memory is freed when the last reference goes).
"""
from __future__ import annotations

import collections
import hashlib
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from lucebox.config import check_snapshot_location
from lucebox.errors import OutOfMemoryError

__all__ = ["PrefixCache", "PrefixCacheStats", "DiskStore", "disk_namespace", "start_session"]

_log = logging.getLogger("lucebox.prefix_cache")

_DIGEST = 16
_ROOT = b"\x00" * _DIGEST


def _ids(tokens: Sequence[int]) -> np.ndarray:
    """Token ids as a contiguous int32 array (one conversion per call; hashing and comparing
    then work on its bytes)."""
    return np.ascontiguousarray(np.asarray(tokens, dtype=np.int32).reshape(-1))


def _chain(prev: bytes, tokens: np.ndarray) -> bytes:
    h = hashlib.blake2b(prev, digest_size=_DIGEST)
    h.update(tokens.tobytes())
    return h.digest()


def _tail_key(block_hash: bytes, tail: np.ndarray) -> bytes:
    """Key of an entry: the chain hash of its full blocks and its partial last block."""
    h = hashlib.blake2b(block_hash, digest_size=_DIGEST, person=b"lucebox-tail")
    h.update(tail.tobytes())
    return h.digest()


def _block_hashes(tokens: np.ndarray, block_tokens: int) -> list[bytes]:
    """Chain hashes of the first 0, 1, ..., len(tokens) // block_tokens full blocks."""
    out = [_ROOT]
    for k in range(len(tokens) // block_tokens):
        out.append(_chain(out[-1], tokens[k * block_tokens:(k + 1) * block_tokens]))
    return out


def _entry_key(tokens: np.ndarray, block_tokens: int) -> tuple[bytes, bytes]:
    """(key, chain hash of the full blocks) of an entry holding exactly `tokens`."""
    hashes = _block_hashes(tokens, block_tokens)
    return _tail_key(hashes[-1], tokens[(len(hashes) - 1) * block_tokens:]), hashes[-1]


def _longest(tokens: np.ndarray, hashes: list[bytes], block_tokens: int,
             by_block: dict[bytes, collections.Counter[int]], entries: Any) -> tuple[bytes, int] | None:
    """(key, length) of the longest entry of `entries` (key -> object with `tokens`) that is a
    prefix of `tokens`, by the chain hashes, then checked token by token; None if there is none."""
    for k in range(len(hashes) - 1, -1, -1):
        lengths = by_block.get(hashes[k])
        if not lengths:
            continue
        for n in sorted(lengths, reverse=True):
            if n > len(tokens):
                continue
            key = _tail_key(hashes[k], tokens[k * block_tokens:n])
            entry = entries.get(key)
            if entry is not None and len(entry.tokens) == n and np.array_equal(entry.tokens, tokens[:n]):
                return key, n
    return None


def _forget(by_block: dict[bytes, collections.Counter[int]], block_hash: bytes, n_tokens: int) -> None:
    lengths = by_block.get(block_hash)
    if lengths is not None:
        lengths[n_tokens] -= 1
        if lengths[n_tokens] <= 0:
            del lengths[n_tokens]
        if not lengths:
            del by_block[block_hash]


@dataclass(frozen=True)
class PrefixCacheStats:
    hits: int
    misses: int
    hit_tokens: int
    bytes: int
    entries: int
    evictions: int
    too_large: int = 0      # snapshots refused because they exceed the whole budget
    out_of_memory: int = 0  # snapshots not taken: memory at the cache's location was short
    disk_hits: int = 0      # lookups answered (a longer prefix) from the disk tier
    disk_entries: int = 0
    disk_bytes: int = 0
    disk_writes: int = 0    # snapshots written to disk
    disk_dropped: int = 0   # snapshots not written: the writer was behind, or the file was bigger than the disk budget
    disk_errors: int = 0    # writes or loads that failed (logged; the file is removed)


@dataclass
class _Entry:
    snapshot: Any
    tokens: np.ndarray  # int32 [n_tokens], kept to verify hits without asking the snapshot
    n_tokens: int
    nbytes: int
    block_hash: bytes


class PrefixCache:
    """Snapshots keyed by token prefix; LRU under `budget_bytes`; snapshots taken at `location`
    ("host" or "device", see `Session.snapshot`).

    >>> cache = PrefixCache(1 << 30, location="device")
    >>> cache.snapshot_session(session)           # or cache.insert(session.snapshot(cache.location))
    >>> hit = cache.lookup(prompt_ids)            # (snapshot, n_tokens) or None
    """

    def __init__(self, budget_bytes: int, block_tokens: int = 256, min_tokens: int = 64,
                 location: str = "host", interval_tokens: int = 0, disk: "DiskStore | None" = None,
                 load: Callable[[str], Any] | None = None) -> None:
        if budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0")
        if block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        if interval_tokens < 0:
            raise ValueError("interval_tokens must be >= 0")
        self.interval_tokens = int(interval_tokens)
        self.location = check_snapshot_location(location)  # ConfigError (a ValueError) otherwise
        self.budget_bytes = int(budget_bytes)
        self.block_tokens = int(block_tokens)
        self.min_tokens = int(min_tokens)
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[bytes, _Entry] = collections.OrderedDict()  # LRU first
        self._by_block: dict[bytes, collections.Counter[int]] = {}  # full-block chain hash -> lengths held
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        self.hit_tokens = 0
        self.evictions = 0
        self.too_large = 0
        self.out_of_memory = 0
        # the disk tier and how to read one of its files into a snapshot at `location`
        # (e.g. lambda path: lucebox.load_snapshot(path, engine=engine, location=location))
        if disk is not None and disk.block_tokens != self.block_tokens:
            raise ValueError("the disk tier's block_tokens must be the cache's")
        self.disk = disk
        self._load = load

    # -- keys -------------------------------------------------------------------------------
    def block_hashes(self, tokens: Sequence[int]) -> list[bytes]:
        """Chain hashes of the first 0, 1, ..., len(tokens) // block_tokens full blocks."""
        return _block_hashes(_ids(tokens), self.block_tokens)

    def key(self, tokens: Sequence[int]) -> bytes:
        """The key of an entry holding exactly `tokens`."""
        return _entry_key(_ids(tokens), self.block_tokens)[0]

    # -- policy -----------------------------------------------------------------------------
    def boundaries(self, n_prompt: int) -> list[int]:
        """Prefix lengths worth snapshotting for a prompt of `n_prompt` tokens, ascending: every
        multiple of `interval_tokens` (when > 0) inside the prompt, so a later prompt that shares
        only the first part of a long one still resumes near the divergence, and the end of the
        prompt less its last token (see the module docstring); only lengths of at least
        `min_tokens` (below that, prefill is cheaper than keeping the state)."""
        end = n_prompt - 1
        points = set()
        if self.interval_tokens > 0:
            points.update(range(self.interval_tokens, end, self.interval_tokens))
        points.add(end)
        return sorted(p for p in points if p >= max(1, self.min_tokens))

    # -- operations -------------------------------------------------------------------------
    def lookup(self, tokens: Sequence[int]) -> tuple[Any, int] | None:
        """(snapshot, n_tokens) of the longest cached prefix of `tokens` (n_tokens <=
        len(tokens)), or None. Counts a hit or a miss. With a disk tier holding a longer prefix
        than memory, that snapshot is loaded (and kept in memory); a file that fails to load is
        removed and the memory tier's answer stands."""
        tokens = _ids(tokens)
        hashes = self.block_hashes(tokens)
        best: tuple[Any, int] | None = None
        with self._lock:
            found = _longest(tokens, hashes, self.block_tokens, self._by_block, self._entries)
            if found is not None:
                self._entries.move_to_end(found[0])
                best = self._entries[found[0]].snapshot, found[1]
        if self.disk is not None and self._load is not None:
            on_disk = self.disk.lookup(tokens, hashes, longer_than=best[1] if best is not None else 0)
            if on_disk is not None:
                loaded = self._load_from_disk(*on_disk, tokens)
                if loaded is not None:
                    best = loaded, on_disk[1]
                    self.insert(loaded, to_disk=False)
        with self._lock:
            if best is None:
                self.misses += 1
            else:
                self.hits += 1
                self.hit_tokens += best[1]
        return best

    def _load_from_disk(self, key: bytes, n: int, tokens: np.ndarray) -> Any | None:
        assert self.disk is not None and self._load is not None
        try:
            snap = self._load(str(self.disk.snapshot_path(key)))
            if len(snap.tokens) != n or not np.array_equal(_ids(snap.tokens), tokens[:n]):
                raise ValueError(f"the file holds {len(snap.tokens)} other tokens")
        except Exception as exc:  # a corrupt or foreign file, or no memory at the location: not used
            _log.warning("prefix cache: loading a %d-token prefix from disk failed (%s); prefilling instead", n, exc)
            self.disk.discard(key, failed=True)
            return None
        self.disk.record_hit()
        return snap

    def snapshot_session(self, session: Any) -> bool:
        """Snapshot `session` at the cache's location and `insert` it. Returns False, storing
        nothing, when the snapshot would exceed the whole budget (counted in `too_large`, before
        anything is copied), holds a pending token, or does not fit in memory even after evicting
        every entry (counted in `out_of_memory`); the session is unchanged in every case. A
        prefix already cached is only marked as recently used (True, nothing copied)."""
        tokens = [int(t) for t in session.tokens]
        key = self.key(tokens)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and list(entry.snapshot.tokens) == tokens:
                self._entries.move_to_end(key)
                return True
        need = int(session.snapshot_nbytes)
        if need > self.budget_bytes:
            with self._lock:
                self.too_large += 1
            return False
        self._evict_for(need)  # free memory (on the device too) before allocating the new snapshot
        while True:
            try:
                snapshot = session.snapshot(self.location)
                break
            except OutOfMemoryError:
                if not self._evict_for(None):
                    with self._lock:
                        self.out_of_memory += 1
                    return False
        return self.insert(snapshot)

    def _evict_for(self, nbytes: int | None) -> bool:
        """Evict least recently used entries until `nbytes` more fit in the budget, or (None) one
        entry. Returns whether anything was evicted."""
        evicted = False
        with self._lock:
            while self._entries:
                if (evicted if nbytes is None else self._bytes + nbytes <= self.budget_bytes):
                    break
                _, victim = self._entries.popitem(last=False)
                self._bytes -= victim.nbytes
                _forget(self._by_block, victim.block_hash, victim.n_tokens)
                self.evictions += 1
                evicted = True
        return evicted

    def insert(self, snapshot: Any, to_disk: bool = True) -> bool:
        """Store `snapshot` (keyed by its tokens), and queue it for the disk tier (to_disk).
        Returns False, storing nothing in memory, when it holds a pending token, has no tokens or
        is larger than the whole budget (counted in `too_large`). Evicts least recently used
        entries to stay within the budget."""
        if int(getattr(snapshot, "pending", -1)) >= 0:
            return False
        tokens = _ids(snapshot.tokens)
        nbytes = int(snapshot.nbytes)
        if not len(tokens):
            return False
        if to_disk and self.disk is not None:
            self.disk.put(snapshot)
        if nbytes > self.budget_bytes:
            with self._lock:
                self.too_large += 1
            return False
        key, block_hash = _entry_key(tokens, self.block_tokens)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
                _forget(self._by_block, old.block_hash, old.n_tokens)
            while self._entries and self._bytes + nbytes > self.budget_bytes:
                _, victim = self._entries.popitem(last=False)
                self._bytes -= victim.nbytes
                _forget(self._by_block, victim.block_hash, victim.n_tokens)
                self.evictions += 1
            entry = _Entry(snapshot, tokens, len(tokens), nbytes, block_hash)
            self._entries[key] = entry
            self._by_block.setdefault(block_hash, collections.Counter())[len(tokens)] += 1
            self._bytes += nbytes
        return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._by_block.clear()
            self._bytes = 0

    # -- counters ---------------------------------------------------------------------------
    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def entries(self) -> int:
        return len(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> PrefixCacheStats:
        disk = self.disk.counters() if self.disk is not None else {}
        with self._lock:
            return PrefixCacheStats(self.hits, self.misses, self.hit_tokens, self._bytes, len(self._entries),
                                    self.evictions, self.too_large, self.out_of_memory, **disk)


def disk_namespace(fingerprint: str, *files: str | os.PathLike[str] | None) -> str:
    """A directory name for the snapshots of one model setup: the snapshot layout
    (`Snapshot.fingerprint`: shapes, KV types, draft) and each model file's resolved path, size and
    modification time (the layout alone does not tell two quantizations or fine-tunes apart)."""
    h = hashlib.blake2b(digest_size=12, person=b"lucebox-disk")
    h.update(fingerprint.encode())
    for f in files:
        if f is None:
            h.update(b"\0-")
            continue
        path = Path(f).resolve()
        st = path.stat()
        h.update(f"\0{path}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()


@dataclass
class _DiskEntry:
    tokens: np.ndarray  # int32 [n_tokens]
    nbytes: int         # both files
    block_hash: bytes
    used: float         # last use, seconds since the epoch (the .snap file's mtime)


class DiskStore:
    """The prefix cache's disk tier: snapshot files under `directory`/`namespace`/, at most
    `budget_bytes` of them (least recently used removed first), written by one background thread.

    An entry is `<key>.snap` (`Snapshot.save`) and `<key>.ids` (its int32 tokens), each written to
    a temporary name and renamed, the .ids last: an entry exists once its .ids does. At start the
    .ids files rebuild the index (a .snap without its .ids, an interrupted write, is removed).
    `put` never blocks the caller: a snapshot arriving while `max_pending` wait is dropped
    (counted). Snapshots are immutable, so writing one while it is used elsewhere is safe.
    """

    def __init__(self, directory: str | os.PathLike[str], budget_bytes: int, namespace: str,
                 block_tokens: int = 256, max_pending: int = 4) -> None:
        if budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0")
        self.dir = Path(directory) / namespace
        self.dir.mkdir(parents=True, exist_ok=True)
        self.budget_bytes = int(budget_bytes)
        self.block_tokens = int(block_tokens)
        self._lock = threading.Lock()
        self._entries: dict[bytes, _DiskEntry] = {}
        self._by_block: dict[bytes, collections.Counter[int]] = {}
        self._bytes = 0
        self.hits = 0
        self.writes = 0
        self.dropped = 0
        self.errors = 0
        self._queue: queue.Queue[Any] = queue.Queue(max_pending)
        self._scan()
        self._thread = threading.Thread(target=self._write_loop, name="lucebox-prefix-disk", daemon=True)
        self._thread.start()

    # -- files ----------------------------------------------------------------------------------
    def snapshot_path(self, key: bytes) -> Path:
        return self.dir / (key.hex() + ".snap")

    def _ids_path(self, key: bytes) -> Path:
        return self.dir / (key.hex() + ".ids")

    def _scan(self) -> None:
        for f in self.dir.iterdir():
            if f.name.endswith(".tmp") or (f.suffix == ".snap" and not f.with_suffix(".ids").exists()):
                f.unlink(missing_ok=True)  # an interrupted write
        for ids in self.dir.glob("*.ids"):
            snap = ids.with_suffix(".snap")
            try:
                tokens = np.fromfile(ids, dtype=np.int32)
                st = snap.stat()
                nbytes = st.st_size + ids.stat().st_size
            except (OSError, ValueError):
                ids.unlink(missing_ok=True)
                snap.unlink(missing_ok=True)
                continue
            key, block_hash = _entry_key(tokens, self.block_tokens)
            if not len(tokens) or key.hex() != ids.stem:  # not written by this layout of keys
                ids.unlink(missing_ok=True)
                snap.unlink(missing_ok=True)
                continue
            self._add(key, _DiskEntry(tokens, nbytes, block_hash, st.st_mtime))
        self._evict_for(0)

    def _add(self, key: bytes, entry: _DiskEntry) -> None:
        self._entries[key] = entry
        self._by_block.setdefault(entry.block_hash, collections.Counter())[len(entry.tokens)] += 1
        self._bytes += entry.nbytes

    def discard(self, key: bytes, failed: bool = False) -> None:
        """Remove an entry and its files (failed: it could not be read; counted in `errors`)."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.nbytes
                _forget(self._by_block, entry.block_hash, len(entry.tokens))
            if failed:
                self.errors += 1
        self._ids_path(key).unlink(missing_ok=True)
        self.snapshot_path(key).unlink(missing_ok=True)

    def _evict_for(self, nbytes: int) -> None:
        """Remove least recently used entries until `nbytes` more fit in the budget."""
        while True:
            with self._lock:
                if not self._entries or self._bytes + nbytes <= self.budget_bytes:
                    return
                key = min(self._entries, key=lambda k: self._entries[k].used)
            self.discard(key)

    # -- operations -----------------------------------------------------------------------------
    def lookup(self, tokens: np.ndarray, hashes: list[bytes], longer_than: int = 0) -> tuple[bytes, int] | None:
        """(key, n_tokens) of the longest entry that is a prefix of `tokens` and longer than
        `longer_than`, marked as used; None if there is none."""
        with self._lock:
            found = _longest(tokens, hashes, self.block_tokens, self._by_block, self._entries)
            if found is None or found[1] <= longer_than:
                return None
            self._entries[found[0]].used = time.time()
        try:
            os.utime(self.snapshot_path(found[0]))  # the use survives a restart
        except OSError:
            pass
        return found

    def put(self, snapshot: Any) -> None:
        """Queue `snapshot` for writing unless its prefix is already on disk."""
        tokens = _ids(snapshot.tokens)
        key, block_hash = _entry_key(tokens, self.block_tokens)
        with self._lock:
            if key in self._entries:
                self._entries[key].used = time.time()
                return
        try:
            self._queue.put_nowait((key, block_hash, tokens, snapshot))
        except queue.Full:
            with self._lock:
                self.dropped += 1

    def flush(self) -> None:
        """Wait until every queued snapshot is written (or dropped)."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            finally:
                self._queue.task_done()

    def _write(self, key: bytes, block_hash: bytes, tokens: np.ndarray, snapshot: Any) -> None:
        with self._lock:
            if key in self._entries:
                return
        need = int(snapshot.nbytes) + tokens.nbytes
        if need > self.budget_bytes:
            with self._lock:
                self.dropped += 1
            return
        self._evict_for(need)
        snap_path, ids_path = self.snapshot_path(key), self._ids_path(key)
        snap_tmp, ids_tmp = snap_path.with_name(snap_path.name + ".tmp"), ids_path.with_name(ids_path.name + ".tmp")
        try:
            snapshot.save(str(snap_tmp))
            os.replace(snap_tmp, snap_path)
            tokens.tofile(ids_tmp)
            os.replace(ids_tmp, ids_path)
            nbytes = snap_path.stat().st_size + ids_path.stat().st_size
        except Exception as exc:  # disk full, unwritable directory, ...: the memory tier goes on
            _log.warning("prefix cache: writing a %d-token snapshot to %s failed (%s)", len(tokens), self.dir, exc)
            for f in (snap_tmp, ids_tmp, snap_path, ids_path):
                f.unlink(missing_ok=True)
            with self._lock:
                self.errors += 1
            return
        with self._lock:
            self._add(key, _DiskEntry(tokens, nbytes, block_hash, time.time()))
            self.writes += 1
        self._evict_for(0)  # the file may be a little larger than the snapshot's own count

    def record_hit(self) -> None:
        with self._lock:
            self.hits += 1

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {"disk_hits": self.hits, "disk_entries": len(self._entries), "disk_bytes": self._bytes,
                    "disk_writes": self.writes, "disk_dropped": self.dropped, "disk_errors": self.errors}


def start_session(session: Any, prompt_ids: Sequence[int], cache: Any = None,
                  points: Sequence[int] = ()) -> tuple[list[int], float]:
    """Put `session` at the start of `prompt_ids` (the server's policy; bench/bench_prefix.py
    measures it): reset it, or restore the longest cached prefix of the prompt (less its last token, so at least one token is left to generate from). Then,
    at each of the cache's `boundaries` (the prompt less its last token, for a long prompt) and
    of `points` beyond that prefix, prefill up to it and insert a snapshot. Returns (the prompt
    ids still to feed to generation, seconds spent). Evaluating a prefix with `append` and the
    rest with `generate` yields the same tokens as generating from the whole prompt."""
    ids = [int(t) for t in prompt_ids]
    if cache is None or len(ids) - 1 < max(1, cache.min_tokens):
        session.reset()
        return ids, 0.0
    t0 = time.perf_counter()
    pos = 0
    hit = cache.lookup(ids[:-1])
    if hit is not None:
        try:
            session.restore(hit[0])
            pos = hit[1]
        except Exception as exc:  # never expected (one engine); fall back to a cold start
            _log.warning("prefix cache: restoring a %d-token prefix failed (%s); prefilling instead", hit[1], exc)
            session.reset()
    else:
        session.reset()
    for end in sorted(set(cache.boundaries(len(ids))) | {int(p) for p in points}):
        if pos < end < len(ids):
            session.append(ids[pos:end])
            pos = end
            cache.snapshot_session(session)  # at the cache's location; refusals are counted there
    return ids[pos:], time.perf_counter() - t0
