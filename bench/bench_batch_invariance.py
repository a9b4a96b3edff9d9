#!/usr/bin/env python3
"""How far one T-token forward's logits are from T one-token steps over the same prefix.

A speculative verify evaluates T tokens in one forward; plain decoding evaluates them one step at a
time. Greedy speculation gives plain decoding's tokens exactly only where the two give the same
logits, or where they differ by less than the top-2 margin. On the CPU every op of lucebox gives a
token the same bits in any batch (docs/architecture.md, "Cache independence"), so every row should
be bit-equal there (tests/integration/test_snapshots.py asserts it); on CUDA too for shapes whose ops
all have a batch-independent path (products, DeltaNet heads of 128, attention with ggml patch 0008's
fixed key split: docs/architecture.md, "Cache independence"), else this measures by how much. For
each prompt length it prints the largest and the mean absolute difference, how many of the T rows
are bit-equal, how many rows pick the same argmax, and the median top-2 margin of the batch's rows
(a difference near that margin parts greedy tokens).
--ggml-kernels runs every product on ggml's own CUDA kernels instead of cpp/kernels/ (the A/B);
--ggml-attention-split flash attention with ggml's own tile width and key split by row count.
Usage (repository root):
    lucebox synth qwen3.6-27b -o /tmp/t27q4.gguf --type q4_k_m
    python bench/bench_batch_invariance.py --model /tmp/t27q4.gguf --device cuda [--ggml-kernels]
"""
from __future__ import annotations

import argparse

import numpy as np

import lucebox
from lucebox import _core


def compare(engine: lucebox.Engine, prompt: list[int], nxt: list[int]) -> dict[str, float]:
    """Logits of nxt evaluated one token a step and as one batch, both after prompt."""
    a = engine.session()
    a.eval(prompt)
    steps = np.concatenate([a.eval([t]) for t in nxt])  # [T, n_vocab]
    b = engine.session()
    b.eval(prompt)
    batch = b.eval(nxt)  # [T, n_vocab]
    diff = np.abs(steps - batch)
    top2 = np.sort(batch, axis=1)[:, -2:]
    return dict(max=float(diff.max()), mean=float(diff.mean()),
                equal=int((diff.max(axis=1) == 0).sum()),
                argmax=int((steps.argmax(axis=1) == batch.argmax(axis=1)).sum()),
                margin=float(np.median(top2[:, 1] - top2[:, 0])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tokens", type=int, default=16, help="T: tokens of the batch (a verify's block: 16)")
    ap.add_argument("--prompts", type=lambda s: [int(x) for x in s.split(",")], default=[40, 500],
                    help="prefix lengths, comma-separated")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--ggml-kernels", action="store_true", help="every product on ggml's CUDA kernels")
    ap.add_argument("--ggml-attention-split", action="store_true",
                    help="flash attention with ggml's own tile width and key split by row count, not patch 0008's")
    args = ap.parse_args()
    if args.tokens < 1 or min(args.prompts) < 1:
        ap.error("--tokens and every --prompts length must be >= 1")
    if args.ggml_kernels:
        _core.set_own_cuda_kernels(False)  # before the engine: ggml replays the graphs it captured
    if args.ggml_attention_split:
        _core.set_fattn_fixed_split(rows=0)
    engine = lucebox.Engine(args.model, ctx=max(args.prompts) + args.tokens + 16, device=args.device)
    n_vocab = engine.session().eval([0]).shape[1]
    rng = np.random.default_rng(args.seed)
    kernels = "ggml's kernels" if args.ggml_kernels else "lucebox's kernels"
    kernels += ", ggml's attention split" if args.ggml_attention_split else ""
    print(f"model {args.model} on {args.device} ({kernels}): {args.tokens} one-token steps against one "
          f"{args.tokens}-token batch")
    print(f"{'prompt':>7} {'max diff':>10} {'mean diff':>10} {'bit-equal rows':>15} {'same argmax':>12} "
          f"{'median top-2 margin':>20}")
    for n in args.prompts:
        prompt = [int(x) for x in rng.integers(0, n_vocab, n)]
        nxt = [int(x) for x in rng.integers(0, n_vocab, args.tokens)]
        r = compare(engine, prompt, nxt)
        print(f"{n:>7} {r['max']:>10.4g} {r['mean']:>10.3g} {r['equal']:>9}/{args.tokens:<5} "
              f"{r['argmax']:>6}/{args.tokens:<5} {r['margin']:>20.4g}")


if __name__ == "__main__":
    main()
