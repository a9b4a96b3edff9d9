"""Sampled decoding on CUDA: the device's top-k candidates (ggml top_k + get_rows on the GPU) and
the host draw give the target's exact two-token distribution, with and without penalties (the
check of tests/integration/test_sampling.py, on the GPU); token logprobs (the rows' normalizers
computed in the CUDA graph) on plain, chain and tree steps and from Session.score."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from lucebox import synth

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_sampling import check_two_token_distribution  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("penalized", [False, True])
def test_two_sampled_tokens_on_cuda(tmp_path: Path, penalized: bool) -> None:
    path = str(tmp_path / "t.gguf")
    synth.write_target(path, "tiny", type="q8_0", seed=1234)
    check_two_token_distribution(path, "cuda", penalized)


def check_device_logprobs(engine, prompt: list[int], got, n_top: int, greedy: bool) -> None:
    """Logprobs of a generation on a GPU: against the exact log-softmax of `eval` over the same
    tokens within 0.05 (a batch and decode steps run different kernels, so their logits differ in
    rounding), best alternatives first, none above 0; greedy tokens are their own best alternative."""
    assert got.logprobs is not None and len(got.logprobs) == len(got.tokens)
    rows = engine.session().eval(prompt + got.tokens[:-1], all_logits=True)[len(prompt) - 1:].astype(np.float64)
    for lp, row, tok in zip(got.logprobs, rows, got.tokens):
        lse = row.max() + np.log(np.exp(row - row.max()).sum())
        assert lp.token == tok and lp.logprob <= 1e-6 and abs(lp.logprob - (row[tok] - lse)) < 0.05
        values = [v for _, v in lp.top]
        assert len(values) == n_top and values == sorted(values, reverse=True)
        if greedy:
            assert lp.top[0][0] == tok or abs(lp.top[0][1] - lp.logprob) < 0.05  # (a near tie)


def test_score_on_cuda_is_evals_exact_log_softmax(pair: tuple[str, str]) -> None:
    """Session.score and eval run the same batch, so the CUDA normalizer (argmax, get_rows, sub, exp,
    sum_rows in the graph) must give eval's log-softmax to float rounding, alternatives included."""
    import lucebox

    engine = lucebox.Engine(pair[0], ctx=512, device="cuda")
    p = [int(x) for x in np.random.default_rng(3).integers(0, 1000, 120)]
    entries = engine.session().score(p, top_logprobs=5)
    rows = engine.session().eval(p, all_logits=True)[:-1].astype(np.float64)
    for e, row, tok in zip(entries, rows, p[1:]):
        lse = row.max() + np.log(np.exp(row - row.max()).sum())
        assert abs(e.logprob - (row[tok] - lse)) < 2e-4
        order = np.lexsort((np.arange(len(row)), -row))[:5]
        assert [i for i, _ in e.top] == [int(i) for i in order]


@pytest.mark.parametrize("spec", ["off", "chain", "tree"])
def test_logprobs_on_cuda(pair: tuple[str, str], spec: str) -> None:
    """Plain, chain and tree steps on CUDA: the same tokens with logprobs as without, and logprobs
    that are the model's (check_device_logprobs)."""
    import lucebox

    target, draft = pair
    engine = lucebox.Engine(target, None if spec == "off" else draft, ctx=512, device="cuda",
                            spec="auto" if spec == "off" else spec)
    p = [3, 14, 15, 92, 65, 35, 89, 79]
    for sampling in (dict(), dict(temperature=0.8, seed=5)):
        ref = engine.session().generate(p, max_tokens=32, **sampling)
        got = engine.session().generate(p, max_tokens=32, logprobs=5, **sampling)
        assert got.tokens == ref.tokens
        check_device_logprobs(engine, p, got, 5, greedy=not sampling)


@pytest.mark.parametrize("spec", ["off", "chain", "tree"])
def test_grammar_on_cuda(pair: tuple[str, str], spec: str) -> None:
    """Structured outputs on CUDA (greedy rows then come from the device's candidates, masked on the
    host): plain, chain and tree steps stay in the language, greedy and sampled, and logprobs do not
    change the tokens. (Chain or tree against plain is not compared: a verify batch and a decode step
    round differently on the GPU.)"""
    import json
    import re

    import lucebox

    target, draft = pair
    engine = lucebox.Engine(target, None if spec == "off" else draft, ctx=512, device="cuda",
                            spec="auto" if spec == "off" else spec)
    regex = r"[a-z]{2,8}@[a-z]{2,6}\.(com|org|net)"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "tags": {"type": "array", "maxItems": 3,
                                                                                   "items": {"type": "string"}}},
              "required": ["n", "tags"], "additionalProperties": False}
    p = [3, 14, 15, 92, 65, 35, 89, 79]
    for sampling in (dict(), dict(temperature=0.8, seed=5)):
        res = engine.generate(p, max_tokens=60, grammar=lucebox.Grammar.regex(regex), **sampling)
        assert res.finish_reason == "stop" and re.fullmatch(regex, res.text), res.text
        res = engine.generate(p, max_tokens=200, grammar=lucebox.Grammar.json_schema(schema), **sampling)
        with_lp = engine.generate(p, max_tokens=200, grammar=lucebox.Grammar.json_schema(schema), logprobs=2,
                                  **sampling)
        assert with_lp.tokens == res.tokens
        if res.finish_reason == "stop":
            obj = json.loads(res.text)
            assert isinstance(obj["n"], int) and len(obj["tags"]) <= 3
        if spec != "off":
            assert res.stats.spec["steps"] > 0
