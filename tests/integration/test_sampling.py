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
        ids, counts = np.unique(np.array(history), return_counts=True)  # penalty_last_n = -1
        for i, c in zip(ids, counts):
            v = row[i] / penalties["repetition_penalty"] if row[i] > 0 else row[i] * penalties["repetition_penalty"]
            row[i] = v - c * penalties["frequency_penalty"] - penalties["presence_penalty"]
    keep = np.lexsort((np.arange(row.size), -row))[:top_k]  # logit desc, id asc
    r = row[keep].astype(np.float64)
    w = np.exp((r - r.max()) / TEMPERATURE)
    return {int(i): float(p) for i, p in zip(keep, w / w.sum())}


def _decode_row(engine: lucebox.Engine, prefix: list[int], tokens: list[int]) -> np.ndarray:
    """The row after prefix + tokens computed as the generation below computes it (the prefix as
    one batch, then one-token forwards): a batch of another size may round differently (on a GPU
    especially) and flip near ties."""
    s = engine.session()
    s.append(prefix)
    for t in tokens[:-1]:
        s.append([t])
    return s.eval(tokens[-1:])[-1]


@pytest.mark.parametrize("penalized", [False, True])
def test_two_sampled_tokens_match_the_exact_distribution(tiny_q8_0, penalized: bool) -> None:
    check_two_token_distribution(str(tiny_q8_0), "cpu", penalized)


def check_two_token_distribution(model: str, device: str, penalized: bool) -> None:
    """Also run on CUDA by tests/gpu/test_cuda_sampling.py."""
    engine = lucebox.Engine(model, ctx=512, device=device)
    # penalized: a long prompt over the whole window (penalty_last_n = -1: ~330 distinct ids, a third
    # of the vocabulary), so the penalties hit the row's top tokens and the device gathers many ids
    pen = dict(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.3,
               penalty_last_n=-1) if penalized else {}
    for seed in range(3, 40):  # a prompt whose penalties do change the first distribution
        prompt = [int(x) for x in np.random.default_rng(seed).integers(0, 1000, 400 if penalized else 12)]
        row1 = _decode_row(engine, prompt[:-1], prompt[-1:])
        p1 = _dist(row1, prompt, pen, TOP_K)
        if not penalized or p1 != _dist(row1, prompt, {}, TOP_K):
            break
    else:
        pytest.fail("no prompt found whose penalties change the top tokens")
    p2 = {a: _dist(_decode_row(engine, prompt[:-1], prompt[-1:] + [a]), prompt + [a], pen, TOP_K) for a in p1}
    exact = {(a, b): p1[a] * p2[a][b] for a in p1 for b in p2[a]}

    # every run restores the prompt less its last token and generates from there (no prefill)
    s = engine.session()
    s.append(prompt[:-1])
    snap = s.snapshot()
    runs = 3000
    counts: dict[tuple[int, int], int] = {}
    for seed in range(runs):
        s.restore(snap)
        r = s.generate([prompt[-1]], max_tokens=2, temperature=TEMPERATURE, top_k=TOP_K, seed=seed, **pen)
        key = (r.tokens[0], r.tokens[1])
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) <= set(exact), f"drawn outside the exact support: {set(counts) - set(exact)}"
    worst = max(abs(counts.get(k, 0) / runs - p) for k, p in exact.items())
    chi2 = sum((counts.get(k, 0) - runs * p) ** 2 / (runs * p) for k, p in exact.items() if runs * p > 0)
    print(f"{device} penalized={penalized}: max |empirical - exact| {worst:.4f}, chi2 {chi2:.1f} over {len(exact)} cells")
    assert worst < 0.03
    assert chi2 < 60  # 15 degrees of freedom: p < 1e-6 for a correct sampler



@pytest.mark.parametrize("spec", ["off", "chain", "tree"])
def test_logit_bias_bans_and_lifts_on_every_path(pair: tuple[str, str], spec: str) -> None:
    """logit_bias: -100 bans a token, a positive bias lifts one; greedy decoding then picks the
    argmax of the biased logits at every step, and speculation gives the tokens plain decoding gives."""
    target, draft = pair
    plain = lucebox.Engine(target, ctx=256, device="cpu")
    engine = plain if spec == "off" else lucebox.Engine(target, draft, ctx=256, device="cpu", spec=spec)
    p = [11, 22, 33, 44, 55, 66]
    ref = plain.generate(p, max_tokens=24).tokens
    lifted = 900 if 900 not in ref[:3] else 901
    bias = {ref[0]: -100.0, ref[1]: -100.0, lifted: 2.0}
    got = engine.generate(p, max_tokens=24, logit_bias=bias)
    assert got.tokens == plain.generate(p, max_tokens=24, logit_bias=bias).tokens
    assert ref[0] not in got.tokens and ref[1] not in got.tokens
    # every greedy step: the argmax of the biased logits (the lowest id on ties)
    rows = plain.session().eval(p + got.tokens[:-1], all_logits=True)[len(p) - 1:]
    for row, tok in zip(rows, got.tokens):
        biased = row.astype(np.float32).copy()
        for i, b in bias.items():
            biased[i] += np.float32(b)
        assert tok == int(np.argmax(biased))
    sampled = dict(temperature=0.8, top_k=8, seed=4, logit_bias=bias)
    assert engine.generate(p, max_tokens=24, **sampled).tokens == plain.generate(p, max_tokens=24, **sampled).tokens


def test_logit_bias_is_validated(pair: tuple[str, str]) -> None:
    engine = lucebox.Engine(pair[0], ctx=128, device="cpu")
    for bad, match in (({5: 101.0}, r"\[-100"), ({-1: 1.0}, "token id"), ({10**7: 1.0}, "outside the vocabulary"),
                       ([(3, 1.0), (3, 2.0)], "twice"), ("x", "logit_bias")):
        with pytest.raises(lucebox.ConfigError, match=match):
            engine.generate([1, 2, 3], max_tokens=2, logit_bias=bad)
