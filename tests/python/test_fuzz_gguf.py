"""Fuzzing the GGUF loader: hundreds of truncated, bit-flipped and structurally mutated files.

Every mutated file is opened (TargetFile.open / DraftFile.open, then plan_memory and
validate_draft against the valid base pair, as `lucebox info` does) in a subprocess worker under a
4 GiB address-space limit and a per-case watchdog (see gguf_mutations.run_cases). A case fails
when the worker raises anything but GGUFError / UnsupportedError / DraftMismatchError (e.g.
MemoryError from a runaway allocation, SystemError), when the error message does not name the
file, when the worker dies (abort, segfault) or when it stops answering (hang). The failure message
lists every failing case with its exact mutation; the files of failing cases are kept in tmp_path.

Cases are deterministic (fixed seed): ~150 truncations biased toward the header and metadata,
~250 files with 1-8 bit flips / byte overwrites biased toward the metadata, and structured
mutations that set counts, lengths, types, dims, offsets and u32 hyperparameters found by parsing
the header to extreme values (0, 2**31, 0xffffffff, 2**62, 2**64-1, ...).
"""
from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import gguf_mutations as gm  # noqa: E402

from lucebox import synth  # noqa: E402

SEED = 20240611
N_TRUNCATIONS = 150  # split between the target and the draft
N_FLIPS = 250
CASE_TIMEOUT_S = 5.0  # a ~1 MB file opens in well under a millisecond
TOTAL_TIMEOUT_S = 90.0
AS_LIMIT = 4 << 30
MAX_RSS_KB = 1536 << 10  # peak RSS of a worker that finished all its cases

U64_EXTREMES = (0, 1, 2**31, 0xFFFFFFFF, 2**62, 2**64 - 1)
U32_EXTREMES = (0, 0x01000000, 0x80000000, 0xFFFFFFFF)


@dataclass
class Case:
    case_id: str
    kind: str  # "target" or "draft"
    what: str  # the mutation, in words, enough to reproduce it
    data: bytes
    must_fail: bool = False  # an "ok" result is a failure too (e.g. tensor data cut off)


@pytest.fixture(scope="module")
def base_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("fuzz-base")
    target, draft = d / "tiny-target.gguf", d / "tiny-draft.gguf"
    synth.write_target(target, "tiny", type="q8_0", seed=0)
    synth.write_draft(draft, "tiny", type="q8_0", seed=1)
    return {"target": target, "draft": draft}


# --------------------------------------------------------------------------------------------
# Case generation
# --------------------------------------------------------------------------------------------

def _truncations(kind: str, data: bytes, lay: gm.Layout, rng: random.Random, n: int) -> list[Case]:
    cuts = {0, 1, 3, 4, 7, 8, 15, 16, 23, 24, lay.kv_start + 4, lay.ti_start - 1, lay.ti_start, lay.ti_start + 1,
            lay.data_start - 1, lay.data_start, lay.data_start + 1, len(data) - 1}
    for _name, start, nbytes in lay.tensors[:3] + lay.tensors[-2:]:
        cuts.update({start, start + nbytes - 1})
    while len(cuts) < n:
        r = rng.random()
        if r < 0.15:
            cut = rng.randrange(0, 64)  # magic, version, counts, first key
        elif r < 0.55:
            cut = rng.randrange(lay.kv_start, lay.ti_start)  # metadata
        elif r < 0.80:
            cut = rng.randrange(lay.ti_start, lay.data_start + 1)  # tensor directory
        else:
            cut = rng.randrange(lay.data_start, len(data))  # tensor data
        cuts.add(cut)
    data_end = max(start + nbytes for _name, start, nbytes in lay.tensors)
    return [Case(f"{kind}-trunc-{i:03d}", kind,
                 f"truncate the valid {kind} ({len(data)} bytes) to {cut} bytes (cut in {lay.locate(cut)})",
                 data[:cut], must_fail=cut < data_end)
            for i, cut in enumerate(sorted(cuts))]


def _flip_position(lay: gm.Layout, size: int, rng: random.Random) -> int:
    r = rng.random()
    if r < 0.30:
        f = rng.choice(lay.fields)  # a count, length, type, dim or offset
        return f.offset + rng.randrange(f.size)
    if r < 0.55:
        return rng.randrange(0, lay.ti_start)  # header + metadata
    if r < 0.80:
        return rng.randrange(lay.ti_start, lay.data_start)  # tensor directory
    return rng.randrange(lay.data_start, size)  # tensor data


def _flips(kind: str, data: bytes, lay: gm.Layout, rng: random.Random, n: int) -> list[Case]:
    cases = []
    for i in range(n):
        b = bytearray(data)
        edits = []
        for _ in range(rng.randint(1, 8)):
            pos = _flip_position(lay, len(data), rng)
            old = b[pos]
            op = rng.random()
            if op < 0.6:
                b[pos] ^= 1 << rng.randrange(8)
            elif op < 0.8:
                b[pos] = rng.randrange(256)
            elif op < 0.9:
                b[pos] = 0x00
            else:
                b[pos] = 0xFF
            if b[pos] != old:
                edits.append(f"byte {pos} ({lay.locate(pos)}) 0x{old:02x}->0x{b[pos]:02x}")
        what = "; ".join(edits) if edits else "no change"
        cases.append(Case(f"{kind}-flip-{i:03d}", kind, f"in the valid {kind}: {what}", bytes(b)))
    return cases


def _structured(kind: str, data: bytes, lay: gm.Layout, rng: random.Random) -> list[Case]:
    """Set fields found by parsing the header to extreme or off-by-one values."""
    plan: list[tuple[gm.Field, int]] = []
    by_kind = {k: lay.by_kind(k) for k in ("version", "count", "strlen", "type", "u32", "ndims", "dim", "ttype",
                                            "toffset")}

    def value(f: gm.Field) -> int:
        return int.from_bytes(data[f.offset:f.offset + f.size], "little")

    for f in by_kind["version"]:
        plan += [(f, v) for v in (0, 1, 2, 4, 0x00030000, 0xFFFFFFFF)]
    header = [f for f in by_kind["count"] if f.label.startswith("header.")]
    for f in header:
        plan += [(f, v) for v in U64_EXTREMES + (value(f) + 1, value(f) - 1)]
    kv_lengths = [f for f in by_kind["count"] + by_kind["strlen"]
                  if f.label.startswith("kv[")]
    for f in sorted(rng.sample(kv_lengths, min(10, len(kv_lengths))), key=lambda f: f.offset):
        plan += [(f, v) for v in (2**62, 2**31, 0xFFFFFFFF, value(f) + 1)]
    kv_types = by_kind["type"]
    for f in sorted(rng.sample(kv_types, min(6, len(kv_types))), key=lambda f: f.offset):
        plan += [(f, v) for v in (8, 9, 13, 0xFFFFFFFF)]
    for f in by_kind["u32"]:  # every u32 hyperparameter (block_count, head counts, sizes, ids...)
        plan += [(f, v) for v in U32_EXTREMES]
    names = [t[0] for t in lay.tensors]
    picked = set(names[:2] + names[-1:] + rng.sample(names, 2))
    for f in lay.fields:
        if not f.label.startswith("tensor[") or f.label.split("]")[0][len("tensor["):] not in picked:
            continue
        if f.kind == "strlen":
            plan += [(f, v) for v in (0, 64, 2**62)]
        elif f.kind == "ndims":
            plan += [(f, v) for v in (0, 1, 5, 0xFFFFFFFF)]
        elif f.kind == "dim":
            plan += [(f, v) for v in (0, 2**31, 0xFFFFFFFF, 2**62, 2**63, value(f) * 2)]
        elif f.kind == "ttype":
            plan += [(f, v) for v in (0, 1, 4, 24, 39, 0xFFFFFFFF)]
        elif f.kind == "toffset":
            plan += [(f, v) for v in (value(f) + 1, value(f) + 32, 2**62, 0xFFFFFFFF)]
    cases = []
    seen: set[tuple[int, int]] = set()
    for f, v in plan:
        v &= (1 << (8 * f.size)) - 1
        if v == value(f) or (f.offset, v) in seen:
            continue  # no change, or already planned
        seen.add((f.offset, v))
        i = len(cases)
        cases.append(Case(f"{kind}-struct-{i:03d}", kind,
                          f"in the valid {kind}: set {f.label} (u{8 * f.size} at byte {f.offset}) "
                          f"from {value(f)} to {v}", gm.patch(data, f.offset, f.size, v)))
    return cases


def _all_cases(base_files: dict[str, Path]) -> list[Case]:
    rng = random.Random(SEED)
    cases: list[Case] = []
    for kind in ("target", "draft"):
        data = base_files[kind].read_bytes()
        lay = gm.scan_layout(data)
        cases += _truncations(kind, data, lay, rng, N_TRUNCATIONS // 2)
        cases += _flips(kind, data, lay, rng, N_FLIPS // 2)
        cases += _structured(kind, data, lay, rng)
    return cases


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------

def test_case_generation_is_deterministic_and_sized(base_files):
    a, b = _all_cases(base_files), _all_cases(base_files)
    assert [(c.case_id, c.what) for c in a] == [(c.case_id, c.what) for c in b]
    assert len({c.case_id for c in a}) == len(a)
    count = lambda family: sum(f"-{family}-" in c.case_id for c in a)  # noqa: E731
    assert count("trunc") >= 140
    assert count("flip") >= 240
    assert count("struct") >= 100
    # The truncations are biased toward the parsed part (header, metadata, tensor directory).
    data_start = {k: gm.scan_layout(p.read_bytes()).data_start for k, p in base_files.items()}
    early = sum(len(c.data) < data_start[c.kind] for c in a if "-trunc-" in c.case_id)
    assert early >= 0.6 * count("trunc")


def test_harness_reports_crash_hang_and_runaway_allocation(base_files):
    """The worker harness itself: an abort, a hang and an 8 GiB allocation each fail one named case
    and the cases after them still run."""
    t, d = str(base_files["target"]), str(base_files["draft"])
    cases = [("abort", "_abort", "-"), ("after-abort", "target", t), ("hang", "_hang", "-"),
             ("after-hang", "draft", d), ("alloc", "_alloc", "-"), ("after-alloc", "validate", f"{t}|{d}")]
    report = gm.run_cases(cases, t, d, case_timeout=2.0, total_timeout=60.0, as_limit=AS_LIMIT, jobs=1)
    o = report.outcomes
    assert o["abort"].result == "CRASH" and "-6" in o["abort"].message
    assert o["hang"].result == "HANG"
    assert o["alloc"].result == "MemoryError"  # RLIMIT_AS is in force in the worker
    for cid in ("after-abort", "after-hang", "after-alloc"):
        assert o[cid].result == "ok", (cid, o[cid])
    assert [c.case_id for c in report.failures()] == ["abort", "hang", "alloc"]


def test_fuzz_truncated_and_mutated_files(base_files, tmp_path):
    cases = _all_cases(base_files)
    paths: dict[str, Path] = {}
    for c in cases:
        p = tmp_path / f"{c.case_id}.gguf"
        p.write_bytes(c.data)
        paths[c.case_id] = p
    report = gm.run_cases([(c.case_id, c.kind, str(paths[c.case_id])) for c in cases],
                          base_files["target"], base_files["draft"], case_timeout=CASE_TIMEOUT_S,
                          total_timeout=TOTAL_TIMEOUT_S, as_limit=AS_LIMIT, jobs=min(2, os.cpu_count() or 1))
    by_id = {c.case_id: c for c in cases}
    failures = [o for o in report.outcomes.values() if o.failed or (o.result == "ok" and by_id[o.case_id].must_fail)]
    failed_ids = {o.case_id for o in failures}
    for cid, p in paths.items():  # keep only the files that reproduce a failure
        if cid not in failed_ids:
            p.unlink()

    results: dict[str, int] = {}
    for o in report.outcomes.values():
        results[o.result] = results.get(o.result, 0) + 1
    summary = (f"{len(cases)} cases in {report.seconds:.1f} s with {report.workers} worker(s): "
               + ", ".join(f"{k} x{v}" for k, v in sorted(results.items())))
    print(summary)
    if failures:
        lines = [f"{len(failures)} of {len(cases)} mutated GGUF files were not rejected cleanly ({summary}).",
                 f"Failing files are kept in {tmp_path}."]
        for o in failures:
            c = by_id[o.case_id]
            problem = o.result if o.names_file else f"{o.result} without naming the file"
            if o.result == "ok":
                problem = "accepted (no error) although it must be rejected"
            lines.append(f"- {o.case_id} [{c.kind}] {problem}: {o.message[:300]!r}\n    mutation: {c.what}")
        pytest.fail("\n".join(lines), pytrace=False)
    assert report.max_rss_kb < MAX_RSS_KB, f"a worker peaked at {report.max_rss_kb} KiB RSS"
