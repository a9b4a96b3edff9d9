#!/usr/bin/env python3
"""Prefill speed of quantized products as BF16 cuBLAS GEMMs (ggml patch 0004) against the route off,
micro-batch by micro-batch: where the BF16 route starts to win (lucebox's k_bf16_gemm_min_cols).
With the route off, row-tiled weights (the default on CUDA, cpp/kernels/weight_tiles.h) run on
lucebox's int8 kernel in groups of 64 columns; with --untiled the weights load in ggml's layout and
the route-off products run on ggml's MMQ.

For each --ubatch size, prefills the same --tokens random prompt with the route off and on
(every product of >= min(ubatch, 65) columns), --reps times each after one warm-up, and prints the median
tok/s, the ratio, and the largest |logit difference| of the last position between the routes
(0 would mean the route did not switch).
Usage (GPU machine, repository root):
    lucebox synth qwen3.6-27b -o /tmp/t27.gguf --type q8_0
    python bench/probes/prefill_gemm_sweep.py /tmp/t27.gguf [--ubatch 64,128,256,512] [--tokens 2048] [--untiled]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import lucebox
from lucebox import _core


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--ubatch", type=lambda s: [int(x) for x in s.split(",")], default=[65, 96, 128, 192, 256, 512])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--untiled", action="store_true", help="weights in ggml's layout: route off = MMQ")
    args = ap.parse_args()
    _core.set_weight_tiles(not args.untiled)
    off = "MMQ" if args.untiled else "kernel"
    print(f"{'ubatch':>6} {off + ' tok/s':>12} {'BF16 tok/s':>11} {'ratio':>6} {'max |dlogit|':>13}")
    for ub in args.ubatch:
        engine = lucebox.Engine(args.model, ctx=args.tokens + 16, device="cuda:0", ubatch=ub)
        if not args.untiled and _core.tiled_weights() == 0:
            print("(no weight is row-tiled: the route-off column is MMQ)")
        ids = [int(x) for x in np.random.default_rng(0).integers(10, engine.hparams.n_vocab, args.tokens)]
        rate: dict[int, float] = {}
        logits: dict[int, np.ndarray] = {}
        on = min(ub, 65)  # every product of the micro-batch's columns on the BF16 route
        for min_cols in (0, on):
            _core.set_bf16_gemm_min_cols(min_cols)
            runs = []
            for _ in range(args.reps + 1):
                s = engine.session()
                t = time.perf_counter()
                s.append(ids[:-1])
                out = np.asarray(s.eval(ids[-1:]))
                runs.append(args.tokens / (time.perf_counter() - t))
            rate[min_cols] = statistics.median(runs[1:])
            logits[min_cols] = out.reshape(-1)
        diff = float(np.max(np.abs(logits[0] - logits[on])))
        print(f"{ub:6d} {rate[0]:12.1f} {rate[on]:11.1f} {rate[on] / rate[0]:5.2f}x {diff:13.4f}", flush=True)
        del engine
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
