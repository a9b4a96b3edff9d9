"""Token logprobs: each generated token's log probability under the model (the log-softmax of its
raw logits) and its N most likely alternatives, on every generation path (plain, chain and tree
speculation, greedy and sampled, penalties, layer and tensor splits), checked against the exact
log-softmax of the logits `Session.eval` returns for the same tokens. Asking for logprobs never
changes the tokens."""
from __future__ import annotations

import numpy as np
import pytest

import lucebox
from lucebox import synth
from lucebox.errors import ConfigError
from forcing import forced, forced_tree

TOL = 2e-4  # the device's float normalizer against a float64 one on the host


def exact_logprobs(engine: lucebox.Engine, prompt: list[int], tokens: list[int], n_top: int
                   ) -> list[tuple[float, list[int]]]:
    """(log p(token), ids of the n_top most likely, best first, lower id on ties) per generated token."""
    logits = engine.session().eval(prompt + tokens[:-1], all_logits=True)[len(prompt) - 1:]
    out = []
    for row, tok in zip(logits.astype(np.float64), tokens):
        lse = row.max() + np.log(np.exp(row - row.max()).sum())
        order = np.lexsort((np.arange(len(row)), -row))[:n_top]  # logit desc, then id asc
        out.append((row[tok] - lse, [int(i) for i in order], row - lse))
    return out


def check_logprobs(engine: lucebox.Engine, prompt: list[int], res: lucebox.GenerationResult, n_top: int) -> None:
    assert res.logprobs is not None and len(res.logprobs) == len(res.tokens) > 0
    for j, (lp, (want, top_ids, all_lp)) in enumerate(zip(res.logprobs, exact_logprobs(engine, prompt, res.tokens,
                                                                                        n_top))):
        assert lp.token == res.tokens[j]
        assert abs(lp.logprob - want) < TOL, f"token {j}"
        assert [i for i, _ in lp.top] == top_ids, f"token {j}"
        for i, v in lp.top:
            assert abs(v - all_lp[i]) < TOL


def prompts(n: int) -> list[list[int]]:
    rng = np.random.default_rng(77)
    return [[int(x) for x in rng.integers(0, 1000, int(rng.integers(4, 40)))] for _ in range(n)]


SAMPLINGS = [dict(), dict(temperature=0.9, seed=3), dict(temperature=0.7, top_k=20, seed=4),
             dict(temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5)]


@pytest.mark.parametrize("spec", ["off", "chain", "tree"])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "sampled", "top_k", "penalized"])
def test_logprobs_on_every_path(pair: tuple[str, str], spec: str, sampling: dict) -> None:
    target, draft = pair
    engine = lucebox.Engine(target, None if spec == "off" else draft, ctx=512, device="cpu", ubatch=32,
                            spec="auto" if spec == "off" else spec)
    for k, p in enumerate(prompts(3)):
        n_top = [0, 5, 20][k]
        ref = engine.session().generate(p, max_tokens=40, **sampling)
        got = engine.session().generate(p, max_tokens=40, logprobs=n_top, **sampling)
        assert got.tokens == ref.tokens and ref.logprobs is None
        assert all(len(lp.top) == n_top for lp in got.logprobs)
        check_logprobs(engine, p, got, n_top)
        if spec != "off":
            assert got.stats.spec["steps"] > 0


@pytest.mark.parametrize("accept", [0, 3, 15])
def test_logprobs_of_forced_chains_and_trees(pair: tuple[str, str], accept: int) -> None:
    """Every token of a step gets its own row's logprobs, whatever the accept length."""
    target, _ = pair
    engine = lucebox.Engine(target, ctx=512, device="cpu")
    p = prompts(1)[0]
    ref = engine.generate(p, max_tokens=48).tokens
    for sampling in (dict(), dict(temperature=0.8, seed=9)):
        plain = engine.session().generate(p, max_tokens=48, logprobs=4, **sampling)
        chain = engine.session().generate(p, max_tokens=48, logprobs=4,
                                          propose=forced(ref, len(p), None if accept == 15 else accept), **sampling)
        tree = engine.session().generate(p, max_tokens=48, logprobs=4,
                                         propose_tree=forced_tree(ref, len(p), accept), **sampling)
        for got in (chain, tree):
            assert got.tokens == plain.tokens
            assert got.stats.spec["steps"] > 0
            check_logprobs(engine, p, got, 4)
        if not sampling:
            assert chain.stats.spec["accepted"] >= accept * (chain.stats.spec["steps"] - 2)


def test_stream_chunks_carry_their_tokens_logprobs(pair: tuple[str, str]) -> None:
    target, draft = pair
    engine = lucebox.Engine(target, draft, ctx=512, device="cpu", spec="chain")
    p = prompts(1)[0]
    whole = engine.session().generate(p, max_tokens=30, logprobs=2)
    text = whole.text
    for stop in (None, [text[len(text) // 2: len(text) // 2 + 3]]):
        res = engine.session().generate(p, max_tokens=30, logprobs=2, stop=stop)
        chunks = list(engine.session().stream(p, max_tokens=30, logprobs=2, stop=stop))
        toks = [t for c in chunks for t in c.tokens]
        lps = [lp for c in chunks for lp in (c.logprobs or [])]
        assert all(c.logprobs is not None and len(c.logprobs) == len(c.tokens) for c in chunks)
        assert toks == res.tokens and [lp.token for lp in lps] == res.tokens
        assert lps == res.logprobs
        assert "".join(c.text for c in chunks) == res.text
        if stop is not None:
            assert res.finish_reason == "stop" and len(res.tokens) < len(whole.tokens)
            assert res.logprobs == whole.logprobs[:len(res.tokens)]
    plain_chunks = list(engine.session().stream(p, max_tokens=10))
    assert all(c.logprobs is None for c in plain_chunks)


@pytest.mark.parametrize("split", ["layer", "tensor"])
def test_logprobs_on_splits(tmp_path, split: str) -> None:
    """A layer split reads whole rows on the host; a tensor split computes the normalizer in the
    meta backend's graph. Both give the single device's numbers."""
    path = str(tmp_path / "t.gguf")
    synth.write_target(path, "tiny", type="f32", seed=8)
    single = lucebox.Engine(path, ctx=256, device="cpu")
    split_engine = lucebox.Engine(path, ctx=256, devices=["cpu:0", "cpu:1"], split=split)
    for sampling in (dict(), dict(temperature=0.8, seed=2)):
        p = prompts(1)[0]
        got = split_engine.generate(p, max_tokens=24, logprobs=3, **sampling)
        ref = single.generate(p, max_tokens=24, logprobs=3, **sampling)
        assert got.tokens == ref.tokens
        check_logprobs(single, p, got, 3)


@pytest.mark.parametrize("bad", [-1, 21, True, 2.0, "3"])
def test_bad_logprobs_are_refused(pair: tuple[str, str], bad) -> None:
    engine = lucebox.Engine(pair[0], ctx=128, device="cpu")
    with pytest.raises(ConfigError, match="logprobs"):
        engine.generate([1, 2, 3], max_tokens=4, logprobs=bad)
    with pytest.raises(ConfigError, match="logprobs"):
        engine.session().stream([1, 2, 3], max_tokens=4, logprobs=bad)


@pytest.mark.parametrize("ubatch", [512, 7])
def test_score_is_the_exact_log_softmax_of_the_prompt(pair: tuple[str, str], ubatch: int) -> None:
    """Session.score: every token after the first, across micro-batch boundaries, then `next`."""
    target, draft = pair
    engine = lucebox.Engine(target, draft, ctx=512, device="cpu", ubatch=ubatch, spec="chain")
    p = prompts(2)[1] + prompts(1)[0]
    for n_top, nxt in ((0, None), (6, 123)):
        s = engine.session()
        got = s.score(p, top_logprobs=n_top, next=nxt)
        assert s.tokens == p  # appended like eval; `next` is not
        scored = p[1:] + ([nxt] if nxt is not None else [])
        assert [e.token for e in got] == scored
        exact = exact_logprobs(engine, p[:1], scored, n_top)
        for e, (want, top_ids, all_lp) in zip(got, exact):
            assert abs(e.logprob - want) < TOL
            assert [i for i, _ in e.top] == top_ids
        # the session goes on as after eval: generation continues the scored context
        ref = engine.session()
        ref.append(p)
        assert s.generate([7], max_tokens=8).tokens == ref.generate([7], max_tokens=8).tokens
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        engine.session().score([1, 2], next=10**6)
    with pytest.raises(ConfigError, match="top_logprobs"):
        engine.session().score([1, 2], top_logprobs=21)


def test_score_on_a_layer_split(tmp_path) -> None:
    path = str(tmp_path / "t.gguf")
    synth.write_target(path, "tiny", type="f32", seed=8)
    single = lucebox.Engine(path, ctx=256, device="cpu")
    split = lucebox.Engine(path, ctx=256, devices=["cpu:0", "cpu:1"], split="layer")
    p = prompts(1)[0]
    a, b = split.session().score(p, top_logprobs=3), single.session().score(p, top_logprobs=3)
    assert [e.token for e in a] == [e.token for e in b]
    for x, y in zip(a, b):
        assert abs(x.logprob - y.logprob) < TOL and [i for i, _ in x.top] == [i for i, _ in y.top]


def test_perplexity_command_is_the_exact_second_half_nll(pair: tuple[str, str], tmp_path, capsys) -> None:
    """`lucebox perplexity`: consecutive chunks from an empty context, the tokens after each
    chunk's first half + 1 scored (llama.cpp's protocol), against the exact log-softmax of eval's logits."""
    import math

    from lucebox import cli

    target, _ = pair
    engine = lucebox.Engine(target, ctx=64, device="cpu")
    text = "def f(x):\n    return x * 2 + 1  # a line of code\n" * 40
    ids = engine.tokenizer.encode(text)
    chunk = 32
    n_chunks = len(ids) // chunk
    assert n_chunks >= 2
    want = []
    for c in range(n_chunks):
        part = ids[c * chunk:(c + 1) * chunk]
        exact = exact_logprobs(engine, part[:1], part[1:], 0)  # exact[i]: token i + 1
        want.append([-lp for lp, *_ in exact[chunk // 2:]])
    got = cli.chunk_perplexity(engine, ids, chunk)
    assert [len(g) for g in got] == [chunk - chunk // 2 - 1] * n_chunks
    for g, w in zip(got, want):
        assert np.allclose(g, w, atol=TOL)
    flat = [x for w in want for x in w]
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    assert cli.main(["perplexity", target, str(path), "--chunk", str(chunk), "--device", "cpu"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("PPL = ")][0]
    ppl = math.exp(sum(flat) / len(flat))
    assert abs(float(line.split()[2]) - ppl) < 1e-3 * ppl
    assert f"over {n_chunks} chunks of {chunk} tokens ({len(flat)} scored)" in line
    with pytest.raises(ConfigError, match="fewer than one chunk"):
        cli.chunk_perplexity(engine, ids[:10], chunk)
    assert cli.main(["perplexity", target, str(tmp_path / "missing.txt"), "--device", "cpu"]) == 1
    assert "cannot read the text file" in capsys.readouterr().err
    assert cli.main(["perplexity", target, str(path), "--max-chunks", "-1"]) == 1
