"""Sampled decoding end to end: the device returns each row's top candidates and the logits of the
penalty window (graph/candidates.h), and the host draws from them. The empirical distribution of
two sampled tokens over many seeds must match the target's exact p(t1) p(t2 | t1) computed here
from full logits rows (penalties, then top_k, then temperature), with and without penalties.
(tests/cpp/test_sampling.cpp checks that the candidate and full-row paths draw the same tokens.)"""
from __future__ import annotations

import numpy as np
import pytest

import lucebox

TEMPERATURE, TOP_K = 1.5, 4


def _dist(row: np.ndarray, history: list[int], penalties: dict[str, float], top_k: int) -> dict[int, float]:
    """The sampling distribution of one row (lucebox's order: penalties, top_k, temperature)."""
    row = row.astype(np.float32).copy()
    if penalties:
        ids, counts = np.unique(np.array(history[-64:]), return_counts=True)
        for i, c in zip(ids, counts):
            v = row[i] / penalties["repetition_penalty"] if row[i] > 0 else row[i] * penalties["repetition_penalty"]
            row[i] = v - c * penalties["frequency_penalty"] - penalties["presence_penalty"]
    keep = np.lexsort((np.arange(row.size), -row))[:top_k]  # logit desc, id asc
    r = row[keep].astype(np.float64)
    w = np.exp((r - r.max()) / TEMPERATURE)
    return {int(i): float(p) for i, p in zip(keep, w / w.sum())}


@pytest.mark.parametrize("penalized", [False, True])
def test_two_sampled_tokens_match_the_exact_distribution(tiny_q8_0, penalized: bool) -> None:
    engine = lucebox.Engine(str(tiny_q8_0), ctx=256, device="cpu")
    base = [int(x) for x in np.random.default_rng(3).integers(0, 1000, 12)]
    first = engine.session().eval(base)[-1]
    # penalized: the prompt repeats its row's two best tokens, so the penalties reorder the top
    prompt = base + ([int(i) for i in np.argsort(-first)[:2]] * 2 if penalized else [])
    pen = dict(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.3) if penalized else {}
    row1 = engine.session().eval(prompt)[-1]
    p1 = _dist(row1, prompt, pen, TOP_K)
    p2 = {a: _dist(engine.session().eval(prompt + [a])[-1], prompt + [a], pen, TOP_K) for a in p1}
    exact = {(a, b): p1[a] * p2[a][b] for a in p1 for b in p2[a]}
    if penalized:  # the penalties do change the first distribution
        assert p1 != _dist(row1, prompt, {}, TOP_K)

    runs = 3000
    counts: dict[tuple[int, int], int] = {}
    for seed in range(runs):
        r = engine.generate(prompt, max_tokens=2, temperature=TEMPERATURE, top_k=TOP_K, seed=seed, **pen)
        key = (r.tokens[0], r.tokens[1])
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) <= set(exact)
    worst = max(abs(counts.get(k, 0) / runs - p) for k, p in exact.items())
    chi2 = sum((counts.get(k, 0) - runs * p) ** 2 / (runs * p) for k, p in exact.items() if runs * p > 0)
    print(f"penalized={penalized}: max |empirical - exact| {worst:.4f}, chi2 {chi2:.1f} over {len(exact)} cells")
    assert worst < 0.03
    assert chi2 < 60  # 15 degrees of freedom: p < 1e-6 for a correct sampler

