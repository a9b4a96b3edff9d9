"""Tree (DDTree, budget 22, top-k 8) vs chain acceptance length on the bundled demo pair, greedy,
the 10 prompts of tests/integration/test_demo_pair.py, 96 tokens each, with decode tok/s; both
compared with plain decoding (on the CPU they must be equal, exit status 1 otherwise; on a GPU a
verify batch and a one-token step round differently, so outputs may part at near ties: counted).
Usage: PYTHONPATH=python python bench/bench_tree_accept.py [device]"""
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
tot = {"chain": [0, 0, 0.0, 0, 0], "tree": [0, 0, 0.0, 0, 0], "plain": [0, 0, 0.0, 0, 0]}
for e in (plain, chain, tree):
    e.generate(PROMPTS[0], max_tokens=8)  # warm-up
for p in PROMPTS:
    ref = plain.generate(p, max_tokens=96)
    tot["plain"][2] += ref.stats.decode_seconds
    tot["plain"][3] += ref.stats.n_generated
    for name, e in (("chain", chain), ("tree", tree)):
        r = e.generate(p, max_tokens=96)
        s = r.stats.spec
        t = tot[name]
        t[0] += s["accepted"] + s["steps"]; t[1] += s["steps"]; t[2] += r.stats.decode_seconds
        t[3] += r.stats.n_generated; t[4] += r.tokens != ref.tokens
plain_tps = tot["plain"][3] / tot["plain"][2]
print(f"$ {' '.join(sys.argv)}")
print(f"plain: {plain_tps:.1f} tok/s ({DEVICE})")
for k in ("chain", "tree"):
    c, s, sec, n, differ = tot[k]
    print(f"{k}: acceptance length {c / s:.3f} tokens/step over {s} steps, {n / sec:.1f} tok/s "
          f"({n / sec / plain_tps:.2f}x plain), output differs from plain on {differ}/{len(PROMPTS)} prompts")
print("ratio tree/chain acceptance", (tot["tree"][0] / tot["tree"][1]) / (tot["chain"][0] / tot["chain"][1]))
sys.exit(1 if DEVICE == "cpu" and (tot["chain"][4] or tot["tree"][4]) else 0)
