"""DDTree tree verification (spec="tree") is lossless at temperature 0: the tokens equal plain
greedy decoding for the real (tiny, random) draft's best-first trees and for forced trees whose
accepted path leaves the top-1 spine at every depth (its node is never the previous row, and
decoy subtrees hang off the rejected siblings), for every accept length, with F16 and Q8_0 KV.
At temperature > 0 the sampled acceptance over forced trees emits tokens distributed exactly as
plain sampling, with and without penalties."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

import lucebox
from forcing import forced_tree
from lucebox import _core, synth

BUDGET = 48  # forced trees: nodes besides the root


def prompts(n: int, seed: int = 4321) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(0, 1000, int(rng.integers(5, 90)))] for _ in range(n)]


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_real_draft_tree_is_lossless(pair: tuple[str, str], kv: str) -> None:
    target, draft = pair
    plain = lucebox.Engine(target, ctx=512, device="cpu", kv_type=kv, ubatch=32)
    tree = lucebox.Engine(target, draft, ctx=512, device="cpu", kv_type=kv, ubatch=32, spec="tree")
    for p in prompts(8):
        ref = plain.generate(p, max_tokens=40)
        got = tree.generate(p, max_tokens=40)
        assert got.tokens == ref.tokens, f"prompt {p[:8]}..."
        s = got.stats.spec
        assert s["speculative"] and s["steps"] > 0
        assert s["drafted"] == s["steps"] * 22  # full budget (top-8 x 15 positions >> 22 nodes)
        assert sum(s["accept_histogram"]) == s["steps"] == s["fast_rollbacks"]
        assert s["accepted"] == sum(a * c for a, c in enumerate(s["accept_histogram"]))


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_forced_trees_off_the_spine_every_accept_length(pair: tuple[str, str], kv: str) -> None:
    target, draft = pair
    plain = lucebox.Engine(target, ctx=512, device="cpu", kv_type=kv)
    engine = lucebox.Engine(target, draft, ctx=512, device="cpu", kv_type=kv, spec="tree", tree_budget=BUDGET)
    max_accept = BUDGET // 3 - 1  # three nodes per depth (wrong, decoy, right)
    for i, p in enumerate(prompts(3)):
        ref = plain.generate(p, max_tokens=64).tokens
        for a in [0, 1, 2, 3, 5, 8, 11, max_accept]:
            got = engine.session().generate(p, max_tokens=64, propose_tree=forced_tree(ref, len(p), a))
            assert got.tokens == ref, f"prompt {i}, accept={a}"
            s = got.stats.spec
            # every full step accepts exactly `a`; the last one may be cut short by the budget
            assert s["accept_histogram"][a] >= max(1, s["steps"] - 1), (a, s["accept_histogram"])
            assert s["accepted"] == sum(k * c for k, c in enumerate(s["accept_histogram"]))


def test_forced_tree_without_a_draft_and_stop_inside_a_path(pair: tuple[str, str]) -> None:
    target, _ = pair
    engine = lucebox.Engine(target, ctx=512, device="cpu")
    p = prompts(1)[0]
    ref = engine.generate(p, max_tokens=40).tokens
    for budget in [1, 2, 5, 9, 17]:
        got = engine.session().generate(p, max_tokens=budget, propose_tree=forced_tree(ref, len(p), 4))
        assert got.tokens == ref[:budget] and got.finish_reason == "length"
    stop_at = 13
    if ref[stop_at] not in ref[:stop_at]:
        got = engine.session()._core.generate(p, 64, lucebox.SamplingConfig().to_core(), [ref[stop_at]], None, None,
                                              None, 0, False, forced_tree(ref, len(p), 4))
        assert list(got.tokens) == ref[:stop_at] and got.finish_reason == "stop"


def test_tree_session_continuation_and_context_end(pair: tuple[str, str]) -> None:
    target, draft = pair
    plain = lucebox.Engine(target, ctx=512, device="cpu")
    tree = lucebox.Engine(target, draft, ctx=512, device="cpu", spec="tree", tree_budget=5, tree_top_k=2)
    p = prompts(1, seed=9)[0]
    s1, s2 = plain.session(), tree.session()
    a = s1.generate(p, max_tokens=10).tokens + s1.generate([7, 8, 9], max_tokens=20).tokens
    b = s2.generate(p, max_tokens=10).tokens + s2.generate([7, 8, 9], max_tokens=20).tokens
    assert a == b and s1.tokens == s2.tokens
    q = p[:40]
    ref = lucebox.Engine(target, ctx=64, device="cpu").generate(q, max_tokens=100)
    got = lucebox.Engine(target, draft, ctx=64, device="cpu", spec="tree").generate(q, max_tokens=100)
    assert got.tokens == ref.tokens and got.finish_reason == ref.finish_reason == "context"


def test_tree_refusals(pair: tuple[str, str]) -> None:
    target, draft = pair
    with pytest.raises(ValueError, match="needs a DFlash draft"):
        lucebox.Engine(target, ctx=64, device="cpu", spec="tree")
    for bad in [dict(tree_budget=0), dict(tree_budget=257), dict(tree_top_k=0), dict(tree_top_k=65),
                dict(rollback="replay")]:
        with pytest.raises(ValueError, match="tree"):
            lucebox.Engine(target, draft, ctx=64, device="cpu", spec="tree", **bad)
    engine = lucebox.Engine(target, draft, ctx=128, device="cpu", spec="tree")
    s = engine.session()
    assert s.generate([1, 2, 3], max_tokens=4, temperature=0.7, top_k=8, seed=1).tokens  # sampling is verified too
    assert s.generate([1, 2, 3], max_tokens=4).tokens
    with pytest.raises(ValueError, match="propose or propose_tree"):
        s.generate([4], max_tokens=4, propose=lambda c, last, n: [0] * n,
                   propose_tree=lambda c, last, n: ([], []))
    bad_trees = [([5], [1]), ([5, 6], [0, 2]), ([5], []), ([5000], [0])]
    for toks, parents in bad_trees:
        with pytest.raises(ValueError):
            engine.session().generate([1, 2, 3], max_tokens=4, propose_tree=lambda c, last, n, t=toks, q=parents: (t, q))


def test_cli_generate_spec_tree(pair: tuple[str, str]) -> None:
    import os
    import subprocess
    import sys

    target, draft = pair
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    base = [sys.executable, "-m", "lucebox", "generate", target, "hello world", "--draft", draft, "--device", "cpu",
            "--ctx", "256", "--max-tokens", "8", "--spec", "tree"]
    ok = subprocess.run([*base, "--tree-budget", "5", "--tree-top-k", "3", "--stats"], capture_output=True,
                        text=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "[spec]" in ok.stderr and "proposals accepted" in ok.stderr
    bad = subprocess.run([*base, "--tree-budget", "0"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode != 0 and "tree_budget" in bad.stderr


def test_memory_per_tree_node_is_reported(pair: tuple[str, str]) -> None:
    """The plan counts one checkpoint and one feature-ring row per tree node (root included), and
    `lucebox info --tree-budget` prints the per-node cost."""
    import os
    import subprocess
    import sys

    target, draft = pair
    plans = {b: lucebox.Engine(target, draft, ctx=256, device="cpu", spec="tree", tree_budget=b).memory_plan()
             for b in (22, 40)}
    per_node = plans[22]["bytes_per_verified_token"]
    assert per_node == plans[40]["bytes_per_verified_token"] > plans[22]["checkpoint_bytes_per_token"] > 0
    assert plans[22]["checkpoint_bytes"] == 23 * plans[22]["checkpoint_bytes_per_token"]
    assert plans[40]["checkpoint_bytes"] == 41 * plans[40]["checkpoint_bytes_per_token"]
    assert plans[40]["total_bytes"] > plans[22]["total_bytes"]
    chain = lucebox.Engine(target, draft, ctx=256, device="cpu", spec="chain").memory_plan()
    block = _core.DraftFile.open(draft).hparams.block_size
    assert chain["checkpoint_bytes"] == block * chain["checkpoint_bytes_per_token"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-m", "lucebox", "info", target, "--draft", draft, "--ctx", "256",
                          "--tree-budget", "40", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    import json
    mem = json.loads(out.stdout)["memory"]
    assert mem["checkpoint_bytes"] == plans[40]["checkpoint_bytes"]
    assert mem["bytes_per_verified_token"] == per_node


def _penalized_dist(engine: lucebox.Engine, context: list[int], temperature: float, top_k: int,
                    rep: float, presence: float) -> dict[int, float]:
    """The sampler's distribution after `context` (the whole context is the penalty window here):
    repetition then presence penalty on the ids present, top_k, temperature."""
    row = engine.session().eval(context)[-1].astype(np.float32)
    for t in set(context):
        v = row[t]
        row[t] = (v / np.float32(rep) if v > 0 else v * np.float32(rep)) - np.float32(presence)
    row = row.astype(np.float64)
    keep = np.argsort(-row, kind="stable")[:top_k]
    w = np.exp((row[keep] - row[keep].max()) / temperature)
    return {int(i): float(p) for i, p in zip(keep, w / w.sum())}


@pytest.mark.parametrize("penalties", [False, True])
def test_tree_sampling_is_distribution_exact(pair: tuple[str, str], penalties: bool) -> None:
    """Three sampled tokens per run, many seeds: t1 from the prefill, t2 and t3 from forced trees
    (the root's children rank 1, rank 0 and rank 3 of the target's distribution; the rank-1 child
    has grandchildren of rank 0 and 2, the rank-0 child one of rank 1), so acceptance, rejection
    of several siblings, deep acceptance and the residual draw all run. The empirical joint
    distribution of (t1, t2, t3) matches the target's p(t1) p(t2 | t1) p(t3 | t1, t2)."""
    target, _ = pair
    engine = lucebox.Engine(target, ctx=256, device="cpu")
    prompt = prompts(1)[0][:12]
    temperature, top_k = 1.5, 4
    rep, presence = (0.7, -2.0) if penalties else (1.0, 0.0)  # lifts the ids present into the top_k
    sampling = dict(temperature=temperature, top_k=top_k, repetition_penalty=rep, presence_penalty=presence,
                    penalty_last_n=64)

    def dist(context: tuple[int, ...]) -> dict[int, float]:
        return _penalized_dist(engine, prompt + list(context), temperature, top_k, rep, presence)

    p: dict[tuple[int, ...], dict[int, float]] = {(): dist(())}
    for a in p[()]:
        p[(a,)] = dist((a,))
        for b in p[(a,)]:
            p[(a, b)] = dist((a, b))
    exact = {(a, b, c): p[()][a] * p[(a,)][b] * p[(a, b)][c] for a in p[()] for b in p[(a,)] for c in p[(a, b)]}
    if penalties:  # the penalties change the distribution, along the tree path too
        plain = _penalized_dist(engine, prompt + [max(p[()], key=p[()].get)], temperature, top_k, 1.0, 0.0)
        assert plain != p[(max(p[()], key=p[()].get),)]

    def ranked(context: tuple[int, ...]) -> list[int]:
        d = p.get(context, {0: 1.0})
        r = sorted(d, key=lambda t: -d[t])
        return r + [(r[-1] + 1 + i) % 1000 for i in range(4)]  # ranks past the kept set: outside it

    def propose_tree(context: np.ndarray, last: int, max_nodes: int) -> tuple[list[int], list[int]]:
        done = tuple(context[len(prompt):].tolist()) + (last,)  # the sampled tokens so far
        r0 = ranked(done)
        tokens = [r0[1], r0[0], r0[3]]  # nodes 1, 2, 3 under the root
        parents = [0, 0, 0]
        r1, r2 = ranked(done + (r0[1],)), ranked(done + (r0[0],))
        tokens += [r1[0], r1[2], r2[1]]  # nodes 4, 5 under node 1; node 6 under node 2
        parents += [1, 1, 2]
        return tokens, parents

    runs = 4000
    counts: dict[tuple[int, ...], int] = {}
    accepted = []
    for seed in range(runs):
        r = engine.session().generate(prompt, max_tokens=3, seed=seed, propose_tree=propose_tree, **sampling)
        assert r.stats.spec["speculative"]
        hist = r.stats.spec["accept_histogram"]  # one step: it accepted 1 or 2; two: the first accepted 0
        accepted.append(next(a for a, c in enumerate(hist) if c) if r.stats.spec["steps"] == 1 else 0)
        key = tuple(r.tokens)
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) <= set(exact)
    worst = max(abs(counts.get(k, 0) / runs - q) for k, q in exact.items())
    chi2 = sum((counts.get(k, 0) - runs * q) ** 2 / (runs * q) for k, q in exact.items() if runs * q > 0)
    print(f"penalties {penalties}: max |empirical - exact| {worst:.4f}, chi2 {chi2:.1f} over {len(exact)} cells, "
          f"first steps accepting 0/1/2: {[accepted.count(a) for a in range(3)]}")
    assert all(accepted.count(a) > 0 for a in range(3))  # rejection, acceptance, deep acceptance
    assert worst < 0.025
    assert chi2 < 130  # 63 degrees of freedom: p < 1e-6 for a correct sampler


def random_tree(reference: list[int], prompt_len: int, seed: int, budget: int = BUDGET
                ) -> Callable[[np.ndarray, int, int], tuple[list[int], list[int]]]:
    """Trees of a new random shape at every step: a right path (the known greedy continuation) of
    random length whose nodes sit at random batch rows, among decoys hung under random nodes (a
    decoy under a right node is never the right token), so each commit moves other rows."""
    rng = np.random.default_rng(seed)

    def propose(context: np.ndarray, last: int, max_nodes: int) -> tuple[list[int], list[int]]:
        start = len(context) - prompt_len + 1

        def nxt(i: int) -> int:
            return reference[start + i] if start + i < len(reference) else 0

        n = min(max_nodes, int(rng.integers(1, budget + 1)))
        accept = int(rng.integers(0, min(n, 6) + 1))
        tokens: list[int] = []
        parents: list[int] = []
        path = [0]  # node indices of the right path (0 = the root)
        while len(tokens) < n:
            if len(path) - 1 < accept and rng.random() < 0.35:
                tokens.append(nxt(len(path) - 1))
                parents.append(path[-1])
                path.append(len(tokens))
                continue
            p = int(rng.integers(0, len(tokens) + 1))
            tok = int(rng.integers(0, 1000))
            if p in path and tok == nxt(path.index(p)):
                tok = (tok + 1) % 1000
            tokens.append(tok)
            parents.append(p)
        return tokens, parents

    return propose


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_tree_commits_of_changing_shapes_sessions_and_restores(pair: tuple[str, str], kv: str) -> None:
    """The tree commit graph is built once per session and reused with the step's moves as inputs:
    tokens stay those of plain greedy decoding over many steps whose paths differ in length and
    rows, with two sessions of one engine alternating steps, and after snapshot restores (into the
    same session and into a fresh one)."""
    target, draft = pair
    plain = lucebox.Engine(target, ctx=512, device="cpu", kv_type=kv)
    engine = lucebox.Engine(target, draft, ctx=512, device="cpu", kv_type=kv, spec="tree", tree_budget=BUDGET)
    ps = prompts(2, seed=77)
    refs = [plain.generate(p, max_tokens=96).tokens for p in ps]
    sessions = [engine.session() for _ in ps]
    got: list[list[int]] = [[], []]
    steps, accepted = 0, set()
    for chunk in range(6):  # the two sessions alternate; each call continues its own sequence
        for i, s in enumerate(sessions):
            r = s.generate(ps[i] if chunk == 0 else [], max_tokens=8,
                           propose_tree=random_tree(refs[i], len(ps[i]), seed=100 * chunk + i))
            got[i] += r.tokens
            steps += r.stats.spec["steps"]
            accepted |= {a for a, c in enumerate(r.stats.spec["accept_histogram"]) if c}
    for i in range(2):
        assert got[i] == refs[i][:48], f"session {i}"
    assert steps >= 20 and len(accepted) >= 5, (steps, accepted)
    s = sessions[0]
    snap = s.snapshot()
    after = s.generate([], max_tokens=24, propose_tree=random_tree(refs[0], len(ps[0]), seed=7)).tokens
    assert after == refs[0][48:72]
    s.restore(snap)
    again = s.generate([], max_tokens=24, propose_tree=random_tree(refs[0], len(ps[0]), seed=8)).tokens
    fresh = engine.session()
    fresh.restore(snap)
    other = fresh.generate([], max_tokens=24, propose_tree=random_tree(refs[0], len(ps[0]), seed=9)).tokens
    assert again == other == after


def test_tree_commit_of_kv_rows_not_in_words(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A q8_0 KV row of one block (34 bytes) cannot be moved as 4-byte words: the commit falls back to
    per-row byte copies, and stays lossless."""
    target = tmp_path_factory.mktemp("odd-kv") / "target.gguf"
    synth.write_target(str(target), "tiny", type="q8_0", seed=5, overrides=dict(n_head_kv=1, head_dim=32))
    plain = lucebox.Engine(str(target), ctx=256, device="cpu", kv_type="q8_0")
    engine = lucebox.Engine(str(target), ctx=256, device="cpu", kv_type="q8_0")
    for i, p in enumerate(prompts(2, seed=3)):
        ref = plain.generate(p, max_tokens=40).tokens
        got = engine.session().generate(p, max_tokens=40, propose_tree=random_tree(ref, len(p), seed=i, budget=15))
        assert got.tokens == ref, f"prompt {i}"
