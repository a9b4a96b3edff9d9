#!/usr/bin/env python3
"""Differential fuzz of speculative decoding on the CPU: each case draws a context size, micro-batch,
KV cache type, prompt (random ids, 1 token to almost the whole context), token budget and sampling
(greedy, seeded temperature / top-k sampling, a logit_bias, logprobs, a grammar), generates without
speculation, then with a chain or a DDTree tree, and requires the same tokens (and, with logprobs,
the same logprobs within 1e-3). The
proposals come from the draft, from the context (spec "ngram", a quarter of the cases, on a prompt
repeating a pattern), or are forced (tests/integration/forcing.py): a chain that is right up
to a chosen index (verify widths 2..16) or a tree whose right path is a chosen depth and never the
first child. A `LuceboxError` from the speculative run where the plain one ran, or a different token,
is printed as a finding. Cases are seeded by their number, so `--start N --cases 1` replays case N.

    python scripts/fuzz_spec.py --cases 300

The model is the tiny synthetic pair (`lucebox synth`), written once into --dir; engines are kept per
configuration while they are reused.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))


def _case(n: int) -> dict:
    r = random.Random(n)
    ctx = r.choice([64, 128, 256, 300, 512, 1024])
    spec = r.choice(["chain", "tree"])
    return dict(ctx=ctx, ubatch=r.choice([1, 7, 32, 512]), kv=r.choice(["f16", "q8_0"]), spec=spec,
                tree_budget=r.choice([4, 8, 22]), n_prompt=r.randint(1, ctx - 2), max_tokens=r.randint(1, 80),
                prompt_seed=r.randrange(2**31), proposals=r.choice(["draft", "forced"]),
                wrong_at=r.choice([None, 0, 1, 3, 7, 15]), block_size=r.choice([0, 2, 5, 16]),
                tree_depth=r.randint(0, 12),
                sampling=r.choice([{}, {}, dict(temperature=0.8, seed=r.randrange(1000)),
                                   dict(temperature=0.7, top_k=r.choice([1, 5, 40]), seed=r.randrange(1000)),
                                   dict(logit_bias={r.randrange(1000): -100.0, r.randrange(1000): 3.0})]),
                logprobs=r.choice([None, None, 0, 3]),
                grammar=r.choice([None, None, None, "regex", "json", "choice"]),
                # a quarter of the cases: draftless lookup (spec "ngram") on a prompt that repeats a
                # pattern of this period, so its proposals start at once
                ngram_period=r.randint(2, 24) if r.random() < 0.25 else None)


GRAMMARS = {  # (kind, argument) of lucebox.Grammar
    "regex": ("regex", r"([a-z]{1,4}[0-9]?[ ,.]){2,12}"),
    "json": ("json_schema", {"type": "object", "properties": {"k": {"type": "array", "items": {"type": "integer"},
                                                                     "maxItems": 6}, "s": {"type": "string"}},
                             "required": ["k", "s"]}),
    "choice": ("choice", ["alpha", "alphabet", "beta", "gamma ray"]),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--dir", default="/tmp/lucebox-fuzz-spec")
    args = ap.parse_args()

    import lucebox
    from forcing import forced, forced_tree
    from lucebox import synth
    from lucebox.errors import LuceboxError

    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    target, draft = d / "target.gguf", d / "draft.gguf"
    if not draft.exists():
        synth.write_target(target, "tiny", type="q8_0", seed=5)
        synth.write_draft(draft, "tiny", type="q8_0", seed=6)
    engines: dict[tuple, lucebox.Engine] = {}

    def engine(c: dict, spec: str) -> lucebox.Engine:
        key = (spec, c["ctx"], c["ubatch"], c["kv"], c["tree_budget"])
        if key not in engines:
            if len(engines) >= 12:
                engines.clear()
            engines[key] = lucebox.Engine(str(target), draft=None if spec in ("off", "ngram") else str(draft),
                                          ctx=c["ctx"],
                                          device="cpu", spec=spec, ubatch=c["ubatch"], kv_type_k=c["kv"],
                                          kv_type_v=c["kv"], tree_budget=c["tree_budget"])
        return engines[key]

    findings = 0
    for n in range(args.start, args.start + args.cases):
        c = _case(n)
        pr = random.Random(c["prompt_seed"])
        prompt = [pr.randrange(0, 1000) for _ in range(c["n_prompt"])]
        if c["ngram_period"] is not None:
            c["spec"] = "ngram"
            prompt = [prompt[i % c["ngram_period"]] for i in range(len(prompt))]
        kw = dict(max_tokens=c["max_tokens"], logprobs=c["logprobs"], **c["sampling"])
        if c["grammar"] is not None:
            kind, arg = GRAMMARS[c["grammar"]]
            kw["grammar"] = getattr(lucebox.Grammar, kind)(arg)
        try:
            ref = engine(c, "off").generate(prompt, **kw)
            plain = list(ref.tokens)
        except LuceboxError as e:  # (not a finding: the case itself may be impossible)
            print(f"case {n}: plain decoding refused it: {type(e).__name__}: {e}")
            continue
        e = engine(c, c["spec"])
        try:
            if c["proposals"] == "draft" or c["spec"] == "ngram":  # (ngram: its own lookup's proposals)
                res = e.generate(prompt, **kw)
            elif c["spec"] == "chain":
                res = e.session().generate(prompt, block_size=c["block_size"],
                                           propose=forced(plain, c["n_prompt"], c["wrong_at"]), **kw)
            else:
                res = e.session().generate(prompt, propose_tree=forced_tree(plain, c["n_prompt"], c["tree_depth"]),
                                           **kw)
            got = res.tokens
        except LuceboxError as err:
            findings += 1
            print(f"case {n}: {c}: the speculative run failed: {type(err).__name__}: {err}", flush=True)
            continue
        if list(got) != plain:
            findings += 1
            first = next((i for i, (a, b) in enumerate(zip(plain, got)) if a != b), min(len(plain), len(got)))
            print(f"case {n}: {c}: tokens differ from plain decoding at {first} "
                  f"({len(got)} against {len(plain)} tokens)", flush=True)
        elif c["logprobs"] is not None and (
                [lp.token for lp in res.logprobs] != plain
                or any(abs(a.logprob - b.logprob) > 1e-3 or [i for i, _ in a.top] != [i for i, _ in b.top]
                       for a, b in zip(res.logprobs, ref.logprobs))):
            findings += 1
            print(f"case {n}: {c}: logprobs differ from plain decoding's", flush=True)
    print(f"{findings} finding(s) in cases [{args.start}, {args.start + args.cases})")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
