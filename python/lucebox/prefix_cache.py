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
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from lucebox.config import check_snapshot_location
from lucebox.errors import OutOfMemoryError

__all__ = ["PrefixCache", "PrefixCacheStats", "start_session"]

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
                 location: str = "host", interval_tokens: int = 0) -> None:
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

    # -- keys -------------------------------------------------------------------------------
    def block_hashes(self, tokens: Sequence[int]) -> list[bytes]:
        """Chain hashes of the first 0, 1, ..., len(tokens) // block_tokens full blocks."""
        tokens = _ids(tokens)
        b = self.block_tokens
        out = [_ROOT]
        for k in range(len(tokens) // b):
            out.append(_chain(out[-1], tokens[k * b:(k + 1) * b]))
        return out

    def key(self, tokens: Sequence[int]) -> bytes:
        """The key of an entry holding exactly `tokens`."""
        tokens = _ids(tokens)
        hashes = self.block_hashes(tokens)
        k = len(hashes) - 1
        return _tail_key(hashes[-1], tokens[k * self.block_tokens:])

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
        len(tokens)), or None. Counts a hit or a miss."""
        tokens = _ids(tokens)
        hashes = self.block_hashes(tokens)
        b = self.block_tokens
        with self._lock:
            for k in range(len(hashes) - 1, -1, -1):
                lengths = self._by_block.get(hashes[k])
                if not lengths:
                    continue
                for n in sorted(lengths, reverse=True):
                    if n > len(tokens):
                        continue
                    key = _tail_key(hashes[k], tokens[k * b:n])
                    entry = self._entries.get(key)
                    if entry is None or entry.n_tokens != n or not np.array_equal(entry.tokens, tokens[:n]):
                        continue
                    self._entries.move_to_end(key)
                    self.hits += 1
                    self.hit_tokens += n
                    return entry.snapshot, n
            self.misses += 1
            return None

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
                self._forget_length(victim)
                self.evictions += 1
                evicted = True
        return evicted

    def insert(self, snapshot: Any) -> bool:
        """Store `snapshot` (keyed by its tokens). Returns False, storing nothing, when it holds a
        pending token, has no tokens or is larger than the whole budget (counted in `too_large`).
        Evicts least recently used entries to stay within the budget."""
        if int(getattr(snapshot, "pending", -1)) >= 0:
            return False
        tokens = _ids(snapshot.tokens)
        nbytes = int(snapshot.nbytes)
        if not len(tokens):
            return False
        if nbytes > self.budget_bytes:
            with self._lock:
                self.too_large += 1
            return False
        hashes = self.block_hashes(tokens)
        block_hash = hashes[-1]
        key = _tail_key(block_hash, tokens[(len(hashes) - 1) * self.block_tokens:])
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
                self._forget_length(old)
            while self._entries and self._bytes + nbytes > self.budget_bytes:
                _, victim = self._entries.popitem(last=False)
                self._bytes -= victim.nbytes
                self._forget_length(victim)
                self.evictions += 1
            entry = _Entry(snapshot, tokens, len(tokens), nbytes, block_hash)
            self._entries[key] = entry
            self._by_block.setdefault(block_hash, collections.Counter())[len(tokens)] += 1
            self._bytes += nbytes
        return True

    def _forget_length(self, entry: _Entry) -> None:
        lengths = self._by_block.get(entry.block_hash)
        if lengths is not None:
            lengths[entry.n_tokens] -= 1
            if lengths[entry.n_tokens] <= 0:
                del lengths[entry.n_tokens]
            if not lengths:
                del self._by_block[entry.block_hash]

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
        with self._lock:
            return PrefixCacheStats(self.hits, self.misses, self.hit_tokens, self._bytes, len(self._entries),
                                    self.evictions, self.too_large, self.out_of_memory)


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
