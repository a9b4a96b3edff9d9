#!/usr/bin/env python3
"""Mutation fuzz of model loading: each case writes a mutated copy of a small GGUF file, opens it with
`lucebox.Engine` on the CPU and generates a few tokens. Every outcome must be a load and a run, or a
`LuceboxError` (GGUFError, UnsupportedError, ...): anything else is printed as a finding, and a
process that dies (a C++ abort or crash) is reported with its case number, then the run goes on
after it. Cases are numbered and seeded by their number, so `--start N --cases 1` replays case N.

    python scripts/fuzz_gguf.py bytes target --cases 3000     # flips, edge integers, splices, cuts
    python scripts/fuzz_gguf.py keys draft --cases 1500       # one numeric metadata key edited
    python scripts/fuzz_gguf.py tensors target --cases 1000   # one tensor retyped or reshaped

Mutations touch the header (metadata and tensor infos), not the tensor data (a retyped or reshaped
tensor gets zero data of its new size). The files are the tiny
synthetic pair (`lucebox synth`), written once into --dir. tests/python/gguf_mutations.py edits keys.
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1] / "tests" / "python"


def _mutate_bytes(base: bytes, header: int, r: random.Random) -> bytes:
    b = bytearray(base)
    kind = r.choice(["flip", "flip", "int", "cut", "splice"])
    if kind == "flip":
        for _ in range(r.randint(1, 8)):
            b[r.randrange(header)] ^= 1 << r.randrange(8)
    elif kind == "int":
        p = r.randrange(header - 8)
        value = r.choice([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1, r.getrandbits(64)])
        b[p:p + 8] = value.to_bytes(8, "little")
    elif kind == "cut":
        b = b[:r.randrange(len(b))]
    else:
        p, q = r.randrange(header), r.randrange(header)
        b[p:p + 16] = base[q:q + 16]
    return bytes(b)


def _mutate_key(src: Path, dst: Path, r: random.Random) -> str:
    import gguf_mutations as gm
    from gguf import GGUFValueType as VT

    m = gm.GGUFModel.read(src)
    numeric = (VT.UINT32, VT.INT32, VT.FLOAT32, VT.UINT64, VT.BOOL)
    keys = [k for k, kv in m.kv.items()
            if kv.type in numeric or (kv.type == VT.ARRAY and k not in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                                                        "tokenizer.ggml.token_type"))]
    key = r.choice(keys)
    kv = m.kv[key]
    if kv.type == VT.ARRAY:
        v = list(kv.value)
        op = r.choice(["drop", "dup", "set"])
        if v and op == "drop":
            v.pop(r.randrange(len(v)))
        elif v and op == "dup":
            v.append(v[-1])
        elif v:
            i = r.randrange(len(v))
            v[i] = (not v[i]) if isinstance(v[i], bool) else type(v[i])(r.choice([0, 1, 2, 3, 7, 64, 1000, 2**31 - 1]))
        m.set_value(key, v)
    elif kv.type == VT.FLOAT32:
        m.set_value(key, r.choice([0.0, -1.0, 1e30, float("nan"), float("inf"), 1e-30]))
    elif kv.type == VT.BOOL:
        m.set_value(key, not kv.value)
    elif kv.type == VT.INT32:
        m.set_value(key, r.choice([0, 1, -1, 7, 2**31 - 1, -2**31]))
    else:
        m.set_value(key, r.choice([0, 1, 2, 3, 5, 7, 8, 16, 64, 100, 1000, 65536, 2**31 - 1, 2**32 - 1]))
    m.write(dst)
    return key


def _mutate_tensor(src: Path, dst: Path, r: random.Random) -> str:
    """One tensor retyped (to any type whose blocks fit its rows, data zero) or reshaped."""
    import gguf_mutations as gm
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as QT

    m = gm.GGUFModel.read(src)
    t = r.choice(m.tensors)
    if r.random() < 0.7:
        fits = [q for q in QT if q in GGML_QUANT_SIZES and t.ne[0] % GGML_QUANT_SIZES[q][0] == 0]
        m.retype_tensor(t.name, r.choice(fits))
    else:
        ne = list(t.ne)
        i = r.randrange(len(ne))
        ne[i] = r.choice([1, 2, ne[i] // 2 or 1, ne[i] * 2, ne[i] + 32])
        m.retype_tensor(t.name, t.type, tuple(ne))
    m.write(dst)
    return t.name


def _worker(args: argparse.Namespace) -> None:
    """Run cases [start, start + cases), writing each case's number to --progress first."""
    import gguf

    import lucebox

    sys.path.insert(0, str(_TESTS))
    target, draft = Path(args.dir) / "target.gguf", Path(args.dir) / "draft.gguf"
    src = target if args.file == "target" else draft
    base = src.read_bytes()
    header = min(len(base), gguf.GGUFReader(src).data_offset)
    out = Path(args.dir) / f"case-{os.getpid()}.gguf"
    counts: dict[str, int] = {}
    for case in range(args.start, args.start + args.cases):
        Path(args.progress).write_text(str(case))
        r = random.Random(case)
        what = ""
        if args.mode == "bytes":
            out.write_bytes(_mutate_bytes(base, header, r))
        elif args.mode == "keys":
            what = _mutate_key(src, out, r)
        else:
            what = _mutate_tensor(src, out, r)
        try:
            if args.file == "target":
                engine = lucebox.Engine(str(out), ctx=64, device="cpu")
            else:
                engine = lucebox.Engine(str(target), str(out), ctx=64, device="cpu", spec="chain")
            engine.generate([1, 2, 3], max_tokens=8)
            outcome = "loaded"
        except lucebox.errors.LuceboxError as e:
            outcome = type(e).__name__
        except Exception as e:  # a finding: not one of lucebox's errors
            outcome = "other"
            print(f"case {case} {what}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        counts[outcome] = counts.get(outcome, 0) + 1
    print("outcomes", counts, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("bytes", "keys", "tensors"))
    ap.add_argument("file", choices=("target", "draft"))
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--dir", default="/tmp/lucebox-fuzz")
    ap.add_argument("--progress", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.progress:
        _worker(args)
        return 0
    from lucebox import synth

    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "target.gguf").exists():
        synth.write_target(d / "target.gguf", "tiny", type="q8_0", seed=1)
        synth.write_draft(d / "draft.gguf", "tiny", type="q8_0", seed=2)
    progress = d / f"progress-{os.getpid()}"
    start, end, crashes = args.start, args.start + args.cases, 0
    while start < end:
        progress.write_text(str(start))
        cmd = [sys.executable, __file__, args.mode, args.file, "--start", str(start), "--cases", str(end - start),
               "--dir", str(d), "--progress", str(progress)]
        rc = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
        if rc.returncode == 0:
            break
        case = int(progress.read_text())
        why = next((ln for ln in rc.stderr.splitlines() if "ASSERT" in ln or "error" in ln.lower()), f"exit {rc.returncode}")
        print(f"case {case}: the process died: {why}", flush=True)
        crashes += 1
        start = case + 1
    print(f"{crashes} crash(es) in cases [{args.start}, {end})")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
