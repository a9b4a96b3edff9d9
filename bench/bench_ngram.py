#!/usr/bin/env python3
"""Draftless speculation (spec="ngram", what spec="auto" does without a draft) against plain
decoding (spec="off"): decode tok/s of the same greedy generation, its tokens (they must be equal:
their hash is printed on every row), and the lookup's steps and accepted proposals.

Prompts: "repeat" asks for the third copy of a stretch of text the prompt holds twice (the model
may copy it: the lookup proposes the copy), "plain" is text without such a stretch (the lookup
rarely matches: what it costs when it does not help). The text is lucebox's own source
(a model trained on code copies it; a random-weight model does not, so there the rows measure the
cost alone).

Method: one discarded warm-up per row, then --reps generations of --tokens tokens; median decode
tok/s (GenerationStats.decode_tokens_per_second). Then predicted outputs: spec="off" given its own
answer as the prediction (whole, and with 8 tokens inserted in the middle: an edit), accepted
counting the prediction's proposals. Example:
    python3 bench/bench_ngram.py                       (the bundled demo target, CPU)
    python3 bench/bench_ngram.py --model t27q4.gguf --device cuda
"""
from __future__ import annotations

import argparse
import hashlib
import statistics
from pathlib import Path

import lucebox
from lucebox import default_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="target GGUF (default: the bundled demo target)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    model = args.model or str(default_model.default_model_paths()[0])
    source = (Path(lucebox.__file__).parent / "prefix_cache.py").read_text()
    stretch = source[2000:3400]
    prompts = {"repeat": stretch + "\n\n" + stretch + "\n\n" + stretch[:200], "plain": source[4000:5600]}
    engines = {spec: lucebox.Engine(model, ctx=4096, device=args.device, spec=spec) for spec in ("off", "ngram")}
    print(f"{model} on {engines['off'].device}, {args.tokens} tokens greedy, median of {args.reps}")
    print(f"{'prompt':8} {'spec':12} {'tok/s':>9} {'ratio':>6} {'steps':>6} {'accepted':>8}  tokens")
    for name, text in prompts.items():
        ids = engines["off"].encode_prompt(text)
        base = None
        for spec, engine in engines.items():
            engine.generate(ids, max_tokens=args.tokens)  # warm-up
            runs = [engine.generate(ids, max_tokens=args.tokens) for _ in range(args.reps)]
            rate = statistics.median(r.stats.decode_tokens_per_second for r in runs)
            base = base or rate
            s = runs[-1].stats.spec
            digest = hashlib.sha1(str(runs[-1].tokens).encode()).hexdigest()[:8]
            print(f"{name:8} {spec:12} {rate:9.1f} {rate / base:6.2f} {s.get('steps', 0):6d} "
                  f"{s.get('accepted', 0):8d}  {digest}")
        # predicted outputs: plain decoding given its own answer, whole and with an edit in the middle
        off = engines["off"]
        answer = off.generate(ids, max_tokens=args.tokens).tokens
        half = len(answer) // 2
        edited = answer[:half] + answer[half + 8:half + 16] + answer[half:]  # 8 tokens inserted
        for label, prediction in (("exact", answer), ("edited", edited)):
            off.generate(ids, max_tokens=args.tokens, prediction=prediction)  # warm-up
            runs = [off.generate(ids, max_tokens=args.tokens, prediction=prediction) for _ in range(args.reps)]
            rate = statistics.median(r.stats.decode_tokens_per_second for r in runs)
            s = runs[-1].stats.spec
            digest = hashlib.sha1(str(runs[-1].tokens).encode()).hexdigest()[:8]
            print(f"{name:8} {'pred:' + label:12} {rate:9.1f} {rate / base:6.2f} {s.get('steps', 0):6d} "
                  f"{s.get('predicted_accepted', 0):8d}  {digest}")


if __name__ == "__main__":
    main()
