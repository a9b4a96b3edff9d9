"""Helpers shared by test_malformed_files.py and test_fuzz_gguf.py: editing and mutating GGUF files.

* `GGUFModel` reads a whole (small) GGUF file into plain Python objects (metadata in file order,
  tensors with their raw bytes) and writes it back with its own minimal serializer, so a test can
  take a valid synthetic file, change one key or tensor, and write the broken variant without
  depending on byte offsets. Writing an unmodified model reproduces the original file byte for byte.
* `scan_layout` parses the header, metadata and tensor directory of a GGUF image and returns the
  position of every structural field (counts, lengths, types, dims, offsets) for targeted mutations.
* `run_cases` opens many files in a subprocess worker (this module run as a script) with an
  address-space limit and a per-case watchdog, so a crash, an abort, a hang or a runaway allocation
  in the C++ core is reported as the failure of one named case instead of taking pytest down.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

_SCALAR_FMT: dict[VT, str] = {
    VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I", VT.INT32: "<i",
    VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d",
}


# --------------------------------------------------------------------------------------------
# Whole-file model: read, edit, write
# --------------------------------------------------------------------------------------------

@dataclass
class KV:
    type: VT
    value: Any
    sub_type: VT | None = None  # element type of an ARRAY


@dataclass
class Tensor:
    name: str
    type: QT
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    data: bytes


def tensor_nbytes(type_: QT, ne: Iterable[int]) -> int:
    block, size = gguf.GGML_QUANT_SIZES[type_]
    ne = list(ne)
    n = 1
    for d in ne:
        n *= int(d)
    return n // block * size


def _pack_string(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _pack_scalar(vtype: VT, value: Any) -> bytes:
    if vtype == VT.STRING:
        return _pack_string(value)
    return struct.pack(_SCALAR_FMT[vtype], value)


def pack_kv(key: str, kv: KV) -> bytes:
    out = bytearray(_pack_string(key))
    out += struct.pack("<I", int(kv.type))
    if kv.type == VT.ARRAY:
        assert kv.sub_type is not None, key
        out += struct.pack("<IQ", int(kv.sub_type), len(kv.value))
        for v in kv.value:
            out += _pack_scalar(kv.sub_type, v)
    else:
        out += _pack_scalar(kv.type, kv.value)
    return bytes(out)


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


@dataclass
class GGUFModel:
    """All of a GGUF file: metadata (in file order, including general.architecture) and tensors."""

    kv: dict[str, KV] = field(default_factory=dict)
    tensors: list[Tensor] = field(default_factory=list)
    version: int = 3

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> "GGUFModel":
        r = gguf.GGUFReader(path)
        m = cls()
        for name, f in r.fields.items():
            if name.startswith("GGUF."):
                continue
            t = VT(f.types[0])
            if t == VT.ARRAY:
                if len(f.types) != 2:
                    raise NotImplementedError(f"nested array {name}")
                m.kv[name] = KV(VT.ARRAY, list(f.contents()), VT(f.types[1]))
            else:
                m.kv[name] = KV(t, f.contents())
        for t in r.tensors:
            ne = tuple(int(d) for d in t.shape)
            raw = r.data[t.data_offset:t.data_offset + t.n_bytes]
            m.tensors.append(Tensor(t.name, QT(t.tensor_type), ne, bytes(raw)))
        return m

    # ---- editing helpers --------------------------------------------------------------------

    def copy(self) -> "GGUFModel":
        return GGUFModel({k: KV(v.type, list(v.value) if isinstance(v.value, list) else v.value, v.sub_type)
                          for k, v in self.kv.items()},
                         [Tensor(t.name, t.type, t.ne, t.data) for t in self.tensors], self.version)

    def set(self, key: str, vtype: VT, value: Any, sub_type: VT | None = None) -> "GGUFModel":
        """Set (or add at the end) a key with an explicit GGUF type."""
        self.kv[key] = KV(vtype, value, sub_type)
        return self

    def set_value(self, key: str, value: Any) -> "GGUFModel":
        """Change the value of an existing key, keeping its type."""
        self.kv[key].value = value
        return self

    def drop(self, key: str) -> "GGUFModel":
        del self.kv[key]
        return self

    def tensor(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def drop_tensor(self, name: str) -> "GGUFModel":
        self.tensors.remove(self.tensor(name))
        return self

    def retype_tensor(self, name: str, type_: QT, ne: tuple[int, ...] | None = None) -> "GGUFModel":
        """Give a tensor another type and/or shape (ggml order), with zero data of the right size."""
        t = self.tensor(name)
        t.type = type_
        if ne is not None:
            t.ne = tuple(ne)
        t.data = bytes(tensor_nbytes(t.type, t.ne))
        return self

    # ---- writing ----------------------------------------------------------------------------

    @property
    def alignment(self) -> int:
        kv = self.kv.get("general.alignment")
        return int(kv.value) if kv is not None and kv.type == VT.UINT32 else DEFAULT_ALIGNMENT

    def to_bytes(self) -> bytes:
        align = self.alignment
        out = bytearray(GGUF_MAGIC)
        out += struct.pack("<IQQ", self.version, len(self.tensors), len(self.kv))
        for key, kv in self.kv.items():
            out += pack_kv(key, kv)
        offset = 0
        for t in self.tensors:
            out += _pack_string(t.name)
            out += struct.pack("<I", len(t.ne))
            out += struct.pack(f"<{len(t.ne)}Q", *t.ne)
            out += struct.pack("<IQ", int(t.type), offset)
            offset += _pad(len(t.data), align)
        if self.tensors:
            out += bytes(_pad(len(out), align) - len(out))
        for t in self.tensors:
            out += t.data
            out += bytes(_pad(len(t.data), align) - len(t.data))
        return bytes(out)

    def write(self, path: str | os.PathLike[str]) -> Path:
        p = Path(path)
        p.write_bytes(self.to_bytes())
        return p


# --------------------------------------------------------------------------------------------
# Layout scan: where every structural field of a GGUF image lies
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Field:
    offset: int
    size: int  # 4 or 8 (little-endian unsigned)
    kind: str  # "version", "count", "strlen", "type", "u32", "ndims", "dim", "ttype", "toffset"
    label: str


@dataclass
class Layout:
    fields: list[Field]
    kv_start: int
    ti_start: int
    data_start: int
    tensors: list[tuple[str, int, int]]  # (name, absolute data offset, nbytes)
    keys: dict[str, int]  # key -> offset of its KV entry
    infos: dict[str, int]  # tensor name -> offset of its tensor-info entry
    size: int = 0  # bytes in the image

    def locate(self, offset: int) -> str:
        """Which part of the file byte `offset` belongs to, in words."""
        if offset >= self.size:
            return "end of file"
        if offset < self.kv_start:
            return "header"
        if offset < self.ti_start:
            key = max((o, k) for k, o in self.keys.items() if o <= offset)[1]
            return f"metadata key '{key}'"
        if offset < self.data_start:
            if not self.infos or offset < min(self.infos.values()):
                return "padding before the data"
            name = max((o, n) for n, o in self.infos.items() if o <= offset)[1]
            return f"tensor info '{name}'"
        for name, start, nbytes in self.tensors:
            if start <= offset < start + nbytes:
                return f"data of tensor '{name}'"
        return "data padding"

    def by_kind(self, *kinds: str) -> list[Field]:
        return [f for f in self.fields if f.kind in kinds]


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def u32(self) -> int:
        (v,) = struct.unpack_from("<I", self.data, self.pos)
        self.pos += 4
        return v

    def u64(self) -> int:
        (v,) = struct.unpack_from("<Q", self.data, self.pos)
        self.pos += 8
        return v

    def string(self) -> tuple[int, str]:
        at = self.pos
        n = self.u64()
        s = self.data[self.pos:self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return at, s


_FIXED_SIZE = {VT.UINT8: 1, VT.INT8: 1, VT.BOOL: 1, VT.UINT16: 2, VT.INT16: 2, VT.UINT32: 4, VT.INT32: 4,
               VT.FLOAT32: 4, VT.UINT64: 8, VT.INT64: 8, VT.FLOAT64: 8}


def scan_layout(data: bytes) -> Layout:
    """Parse a valid GGUF image and list its structural fields (for targeted mutations)."""
    c = _Cursor(data)
    assert data[:4] == GGUF_MAGIC
    c.pos = 4
    fields = [Field(4, 4, "version", "header.version")]
    fields.append(Field(c.pos + 4, 8, "count", "header.n_tensors"))
    fields.append(Field(c.pos + 12, 8, "count", "header.n_kv"))
    c.u32()
    n_tensors = c.u64()
    n_kv = c.u64()
    kv_start = c.pos
    keys: dict[str, int] = {}
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        at, key = c.string()
        keys[key] = at
        fields.append(Field(at, 8, "strlen", f"kv[{key}].key_length"))
        fields.append(Field(c.pos, 4, "type", f"kv[{key}].type"))
        t = VT(c.u32())
        if t == VT.ARRAY:
            fields.append(Field(c.pos, 4, "type", f"kv[{key}].array_type"))
            sub = VT(c.u32())
            fields.append(Field(c.pos, 8, "count", f"kv[{key}].array_length"))
            n = c.u64()
            if sub == VT.STRING:
                for i in range(n):
                    if i < 2 or i == n - 1:
                        fields.append(Field(c.pos, 8, "strlen", f"kv[{key}][{i}].length"))
                    c.string()
            else:
                c.pos += n * _FIXED_SIZE[sub]
        elif t == VT.STRING:
            fields.append(Field(c.pos, 8, "strlen", f"kv[{key}].length"))
            c.string()
        else:
            if t == VT.UINT32:
                fields.append(Field(c.pos, 4, "u32", f"kv[{key}].value"))
                if key == "general.alignment":
                    (alignment,) = struct.unpack_from("<I", data, c.pos)
            c.pos += _FIXED_SIZE[t]
    ti_start = c.pos
    infos = []
    info_at: dict[str, int] = {}
    for _ in range(n_tensors):
        at, name = c.string()
        info_at[name] = at
        fields.append(Field(at, 8, "strlen", f"tensor[{name}].name_length"))
        fields.append(Field(c.pos, 4, "ndims", f"tensor[{name}].n_dims"))
        nd = c.u32()
        ne = []
        for d in range(nd):
            fields.append(Field(c.pos, 8, "dim", f"tensor[{name}].ne[{d}]"))
            ne.append(c.u64())
        fields.append(Field(c.pos, 4, "ttype", f"tensor[{name}].type"))
        tt = QT(c.u32())
        fields.append(Field(c.pos, 8, "toffset", f"tensor[{name}].offset"))
        off = c.u64()
        infos.append((name, off, tensor_nbytes(tt, ne)))
    data_start = _pad(c.pos, alignment)
    tensors = [(n, data_start + off, nb) for n, off, nb in infos]
    return Layout(fields, kv_start, ti_start, data_start, tensors, keys, info_at, len(data))


def patch(data: bytes, offset: int, size: int, value: int) -> bytes:
    """`data` with the little-endian unsigned field at `offset` set to `value` (masked to size)."""
    fmt = {4: "<I", 8: "<Q"}[size]
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, value & ((1 << (8 * size)) - 1))
    return bytes(b)


# --------------------------------------------------------------------------------------------
# Subprocess worker
# --------------------------------------------------------------------------------------------

#: Exceptions a malformed file may raise; anything else is a bug.
ALLOWED = ("GGUFError", "UnsupportedError", "DraftMismatchError")


@dataclass
class Outcome:
    case_id: str
    result: str  # "ok", an exception class name, "CRASH", "HANG", "NOT RUN"
    message: str = ""
    names_file: bool = True

    @property
    def failed(self) -> bool:
        return not (self.result == "ok" or self.result in ALLOWED) or not self.names_file


def _worker_check(core, kind: str, path: str, base_target, base_draft, step) -> None:
    """Open `path` as `kind` and use it the way `lucebox info` does; `step(name)` marks progress."""
    if kind == "_abort":  # harness self-test
        os.abort()
    if kind == "_hang":  # harness self-test
        step("sleep")
        while True:
            time.sleep(0.05)
    if kind == "_alloc":  # harness self-test: a runaway allocation
        bytearray(8 << 30)
        return
    if kind == "target":
        step("TargetFile.open")
        t = core.TargetFile.open(path)
        step("TargetFile properties")
        t.tensors, t.bytes_by_type, t.weight_bytes, t.hparams.n_layer  # noqa: B018
        step("plan_memory(target)")
        core.plan_memory(t, None)
        step("validate_draft(target, base draft)")
        core.validate_draft(t, base_draft)
    elif kind == "draft":
        step("DraftFile.open")
        d = core.DraftFile.open(path)
        step("DraftFile properties")
        d.tensors, d.bytes_by_type, d.weight_bytes, d.hparams.target_layers  # noqa: B018
        step("validate_draft(base target, draft)")
        core.validate_draft(base_target, d)
        step("plan_memory(base target, draft)")
        core.plan_memory(base_target, d)
    elif kind == "validate":  # path is "TARGET|DRAFT"
        tp, dp = path.split("|")
        step("TargetFile.open")
        t = core.TargetFile.open(tp)
        step("DraftFile.open")
        d = core.DraftFile.open(dp)
        step("validate_draft")
        core.validate_draft(t, d)
    else:
        raise AssertionError(f"unknown case kind {kind!r}")


def _peak_rss_kb() -> int:
    """This process's own peak RSS. Linux carries ru_maxrss across fork + exec (a worker would
    report its parent's RSS at fork time), so prefer VmHWM, which belongs to the current image."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def worker_main(argv: list[str]) -> int:
    """Run as ``python gguf_mutations.py BASE_TARGET BASE_DRAFT CASE_TIMEOUT_S AS_LIMIT_BYTES``.

    Reads ``case_id<TAB>kind<TAB>path`` lines from stdin; for each prints ``BEGIN<TAB>case_id``,
    ``STEP<TAB>call`` before each call into the core, then one JSON result line; at the end
    ``DONE<TAB>{maxrss_kb}``.
    """
    import faulthandler
    import resource

    base_target_path, base_draft_path, case_timeout, as_limit = argv[0], argv[1], float(argv[2]), int(argv[3])
    from lucebox import _core as core

    base_target = core.TargetFile.open(base_target_path)
    base_draft = core.DraftFile.open(base_draft_path)
    if as_limit > 0:
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            as_limit = min(as_limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (as_limit, hard))
    cases = [line.rstrip("\n").split("\t") for line in sys.stdin if line.strip()]
    out = sys.stdout

    def step(name: str) -> None:
        out.write(f"STEP\t{name}\n")
        out.flush()

    for case_id, kind, path in cases:
        out.write(f"BEGIN\t{case_id}\n")
        out.flush()
        faulthandler.dump_traceback_later(case_timeout, exit=True)
        result, message, names_file = "ok", "", True
        try:
            _worker_check(core, kind, path, base_target, base_draft, step)
        except Exception as e:  # noqa: BLE001 - every exception is classified by the parent
            result, message = type(e).__name__, str(e)
            first = path.split("|")[0]
            names_file = first in message or path.split("|")[-1] in message
        finally:
            faulthandler.cancel_dump_traceback_later()
        out.write(json.dumps({"id": case_id, "result": result, "message": message[:400],
                              "names_file": names_file}) + "\n")
        out.flush()
    out.write(f"DONE\t{_peak_rss_kb()}\n")
    out.flush()
    return 0


def subprocess_env() -> dict[str, str]:
    """Environment for a Python subprocess that imports this checkout's lucebox (and dies fast on abort)."""
    import lucebox

    env = dict(os.environ)
    pkg_root = str(Path(lucebox.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
    env["GGML_NO_BACKTRACE"] = "1"  # no gdb backtrace on abort: just die
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@dataclass
class RunReport:
    outcomes: dict[str, Outcome]
    max_rss_kb: int
    seconds: float
    workers: int

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes.values() if o.failed]


def _run_shard(cases: list[tuple[str, str, str]], cmd: list[str], env: dict[str, str], deadline: float,
               max_restarts: int) -> tuple[dict[str, Outcome], int, int]:
    outcomes: dict[str, Outcome] = {}
    pending = list(cases)
    max_rss = 0
    workers = 0
    while pending and workers <= max_restarts:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        workers += 1
        stdin = "".join(f"{cid}\t{kind}\t{path}\n" for cid, kind, path in pending)
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)
        timed_out = False
        try:
            out, err = proc.communicate(stdin, timeout=left)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            out, err = proc.communicate()
        in_flight = None
        last_step = ""
        done = False
        for line in out.splitlines():
            if line.startswith("BEGIN\t"):
                in_flight = line.split("\t", 1)[1]
                last_step = ""
            elif line.startswith("STEP\t"):
                last_step = line.split("\t", 1)[1]
            elif line.startswith("DONE\t"):
                done = True
                max_rss = max(max_rss, int(line.split("\t", 1)[1]))
            elif line.startswith("{"):
                r = json.loads(line)
                outcomes[r["id"]] = Outcome(r["id"], r["result"], r["message"], r["names_file"])
                in_flight = None
        ids = [c[0] for c in pending]
        if done and proc.returncode == 0 and in_flight is None:
            pending = [c for c in pending if c[0] not in outcomes]
            break
        err = (err or "").strip()
        tail = err[-1500:]
        if in_flight is None:
            # Died before or between cases (e.g. at start-up): report it on the next case.
            nxt = next((c for c in pending if c[0] not in outcomes), None)
            if nxt is None:
                pending = []
                break
            in_flight = nxt[0]
        hang = timed_out or err.startswith("Timeout (")
        during = f" during {last_step}" if last_step else ""
        if hang:
            message = f"no answer{during} within the per-case watchdog ({err.splitlines()[0] if err else 'killed'})"
        else:
            message = f"worker died{during} with exit code {proc.returncode}; stderr: {tail}"
        outcomes[in_flight] = Outcome(in_flight, "HANG" if hang else "CRASH", message)
        after = ids.index(in_flight) + 1
        pending = [c for c in pending[after:] if c[0] not in outcomes]
    for cid, _kind, _path in pending:
        if cid not in outcomes:
            outcomes[cid] = Outcome(cid, "NOT RUN", "time budget or restart limit exhausted")
    return outcomes, max_rss, workers


def run_cases(cases: list[tuple[str, str, str]], base_target: str | os.PathLike[str],
              base_draft: str | os.PathLike[str], *, case_timeout: float = 10.0,
              total_timeout: float = 60.0, as_limit: int = 4 << 30, max_restarts: int = 30,
              jobs: int = 2) -> RunReport:
    """Run ``(case_id, kind, path)`` cases in worker subprocesses; return one Outcome per case.

    Kinds: "target" (TargetFile.open, then plan_memory and validate_draft against the base draft),
    "draft" (DraftFile.open, then validate_draft / plan_memory with the base target), "validate"
    (path "TARGET|DRAFT"). The cases are split over `jobs` concurrent workers. A worker that dies
    (signal, abort, nonzero exit) or stops answering (per-case watchdog `case_timeout`) marks the
    case it was running as CRASH or HANG, with the tail of its stderr, and a fresh worker goes on
    with the following cases. Cases left when `total_timeout` or `max_restarts` (per job) runs
    out are NOT RUN. Each worker runs under RLIMIT_AS = `as_limit` bytes (0: no limit).
    """
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.monotonic()
    deadline = t0 + total_timeout
    env = subprocess_env()
    cmd = [sys.executable, str(Path(__file__).resolve()), str(base_target), str(base_draft),
           str(case_timeout), str(as_limit)]
    jobs = max(1, min(jobs, len(cases)))
    shards = [cases[i::jobs] for i in range(jobs)]
    with ThreadPoolExecutor(jobs) as ex:
        results = list(ex.map(lambda shard: _run_shard(shard, cmd, env, deadline, max_restarts), shards))
    outcomes: dict[str, Outcome] = {}
    for o, _rss, _w in results:
        outcomes.update(o)
    ordered = {cid: outcomes[cid] for cid, _k, _p in cases}
    return RunReport(ordered, max((r[1] for r in results), default=0), time.monotonic() - t0,
                     sum(r[2] for r in results))


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
