#!/usr/bin/env python3
"""Where a speculative step's time goes, chain vs tree (budget 22, top-k 8), on the bundled demo
pair: per-step draft, verify and commit time from generate(..., phase_timings=True), greedy, over
the first 4 prompts of tests/integration/test_demo_pair.py, 96 tokens each.
Usage (repository root): python bench/bench_tree_phases.py [device] [repeats]
With repeats > 1 each figure is the minimum over that many passes (for shared, noisy machines)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
import lucebox  # noqa: E402
from lucebox import default_model  # noqa: E402
from test_demo_pair import PROMPTS  # noqa: E402

dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
t, d = (str(p) for p in default_model.default_model_paths())
chain = lucebox.Engine(t, d, ctx=1024, device=dev, spec="chain")
tree = lucebox.Engine(t, d, ctx=1024, device=dev, spec="tree", tree_budget=22, tree_top_k=8)
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 1
for name, e in (("chain", chain), ("tree", tree)):
    e.generate(PROMPTS[0], max_tokens=8)  # warm-up
    best: dict[str, float] = {}
    for _ in range(repeats):
        tot = dict(steps=0, draft=0.0, verify=0.0, commit=0.0, dec=0.0)
        for p in PROMPTS[:4]:
            r = e.generate(p, max_tokens=96, phase_timings=True)
            s = r.stats.spec
            tot["steps"] += s["steps"]
            tot["dec"] += r.stats.decode_seconds
            for k in ("draft", "verify", "commit"):
                tot[k] += s[k + "_seconds"]
        n = tot["steps"]
        per = {k: 1e3 * tot[k] / n for k in ("dec", "draft", "verify", "commit")}
        per["other"] = per["dec"] - per["draft"] - per["verify"] - per["commit"]
        best = {k: min(v, best.get(k, v)) for k, v in per.items()}
    print(f"{name}: per step {best['dec']:.3f} ms: draft {best['draft']:.3f} verify {best['verify']:.3f} "
          f"commit {best['commit']:.3f} other {best['other']:.3f}")
