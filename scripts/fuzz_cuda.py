#!/usr/bin/env python3
"""Differential fuzz on a CUDA device: fuzz_shapes' random targets and drafts (its `case`: layer patterns,
hidden, FFN, attention and DeltaNet head layouts, rope sections, conv widths, tied heads; 19 weight types;
K / V cache types; micro-batches; long prompts), each run on the GPU and held to what lucebox promises
there. Per case:

1. The target loads on CUDA, or is refused with a LuceboxError naming why (counted, printed); the same
   file runs on the CPU. A refusal for the target's conv width is a finding: fuzz_shapes draws widths
   2-15, which CUDA runs (ggml's kernels, or lucebox's padding with zero taps).
2. Prompt logits (the first part as micro-batches of the case's size, then up to 16 one-token steps):
   finite, and of the CPU's accuracy against the exact model, the weights decoded to F32 and run on the
   CPU (tests/gpu/exact_model.py: the two backends quantize activations differently inside a product).
3. A snapshot (host or device, drawn) taken after a prefix and restored into another session gives the
   rest of the prompt the bits the first session computed without it.
4. Greedy speculation on CUDA, with the case's draft (chain or DDTree tree) and with forced chain
   proposals (a wrong one at a drawn index: every verify width), gives plain CUDA decoding's tokens, or
   parts from them only at a near tie (exact_model.check_same_or_near_tie).

Each case runs in a child process, so an abort (a ggml assertion, a CUDA error) is a finding too and the
run goes on. Cases are seeded by their number (fuzz_shapes' case n), so `--start N --cases 1` replays
case N. Not run by CI (no GPU); `tests/gpu/test_fuzz_cuda.py` runs its first cases on the GPU machine.
On a machine lent for minutes, `--seconds S` starts no case after S seconds and still prints the totals
and the range of cases that ran.

    python scripts/fuzz_cuda.py --start 0 --cases 100
"""
from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

#: one-token steps after the prompt's micro-batches in check 2
STEPS = 16


def run_case(n: int, d: str, device: str) -> tuple[dict, list[str]]:
    """Case `n` in directory `d` on `device`: (counts, findings)."""
    import numpy as np

    import lucebox
    from exact_model import check_like_the_cpu, check_same_or_near_tie, error_ratio, exact_logits
    from forcing import forced
    from fuzz_shapes import case, write_pair
    from lucebox.errors import ConfigError, LuceboxError

    c = case(n)
    counts: dict = {}
    findings: list[str] = []
    here = Path(d)
    target, draft = here / f"c{n}.gguf", here / f"c{n}-draft.gguf"

    def fail(what: str) -> None:
        findings.append(f"case {n}: {c}: {what}")

    try:
        try:
            write_pair(c, target, draft)
        except ConfigError as e:
            counts["refused_by_synth"] = 1
            print(f"case {n}: synth refused the shape: {e}", flush=True)
            return counts, findings
        prompt = [int(x) for x in np.random.default_rng(c["seed"]).integers(0, 1000, c["n_prompt"])]
        common = dict(ctx=c["ctx"], ubatch=c["ubatch"], kv_type_k=c["kv"][0], kv_type_v=c["kv"][1])
        try:
            gpu = lucebox.Engine(str(target), device=device, spec="off", **common)
        except LuceboxError as e:  # check 1
            counts["refused_on_device"] = 1
            print(f"case {n}: refused on {device}: {type(e).__name__}: {e}", flush=True)
            if not str(e).strip():
                fail(f"refused on {device} without a message: {type(e).__name__}")
            if "convolution of width" in str(e):
                fail(f"refused a conv width of at most 15 on {device}: {e}")
            return counts, findings
        cpu = lucebox.Engine(str(target), device="cpu", spec="off", **common)

        # check 2: a micro-batched prefix, then one-token steps, against the exact model as the CPU
        n_batched = max(1, len(prompt) - STEPS)
        s = gpu.session()
        got = np.concatenate([s.eval(prompt[:n_batched]), *[s.eval([t]) for t in prompt[n_batched:]]])
        ref = cpu.session().eval(prompt)
        exact = exact_logits(str(target), prompt, c["target"], here, ctx=c["ctx"], ubatch=c["ubatch"])
        try:
            # (the exact model's cache is F16; a model without attention layers has none)
            cpu_is_exact = c["type"] == "f32" and (c["kv"] == ("f16", "f16") or all(cpu.hparams.is_recurrent))
            check_like_the_cpu(f"case {n} ({c['type']}, kv {c['kv']})", exact, ref, got, cpu_is_exact=cpu_is_exact,
                               ratio=error_ratio(c["type"]))
            counts["logits_checked"] = 1
        except AssertionError as e:
            fail(f"logits on {device}: {e or 'assertion'}")
            return counts, findings

        # check 3: a snapshot of a prefix restored into another session
        if len(prompt) > 1:
            r = random.Random(f"restore {n}")
            cut, where = r.randint(1, len(prompt) - 1), r.choice(["host", "device"])
            first = gpu.session()
            first.eval(prompt[:cut])
            snap = first.snapshot(where)
            rest = first.eval(prompt[cut:])
            second = gpu.session()
            second.restore(snap)
            if not np.array_equal(second.eval(prompt[cut:]), rest):
                fail(f"a {where} snapshot after {cut} of {len(prompt)} tokens restored: other logits")
            else:
                counts["restores_checked"] = 1

        # check 4: speculation gives plain decoding's tokens, or parts at a near tie
        plain = list(gpu.generate(prompt, max_tokens=c["max_tokens"]).tokens)
        batched = lucebox.Engine(str(target), device=device, spec="off", **dict(common, ubatch=512))
        spec = lucebox.Engine(str(target), draft=str(draft), device=device, spec=c["spec"],
                              tree_budget=c["tree_budget"], **common)
        wrong_at = random.Random(f"forced {n}").choice([None, 0, 1, 3, 7, 15])
        runs = {c["spec"]: list(spec.generate(prompt, max_tokens=c["max_tokens"]).tokens),
                f"forced chain (wrong at {wrong_at})": list(gpu.session().generate(
                    prompt, max_tokens=c["max_tokens"], propose=forced(plain, len(prompt), wrong_at)).tokens)}
        for what, tokens in runs.items():
            try:
                check_same_or_near_tie(gpu, cpu, prompt, plain, tokens, batched)
                counts["spec_checked"] = counts.get("spec_checked", 0) + 1
                counts["spec_parted_at_ties"] = counts.get("spec_parted_at_ties", 0) + int(tokens != plain)
            except AssertionError as e:
                fail(f"{what} on {device}: {e}")
    except LuceboxError as e:
        fail(f"{type(e).__name__}: {e}")
    except Exception:  # noqa: BLE001 (a finding, with its traceback)
        fail(traceback.format_exc())
    finally:
        for f in (target, draft, here / f"c{n}-exact-f32.gguf"):
            f.unlink(missing_ok=True)
    return counts, findings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--dir", default="/tmp/lucebox-fuzz-cuda")
    ap.add_argument("--device", default="cuda", help="the device under test (cpu: a dry run of the script)")
    ap.add_argument("--case-timeout", type=float, default=600.0, help="seconds before a case counts as hung")
    ap.add_argument("--seconds", type=float, default=None,
                    help="start no case after this many seconds (the totals still print)")
    args = ap.parse_args()
    if args.seconds is not None and args.seconds <= 0:
        ap.error(f"--seconds must be positive, got {args.seconds}")

    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures import TimeoutError as CaseTimeout
    from concurrent.futures.process import BrokenProcessPool

    Path(args.dir).mkdir(parents=True, exist_ok=True)
    spawn = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(1, mp_context=spawn)
    totals: dict = {}
    findings: list[str] = []
    t0 = time.monotonic()
    end = args.start  # one past the last case run
    for n in range(args.start, args.start + args.cases):
        if args.seconds is not None and time.monotonic() - t0 >= args.seconds:
            break
        end = n + 1
        print(f"[case {n}]", file=sys.stderr, flush=True)
        try:
            counts, found = pool.submit(run_case, n, args.dir, args.device).result(timeout=args.case_timeout)
        except (BrokenProcessPool, CaseTimeout) as e:
            for p in list(getattr(pool, "_processes", {}).values()):
                p.kill()
            pool.shutdown(wait=False, cancel_futures=True)
            pool = ProcessPoolExecutor(1, mp_context=spawn)
            what = "hung" if isinstance(e, CaseTimeout) else "its process died (an abort)"
            counts, found = {}, [f"case {n}: {what}; replay: python scripts/fuzz_cuda.py --start {n} --cases 1"]
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + v
        for f in found:
            print(f, flush=True)
        findings += found
    pool.shutdown()
    print(f"outcomes {totals}")
    print(f"{len(findings)} finding(s) in cases [{args.start}, {end}) on {args.device}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
