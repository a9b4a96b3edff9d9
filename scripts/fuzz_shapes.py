#!/usr/bin/env python3
"""Differential fuzz over model shapes, against upstream llama.cpp, on the CPU.

Each case draws a qwen35 target shape that no preset has (1-7 layers in an interval or an explicit
pattern, hidden size, FFN width, attention heads / KV heads / head size / rope dims and sections,
DeltaNet conv width / state size / K and V heads, tied or untied head, vocabulary size), a weight type
(matrices whose rows do not fit the type fall back as synth documents), K and V cache types and a prompt
(1-160 tokens, at times 480-1800: caches past 512 rows), writes the target with `lucebox.synth`, and
requires:

1. the prompt's logits, evaluated in micro-batches of U tokens, to be the bits llama.cpp gives
   them one token at a time (the oracle of tests/integration, no repacked weights, no Hadamard
   rotation of a quantized cache): lucebox runs ggml's graph with ggml's one-row kernels whatever
   the batch (the CPU backend's reference mode, docs/architecture.md "Cache independence"), so any
   difference is a finding. Where lucebox's own fused DeltaNet ops run instead of ggml's (heads of
   128: every real model's), an F32-weight twin of the target with an F16 cache is compared within
   FUSED_TOL of the logits' RMS instead. Upstream rounds an F32 cache's K and V to F16 before its
   flash attention (llama-graph.cpp, build_attn_mha) where lucebox reads them as F32, so an F32
   cache is compared as lucebox's F16 one (the same bits as upstream's F32), and lucebox's F32
   cache only checked finite. Rows are also checked finite;
2. the prompt evaluated as a prefix restored from a snapshot (cut at random) plus the rest to give
   the cold evaluation's bits;
3. decoding with a DFlash draft of a random shape (layers, heads, head size, captured target layers,
   block size, causal or not, a sliding window; upstream's GGUF schema or the original lucebox one),
   verified as a chain or a DDTree tree (budgets 4-80), to give plain decoding's tokens, greedy or
   sampled with a seed;
4. a draft in upstream's schema to propose, at every step of upstream's own greedy DFlash generation
   (``llama-speculative-simple``, its debug log; tests/integration/upstream_spec.py), what upstream's
   draft proposes on the same context: in half the cases (drawn by case) the pair in its own weight
   types (any target type, an F32 / Q8_0 / F16 draft), else on F32 twins of the pair (upstream's
   batched kernels round differently, which moves the printed probabilities by a few thousandths at
   most: ties of TWIN_DRAFT_TIE). A pair in its own quantized types that parts beyond the tie but
   within OWN_TYPES_ROUNDING is checked again on its F32 twins, and is a finding only if they part too.
   Where lucebox's fused
   DeltaNet ops run, and for pairs in their own types that are not all F32, the target's features
   differ from upstream's by more than rounding, and ties are wider (WIDE_DRAFT_TIE). Needs that
   program (``scripts/build_upstream_spec.sh``); without it this check is skipped, said once;
5. the target placed over 2-3 CPU devices (every `cpu:N` a backend of its own): a layer split (random
   proportions, the draft on a random device) to give one device's prompt logits bit for bit and
   speculation plain decoding's tokens; a tensor split (ggml's meta device) to be refused with a
   ConfigError naming what does not divide, or to give, on an F32 twin, one device's logits within
   SPLIT_TOL of their RMS (only the order of the all-reduced partial sums differs), and speculation on
   the placement its plain decoding's tokens.

A shape that `lucebox.synth` refuses (ConfigError) is counted, not a finding; where upstream refuses or
aborts (it runs in a child process; it aborts on a model without attention layers or without
DeltaNet layers) only lucebox's own checks run (finite logits, speculation). A load or generation
error from lucebox is a finding. Cases are seeded by their number, so `--start N --cases 1` replays case N.

    bash scripts/install_oracle.sh .venv/bin/python      # upstream llama.cpp (cached build)
    .venv/bin/python scripts/fuzz_shapes.py --start 0 --cases 100
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

# Types with CPU kernels on both sides; the i-quants that need an importance matrix get synth's
# uniform one. (TQ1_0 / TQ2_0 / MXFP4 / NVFP4 are in tests/integration/test_weight_types.py.)
WEIGHT_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k",
                "q2_k", "q3_k", "q4_k_m", "q5_k_m", "iq4_nl", "iq4_xs", "iq3_s", "iq2_s")


def _split(r: random.Random, total: int, parts: int) -> list[int]:
    cuts = sorted(r.randint(0, total) for _ in range(parts - 1))
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]


def case(n: int) -> dict:
    """Case `n`: target overrides, draft overrides, types and the run's settings."""
    from lucebox.config import KV_TYPES  # (every cache type lucebox takes; llama.cpp takes them too)

    r = random.Random(n)
    n_layer = r.randint(1, 7)
    t: dict = dict(n_layer=n_layer, n_embd=r.choice([32, 64, 96, 128, 160, 256]),
                   n_ff=r.choice([32, 64, 96, 128, 192, 256, 320, 512]),
                   n_vocab=r.choice([1024, 1024, 1100, 2048]), has_output=r.random() < 0.7)
    # mostly both kinds of layer (upstream aborts on a model without one of them), at times one kind
    if r.random() < 0.15:
        t["recurrent_layers"] = tuple([r.random() < 0.5] * n_layer)
    elif n_layer == 1:
        t["n_layer"] = n_layer = 2
        t["recurrent_layers"] = (True, False) if r.random() < 0.5 else (False, True)
    elif r.random() < 0.5:
        t["full_attention_interval"] = r.randint(2, n_layer)
    else:
        pattern = [r.random() < 0.7 for _ in range(n_layer)]
        if all(pattern) or not any(pattern):  # (one layer of the other kind)
            i = r.randrange(n_layer)
            pattern[i] = not pattern[i]
        t["recurrent_layers"] = tuple(pattern)
    n_head_kv = r.choice([1, 2, 4])
    head_dim = r.choice([32, 64, 96, 128, 256])
    n_rot = r.choice([d for d in (8, 16, 32, 64, head_dim // 2, head_dim) if d <= head_dim and d % 2 == 0])
    sections = _split(r, n_rot // 2, 3) + [0]
    if sum(sections) == 0:
        sections[0] = 1
    t.update(n_head_kv=n_head_kv, n_head=n_head_kv * r.choice([1, 2, 3, 4, 6]), head_dim=head_dim, n_rot=n_rot,
             rope_sections=tuple(sections))
    k_heads = r.choice([1, 2, 4])
    t.update(ssm_d_conv=r.choice([2, 3, 4, 5]), ssm_d_state=r.choice([16, 32, 64, 128, 128]), ssm_n_k_heads=k_heads,
             ssm_n_v_heads=k_heads * r.choice([1, 2, 3, 4]))
    # one case in eight a wide conv (lucebox's fused DeltaNet ops take up to 8 taps, ggml's CUDA conv has
    # kernels for 9 and 15, there the others run padded with zero taps), drawn aside: the other draws stay
    wide = random.Random(f"wide conv {n}")
    if wide.random() < 0.125:
        t["ssm_d_conv"] = wide.randint(6, 15)
    d_layers = r.randint(1, 3)
    d_head = r.choice([32, 64, 128])
    d_kv = r.choice([1, 2])
    d: dict = dict(n_layer=d_layers, n_ff=r.choice([64, 128, 256]), n_head_kv=d_kv, n_head=d_kv * r.choice([1, 2, 4]),
                   head_dim=d_head, n_rot=r.choice([d_head, d_head // 2]), block_size=r.choice([2, 4, 8, 16]),
                   causal=r.random() < 0.3,
                   target_layers=tuple(sorted(r.sample(range(n_layer), r.randint(1, min(n_layer, 4))))))
    if r.random() < 0.3:
        d["sliding_window"] = r.choice([4, 16, 64])
    schema = r.choice(["upstream", "upstream", "lucebox"])
    if schema == "lucebox":  # (it captures layer outputs, ids 1..n_layer, ropes whole heads, has no causal flag)
        d.update(target_layers=tuple(i + 1 for i in d["target_layers"]), n_rot=d_head, causal=False)
    ctx = r.choice([256, 512])
    c = dict(target=t, draft=d, type=r.choice(WEIGHT_TYPES), draft_type=r.choice(["f32", "q8_0", "f16"]),
             kv=(r.choice(KV_TYPES), r.choice(KV_TYPES)) if r.random() < 0.3 else (r.choice(["f16", "q8_0"]),) * 2,
             ctx=ctx, ubatch=r.choice([1, 3, 16, 64, 512]),
             n_prompt=r.randint(1, 160), max_tokens=r.randint(4, 40), spec=r.choice(["chain", "tree"]),
             tree_budget=r.choice([4, 22, 80]), schema=schema,
             sampling=r.choice([{}, {}, dict(temperature=0.8, seed=r.randrange(1000)),
                                dict(temperature=0.7, top_k=20, seed=r.randrange(1000))]),
             seed=r.randrange(2**31))
    if r.random() < 0.1:  # at times a long prompt: caches past 512 rows, where upstream's threads would split keys
        c.update(ctx=2048, n_prompt=r.randint(480, 1800))
    return c


def write_pair(c: dict, target: Path, draft: Path) -> None:
    """Write case `c`'s target and draft GGUFs; ConfigError where synth refuses the shape."""
    from lucebox import synth

    synth.write_target(target, "tiny", type=c["type"], seed=c["seed"], overrides=c["target"])
    synth.write_draft(draft, "tiny", type=c["draft_type"], seed=c["seed"] + 1, overrides=c["draft"],
                      target_overrides=c["target"], schema=c["schema"])


def _reference(path: str, prompt: list[int], ctx: int, kv: tuple[str, str]):
    """Upstream's logits of `prompt`, one token at a time (run in a child process: upstream aborts
    on some shapes, e.g. a model without attention layers). One thread: from 512 cache rows on, upstream's
    one-row attention splits the keys over its threads and adds the parts, which rounds otherwise;
    with one thread it is one part, the bits of lucebox's reference mode, which never splits
    (docs/architecture.md "Cache independence"; its matrix products do not depend on the thread count)."""
    import oracle
    return oracle.reference_logits(path, prompt, n_ctx=ctx, n_batch=1, n_ubatch=1, n_threads=1, type_k=kv[0],
                                   type_v=kv[1], attn_rot=False, repack=False)


#: Largest |lucebox - upstream| / RMS(upstream logits) where lucebox's fused DeltaNet ops replace
#: ggml's: F32 weights and an F16 cache, so that the ops' rounding shows alone
#: (tests/integration/test_oracle.py's TOL_F32_F16KV).
FUSED_TOL = 2e-2
#: Largest |tensor split - one device| / RMS(logits) on F32 weights (tests/integration/test_tensor_parallel.py
#: measured 1e-4 absolute on logits of RMS ~1).
SPLIT_TOL = 2e-3
#: Check 4's tie in printed probability where the target's features, the draft's input, differ from upstream's
#: by more than rounding, so the draft's logits may differ by a few hundredths: where lucebox's fused DeltaNet
#: ops run (up to ~FUSED_TOL; case 6584: candidates 0.479 and 0.476 swapped), and for a pair in its own weight
#: types, not all F32 (upstream's target verifies in batches, whose quantized products round otherwise than
#: its and lucebox's one-row ones, and each later layer's quantized input can turn that into a whole step:
#: cases 7700-8200, swaps of 0.002-0.004 with Q8_0 drafts; case 20019, 0.374 and 0.350 with a Q4_0 target of
#: width 32, whose F32 twins agree at every step).
WIDE_DRAFT_TIE = 0.03
#: Check 4's tie on F32 pairs: upstream's target features come from batched products (its prompt in one
#: batch, its verifies in blocks), which round otherwise than one-row ones: over fuzz_shapes' F32 targets
#: (cases 11000-11040, the prompt in 512-token batches against one token at a time) by 7e-5 to 4e-3 of the
#: logits' RMS, which may move the draft's printed probabilities by a few thousandths (case 11107: 0.369 and
#: 0.367 swapped at step 4; one-token against 4-token batches, its target's logits part by 2e-3).
TWIN_DRAFT_TIE = 0.004
#: Check 4: the largest parting in printed probability of a pair in its own quantized types that its F32 twins
#: may excuse (they must then agree at every step). Narrow quantized models turn rounding into whole quantization
#: steps of each later layer's input: width 32 moved proposals by 0.05 (case 12788: IQ3_S target, F32 draft),
#: 0.043 (13080: Q4_1 target), 0.036 (13489: IQ4_NL target, Q8_0 draft) and 0.065 (13597: Q4_K_M target, Q8_0
#: draft, still 0.037 on the target's F32 twin); all four pairs agree at every step as F32 twins. A logic error
#: parts by more, or on the twins too.
OWN_TYPES_ROUNDING = 0.1


def placement(n: int, t: dict) -> dict:
    """Case `n`'s placement for check 5 over target `t` (its own random stream: the case's other draws stay
    as they were). Tensor splits mostly over as many devices as the K and KV heads allow (others are refused)."""
    r = random.Random(f"placement {n}")
    split = r.choice(["layer", "tensor"]) if t["n_layer"] > 1 else "tensor"
    heads = min(t["ssm_n_k_heads"], t["n_head_kv"])
    if split == "tensor":
        k = r.choice([2, 3]) if heads >= 3 or r.random() < 0.2 else 2
    else:
        k = r.randint(2, min(3, t["n_layer"]))
    devices = [f"cpu:{i}" for i in range(k)]
    p = dict(split=split, devices=devices)
    if split == "layer":
        if r.random() < 0.5:
            p["layer_proportions"] = tuple(r.choice([1.0, 2.0, 3.0]) for _ in devices)
        p["draft_device"] = r.choice(["", "cpu:0", devices[-1], f"cpu:{k}"])
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--dir", default="/tmp/lucebox-fuzz-shapes")
    args = ap.parse_args()

    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    import numpy as np

    import lucebox
    import oracle
    from lucebox import _core, synth
    from lucebox.errors import ConfigError, LuceboxError

    ok, why = oracle.available()
    if not ok:
        print(f"the oracle is missing: {why}")
        return 2
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    spawn = multiprocessing.get_context("spawn")
    findings = 0
    counts = dict(compared=0, refused_by_synth=0, refused_by_upstream=0, restores_checked=0, spec_checked=0,
                  draft_steps_checked=0, draft_steps_own_types=0, draft_ties=0, draft_own_type_roundings=0,
                  layer_splits_checked=0, tensor_splits_checked=0, tensor_splits_refused=0)
    import upstream_spec
    spec_binary, why = upstream_spec.find_binary()
    if spec_binary is None:
        print(f"check 4 (drafts against upstream's) skipped: {why}")

    def finding(n: int, c: dict, what: str) -> None:
        nonlocal findings
        findings += 1
        print(f"case {n}: {c}: {what}", flush=True)

    def upstream(path: Path, prompt: list[int], ctx: int, kv: tuple[str, str]):
        """Upstream's logits, or None (counted) where it refuses or aborts."""
        with ProcessPoolExecutor(1, mp_context=spawn) as pool:
            try:
                return pool.submit(_reference, str(path), prompt, ctx, kv).result()
            except (BrokenProcessPool, ValueError, RuntimeError) as e:  # (a load error, or an abort)
                counts["refused_by_upstream"] += 1
                print(f"case {n}: upstream refused it: {type(e).__name__}: {str(e)[:120]}", flush=True)
                return None

    def lucebox_logits(n: int, c: dict, path: Path, prompt: list[int], kv: tuple[str, str], engine=None):
        """lucebox's prompt logits with K / V caches `kv` (on `engine` if given), or None after a finding
        (a refusal, non-finite values)."""
        try:
            engine = engine or lucebox.Engine(str(path), ctx=c["ctx"], device="cpu", ubatch=c["ubatch"],
                                              kv_type_k=kv[0], kv_type_v=kv[1], spec="off")
            ours = engine.session().eval(prompt)
        except LuceboxError as e:
            finding(n, c, f"lucebox refused {path.name}: {type(e).__name__}: {e}")
            return None
        if not np.isfinite(ours).all():
            finding(n, c, f"{path.name}: non-finite logits")
            return None
        return ours

    def matches_upstream(n: int, c: dict, path: Path, prompt: list[int], ours, kv: tuple[str, str],
                         tol: float | None) -> bool:
        """`ours` against upstream's logits with caches `kv`: the same bits (tol None) or within tol x the
        logits' RMS. True where upstream refused; False after a finding."""
        if ours is None:
            return False
        ref = upstream(path, prompt, c["ctx"], kv)
        if ref is None:
            return True
        counts["compared"] += 1
        scale = float(np.sqrt(np.mean(np.square(ref, dtype=np.float64))))
        worst = float(np.abs(ours - ref).max()) / scale if ours.shape == ref.shape else float("inf")
        if ours.shape == ref.shape and (np.array_equal(ours, ref) if tol is None else worst <= tol):
            return True
        rows = np.unique(np.nonzero(ours != ref)[0]) if ours.shape == ref.shape else []
        finding(n, c, f"{path.name}: logits differ from upstream's in {len(rows)} of {len(prompt)} rows "
                      f"(first {rows[0] if len(rows) else '-'}), max |diff| / scale {worst:.2e}"
                      + ("" if tol is None else f" > {tol}"))
        return False

    def f32_twin(c: dict, twin: Path) -> Path:
        """`twin`, the case's target with F32 weights (written on first use)."""
        if not twin.exists():
            synth.write_target(twin, "tiny", type="f32", seed=c["seed"], overrides=c["target"])
        return twin

    def drafts_match_upstream(n: int, c: dict, pair: tuple[Path, Path], twins: tuple[Path, Path],
                              fused: bool) -> None:
        """Check 4 on the case's `pair` (target, draft) in their own weight types or on F32 `twins` of it
        (written here); `fused`: lucebox's fused DeltaNet ops run. A pair in its own, quantized types that
        parts from upstream beyond the tie but within OWN_TYPES_ROUNDING is checked again on the twins:
        where they agree, the parting is the quantized types' rounding, not the draft's logic."""
        def write_twins() -> None:
            f32_twin(c, twins[0])
            synth.write_draft(twins[1], "tiny", type="f32", seed=c["seed"] + 1, overrides=c["draft"],
                              target_overrides=c["target"], schema="upstream")

        own = random.Random(f"draft types {n}").random() < 0.5
        quantized = c["type"] != "f32" or c["draft_type"] != "f32"
        if not own:
            write_twins()
        tie = WIDE_DRAFT_TIE if fused or (own and quantized) else TWIN_DRAFT_TIE
        difference, within_rounding = draft_steps_differ(n, c, *(pair if own else twins), own,
                                                         (tie, OWN_TYPES_ROUNDING))
        if difference is not None and own and quantized and within_rounding is None:
            write_twins()
            (on_twins,) = draft_steps_differ(n, c, *twins, False, (WIDE_DRAFT_TIE if fused else TWIN_DRAFT_TIE,))
            if on_twins is None:
                counts["draft_own_type_roundings"] += 1
                print(f"case {n}: the draft parts from upstream's in its own types only ({difference}); "
                      "its F32 twins agree", flush=True)
                return
            difference += f"; on F32 twins: {on_twins}"
        if difference is not None:
            finding(n, c, f"the draft's proposals differ from upstream's: {difference}")

    def draft_steps_differ(n: int, c: dict, target: Path, draft: Path, own: bool,
                           ties: tuple[float, ...]) -> list[str | None]:
        """Check 4 on one pair (`own`: in the case's own types), upstream run once: for each of `ties`
        (ascending), the first proposal that is not upstream's nor within that tie of it, or None."""
        from lucebox.vocab import TOKEN_TYPE_NORMAL
        engine = lucebox.Engine(str(target), draft=str(draft), ctx=c["ctx"], device="cpu", spec="chain")
        tk = engine.tokenizer
        # a text prompt (upstream's example tokenizes one): ordinary tokens' text, no NUL (a C string)
        normal = [i for i, t in enumerate(tk.vocab.token_types) if t == TOKEN_TYPE_NORMAL]
        pick = np.random.default_rng(c["seed"]).integers(0, len(normal), c["n_prompt"])
        text = tk.decode([normal[int(i)] for i in pick]).replace("\0", "")
        ids = tk.encode(text, add_special=True)
        if len(ids) < 2 or len(ids) + c["max_tokens"] + 2 * c["draft"]["block_size"] > c["ctx"]:
            return [None] * len(ties)
        if oracle.tokenize(target, text) != ids:  # (upstream tokenizes the text itself)
            finding(n, c, f"llama.cpp tokenizes the prompt otherwise: {text!r}")
            return [None] * len(ties)
        try:
            steps = upstream_spec.run_logged(spec_binary, target, draft, text, c["max_tokens"],
                                             echo=tk.decode_bytes(ids), ctx=c["ctx"], threads=1)
        except RuntimeError as e:  # (an abort: a model without one of the layer kinds)
            counts["refused_by_upstream"] += 1
            print(f"case {n}: upstream's DFlash example refused it: {str(e)[:120]}", flush=True)
            return [None] * len(ties)
        _, n_ties, difference = upstream_spec.compare_draft_steps(engine.session(), ids, steps, ties[0])
        counts["draft_steps_checked"] += len(steps)
        counts["draft_steps_own_types"] += len(steps) if own else 0
        counts["draft_ties"] += n_ties
        differences = [difference]
        for tie in ties[1:]:  # (ascending: where a narrower tie finds no difference, a wider one finds none)
            if differences[-1] is not None:
                difference = upstream_spec.compare_draft_steps(engine.session(), ids, steps, tie)[2]
            differences.append(difference)
        return differences

    def placed(n: int, c: dict, target: Path, twin: Path, draft: Path, prompt: list[int], cold, plain) -> None:
        """Check 5: `cold` / `plain` are one device's prompt logits / tokens of the case's target."""
        p = placement(n, c["target"])
        common = dict(ctx=c["ctx"], ubatch=c["ubatch"], kv_type_k=c["kv"][0], kv_type_v=c["kv"][1])
        where = f"{p['split']} split over {p['devices']}"
        kw = dict(max_tokens=c["max_tokens"], **c["sampling"])
        try:
            if p["split"] == "layer":
                split = lucebox.Engine(str(target), spec="off", devices=p["devices"], split="layer",
                                       layer_proportions=p.get("layer_proportions", ()), **common)
                if not np.array_equal(split.session().eval(prompt), cold):
                    finding(n, c, f"{where}: prompt logits differ from one device's")
                    return
                spec = lucebox.Engine(str(target), draft=str(draft), spec="chain", devices=p["devices"], split="layer",
                                      layer_proportions=p.get("layer_proportions", ()),
                                      draft_device=p["draft_device"], **common)
                got = spec.generate(prompt, **kw).tokens
                counts["layer_splits_checked"] += 1
                if list(got) != list(plain):
                    finding(n, c, f"{where}: speculation's tokens differ from one device's plain decoding's")
                return
            try:
                split = lucebox.Engine(str(target), spec="off", devices=p["devices"], split="tensor", **common)
            except ConfigError as e:
                counts["tensor_splits_refused"] += 1
                if "cannot be divided" not in str(e) and "slices" not in str(e):
                    finding(n, c, f"{where}: refused without naming what does not divide: {e}")
                return
            tplain = split.generate(prompt, **kw).tokens
            spec = lucebox.Engine(str(target), draft=str(draft), spec="chain", devices=p["devices"], split="tensor",
                                  **common)
            if list(spec.generate(prompt, **kw).tokens) != list(tplain):
                finding(n, c, f"{where}: speculation's tokens differ from plain decoding's on the placement")
                return
            f32_twin(c, twin)
            f32 = dict(ctx=c["ctx"], ubatch=c["ubatch"], kv_type_k="f32", kv_type_v="f32", spec="off")
            one = lucebox.Engine(str(twin), device="cpu", **f32).session().eval(prompt)
            many = lucebox.Engine(str(twin), devices=p["devices"], split="tensor", **f32).session().eval(prompt)
            scale = float(np.sqrt(np.mean(np.square(one, dtype=np.float64))))
            worst = float(np.abs(many - one).max()) / scale
            counts["tensor_splits_checked"] += 1
            if not worst <= SPLIT_TOL:
                finding(n, c, f"{where}: F32 logits {worst:.2e} x RMS from one device's (> {SPLIT_TOL})")
        except LuceboxError as e:
            finding(n, c, f"{where}: {type(e).__name__}: {e}")

    for n in range(args.start, args.start + args.cases):
        c = case(n)
        print(f"[case {n}]", file=sys.stderr, flush=True)  # (names the case if lucebox itself crashes)
        target, twin, draft = d / f"t{n}.gguf", d / f"t{n}-f32.gguf", d / f"d{n}.gguf"
        draft_twin = d / f"d{n}-f32.gguf"
        try:
            try:
                write_pair(c, target, draft)
            except ConfigError as e:
                counts["refused_by_synth"] += 1
                print(f"case {n}: synth refused the shape: {e}", flush=True)
                continue
            prompt = [int(x) for x in np.random.default_rng(c["seed"]).integers(0, 1000, c["n_prompt"])]
            common = dict(ctx=c["ctx"], device="cpu", ubatch=c["ubatch"], kv_type_k=c["kv"][0], kv_type_v=c["kv"][1])
            try:
                engine = lucebox.Engine(str(target), spec="off", **common)
            except LuceboxError as e:
                finding(n, c, f"lucebox refused {target.name}: {type(e).__name__}: {e}")
                continue
            before = _core.delta_net_step_runs()
            cold = lucebox_logits(n, c, target, prompt, c["kv"], engine)
            # lucebox's own fused DeltaNet ops ran (heads of 128): their rounding is not ggml's, so upstream
            # is matched within FUSED_TOL on an F32 twin with an F16 cache, where it shows alone
            fused = _core.delta_net_step_runs() > before
            if cold is None:
                continue
            as_f16 = tuple("f16" if t == "f32" else t for t in c["kv"])  # (lucebox's match for upstream's F32 cache)
            if fused:
                f32_twin(c, twin)
                if not matches_upstream(n, c, twin, prompt, lucebox_logits(n, c, twin, prompt, ("f16", "f16")),
                                        ("f16", "f16"), FUSED_TOL):
                    continue
            elif as_f16 != c["kv"]:
                if not matches_upstream(n, c, target, prompt, lucebox_logits(n, c, target, prompt, as_f16),
                                        c["kv"], None):
                    continue
            elif not matches_upstream(n, c, target, prompt, cold, c["kv"], None):
                continue
            if len(prompt) > 1:  # a prefix restored from a snapshot, then the rest: the cold prefill's bits
                cut = random.Random(n).randint(1, len(prompt) - 1)
                first = engine.session()
                first.eval(prompt[:cut])
                warm = engine.session()
                warm.restore(first.snapshot())
                if not np.array_equal(warm.eval(prompt[cut:]), cold[cut:]):
                    finding(n, c, f"a restore after {cut} of {len(prompt)} tokens differs from the cold prefill")
                    continue
                counts["restores_checked"] += 1
            try:
                kw = dict(max_tokens=c["max_tokens"], **c["sampling"])
                plain = engine.generate(prompt, **kw).tokens
                got = lucebox.Engine(str(target), draft=str(draft), spec=c["spec"], tree_budget=c["tree_budget"],
                                     **common).generate(prompt, **kw).tokens
            except LuceboxError as e:
                finding(n, c, f"generation failed: {type(e).__name__}: {e}")
                continue
            counts["spec_checked"] += 1
            if list(got) != list(plain):
                first_diff = next((i for i, (a, b) in enumerate(zip(plain, got)) if a != b), min(len(plain), len(got)))
                finding(n, c, f"speculative tokens differ from plain decoding's at {first_diff} "
                              f"({len(got)} against {len(plain)} tokens)")
            if spec_binary is not None and c["schema"] == "upstream":
                drafts_match_upstream(n, c, (target, draft), (twin, draft_twin), fused)
            placed(n, c, target, twin, draft, prompt, cold, plain)
        finally:
            for f in (target, twin, draft, draft_twin):
                f.unlink(missing_ok=True)
    print(f"outcomes {counts}")
    print(f"{findings} finding(s) in cases [{args.start}, {args.start + args.cases})")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
