#!/usr/bin/env python3
"""Target-only speed: lucebox vs upstream llama.cpp (llama-bench) on the same GGUF, same run.

Measures decode tok/s at depths, prefill tok/s at prompt lengths, and the time of one 16-token
forward (the verify width of speculative decoding), prints lucebox/llama.cpp ratios and the
fraction of the bandwidth roofline (weight bytes read per decoded token / measured copy rate).

Method: one discarded warm-up per configuration, then --reps measured runs; median (min..max).
Every lucebox decode row prints a hash of its generated tokens, so rows are shown to do the
same work. Example (GPU machine):
    python bench/bench_target.py --model t27-q8_0.gguf --llama-bench build/bin/llama-bench --json out.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np

import kernel_switches
import lucebox
from lucebox import _core


def stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def measure(fn: Callable[[], float], reps: int) -> dict[str, float]:
    fn()  # warm-up, discarded
    return stats([fn() for _ in range(reps)])


def copy_bandwidth() -> float | None:
    """Device-to-device copy rate in bytes/s (read + write), via torch if it is available."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    return 2 * n * 10 / (time.perf_counter() - t)


def decode_bytes_per_token(path: str) -> int:
    """Bytes of weights read per decoded token: every tensor except the embedding table (only one
    row is gathered), unless the head is tied to it."""
    t = _core.TargetFile.open(path)
    total = sum(nb for _name, _type, _shape, nb in t.tensors)
    if t.hparams.has_output:
        total -= next(nb for name, _type, _shape, nb in t.tensors if name == "token_embd.weight")
    return total


def bench_lucebox(args: argparse.Namespace) -> dict[str, Any]:
    t = time.perf_counter()
    tiled_before = _core.tiled_weights()
    engine = lucebox.Engine(args.model, ctx=args.ctx, device=args.device, ubatch=args.ubatch,
                            kv_type=args.kv_type)
    # the weights' load (from the page cache once the file was read before), row-tiling included
    out: dict[str, Any] = {"device": engine.device, "load_s": time.perf_counter() - t,
                           "tiled_ranges": _core.tiled_weights() - tiled_before}
    rng = np.random.default_rng(0)
    n_vocab = engine.hparams.n_vocab

    def prompt(n: int) -> list[int]:
        return [int(x) for x in rng.integers(10, n_vocab, n)]

    for n in args.prefill:
        ids = prompt(n)

        def run() -> float:
            s = engine.session()
            t = time.perf_counter()
            s.append(ids)
            return n / (time.perf_counter() - t)

        out[f"pp{n}"] = measure(run, args.reps)
    for depth in args.depths:
        ctx_ids = prompt(max(depth, 1))
        hashes: set[str] = set()

        def run_decode() -> float:
            s = engine.session()
            r = s.generate(ctx_ids, max_tokens=args.n_decode, temperature=0.0)
            hashes.add(hashlib.sha1(np.asarray(r.tokens, dtype=np.int32).tobytes()).hexdigest()[:12])
            return r.stats.decode_tokens_per_second

        out[f"tg{args.n_decode}@d{depth}"] = measure(run_decode, args.reps) | {"tokens_hash": ",".join(sorted(hashes))}
        block = prompt(16)

        def run_block() -> float:
            s = engine.session()
            s.append(ctx_ids)
            t = time.perf_counter()
            s.eval(block, all_logits=False)  # last-row logits, like llama-bench's pp16
            return (time.perf_counter() - t) * 1e3

        out[f"fwd16_ms@d{depth}"] = measure(run_block, args.reps)
    return out


def bench_llama(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    runs = [(0, ",".join(str(p) for p in [16, *args.prefill]))] + [(d, "16") for d in args.depths if d > 0]
    for depth, pp in runs:
        cmd = [args.llama_bench, "-m", args.model, "-fa", "1", "-ngl", "99", "-p", pp, "-n", str(args.n_decode),
               "-d", str(depth), "-r", str(args.reps), "-ub", str(args.ubatch), "-o", "json",
               "-ctk", args.kv_type, "-ctv", args.kv_type]
        print("$", " ".join(cmd), file=sys.stderr, flush=True)
        res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        for row in res:
            n_p, n_g = row["n_prompt"], row["n_gen"]
            key = f"pp{n_p}" if n_p else f"tg{n_g}@d{depth}"
            if n_p == 16:
                key = f"fwd16_ms@d{depth}"
                ts = [1e3 * 16 / x for x in row["samples_ts"]]
            else:
                ts = row["samples_ts"]
            if n_p and depth and n_p != 16:
                continue
            out[key] = stats(ts)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--llama-bench", help="path to llama-bench built from the pinned tree (bench/llama_anchor)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--prefill", type=lambda s: [int(x) for x in s.split(",")], default=[512, 4096])
    ap.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")], default=[0, 4096])
    ap.add_argument("--n-decode", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--untiled", action="store_true",
                    help="load the weights in ggml's layout, not row-tiled (A/B comparison of the tiles)")
    kernel_switches.add_arguments(ap)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    print(f"attention split: {kernel_switches.apply(args)}")
    if args.untiled:
        _core.set_weight_tiles(False)

    bw = copy_bandwidth()
    bpt = decode_bytes_per_token(args.model)
    ours = bench_lucebox(args)
    theirs = bench_llama(args) if args.llama_bench else {}
    print(f"\nmodel {args.model}: {bpt / 1e9:.2f} GB read per decoded token; "
          f"copy bandwidth {bw / 1e12:.2f} TB/s" if bw else "copy bandwidth: n/a (no torch/CUDA)")
    print(f"{'test':<16} {'lucebox':>22} {'llama.cpp':>22} {'ratio':>7} {'roofline':>9}")
    for key, val in ours.items():
        if not isinstance(val, dict):
            continue
        other = theirs.get(key)
        lower_is_better = key.startswith("fwd16")
        ratio = ""
        if other:
            r = other["median"] / val["median"] if lower_is_better else val["median"] / other["median"]
            ratio = f"{r:.2f}x"
        roof = ""
        if key.startswith("tg") and bw:
            roof = f"{val['median'] * bpt / bw:.0%}"
        fmt = lambda v: f"{v['median']:.1f} ({v['min']:.1f}..{v['max']:.1f})" if v else "-"
        print(f"{key:<16} {fmt(val):>22} {fmt(other):>22} {ratio:>7} {roof:>9}")
    unit_note = "(pp/tg: tokens/s, higher is better; fwd16: ms per 16-token forward, lower is better; ratio > 1 means lucebox is faster)"
    print(unit_note)
    print(f"lucebox engine load {ours['load_s']:.1f} s ({ours['tiled_ranges']} row-tiled weight ranges)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "copy_bandwidth": bw, "bytes_per_token": bpt, "lucebox": ours,
                       "llama.cpp": theirs}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
