#!/usr/bin/env python3
"""Prefix cache and session snapshots: warm vs cold time to first token, restore cost, bytes per token.

On one engine and one deterministic prompt of N random token ids (normal tokens only, fixed seed):
  cold TTFT     fresh session, prefill the N tokens and produce 1 greedy token (wall time);
  miss TTFT     the server's path on a cache miss: prefill N-1 tokens, snapshot into the
                PrefixCache, evaluate the last token and produce 1 (what a first request pays);
  warm TTFT     the server's path on a hit: look up the prompt in the PrefixCache, restore the
                (N-1)-token snapshot into the slot's session, evaluate the last token, produce 1;
  restore       snapshots taken at several prefix lengths: their size, snapshot and restore time
                and restore + 1 token, so the cost can be read against the prefix length;
  bytes/token   snapshot size / prefix length, and the fixed part (DeltaNet conv + ssm state)
                and per-token part (attention KV rows + the token id) fitted over the lengths,
                next to what the model's shapes predict.
Correctness: the first --check tokens (greedy) after a warm restore must equal the miss path's
(the same computation: prefill N-1 tokens, then 1); otherwise MISMATCH is printed and the exit
status is 1. Whether they also equal the cold run's is printed as information: the cold run
splits the prompt into different micro-batches, and on a GPU different batch shapes can flip a
near-tied argmax of a random-weight model.

Method: one short discarded generation warms the engine up; cold and miss are then measured
--cold-reps times (each a full prefill); warm and restore get one discarded run, then --reps
runs; median (min..max). The warm path is the server's own policy, `lucebox.prefix_cache`'s
`start_session` with a `PrefixCache` keeping its snapshots at --location (host: pinned host
memory where the device offers it; device: the GPU's memory).
Example (GPU machine; writes or reuses the synthetic 27B target in the cache dir):
    python bench/bench_prefix.py --preset qwen3.6-27b --type q8_0 --prompt-tokens 26000 --json prefix.json
CPU check:
    python bench/bench_prefix.py --preset tiny --prompt-tokens 2000
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import lucebox
from lucebox import _core
from lucebox.prefix_cache import PrefixCache, start_session
from lucebox.vocab import TOKEN_TYPE_NORMAL



def stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def fmt_ms(s: dict[str, float]) -> str:
    return f"{s['median'] * 1e3:.2f} ({s['min'] * 1e3:.2f}..{s['max'] * 1e3:.2f})"


def ensure_model(args: argparse.Namespace) -> str:
    if args.model:
        return args.model
    from lucebox import synth
    from lucebox.default_model import cache_dir

    workdir = Path(args.workdir) if args.workdir else cache_dir() / "bench"
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"synth-{args.preset}-{args.type}.gguf"
    if path.exists():
        print(f"reusing {path}", file=sys.stderr)
        return str(path)
    print(f"writing {path} (lucebox synth {args.preset} --type {args.type}) ...", file=sys.stderr, flush=True)
    last = [-1]

    def progress(done: int, total: int) -> None:
        pct = 100 * done // max(1, total)
        if pct // 10 != last[0] // 10:
            last[0] = pct
            print(f"  {pct}% of {total / 1e6:.1f} MB", file=sys.stderr, flush=True)

    s = synth.write_target(path, args.preset, type=args.type, progress=progress)
    print(f"wrote {path}: {s['bytes'] / 1e9:.2f} GB in {s['seconds']:.1f} s", file=sys.stderr)
    return str(path)


def make_prompt(engine: lucebox.Engine, n: int, seed: int) -> list[int]:
    """n random ids drawn from the vocabulary's normal tokens (no control / user-defined / unused)."""
    tok = engine.tokenizer
    types = np.asarray(tok.vocab.token_types)
    normal = np.flatnonzero(types == TOKEN_TYPE_NORMAL)
    normal = normal[normal < engine.hparams.n_vocab]
    normal = np.setdiff1d(normal, np.fromiter(tok.eos_ids | tok.special_ids, dtype=np.int64))
    if normal.size == 0:
        raise SystemExit("the vocabulary has no normal tokens")
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.choice(normal, n)]


def continue_greedy(session: lucebox.Session, first: lucebox.GenerationResult, n_check: int) -> tuple[list[int], str]:
    """`first` (1 token) followed by n_check - 1 more greedy tokens from the same session."""
    toks = list(first.tokens)
    if first.finish_reason != "length" or n_check <= 1:
        return toks, first.finish_reason
    r = session.generate((), max_tokens=n_check - 1, temperature=0.0)
    return toks + list(r.tokens), r.finish_reason


def expected_bytes(hp: _core.Qwen35HParams, kv_k: str, kv_v: str) -> tuple[int, int]:
    """(fixed, per-token) snapshot bytes the shapes predict: DeltaNet conv ((d_conv-1) x conv_dim)
    and ssm (d_state^2 x n_v_heads) state in f32 per recurrent layer; per token a K and a V row of
    n_head_kv * head_dim per attention layer in the KV types, plus the int32 token id."""
    def row(type_name: str, n: int) -> int:
        _name, blck, size = _core.ggml_type_traits(type_name)
        return n // blck * size

    fixed = hp.n_recurrent_layers * ((hp.ssm_d_conv - 1) * hp.conv_dim + hp.ssm_d_state ** 2 * hp.ssm_n_v_heads) * 4
    width = hp.n_head_kv * hp.head_dim
    per_token = 4 + hp.n_attention_layers * (row(kv_k, width) + row(kv_v, width))
    return fixed, per_token


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3.6-27b", help="synthetic target preset: tiny, small, qwen3.6-27b")
    ap.add_argument("--type", default="q8_0", help="tensor type of the synthetic target")
    ap.add_argument("--model", help="use this GGUF instead of a synthetic target")
    ap.add_argument("--workdir", help="where synthetic files go (default: the lucebox cache dir /bench)")
    ap.add_argument("--prompt-tokens", type=int, default=26000)
    ap.add_argument("--ctx", type=int, help="context per session (default: prompt tokens + 512)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 4096, 16384],
                    help="prefix lengths to snapshot and restore (the end of the prompt is always added)")
    ap.add_argument("--reps", type=int, default=5, help="measured warm / restore runs")
    ap.add_argument("--cold-reps", type=int, default=2, help="measured cold and cache-miss runs")
    ap.add_argument("--check", type=int, default=8, help="greedy tokens compared between cold and warm")
    ap.add_argument("--seed", type=int, default=0, help="prompt seed")
    ap.add_argument("--location", choices=("host", "device"), default="host",
                    help="where the prefix cache keeps snapshots (the server's --prefix-cache-location)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if min(args.reps, args.cold_reps, args.check) < 1:
        ap.error("--reps, --cold-reps and --check must be >= 1")
    n = args.prompt_tokens
    ctx = args.ctx or n + 512
    if ctx < n + args.check:
        ap.error(f"--ctx {ctx} leaves no room for {args.check} generated tokens after {n} prompt tokens")

    command = "python " + shlex.join(sys.argv)
    model = ensure_model(args)
    t = time.perf_counter()
    engine = lucebox.Engine(model, ctx=ctx, device=args.device, kv_type=args.kv_type, ubatch=args.ubatch)
    load_s = time.perf_counter() - t
    hp = engine.hparams
    prompt = make_prompt(engine, n, args.seed)
    path_used = f"start_session, snapshots in {args.location} memory"
    cache = PrefixCache(1 << 40, location=args.location)  # budget large enough for every snapshot here; the server's is --prefix-cache-mb
    if n - 1 < max(1, cache.min_tokens):
        ap.error(f"--prompt-tokens must be > {cache.min_tokens} (the prefix cache ignores shorter prompts)")
    print(f"device {engine.device}; model {model} ({hp.n_layer} layers: {hp.n_recurrent_layers} DeltaNet + "
          f"{hp.n_attention_layers} attention, vocab {hp.n_vocab}); ctx {ctx}, KV {args.kv_type}; "
          f"loaded in {load_s:.1f} s", flush=True)
    print(f"prompt: {n} random normal-token ids (seed {args.seed}); warm path: PrefixCache + {path_used}",
          flush=True)

    # Warm-up: graphs, allocations, first-touch of the weights. Discarded.
    engine.session().generate(prompt[:min(n, 2 * args.ubatch)], max_tokens=2, temperature=0.0)

    # Cold: fresh session, whole prompt, 1 token.
    cold_times: list[float] = []
    cold_tokens: list[int] = []
    cold_finish = ""
    for _ in range(args.cold_reps):
        s = engine.session()
        t = time.perf_counter()
        r = s.generate(prompt, max_tokens=1, temperature=0.0)
        cold_times.append(time.perf_counter() - t)
        toks, finish = continue_greedy(s, r, args.check)
        if cold_tokens and toks != cold_tokens:
            print(f"MISMATCH: two cold runs differ: {cold_tokens} vs {toks}")
            return 1
        cold_tokens, cold_finish = toks, finish
        del s
    cold = stats(cold_times)
    print(f"cold TTFT: {fmt_ms(cold)} ms", flush=True)

    # Miss: the server's path with an empty cache (prefill N-1, snapshot, last token, 1 token).
    slot = engine.session()  # the server's slot session, reused by every request below
    miss_times: list[float] = []
    miss_tokens: list[int] = []
    for _ in range(args.cold_reps):
        cache.clear()
        t = time.perf_counter()
        rest, _start_s = start_session(slot, prompt, cache)
        r = slot.generate(rest, max_tokens=1, temperature=0.0)
        miss_times.append(time.perf_counter() - t)
        toks, _ = continue_greedy(slot, r, args.check)
        if cache.entries != 1 or len(rest) != 1:
            print(f"ERROR: the miss path left {len(rest)} tokens to generate from and {cache.entries} cache "
                  f"entries (expected 1 and 1)")
            return 1
        if miss_tokens and toks != miss_tokens:
            print(f"MISMATCH: two miss-path runs differ: {miss_tokens} vs {toks}")
            return 1
        miss_tokens = toks
    miss = stats(miss_times)
    print(f"miss TTFT (prefill {n - 1} + snapshot + 1 token): {fmt_ms(miss)} ms", flush=True)

    # Warm: cache hit, restore into the slot's session, last token, 1 token.
    warm_times: list[float] = []
    start_times: list[float] = []
    mismatches: list[str] = []
    for i in range(args.reps + 1):
        hits = cache.hits
        t = time.perf_counter()
        rest, start_s = start_session(slot, prompt, cache)
        r = slot.generate(rest, max_tokens=1, temperature=0.0)
        dt = time.perf_counter() - t
        if cache.hits != hits + 1 or len(rest) != 1:
            print(f"ERROR: warm run {i} did not hit the prefix cache ({len(rest)} tokens left to evaluate)")
            return 1
        toks, _ = continue_greedy(slot, r, args.check)
        if toks != miss_tokens:
            mismatches.append(f"warm run {i}: {toks}")
        if i:
            warm_times.append(dt)
            start_times.append(start_s)
    warm = stats(warm_times)
    lookup_restore = stats(start_times)
    lookup_times: list[float] = []
    for i in range(args.reps + 1):
        t = time.perf_counter()
        hit = cache.lookup(prompt[:-1])
        if i:
            lookup_times.append(time.perf_counter() - t)
        assert hit is not None and hit[1] == n - 1
    lookup = stats(lookup_times)
    ratio = cold["median"] / warm["median"]
    print(f"warm TTFT: {fmt_ms(warm)} ms (lookup + restore {fmt_ms(lookup_restore)} ms, "
          f"lookup alone {fmt_ms(lookup)} ms)", flush=True)
    snap_end_bytes = cache.bytes
    cache.clear()
    del slot

    # Restore cost against prefix length: one session prefilled in steps, a snapshot at each length.
    lengths = sorted({x for x in args.lengths if 0 < x < n - 1} | {n - 1})
    builder = engine.session()
    snaps: list[tuple[int, Any, float]] = []
    pos = 0
    for length in lengths:
        builder.append(prompt[pos:length])
        pos = length
        t = time.perf_counter()
        snap = builder.snapshot(args.location)
        snaps.append((length, snap, time.perf_counter() - t))
    del builder
    rows: list[dict[str, Any]] = []
    target = engine.session()
    for length, snap, snap_s in snaps:
        restore_t: list[float] = []
        first_t: list[float] = []
        for i in range(args.reps + 1):
            t = time.perf_counter()
            target.restore(snap)
            t1 = time.perf_counter()
            target.generate([prompt[length]], max_tokens=1, temperature=0.0)
            t2 = time.perf_counter()
            if i:
                restore_t.append(t1 - t)
                first_t.append(t2 - t)
        rows.append({"tokens": length, "bytes": int(snap.nbytes), "bytes_per_token": snap.nbytes / length,
                     "snapshot_seconds": snap_s, "restore_seconds": stats(restore_t),
                     "restore_plus_1_token_seconds": stats(first_t)})
    del target, snaps

    # Fixed (recurrent state) + per-token (KV) parts: least squares over the lengths.
    xs = np.array([r["tokens"] for r in rows], dtype=np.float64)
    ys = np.array([r["bytes"] for r in rows], dtype=np.float64)
    fit: dict[str, float] | None = None
    if len(rows) >= 2:
        per_token_fit, fixed_fit = np.polyfit(xs, ys, 1)
        fit = {"fixed": float(fixed_fit), "per_token": float(per_token_fit),
               "max_residual": float(np.max(np.abs(ys - (per_token_fit * xs + fixed_fit))))}
    fixed_exp, per_token_exp = expected_bytes(hp, engine.config.kv_type_k, engine.config.kv_type_v)

    # Report.
    print()
    print(f"command: {command}")
    print(f"device:  {engine.device}")
    print(f"model:   {model}")
    print(f"prompt:  {n} tokens, ctx {ctx}, KV {args.kv_type}, ubatch {args.ubatch}; "
          f"warm path: PrefixCache + {path_used}")
    print()
    print(f"{'time to first token':<44} {'ms, median (min..max)':>28}")
    print(f"{'cold (fresh session, ' + str(n) + ' tokens)':<44} {fmt_ms(cold):>28}")
    print(f"{'miss (prefill N-1, snapshot, last token)':<44} {fmt_ms(miss):>28}")
    print(f"{'warm (cache hit: restore N-1, last token)':<44} {fmt_ms(warm):>28}")
    print(f"{'  of which lookup + restore':<44} {fmt_ms(lookup_restore):>28}")
    print(f"{'  of which lookup (PrefixCache.lookup)':<44} {fmt_ms(lookup):>28}")
    bar = "met" if ratio >= 100 else "NOT met"
    print(f"cold / warm = {ratio:.1f}x  (issue bar: >= 100x: {bar}); miss / cold = {miss['median'] / cold['median']:.2f}x; "
          f"cached snapshot {snap_end_bytes / 2**20:.1f} MiB (a server needs --prefix-cache-mb >= "
          f"{-(-snap_end_bytes // 2**20)} to keep it)")
    print()
    print(f"{'prefix':>8} {'snapshot MiB':>13} {'B/token':>10} {'snapshot ms':>12} "
          f"{'restore ms, median (min..max)':>32} {'restore GB/s':>13} {'restore+1 tok ms':>17}")
    for r in rows:
        rs = r["restore_seconds"]
        print(f"{r['tokens']:>8} {r['bytes'] / 2**20:>13.2f} {r['bytes_per_token']:>10.0f} "
              f"{r['snapshot_seconds'] * 1e3:>12.2f} {fmt_ms(rs):>32} {r['bytes'] / rs['median'] / 1e9:>13.2f} "
              f"{r['restore_plus_1_token_seconds']['median'] * 1e3:>17.2f}")
    fitted = (f"fitted fixed {fit['fixed'] / 2**20:.2f} MiB, per token {fit['per_token']:.1f} B "
              f"(max residual {fit['max_residual']:.0f} B)" if fit else "no fit (needs two prefix lengths)")
    print(f"snapshot bytes = fixed + per_token * tokens: {fitted}; shapes predict fixed "
          f"{fixed_exp / 2**20:.2f} MiB (DeltaNet conv+ssm state), per token {per_token_exp} B (KV rows + token id)")
    print()
    ok = not mismatches
    print(f"greedy tokens (first {args.check}): cold {cold_tokens} ({cold_finish}), miss {miss_tokens}")
    if miss_tokens != cold_tokens:
        at = next((i for i, (a, b) in enumerate(zip(miss_tokens, cold_tokens)) if a != b), None)
        print(f"note: the miss path (prefill {n - 1} + 1) differs from the cold run (prefill {n}) from token "
              f"{at}: different micro-batch splits, different rounding (not a restore error)")
    for m in mismatches:
        print(f"MISMATCH: {m} != miss path {miss_tokens}")
    if ok:
        print(f"correctness: warm restore x{args.reps + 1} == miss path (same computation): OK")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "args": vars(args), "model": model, "device": engine.device,
                       "ctx": ctx, "warm_path": f"PrefixCache + {path_used}", "load_seconds": load_s,
                       "cold_ttft_seconds": cold, "miss_ttft_seconds": miss, "warm_ttft_seconds": warm,
                       "warm_lookup_restore_seconds": lookup_restore, "lookup_seconds": lookup,
                       "cold_over_warm": ratio,
                       "cached_snapshot_bytes": snap_end_bytes, "restore_by_length": rows,
                       "bytes_fit": fit,
                       "bytes_expected": {"fixed": fixed_exp, "per_token": per_token_exp},
                       "tokens": {"cold": cold_tokens, "miss": miss_tokens, "mismatches": mismatches},
                       "correct": ok}, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
