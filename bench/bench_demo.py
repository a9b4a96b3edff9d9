#!/usr/bin/env python3
"""Acceptance of the bundled demo pair: chain speculative decoding (block 16) at temperature 0 on
20 held-out code prompts (train/corpus.py: files of this interpreter's standard library whose
path hash puts them outside the training split), against plain decoding on the same engine.

Prints, per prompt, the acceptance length of chain speculation (committed tokens per verify step)
and checks that the speculative tokens equal plain decoding's; then mean / median acceptance
length, and tok/s of chain, of spec "auto" (speculates only while measured faster) and of plain.
Where the two part, it prints the plain path's logit margin between the two tokens at that row and
the rounding noise there (the largest |device - CPU| logit difference of that row): a 16-token
verify and a 1-token decode use different GPU kernels, whose rounding differs, and the difference
accumulates in the recurrent state, so a path may part at a near tie (margin < 2 x noise); a part
at a clear margin would be a bug (exit status 1). On the CPU the noise is 0: any part is a bug.
Example:
    python bench/bench_demo.py                 # CPU
    python bench/bench_demo.py --device cuda --max-tokens 256
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))

import numpy as np  # noqa: E402

import lucebox  # noqa: E402
from lucebox import default_model  # noqa: E402
from corpus import code_prompts  # noqa: E402

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=2048)
    args = ap.parse_args()
    target, draft = (str(p) for p in default_model.default_model_paths())
    prompts = code_prompts(args.prompts)
    if len(prompts) < args.prompts:
        print(f"only {len(prompts)} held-out prompts found in this interpreter's standard library", file=sys.stderr)
    spec = lucebox.Engine(target, draft, ctx=args.ctx, device=args.device, spec="chain")
    auto = lucebox.Engine(target, draft, ctx=args.ctx, device=args.device)  # spec="auto", the default
    plain = lucebox.Engine(target, ctx=args.ctx, device=args.device, spec="off")
    cpu = plain if args.device == "cpu" else lucebox.Engine(target, ctx=args.ctx, device="cpu", spec="off")
    print(f"$ {' '.join(sys.argv)}")
    print(f"device {spec.device}; {len(prompts)} held-out prompts; max {args.max_tokens} tokens; temperature 0")
    als, spec_t, plain_t, n_spec, n_plain, ties, clear = [], 0.0, 0.0, 0, 0, 0, 0
    auto_t, n_auto, auto_plain_steps, auto_steps = 0.0, 0, 0, 0
    spec.generate(prompts[0], max_tokens=8)  # warm-up
    auto.generate(prompts[0], max_tokens=8)
    plain.generate(prompts[0], max_tokens=8)
    print(f"{'#':>3} {'prompt tok':>10} {'gen':>5} {'AL':>6} {'steps':>6}  same as plain")
    for i, p in enumerate(prompts):
        t0 = time.perf_counter()
        r = spec.generate(p, max_tokens=args.max_tokens)
        spec_t += time.perf_counter() - t0
        t0 = time.perf_counter()
        q = plain.generate(p, max_tokens=args.max_tokens)
        plain_t += time.perf_counter() - t0
        n_spec += r.stats.n_generated
        t0 = time.perf_counter()
        u = auto.generate(p, max_tokens=args.max_tokens)
        auto_t += time.perf_counter() - t0
        n_auto += u.stats.n_generated
        auto_steps += u.stats.spec["steps"]
        auto_plain_steps += u.stats.spec["plain_steps"]
        n_plain += q.stats.n_generated
        same = r.tokens == q.tokens
        note = "yes"
        if not same:
            at = next((j for j, (a, b) in enumerate(zip(q.tokens, r.tokens)) if a != b),
                      min(len(q.tokens), len(r.tokens)))
            ids = plain.encode_prompt(p) + q.tokens[:at]
            row = plain.session().eval(ids, all_logits=False)[-1]
            noise = float(np.abs(row - cpu.session().eval(ids, all_logits=False)[-1]).max())
            if at < min(len(q.tokens), len(r.tokens)):
                margin = float(row[q.tokens[at]] - row[r.tokens[at]])
            else:  # one stopped early: the top-2 margin
                top2 = np.sort(row)[-2:]
                margin = float(top2[1] - top2[0])
            tie = margin < 2 * noise
            ties += tie
            clear += not tie
            note = (f"parts at token {at}, plain margin {margin:.4f}, noise {noise:.4f} "
                    f"({'near tie' if tie else 'CLEAR MARGIN'})")
        als.append(r.stats.acceptance_length)
        print(f"{i:>3} {r.stats.n_prompt:>10} {r.stats.n_generated:>5} {als[-1]:>6.2f} "
              f"{r.stats.spec['steps']:>6}  {note}")
    print(f"acceptance length: mean {statistics.mean(als):.2f}, median {statistics.median(als):.2f}, "
          f"min {min(als):.2f}, max {max(als):.2f} (bar: mean >= 3.0)")
    plain_tps = n_plain / plain_t
    print(f"chain {n_spec / spec_t:.1f} tok/s ({n_spec / spec_t / plain_tps:.2f}x), auto {n_auto / auto_t:.1f} tok/s "
          f"({n_auto / auto_t / plain_tps:.2f}x; {auto_steps} speculative + {auto_plain_steps} plain steps), "
          f"plain {plain_tps:.1f} tok/s; wall time incl. prefill")
    print(f"speculative == plain on {len(prompts) - ties - clear} / {len(prompts)} prompts; parted at a near "
          f"tie on {ties}, at a clear margin on {clear}")
    if clear:
        print(f"MISMATCH: {clear} prompt(s) part from plain decoding at a clear margin")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
