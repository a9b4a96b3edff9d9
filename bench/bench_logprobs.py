#!/usr/bin/env python3
"""What logprobs cost: decode tok/s of the same generation with and without `logprobs=N`, greedy and
sampled, and with a draft, speculative (chain). The tokens must be the same (their hash is printed
on every row); the ratio is the speed with logprobs over without.

Method: one discarded warm-up per row, then --reps generations of --tokens tokens from a fixed
prompt; median decode tok/s (GenerationStats.decode_tokens_per_second). Example:
    python3 bench/bench_logprobs.py --model t27q4.gguf --device cuda [--draft d27.gguf]
"""
from __future__ import annotations

import argparse
import hashlib
import statistics

import lucebox


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", default=None, help="DFlash draft: measure chain speculation too")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    engine = lucebox.Engine(args.model, args.draft, ctx=1024, device=args.device,
                            spec="chain" if args.draft else "off")
    prompt = list(range(10, 74))

    def measure(**kw) -> tuple[float, str]:
        engine.generate(prompt, max_tokens=args.tokens, **kw)  # warm-up
        runs = [engine.generate(prompt, max_tokens=args.tokens, **kw) for _ in range(args.reps)]
        digest = hashlib.sha1(str(runs[-1].tokens).encode()).hexdigest()[:8]
        return statistics.median(r.stats.decode_tokens_per_second for r in runs), digest

    print(f"{args.model} on {engine.device}, {'chain speculation' if args.draft else 'plain decoding'}, "
          f"{args.tokens} tokens, median of {args.reps}")
    for name, sampling in (("greedy", {}), ("top_k=40 T=0.8", dict(temperature=0.8, top_k=40, seed=1))):
        base, h0 = measure(**sampling)
        print(f"  {name:16s} no logprobs  {base:9.1f} tok/s  tokens {h0}")
        for n in (0, 5):
            tps, h = measure(logprobs=n, **sampling)
            same = "same tokens" if h == h0 else "TOKENS DIFFER"
            print(f"  {name:16s} logprobs={n}   {tps:9.1f} tok/s  tokens {h}  {tps / base:.3f}x  {same}")


if __name__ == "__main__":
    main()
