#!/usr/bin/env python3
"""Where the GPU time of one decode step and of one 16-token verify goes, kernel by kernel.

Uses PyTorch's profiler (CUPTI) to record every CUDA kernel launched in this process, including
ggml's, over 33 generated tokens after a prompt of --depth tokens (default 256): plain greedy decoding, then the same with
16-token verify steps whose proposals are all rejected (each step = one 16-token target forward +
commit). Prints the per-step kernel time, its split by kind (products, quantization, gated delta
net, attention, copies, the other small ops) and the --top (default 22) most expensive kernels of each.
With --prefill N, also the kernels of one N-token prefill; with --draft D, also the kernels of
speculative steps with that DFlash draft (each the draft's forward, a verify and the commit: set
beside the forced verify's, what the draft adds to a step). With programmatic dependent launches
(the default on Hopper) a kernel may start before its predecessor ends and wait on the device, so
its time includes that wait and the per-step sum exceeds the wall time; --no-pdl (GGML_CUDA_PDL=0,
which lucebox's kernels honour too) gives each kernel's own time, and the gap line (wall minus
kernel time) the device's idle time between kernels. The timeline line of each phase says the same
from the kernels' own start and end times: the device's busy time (the union of the kernels'
intervals), the overlap (kernel time minus busy time: what programmatic dependent launches let run
side by side; the kinds of neighbouring kernels that overlap, with how much), the busy time by kind
and by kernel (each kernel's part of the union past the latest end before it: with dependent
launches, the time a kernel adds to the step, its prologue hidden behind its predecessor left out) and
the idle time inside the profiled steps; --gaps N also lists the N pairs of
neighbouring kernels with the most idle time between them. The last lines count the host's CUDA
runtime calls per step, which the profiler's CUDA activity records too (cudaGraphLaunch: the step ran
as a captured CUDA graph; cudaLaunchKernel*: kernel by kernel), and the kernels per step by the call
that launched them, with those launched outside a graph most often and how many steps' worth
of kernels they are (a new graph's first call runs uncaptured). --trace DIR writes each phase's
kernel intervals (start, end, name) to DIR, for analyses after the run. Needs torch with CUDA.
Usage (repository root, GPU machine):
    lucebox synth qwen3.6-27b -o /tmp/t27.gguf --type q8_0
    python bench/bench_kernels.py /tmp/t27.gguf [--depth 4096] [--prefill 4096] [--draft /tmp/d27.gguf] [--no-pdl] [--top N]
        [--gaps N] [--trace DIR]
The kernel switches of bench_spec.py and bench_target.py (kernel_switches.py: --ggml-kernels, the attention's
split, --host-masks) apply here too, e.g. --depth 4096 --attention-long-keys 0: the narrow tile at that depth.
"""
from __future__ import annotations

import argparse
import collections
import gc
import gzip
import json
import os
import sys

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import kernel_switches
import lucebox


def profile_generation(engine: lucebox.Engine, prompt: list[int], label: str, args: argparse.Namespace, **kw) -> None:
    engine.session().generate(prompt, max_tokens=8, **kw)  # warm-up: graphs built, kernels loaded
    s = engine.session()
    s.append(prompt[:-1])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        r = s.generate(prompt[-1:], max_tokens=33, **kw)
        torch.cuda.synchronize()
    steps = (r.stats.spec or {}).get("steps", 0) or r.stats.n_generated
    print_kernels(prof, label, steps, r.stats.decode_seconds, args)


Pairs = list[tuple[float, str, str]]


def timeline(intervals: list[tuple[float, float, str]]) -> tuple[float, float, Pairs, Pairs, dict[str, float]]:
    """Of kernels (start, end, name) in microseconds: the busy time (the union of the intervals), the span
    (first start to last end), the idle gaps as (microseconds, the kernel that ended last before the gap,
    the kernel after it), the overlaps as (microseconds of a kernel's interval before the latest end so
    far, that kernel's predecessor, the kernel) and the busy time by kernel name: each kernel's part of
    the union past the latest end before it (what it adds to the step; the parts sum to the busy time)."""
    if not intervals:
        return 0.0, 0.0, [], [], {}
    spans = sorted(intervals)
    busy, gaps, overlaps = 0.0, [], []
    adds: dict[str, float] = collections.defaultdict(float)
    start, end, last = spans[0]
    adds[last] += end - start
    for s, e, name in spans[1:]:
        if s > end:
            busy += end - start
            gaps.append((s - end, last, name))
            start, end, last = s, e, name
            adds[name] += e - s
            continue
        overlaps.append((min(e, end) - s, last, name))
        if e > end:
            adds[name] += e - end
            end, last = e, name
    busy += end - start
    return busy, max(e for _, e, _ in spans) - spans[0][0], gaps, overlaps, adds


def print_kernels(prof, label: str, steps: int, wall_seconds: float | None, args: argparse.Namespace) -> None:
    agg: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    intervals = []
    api: collections.Counter[str] = collections.Counter()
    runtime_call: dict[int, str] = {}  # correlation id -> the runtime call (cudaGraphLaunch, cudaLaunchKernel*, ..)
    kernels = []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            agg[ev.name][0] += ev.device_time_total
            agg[ev.name][1] += 1
            intervals.append((ev.time_range.start, ev.time_range.end, ev.name))
            kernels.append(ev)
        elif ev.name.startswith("cuda"):
            api[ev.name] += 1
            runtime_call[ev.id] = ev.name
    if args.trace:
        write_intervals(args.trace, label, steps, intervals)
    total = sum(v[0] for v in agg.values())
    launches = sum(v[1] for v in agg.values())
    wall = ""
    if wall_seconds is not None:
        gap = 1e3 * wall_seconds / steps - total / 1e3 / steps
        wall = f"; wall {1e3 * wall_seconds / steps:.2f} ms per step, gaps {gap:.2f} ms"
    print(f"== {label}: {steps} steps; {launches / steps:.0f} kernels and kernel time {total / 1e3 / steps:.2f} ms "
          f"per step{wall}")
    groups = tally((us, kernel_group(name), n) for name, (us, n) in agg.items())
    print("  by kind: " + "; ".join(f"{g} {us / 1e3 / steps:.2f} ms ({n / steps:.0f}x)"
                                    for g, (us, n) in sorted(groups.items(), key=lambda x: -x[1][0])))
    for name, (us, n) in sorted(agg.items(), key=lambda x: -x[1][0])[:args.top]:
        print(f"  {us / 1e3 / steps:7.3f} ms/step {n / steps:6.1f}x  {us / max(1, n):8.1f} us  {name[:100]}")
    busy, span, gaps, overlaps, adds = timeline(intervals)
    print(f"  timeline: busy {busy / 1e3 / steps:.2f} ms per step, overlap {(total - busy) / 1e3 / steps:.2f} ms, "
          f"idle {(span - busy) / 1e3 / steps:.2f} ms in {len(gaps) / steps:.0f} gaps")
    busy_kinds = tally((us, kernel_group(name)) for name, us in adds.items())
    print("  busy by kind (what each kind adds past its predecessors' ends): " + "; ".join(
        f"{kind} {us / 1e3 / steps:.3f} ms" for kind, (us, _) in sorted(busy_kinds.items(), key=lambda x: -x[1][0])))
    for name, us in sorted(adds.items(), key=lambda x: -x[1])[:args.top]:
        print(f"  adds {us / 1e3 / steps:7.3f} ms/step  {name[:100]}")
    kinds = tally((us, (kernel_group(before), kernel_group(after))) for us, before, after in overlaps)
    print("  overlap by kind (predecessor -> kernel): " + "; ".join(
        f"{a} -> {b} {us / steps:.1f} us ({n / steps:.0f}x)"
        for (a, b), (us, n) in sorted(kinds.items(), key=lambda x: -x[1][0])[:8]))
    pairs = tally((us, (before, after)) for us, before, after in gaps)
    for (before, after), (us, n) in sorted(pairs.items(), key=lambda x: -x[1][0])[:args.gaps]:
        print(f"  idle {us / steps:7.1f} us/step {n / steps:5.1f}x  after {before[:60]}  before {after[:60]}")
    if api:
        print("  CUDA runtime calls per step: " + ", ".join(f"{name} {n / steps:.1f}" for name, n in api.most_common()))
        print_launchers(kernels, runtime_call, steps)


def print_launchers(kernels: list, runtime_call: dict[int, str], steps: int) -> None:
    """Kernels per step by the runtime call that launched them, matched by the profiler's correlation
    id (a captured CUDA graph's kernels carry its cudaGraphLaunch's), and the kernels launched outside
    a graph most often: the parts of a step that pay the host's launch cost each time."""
    by_call = collections.Counter(runtime_call.get(ev.id, "?") for ev in kernels)
    if by_call.keys() <= {"?"}:
        print("  kernels by launching call: not linked by this profiler")
        return
    direct = collections.Counter(ev.name for ev in kernels if runtime_call.get(ev.id, "?") not in ("cudaGraphLaunch", "?"))
    # ggml runs a new graph (a new session's, or one rebuilt as the cache view grows by 256 rows) directly
    # once before it captures it: outside-graph kernels in a step's proportions are such whole steps
    uncaptured = sum(direct.values()) / (len(kernels) / steps) if kernels else 0.0
    print("  kernels per step by launching call: " + ", ".join(f"{call} {n / steps:.1f}" for call, n in by_call.most_common())
          + f"; outside a graph: the kernels of ~{uncaptured:.1f} of the {steps} steps, most often: "
          + ", ".join(f"{name[:60]} {n / steps:.1f}x" for name, n in direct.most_common(6)))


def tally(items) -> dict:
    """(microseconds, key[, count]) items -> {key: [microseconds, count]} (count 1 where not given)."""
    out: dict = collections.defaultdict(lambda: [0.0, 0])
    for us, key, *n in items:
        out[key][0] += us
        out[key][1] += n[0] if n else 1
    return out


def write_intervals(directory: str, label: str, steps: int, intervals: list[tuple[float, float, str]]) -> None:
    """The phase's kernel intervals as DIRECTORY/<label's first word(s)>.json.gz: {"label", "steps", "names",
    "kernels": [[start us, end us, name index], ...] in start order}, for analyses after the run
    (`timeline` on them gives this script's own numbers)."""
    names: dict[str, int] = {}
    rows = [[round(s, 3), round(e, 3), names.setdefault(n, len(names))] for s, e, n in sorted(intervals)]
    slug = "_".join(label.split()[:2]).strip("-").replace("/", "_")
    os.makedirs(directory, exist_ok=True)
    with gzip.open(os.path.join(directory, f"{slug}.json.gz"), "wt") as f:
        json.dump({"label": label, "steps": steps, "names": list(names), "kernels": rows}, f)


# kernel name fragment -> kind, first match wins (everything else: "small ops")
KERNEL_KINDS = (("quantize_columns", "activation quantization"), ("q8_0::detail::matmul", "lucebox products"),
                ("mul_mat", "ggml products"), ("gemm", "cuBLAS GEMMs"), ("cutlass", "cuBLAS GEMMs"),
                ("bf16_dequant", "BF16 dequantization"), ("gated_delta_net", "gated delta net"),
                ("delta_net::cuda_step::recurrence", "DeltaNet step: recurrence"),
                ("delta_net::cuda_step::inputs", "DeltaNet step: inputs"), ("flash_attn", "attention"),
                ("Memcpy", "copies"), ("cpy", "copies"))


def kernel_group(name: str) -> str:
    return next((kind for frag, kind in KERNEL_KINDS if frag in name), "small ops")


def profile_prefill(engine: lucebox.Engine, prompt: list[int], args: argparse.Namespace) -> None:
    engine.session().append(prompt)  # warm-up
    s = engine.session()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        s.append(prompt)
        torch.cuda.synchronize()
    print_kernels(prof, f"prefill of {len(prompt)} tokens", 1, None, args)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=256, help="prompt tokens before the profiled steps")
    ap.add_argument("--draft",
                    help="also profile speculative steps with this DFlash draft (spec chain, the draft's own "
                         "acceptance: a random-weight draft's proposals are rejected, so a step is the draft's "
                         "forward, a 16-token verify and the commit), on an engine made after the plain one is freed")
    ap.add_argument("--prefill", type=int, default=0,
                    help="also profile the prefill of a prompt of this many tokens (one step)")
    ap.add_argument("--no-pdl", action="store_true",
                    help="programmatic dependent launches off (GGML_CUDA_PDL=0): each kernel's own time")
    ap.add_argument("--top", type=int, default=22, help="kernels listed per phase, the most expensive first")
    ap.add_argument("--gaps", type=int, default=0,
                    help="also list this many pairs of neighbouring kernels with the most idle time between them")
    ap.add_argument("--trace", metavar="DIR",
                    help="also write each phase's kernel intervals to DIR/<phase>.json.gz (for later analysis)")
    kernel_switches.add_arguments(ap)
    args = ap.parse_args()
    if args.no_pdl:
        os.environ["GGML_CUDA_PDL"] = "0"  # read at the first launch, after this
    print(f"attention split: {kernel_switches.apply(args)}")
    ctx = max(args.depth, args.prefill) + 64  # (the prompt, then 8 + 33 tokens and a 16-token verify's room)
    engine = lucebox.Engine(args.model, ctx=ctx, device="cuda:0")
    rng = np.random.default_rng(0)
    prompt = [int(x) for x in rng.integers(10, engine.hparams.n_vocab, args.depth)]
    profile_generation(engine, prompt, "plain decode", args)
    profile_generation(engine, prompt, "16-token verify (forced, all rejected)", args, propose=lambda c, last, n: [0] * n)
    if args.prefill:
        profile_prefill(engine, [int(x) for x in rng.integers(10, engine.hparams.n_vocab, args.prefill)], args)
    if args.draft:
        del engine  # (its weights and caches: one 27B target on the device at a time)
        gc.collect()
        engine = lucebox.Engine(args.model, args.draft, ctx=ctx, device="cuda:0", spec="chain")
        profile_generation(engine, prompt, "speculative step with the draft (draft, verify, commit)", args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
