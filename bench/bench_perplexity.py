#!/usr/bin/env python3
"""Perplexity: `lucebox perplexity`'s protocol against upstream's llama-perplexity on the same GGUF
and text, same run: both perplexities (they should agree to float rounding: same chunks, same
scored tokens, logits equal up to the backends' arithmetic) and the time of each.

Protocol (llama.cpp's tools/perplexity, which lucebox.cli.chunk_perplexity follows): the text's
tokens in consecutive chunks of --chunk tokens, each from an empty context; the tokens after each
chunk's first half + 1 are scored. Timing: lucebox's is the scoring alone (model loaded, text
tokenized, one discarded warm-up chunk); llama.cpp's is its own "seconds per pass" times the
chunks (its log), so model loading and tokenization count on neither side. Example (GPU machine):
    python3 bench/bench_perplexity.py --model t27q4.gguf --text docs/benchmarks.md \
        --llama-perplexity build/perplexity/llama-perplexity --chunk 512 --chunks 8 --device cuda
"""
from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
import time

import lucebox
from lucebox.cli import chunk_perplexity


def upstream(binary: str, model: str, text: str, chunk: int, chunks: int, device: str) -> tuple[float, float]:
    """llama-perplexity's final PPL and its seconds per chunk."""
    cmd = [binary, "-m", model, "-f", text, "-c", str(chunk), "-b", str(chunk), "--chunks", str(chunks)]
    cmd += ["-ngl", "999"] if device != "cpu" else ["-ngl", "0"]
    print("$ " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True)
    log = out.stdout + out.stderr
    if out.returncode != 0:
        sys.exit(f"llama-perplexity failed ({out.returncode}):\n{log[-3000:]}")
    final = re.search(r"Final estimate: PPL = ([0-9.]+)", log)
    per_pass = re.search(r"([0-9.]+) seconds per pass", log)
    if final is None or per_pass is None:
        sys.exit(f"could not read llama-perplexity's output:\n{log[-3000:]}")
    return float(final.group(1)), float(per_pass.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True, help="UTF-8 text file")
    ap.add_argument("--llama-perplexity", help="upstream llama-perplexity binary (omit: lucebox only)")
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()

    engine = lucebox.Engine(args.model, ctx=args.chunk, device=args.device, ubatch=args.chunk)
    with open(args.text, encoding="utf-8", errors="replace") as f:
        ids = engine.tokenizer.encode(f.read())
    n = min(args.chunks, len(ids) // args.chunk)
    if n < 1:
        sys.exit(f"{args.text} has {len(ids)} tokens, fewer than one chunk of {args.chunk}")
    ids = ids[:n * args.chunk]
    chunk_perplexity(engine, ids[:args.chunk], args.chunk)  # warm-up (graphs, device buffers)
    t = time.perf_counter()
    nll = [x for c in chunk_perplexity(engine, ids, args.chunk) for x in c]
    seconds = time.perf_counter() - t
    ppl = math.exp(sum(nll) / len(nll))
    print(f"lucebox    PPL {ppl:.6f} over {n} chunks of {args.chunk} ({len(nll)} scored): {seconds / n:.4f} s "
          f"a chunk, {n * args.chunk / seconds:.1f} tok/s on {engine.device}")
    if not args.llama_perplexity:
        return
    ref, per_pass = upstream(args.llama_perplexity, args.model, args.text, args.chunk, n, args.device)
    print(f"llama.cpp  PPL {ref:.6f}: {per_pass:.4f} s a chunk, {args.chunk / per_pass:.1f} tok/s")
    print(f"PPL relative difference {abs(ppl - ref) / ref:.2e}; speed lucebox / llama.cpp "
          f"{per_pass / (seconds / n):.2f}x")


if __name__ == "__main__":
    main()
