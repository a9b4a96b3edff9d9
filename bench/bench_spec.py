#!/usr/bin/env python3
"""DFlash chain speculative decoding speed at controlled acceptance.

Random-weight drafts are never accepted, so acceptance is forced: the proposals are the target's
own greedy continuation corrupted at index AL-1, so every step commits exactly AL tokens (AL =
accepted proposals + the target's bonus token; AL 16 = nothing corrupted). That continuation is
computed through the verify path itself (a speculative run whose proposals are all rejected):
a 16-token verify and a 1-token decode use different GPU kernels, and on a deep random-weight
model the last-bit differences flip near-tied argmaxes, after which a plain-decode reference would
no longer be the target's choice. Whether the two references agree is printed as information.
Prints tok/s per AL, the ratio to plain decoding measured in the same run, and one step's phase
costs (draft, verify, commit; the phase timings wait for the device after each commit, so the
verify column is the verify's own time) relative to one plain decode step. Two ratios: "x plain" divides the
generations' tok/s (both count the token sampled from the prompt, and a speculative run's last step
commits only what the budget has left: the ratio depends on --tokens), "x step" divides the
steady-state rates, committed tokens per speculative step time over tokens per plain decode step
time (the first, prompt-sampled token excluded from the plain steps). With --draft, also the real
draft's full step (draft forward + verify + commit) at its natural acceptance. --tree-budgets:
the cost of one DDTree verify (spec "tree") of a forced tree of that many nodes (a balanced tree,
8 children per node; its tokens are never accepted, so each step verifies a whole tree), relative
to one plain decode step.
    python bench/bench_spec.py --model t27-q8_0.gguf --draft d27-q8_0.gguf --tokens 97 --tree-budgets 22,64
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

import kernel_switches
import lucebox


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--devices", default="", help="comma-separated devices for a split placement (e.g. cuda:0,cuda:1)")
    ap.add_argument("--split", default="none", help="none | layer | tensor (with --devices)")
    ap.add_argument("--draft-device", default="", help="the draft's device on a split placement")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens (random ids)")
    ap.add_argument("--tokens", type=int, default=97,
                    help="tokens generated per run (97: the 96 after the prompt-sampled one split evenly into steps "
                         "of 1, 4, 6, 8 and 16)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--accept", default="1,4,6,8,16", help="acceptance lengths to force")
    ap.add_argument("--tree-budgets", default="", help="tree sizes whose verify cost to measure (e.g. 22,64)")
    kernel_switches.add_arguments(ap)
    args = ap.parse_args()
    print(f"attention split: {kernel_switches.apply(args)}")

    placement = dict(device=args.device, devices=[d for d in args.devices.split(",") if d], split=args.split)
    engine = lucebox.Engine(args.model, args.draft, ctx=args.ctx, spec="chain" if args.draft else "off",
                            draft_device=args.draft_device, **placement)
    rng = np.random.default_rng(0)
    prompt = [int(x) for x in rng.integers(10, engine.hparams.n_vocab, args.prompt)]
    plain = lucebox.Engine(args.model, ctx=args.ctx, **placement)
    plain_ref = plain.generate(prompt, max_tokens=args.tokens + 32).tokens
    # the verify path's greedy continuation: proposals that are (almost surely) all rejected
    reference = plain.session().generate(prompt, max_tokens=args.tokens + 32,
                                         propose=lambda context, last, n: [0] * n).tokens
    first_diff = next((i for i, (a, b) in enumerate(zip(plain_ref, reference)) if a != b), None)
    print("verify-path greedy vs plain decode: " +
          ("identical" if first_diff is None and len(plain_ref) == len(reference)
           else f"differ from token {first_diff} (batch-dependent GPU numerics on near-tied logits)"))

    def med(xs: list[float]) -> str:
        return f"{statistics.median(xs):.1f} ({min(xs):.1f}..{max(xs):.1f})"

    plain_tps, plain_steps = [], []
    for i in range(args.reps + 1):
        r = plain.generate(prompt, max_tokens=args.tokens)
        if i:
            plain_tps.append(r.stats.decode_tokens_per_second)
            plain_steps.append(1e3 * r.stats.decode_seconds / max(1, r.stats.n_generated - 1))
    step_ms = statistics.median(plain_steps)
    print(f"plain decode: {med(plain_tps)} tok/s, {step_ms:.2f} ms per decode step on {engine.device}")
    print(f"{'AL':>4} {'tok/s':>22} {'x plain':>8} {'x step':>7} {'step ms':>8} {'verify/decode':>14} "
          f"{'draft ms':>9} {'commit ms':>10} {'AL seen':>8}")

    mismatches = 0
    for al in [int(x) for x in args.accept.split(",")]:
        corrupt = None if al >= 16 else al - 1

        def propose(context: np.ndarray, last: int, n: int) -> list[int]:
            start = len(context) - len(prompt) + 1
            out = [reference[start + i] if start + i < len(reference) else 0 for i in range(n)]
            if corrupt is not None and corrupt < n:
                out[corrupt] = (out[corrupt] + 1) % engine.hparams.n_vocab
            return out

        tps, steps, verify, draft, commit, seen = [], [], [], [], [], []
        for i in range(args.reps + 1):
            r = plain.session().generate(prompt, max_tokens=args.tokens, propose=propose, phase_timings=True)
            if r.tokens != reference[: len(r.tokens)]:
                print(f"  MISMATCH: AL {al}: output differs from the verify-path greedy reference", file=sys.stderr)
                mismatches += 1
            s = r.stats.spec
            if i:
                tps.append(r.stats.decode_tokens_per_second)
                steps.append(1e3 * r.stats.decode_seconds / s["steps"])
                verify.append(1e3 * s["verify_seconds"] / s["steps"])
                draft.append(1e3 * s["draft_seconds"] / s["steps"])
                commit.append(1e3 * s["commit_seconds"] / s["steps"])
                seen.append(r.stats.acceptance_length)
        spec_step = statistics.median(steps)
        print(f"{al:>4} {med(tps):>22} {statistics.median(tps) / statistics.median(plain_tps):>7.2f}x "
              f"{statistics.median(seen) * step_ms / spec_step:>6.2f}x "
              f"{spec_step:>8.2f} {statistics.median(verify) / step_ms:>13.2f}x "
              f"{statistics.median(draft):>9.2f} {statistics.median(commit):>10.2f} {statistics.median(seen):>8.2f}")

    if args.draft:
        times = []
        for i in range(args.reps + 1):
            r = engine.generate(prompt, max_tokens=args.tokens)
            if i:
                s = r.stats.spec
                times.append((r.stats.decode_tokens_per_second, 1e3 * r.stats.decode_seconds / max(1, s["steps"]),
                              r.stats.acceptance_length))
        tps = [x[0] for x in times]
        print(f"real draft: {med(tps)} tok/s, {statistics.median(x[1] for x in times):.2f} ms per full step "
              f"({statistics.median(x[1] for x in times) / step_ms:.2f}x a decode step), AL {times[0][2]:.2f}")
    for budget in [int(x) for x in args.tree_budgets.split(",") if x]:
        def propose_tree(context: np.ndarray, last: int, max_nodes: int,
                         budget: int = budget) -> tuple[list[int], list[int]]:
            n = min(budget, max_nodes)
            # node i+1's parent: breadth-first, 8 children per node (0 = the root)
            return [1] * n, [i // 8 for i in range(n)]

        verify, commit = [], []
        for i in range(args.reps + 1):
            r = plain.session().generate(prompt, max_tokens=args.tokens // 4, propose_tree=propose_tree,
                                         phase_timings=True)
            s = r.stats.spec
            if i:
                verify.append(1e3 * s["verify_seconds"] / s["steps"])
                commit.append(1e3 * s["commit_seconds"] / s["steps"])
        print(f"tree verify, {budget} nodes + root: {statistics.median(verify):.2f} ms "
              f"({statistics.median(verify) / step_ms:.2f}x a decode step), commit {statistics.median(commit):.2f} ms")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
