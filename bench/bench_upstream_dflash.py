#!/usr/bin/env python3
"""lucebox chain speculation vs upstream llama.cpp's own DFlash speculative decoding, side by side.

Both run greedy on the same target and DFlash draft (default: the bundled demo pair) and the same
prompts (default: the 10 code prompts of tests/integration/test_demo_pair.py), on the CPU, with the
same thread count. Upstream is its ``llama-speculative-simple`` example with ``--spec-type
draft-dflash`` and the whole 16-token block, built from the pinned sdist by
scripts/build_upstream_spec.sh (how it is invoked and what it prints:
tests/integration/upstream_spec.py); lucebox is ``Engine(..., spec="chain").generate``, asked for
as many tokens as upstream produced (upstream's budget is loose: it can overshoot -n by a block).
Upstream runs with its default environment (OpenMP's default wait policy), one process per prompt
and repetition; its model loading and warm-up are outside its timings, as are lucebox's.

Prints the exact commands, then per side: tokens, decode tok/s (each side's own decode clock:
upstream's "decoded N tokens in S seconds", from after the prompt less its last token to the end;
lucebox's stats.decode_seconds, after the prefill that samples the first token), end-to-end tok/s
(generated tokens over prompt + generation time, the same span on both sides), acceptance
(accepted / drafted proposals, as both count them) and acceptance length (tokens per verify
step; upstream's steps = n_predict - n_accept), the ratios lucebox / upstream, and whether the
outputs are the same bytes (exit status 1 if not). With --plain also lucebox plain decoding.
Each figure is the median over --reps repetitions of the totals over all prompts.

Usage:
    bash scripts/build_upstream_spec.sh          # once (cached); prints the binary's path
    PYTHONPATH=python python bench/bench_upstream_dflash.py [--tokens 128] [--threads 2] [--reps 3]
    python bench/bench_upstream_dflash.py --model t.gguf --draft d.gguf --prompt "def f(x):" --upstream BIN
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

import lucebox  # noqa: E402
from lucebox import default_model  # noqa: E402
import upstream_spec  # noqa: E402
from test_demo_pair import PROMPTS  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", help="target GGUF (default: the bundled demo target)")
    ap.add_argument("--draft", help="DFlash draft GGUF, upstream's dflash schema (default: the demo draft)")
    ap.add_argument("--upstream", help=f"llama-speculative-simple (default: ${upstream_spec.ENV}, else the "
                                       "cached build of scripts/build_upstream_spec.sh)")
    ap.add_argument("--prompt", action="append", help="a prompt text (repeatable; default: 10 code prompts)")
    ap.add_argument("--tokens", type=int, default=128, help="upstream's -n (lucebox generates what upstream did)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--plain", action="store_true", help="also time lucebox plain decoding (spec off)")
    args = ap.parse_args()

    demo_target, demo_draft = (str(p) for p in default_model.default_model_paths())
    target, draft = args.model or demo_target, args.draft or demo_draft
    binary = args.upstream
    if binary is None:
        binary, why = upstream_spec.find_binary()
        if binary is None:
            print(why, file=sys.stderr)
            return 2
    prompts = args.prompt or PROMPTS

    spec = lucebox.Engine(target, draft, ctx=args.ctx, device="cpu", spec="chain", threads=args.threads)
    plain = lucebox.Engine(target, ctx=args.ctx, device="cpu", spec="off", threads=args.threads) if args.plain else None
    tk = spec.tokenizer
    ids = [tk.encode(p, add_special=True) for p in prompts]
    spec.generate(ids[0], max_tokens=8)  # warm-up (graphs, caches)
    if plain is not None:
        plain.generate(ids[0], max_tokens=8)

    print(f"$ {shlex.join([sys.executable, *sys.argv])}")
    print(f"target {target}\ndraft  {draft}\n{len(prompts)} prompts, -n {args.tokens}, {args.threads} threads, "
          f"ctx {args.ctx}, {args.reps} reps, greedy, CPU")
    print("upstream, per prompt (prompt 1 shown):")
    print("  " + shlex.join(upstream_spec.command(binary, target, draft, prompts[0], args.tokens,
                                                  ctx=args.ctx, threads=args.threads)))
    print("lucebox, per prompt:")
    print(f"  lucebox.Engine({target!r}, {draft!r}, ctx={args.ctx}, device='cpu', spec='chain', "
          f"threads={args.threads}).generate(tokenizer.encode(prompt, add_special=True), max_tokens=<upstream n_predict>)")

    keys = ("tokens", "decode_s", "total_s", "drafted", "accepted", "steps")
    reps: dict[str, list[dict[str, float]]] = {"upstream": [], "lucebox": [], "plain": []}
    same = True
    for _ in range(args.reps):
        tot = {side: dict.fromkeys(keys, 0.0) for side in reps}
        for text, p in zip(prompts, ids):
            up = upstream_spec.run(binary, target, draft, text, args.tokens, echo=tk.decode_bytes(p),
                                   ctx=args.ctx, threads=args.threads)
            u = tot["upstream"]
            u["tokens"] += up.n_predict
            u["decode_s"] += up.decode_seconds
            u["total_s"] += up.encode_seconds + up.decode_seconds
            u["drafted"] += up.n_drafted
            u["accepted"] += up.n_accept
            u["steps"] += up.n_predict - up.n_accept
            r = spec.generate(p, max_tokens=up.n_predict)
            same = same and upstream_spec.printed_bytes(tk, r.tokens) == up.generated
            s, st = tot["lucebox"], r.stats
            s["tokens"] += st.n_generated
            s["decode_s"] += st.decode_seconds
            s["total_s"] += st.prefill_seconds + st.decode_seconds
            s["drafted"] += st.spec["drafted"]
            s["accepted"] += st.spec["accepted"]
            s["steps"] += st.spec["steps"]
            if plain is not None:
                q = plain.generate(p, max_tokens=up.n_predict).stats
                pl = tot["plain"]
                pl["tokens"] += q.n_generated
                pl["decode_s"] += q.decode_seconds
                pl["total_s"] += q.prefill_seconds + q.decode_seconds
        for side in reps:
            reps[side].append(tot[side])

    def rate(side: str, clock: str) -> float:
        return statistics.median(t["tokens"] / t[clock] for t in reps[side] if t[clock] > 0)

    print()
    print(f"{'':10} {'tokens':>7} {'decode tok/s':>13} {'end-to-end tok/s':>17} {'acceptance':>11} {'AL':>6}")
    rows = ["upstream", "lucebox"] + (["plain"] if plain is not None else [])
    names = {"upstream": "upstream", "lucebox": "lucebox", "plain": "lb plain"}
    for side in rows:
        t = reps[side][-1]
        acc = f"{t['accepted'] / t['drafted']:.1%}" if t["drafted"] else "-"
        al = f"{(t['accepted'] + t['steps']) / t['steps']:.2f}" if t["steps"] else "-"
        print(f"{names[side]:10} {int(t['tokens']):>7} {rate(side, 'decode_s'):>13.1f} "
              f"{rate(side, 'total_s'):>17.1f} {acc:>11} {al:>6}")
    print(f"lucebox / upstream: decode x{rate('lucebox', 'decode_s') / rate('upstream', 'decode_s'):.2f}, "
          f"end-to-end x{rate('lucebox', 'total_s') / rate('upstream', 'total_s'):.2f}")
    if plain is not None:
        print(f"lucebox chain / lucebox plain: decode x{rate('lucebox', 'decode_s') / rate('plain', 'decode_s'):.2f}")
    print(f"same output as upstream on every prompt and repetition: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
