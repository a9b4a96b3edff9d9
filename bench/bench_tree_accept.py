"""Tree (DDTree, budget 22, top-k 8) vs chain acceptance length on the bundled demo pair, greedy,
the 10 prompts of tests/integration/test_demo_pair.py, 96 tokens each; both checked token-equal to
plain decoding. Usage: PYTHONPATH=python python bench/bench_tree_accept.py [device]"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
import lucebox  # noqa: E402
from lucebox import default_model  # noqa: E402
from test_demo_pair import PROMPTS  # noqa: E402

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cpu"
t, d = (str(p) for p in default_model.default_model_paths())
plain = lucebox.Engine(t, ctx=1024, device=DEVICE, spec="off")
chain = lucebox.Engine(t, d, ctx=1024, device=DEVICE, spec="chain")
tree = lucebox.Engine(t, d, ctx=1024, device=DEVICE, spec="tree", tree_budget=22, tree_top_k=8)
tot = {"chain": [0, 0, 0.0], "tree": [0, 0, 0.0]}
for p in PROMPTS:
    ref = plain.generate(p, max_tokens=96).tokens
    for name, e in (("chain", chain), ("tree", tree)):
        r = e.generate(p, max_tokens=96)
        assert r.tokens == ref, (name, p)
        s = r.stats.spec
        tot[name][0] += s["accepted"] + s["steps"]; tot[name][1] += s["steps"]; tot[name][2] += r.stats.decode_seconds
for k, (c, s, sec) in tot.items():
    print(f"{k}: acceptance length {c / s:.3f} tokens/step over {s} steps, decode {sec:.2f} s ({DEVICE})")
print("ratio tree/chain", (tot["tree"][0] / tot["tree"][1]) / (tot["chain"][0] / tot["chain"][1]))
