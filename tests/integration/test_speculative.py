"""DFlash chain speculative decoding is lossless at temperature 0: the tokens equal plain greedy
decoding, for the real (tiny, random) draft and for forced proposals covering every accept length
0..B-1, with F16 and Q8_0 KV caches, across stop tokens, token budgets and session continuation."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import lucebox
from lucebox import synth
from forcing import forced, forced_tree

BLOCK = 16
N_PROMPTS = 20


def prompts(n: int = N_PROMPTS) -> list[list[int]]:
    rng = np.random.default_rng(1234)
    return [[int(x) for x in rng.integers(0, 1000, int(rng.integers(5, 90)))] for _ in range(n)]


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_real_draft_is_lossless(pair: tuple[str, str], kv: str) -> None:
    target, draft = pair
    plain = lucebox.Engine(target, ctx=512, device="cpu", kv_type=kv, ubatch=32)
    spec = lucebox.Engine(target, draft, ctx=512, device="cpu", kv_type=kv, ubatch=32, spec="chain")
    for p in prompts():
        ref = plain.generate(p, max_tokens=48)
        got = spec.generate(p, max_tokens=48)
        assert got.tokens == ref.tokens, f"prompt {p[:8]}..."
        s = got.stats.spec
        assert s["speculative"] and s["steps"] > 0
        assert s["drafted"] == s["steps"] * (BLOCK - 1)  # full-width verify (far from the context end)
        assert sum(s["accept_histogram"]) == s["steps"]
        assert s["accepted"] == sum(a * c for a, c in enumerate(s["accept_histogram"]))


@pytest.mark.parametrize("kv,rollback", [("f16", "fast"), ("q8_0", "fast"), ("f16", "replay")])
def test_forced_proposals_every_accept_length(pair: tuple[str, str], kv: str, rollback: str) -> None:
    target, _ = pair
    engine = lucebox.Engine(target, ctx=512, device="cpu", kv_type=kv, rollback=rollback)
    for i, p in enumerate(prompts(6)):
        ref = engine.generate(p, max_tokens=64).tokens
        for k in [*range(BLOCK - 1), None]:  # accept lengths 0..14, then full acceptance (15)
            got = engine.session().generate(p, max_tokens=64, propose=forced(ref, len(p), k))
            assert got.tokens == ref, f"prompt {i}, corrupt_at={k}"
            hist = got.stats.spec["accept_histogram"]
            a = BLOCK - 1 if k is None else k
            # every full step accepts exactly `a`; the last step may be cut short by the budget
            assert hist[a] >= max(1, got.stats.spec["steps"] - 2), (k, hist)
            if rollback == "fast":
                assert got.stats.spec["fast_rollbacks"] == got.stats.spec["steps"]
            else:  # a replay for every step that was not fully kept
                assert got.stats.spec["replays"] >= got.stats.spec["steps"] - hist[BLOCK - 1] - 1
            if k is None:
                assert got.stats.acceptance_length > 8


def test_commit_shapes_beyond_the_commit_cache(pair: tuple[str, str]) -> None:
    """A session keeps one commit graph per (verified, kept) shape, up to a bound, then starts over:
    more block sizes x accept lengths than the bound, on one session and on two interleaved
    sessions, still give greedy's tokens with a fast rollback every step."""
    target, _ = pair
    engine = lucebox.Engine(target, ctx=512, device="cpu")
    p = prompts(1)[0]
    ref = engine.generate(p, max_tokens=24).tokens
    a, b = engine.session(), engine.session()
    shapes = [(block, k) for block in (16, 11, 7, 4, 2) for k in range(block)]  # 40 shapes (bound: 32)
    for n, (block, k) in enumerate(shapes):
        s = a if n % 3 else b
        s.reset()
        got = s.generate(p, max_tokens=24, block_size=block, propose=forced(ref, len(p), k))
        assert got.tokens == ref, (block, k)
        assert got.stats.spec["fast_rollbacks"] == got.stats.spec["steps"] > 0


@pytest.mark.parametrize("with_draft", [False, True])
def test_kept_graphs_survive_larger_graphs_in_between(pair: tuple[str, str], with_draft: bool) -> None:
    """Graphs kept between steps (target forward, draft block) are allocated again after another
    session ran larger graphs in the same schedulers (which replaces their buffers): a short session
    continues after a long prefill of another one exactly like on its own."""
    target, draft = pair
    engine = (lucebox.Engine(target, draft, ctx=1024, device="cpu", spec="chain") if with_draft
              else lucebox.Engine(target, ctx=1024, device="cpu"))
    rng = np.random.default_rng(9)
    short_p = [int(x) for x in rng.integers(0, 1000, 6)]
    long_p = [int(x) for x in rng.integers(0, 1000, 700)]  # two micro-batches of 512 rows
    ref = lucebox.Engine(target, ctx=1024, device="cpu").generate(short_p, max_tokens=30).tokens
    a = engine.session()
    got = a.generate(short_p, max_tokens=10).tokens
    engine.session().generate(long_p, max_tokens=5)
    got += a.generate(max_tokens=20).tokens
    assert got == ref


def test_kept_draft_graph_across_kv_windows_and_sessions(pair: tuple[str, str]) -> None:
    """The draft's proposal-block graph is kept per (block, KV window) shape: generation that
    crosses a 256-row KV window (a new shape), alternating with another session of the engine
    (the draft scheduler switches graphs), with the draft's own proposals, is plain greedy."""
    target, draft = pair
    plain = lucebox.Engine(target, ctx=1024, device="cpu")
    spec = lucebox.Engine(target, draft, ctx=1024, device="cpu", spec="chain")
    rng = np.random.default_rng(5)
    long_p = [int(x) for x in rng.integers(0, 1000, 230)]  # generation crosses position 256
    short_p = prompts(1)[0]
    a, b = spec.session(), spec.session()
    ref_a = plain.generate(long_p, max_tokens=60).tokens
    ref_b = plain.generate(short_p, max_tokens=60).tokens
    got_a, got_b = [], []
    for n in range(6):  # 10 tokens at a time from each, alternating
        got_a += a.generate(long_p if n == 0 else [], max_tokens=10).tokens
        got_b += b.generate(short_p if n == 0 else [], max_tokens=10).tokens
    assert got_a == ref_a and got_b == ref_b


def test_phase_timings_split_the_decode_time(pair: tuple[str, str]) -> None:
    target, draft = pair
    spec = lucebox.Engine(target, draft, ctx=512, device="cpu", spec="chain")
    p = prompts(1)[0]
    got = spec.session().generate(p, max_tokens=40, phase_timings=True)
    assert got.tokens == spec.session().generate(p, max_tokens=40).tokens
    s, st = got.stats.spec, got.stats
    assert s["steps"] > 0 and min(s["draft_seconds"], s["verify_seconds"], s["commit_seconds"]) > 0
    # the phases are parts of the decode time (each waits for its own device work)
    assert s["draft_seconds"] + s["verify_seconds"] + s["commit_seconds"] <= st.decode_seconds * 1.001
    untimed = spec.session().generate(p, max_tokens=40).stats.spec  # not asked: not measured
    assert untimed["verify_seconds"] == untimed["commit_seconds"] == 0


def test_stop_tokens_and_budget_inside_a_step(pair: tuple[str, str]) -> None:
    target, _ = pair
    engine = lucebox.Engine(target, ctx=512, device="cpu")
    p = prompts(1)[0]
    ref = engine.generate(p, max_tokens=64).tokens
    for budget in [1, 2, 7, 16, 17, 33]:
        got = engine.session().generate(p, max_tokens=budget, propose=forced(ref, len(p), None))
        assert got.tokens == ref[:budget]
        assert got.finish_reason == "length"
    # a stop token in the middle of an accepted run: emitted tokens end before it
    stop_at = 20
    stop_tok = ref[stop_at]
    if stop_tok not in ref[:stop_at]:
        s = engine.session()
        got = s._core.generate(p, 64, lucebox.SamplingConfig().to_core(), [stop_tok], None, None,
                               forced(ref, len(p), None), 0, False)
        assert list(got.tokens) == ref[:stop_at]
        assert got.finish_reason == "stop"


@pytest.mark.parametrize("spec", ["off", "chain", "auto"])
def test_a_cancelled_generation_counts_what_it_emitted(pair: tuple[str, str], spec: str) -> None:
    # on_token returning False (how stop strings end a generation) after the k-th token, the first
    # (sampled from the prompt) included: the stats count the k tokens returned
    target, draft = pair
    engine = lucebox.Engine(target, draft, ctx=512, device="cpu", spec=spec)
    p = prompts(1)[0]
    for k in (1, 2, 5, 17):
        seen: list[int] = []

        def on_token(tok: int) -> bool:
            seen.append(tok)
            return len(seen) < k

        got = engine.session()._core.generate(p, 40, lucebox.SamplingConfig().to_core(), [], on_token)
        assert got.finish_reason == "cancelled" and list(got.tokens) == seen and len(seen) == k
        assert got.n_generated == k, f"spec {spec}, cancelled at token {k}"


def test_session_continues_after_speculative_generation(pair: tuple[str, str]) -> None:
    target, draft = pair
    plain = lucebox.Engine(target, ctx=512, device="cpu")
    spec = lucebox.Engine(target, draft, ctx=512, device="cpu", spec="chain")
    p = prompts(1)[0]
    s1, s2 = plain.session(), spec.session()
    a = s1.generate(p, max_tokens=10).tokens + s1.generate([7, 8, 9], max_tokens=20).tokens
    b = s2.generate(p, max_tokens=10).tokens + s2.generate([7, 8, 9], max_tokens=20).tokens
    assert a == b
    assert s1.tokens == s2.tokens
    assert s1.tokens == p + a[:10] + [7, 8, 9] + a[10:]  # evaluated tokens + the pending one


def test_context_end_during_speculation(pair: tuple[str, str]) -> None:
    target, draft = pair
    p = prompts(1)[0][:40]
    plain = lucebox.Engine(target, ctx=64, device="cpu").generate(p, max_tokens=100)
    spec = lucebox.Engine(target, draft, ctx=64, device="cpu", spec="chain").generate(p, max_tokens=100)
    assert spec.tokens == plain.tokens
    assert spec.finish_reason == plain.finish_reason == "context"


def _blocks_asked(engine: lucebox.Engine, prompt: list[int], ref: list[int],
                  tree: bool) -> tuple[list[int], list[tuple[int, int]]]:
    """A generation with forced proposals (the whole known continuation `ref`; a tree 4 deep) and what
    each step asked for: (tokens before the step, proposals asked for)."""
    asked: list[tuple[int, int]] = []
    inner = forced_tree(ref, len(prompt), 4) if tree else forced(ref, len(prompt), None)

    def propose(context: np.ndarray, last: int, n: int):
        asked.append((len(context), n))
        return inner(context, last, n)

    kw = dict(propose_tree=propose) if tree else dict(propose=propose)
    return engine.session().generate(prompt, max_tokens=40, **kw).tokens, asked


def test_verify_blocks_stop_at_the_attention_width_switch(pair: tuple[str, str]) -> None:
    # CUDA's attention takes another query tile width for key views of >= long_keys rows (ggml patch
    # 0008); views are padded to 256 rows (long ones then to 1024), so with long_keys 600 the decode
    # steps from position 512 on see long views. A verify from below 512 must end below it, on every
    # backend (here the CPU).
    from lucebox import _core
    target, _ = pair
    engine = lucebox.Engine(target, ctx=1024, device="cpu")
    p = [int(x) for x in np.random.default_rng(8).integers(0, 1000, 505)]
    ref = engine.generate(p, max_tokens=40).tokens

    def run(tree: bool) -> tuple[list[int], list[tuple[int, int]]]:
        return _blocks_asked(engine, p, ref, tree)

    chain, asked = run(False)  # the default switch (4096 keys) is past this 1024-token context: full blocks
    assert chain == ref and asked[0] == (505, BLOCK - 1)
    free_tree_cap = run(True)[1][0][1]
    _core.set_fattn_fixed_split(long_keys=600)
    try:
        chain, asked = run(False)
        tree, tree_asked = run(True)
    finally:
        _core.set_fattn_fixed_split()
    assert chain == ref and tree == ref
    # positions 505..511 (the last token and 6 proposals), then full blocks from 512 on
    assert asked[0] == (505, 6) and asked[1] == (512, BLOCK - 1), asked[:3]
    assert tree_asked[0] == (505, 6) and free_tree_cap > 6, (tree_asked[:2], free_tree_cap)


# (ctx, long_keys, prompt, bound). Long key views are padded to 1024 rows (cuda_kernels.h:
# k_fattn_long_view_pad, whole long pieces), clipped at the cache. An engine whose cache reaches long
# views gets whole pads; these are made while the switch (4096 keys) is past their caches, then it
# moves to long_keys.
# - 1280 rows, switch at 600: a view ends at 1024 until the tokens pass it, then at 1280, which is not
#   whole pieces (patch 0008 cuts it at its KV tiles). A verify from below 1024 ends there.
# - 3840 rows, switch at 3800: views up to 3584 rows are short, every longer one is the clipped 3840,
#   so the one bound is the switch at 3584.
CLIPPED_VIEWS = [(1280, 600, 1017, 1024), (3840, 3800, 3577, 3584)]


@pytest.mark.parametrize("ctx,long_keys,n_prompt,bound", CLIPPED_VIEWS)
def test_verify_blocks_stop_where_a_long_view_is_clipped(pair: tuple[str, str], ctx: int, long_keys: int,
                                                         n_prompt: int, bound: int) -> None:
    from lucebox import _core
    target, _ = pair
    engine = lucebox.Engine(target, ctx=ctx, device="cpu")
    _core.set_fattn_fixed_split(long_keys=long_keys)
    try:
        p = [int(x) for x in np.random.default_rng(10).integers(0, 1000, n_prompt)]
        ref = engine.generate(p, max_tokens=40).tokens
        chain, chain_asked = _blocks_asked(engine, p, ref, tree=False)
        tree, asked = _blocks_asked(engine, p, ref, tree=True)
    finally:
        _core.set_fattn_fixed_split()
    assert chain == ref and tree == ref
    # the last token and 6 proposals up to the bound, then full blocks
    assert bound - n_prompt == 7
    assert chain_asked[0] == (n_prompt, 6) and chain_asked[1] == (bound, BLOCK - 1), chain_asked[:3]
    assert asked[0] == (n_prompt, 6), asked[:2]


def test_a_cache_that_reaches_long_views_is_whole_long_pads(pair: tuple[str, str]) -> None:
    # cache rows: the context padded to 256, and to 1024 where it reaches the long views (4096 keys by
    # default; 600 below), so that no long view is clipped to a length the long pieces do not divide
    from lucebox import _core
    target, _ = pair
    per_row = lucebox.Engine(target, ctx=256, device="cpu").memory_plan()["kv_bytes_per_token"]

    def rows(ctx: int) -> int:
        return lucebox.Engine(target, ctx=ctx, device="cpu").memory_plan()["kv_bytes"] // per_row

    assert [rows(c) for c in (300, 1280, 3000)] == [512, 1280, 3072]
    _core.set_fattn_fixed_split(long_keys=600)
    try:
        assert [rows(c) for c in (300, 1000, 1280, 3000)] == [512, 1024, 2048, 3072]
    finally:
        _core.set_fattn_fixed_split()


def _target_dist(engine: lucebox.Engine, context: list[int], temperature: float, top_k: int) -> dict[int, float]:
    """The target's sampling distribution after `context` (top_k, then temperature)."""
    row = engine.session().eval(context)[-1].astype(np.float64)
    keep = np.argsort(-row, kind="stable")[:top_k]
    w = np.exp((row[keep] - row[keep].max()) / temperature)
    return {int(i): float(p) for i, p in zip(keep, w / w.sum())}


@pytest.mark.parametrize("proposal_rank", [0, 1])
def test_speculative_sampling_is_distribution_exact(pair: tuple[str, str], proposal_rank: int) -> None:
    """Two sampled tokens per run, many seeds: the empirical joint distribution of (t1, t2) with
    forced proposals (the target's top or second choice, so both acceptance and the residual
    resampling run) matches the target's own p(t1) p(t2 | t1)."""
    target, _ = pair
    engine = lucebox.Engine(target, ctx=256, device="cpu")
    prompt = prompts(1)[0][:12]
    temperature, top_k = 1.5, 4
    p1 = _target_dist(engine, prompt, temperature, top_k)
    p2 = {t1: _target_dist(engine, prompt + [t1], temperature, top_k) for t1 in p1}
    exact = {(a, b): p1[a] * p2[a][b] for a in p1 for b in p2[a]}

    def propose(context: np.ndarray, last: int, n: int) -> list[int]:
        ranked = sorted(p2[last], key=lambda t: -p2[last][t]) if last in p2 else [0]
        return [ranked[min(proposal_rank, len(ranked) - 1)]] * n

    runs = 4000
    counts: dict[tuple[int, int], int] = {}
    accepted = 0
    for seed in range(runs):
        r = engine.session().generate(prompt, max_tokens=2, temperature=temperature, top_k=top_k, seed=seed,
                                      propose=propose)
        assert r.stats.spec["speculative"]
        accepted += r.stats.spec["accepted"]
        key = (r.tokens[0], r.tokens[1])
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) <= set(exact)
    worst = max(abs(counts.get(k, 0) / runs - p) for k, p in exact.items())
    chi2 = sum((counts.get(k, 0) - runs * p) ** 2 / (runs * p) for k, p in exact.items() if runs * p > 0)
    print(f"rank {proposal_rank}: max |empirical - exact| {worst:.4f}, chi2 {chi2:.1f} over {len(exact)} cells, "
          f"accepted {accepted}/{runs}")
    assert 0 < accepted < runs  # both branches ran
    assert worst < 0.025
    assert chi2 < 60  # 15 degrees of freedom: p < 1e-6 for a correct sampler


@pytest.mark.parametrize("spec", ["chain", "auto", "tree"])
def test_sampled_speculation_is_plain_sampling(pair: tuple[str, str], spec: str) -> None:
    """Coupled acceptance (sampler::accept_or_resample): a speculative generation at temperature > 0
    emits exactly the tokens plain sampling draws with the same seed: the real draft, forced
    proposals that are accepted or not, and spec "auto", whose plain and speculative steps follow
    measured costs (so it is also the same from one run to the next)."""
    target, draft = pair
    plain = lucebox.Engine(target, ctx=512, device="cpu")
    engine = lucebox.Engine(target, draft, ctx=512, device="cpu", spec=spec)
    settings = [dict(temperature=0.9), dict(temperature=1.3, top_k=8, top_p=0.9),
                dict(temperature=0.7, min_p=0.05, presence_penalty=0.5, repetition_penalty=1.1)]
    accepted = 0
    for i, p in enumerate(prompts(4)):
        for seed in (i, 100 + i):
            kw = dict(settings[(i + seed) % len(settings)], seed=seed)
            ref = plain.generate(p, max_tokens=40, **kw).tokens
            assert engine.generate(p, max_tokens=40, **kw).tokens == ref, f"{spec}: prompt {i}, {kw}"
            if spec == "chain":  # forced proposals: the sampled reference itself, wrong at index k
                for k in (0, 3, None):
                    run = engine.session().generate(p, max_tokens=40, propose=forced(ref, len(p), k), **kw)
                    assert run.tokens == ref, f"forced accept {k}: prompt {i}, {kw}"
                    accepted += run.stats.spec["accepted"]
    if spec == "chain":  # (the random-weight draft is never right: the forced runs accept)
        assert accepted > 0


def test_bad_proposals_are_rejected_cleanly(pair: tuple[str, str]) -> None:
    target, _ = pair
    engine = lucebox.Engine(target, ctx=256, device="cpu")
    with pytest.raises(lucebox.ConfigError, match="outside the vocabulary"):
        engine.session().generate([1, 2, 3], max_tokens=8, propose=lambda c, l, n: [10**6] * n)
    with pytest.raises(lucebox.ConfigError, match="expected"):
        engine.session().generate([1, 2, 3], max_tokens=8, propose=lambda c, l, n: [1])


def test_the_proposal_hook_sees_the_session_tokens(pair: tuple[str, str]) -> None:
    # propose(context, last, n): context is the session's tokens so far (prompt and kept tokens, not
    # `last`), a read-only int32 array
    target, _ = pair
    engine = lucebox.Engine(target, ctx=256, device="cpu")
    seen: list[np.ndarray] = []

    def propose(context: np.ndarray, last: int, n: int) -> list[int]:
        seen.append(context)
        return [0] * n

    prompt = [5, 6, 7, 8]
    out = engine.session().generate(prompt, max_tokens=6, propose=propose).tokens
    assert len(seen) >= 2
    for ctx in seen:
        assert ctx.dtype == np.int32 and not ctx.flags.writeable
        with pytest.raises(ValueError):
            ctx[0] = 1
    generated = prompt + out
    for ctx in seen:
        assert ctx.tolist() == generated[:len(ctx)]
    assert sorted({len(c) for c in seen}) == [len(c) for c in seen]  # it grows step by step


def test_speculative_output_equals_upstream_greedy(tmp_path: "pytest.TempPathFactory") -> None:
    """Oracle: our speculative greedy output equals upstream llama.cpp's greedy continuation on the
    same target (F32 weights, F16 KV). Upstream's own DFlash mode is lossless by construction, so
    this pins our speculative output to upstream's token for token."""
    oracle = pytest.importorskip("oracle")
    ok, why = oracle.available()
    if not ok:
        pytest.skip(why)
    target, draft = str(tmp_path / "t.gguf"), str(tmp_path / "d.gguf")
    synth.write_target(target, "tiny", type="f32", seed=21)
    synth.write_draft(draft, "tiny", type="f32", seed=22)
    spec = lucebox.Engine(target, draft, ctx=512, device="cpu", spec="chain")
    eos = spec.tokenizer.eos_ids
    for p in prompts(4):
        ref = oracle.reference_greedy(target, p, 32, n_ctx=512)
        got = spec.generate(p, max_tokens=32).tokens
        cut = next((i for i, t in enumerate(ref) if t in eos), len(ref))  # we stop at end-of-turn tokens
        assert got == ref[:cut]


def _drafts_with(tmp_path: Path, target: str, **fields: object) -> str:
    path = str(tmp_path / ("draft-" + "-".join(f"{k}{v}" for k, v in sorted(fields.items())) + ".gguf"))
    synth.write_draft(path, "tiny", type="f32", seed=6, overrides=dict(fields) or None)
    return path


def test_draft_attention_masks(pair: tuple[str, str], tmp_path: Path) -> None:
    """Sliding-window and causal drafts: a window longer than the context changes nothing, a short
    window and a causal block change the proposals, and speculative output stays lossless."""
    target, _ = pair
    plain_draft = _drafts_with(tmp_path, target)
    wide = _drafts_with(tmp_path, target, sliding_window=100000, swa_pattern=(True, True))
    narrow = _drafts_with(tmp_path, target, sliding_window=4, swa_pattern=(True, False))
    causal = _drafts_with(tmp_path, target, causal=True)

    def proposals(draft: str, prompt: list[int]) -> list[int]:
        s = lucebox.Engine(target, draft, ctx=256, device="cpu", spec="chain").session()
        s.append(prompt)
        return list(s._core.draft_proposals(prompt[-1]))

    ps = prompts(4)
    base = [proposals(plain_draft, p) for p in ps]
    assert [proposals(wide, p) for p in ps] == base
    assert [proposals(narrow, p) for p in ps] != base
    assert [proposals(causal, p) for p in ps] != base
    plain = lucebox.Engine(target, ctx=256, device="cpu")
    for draft in (narrow, causal):
        spec = lucebox.Engine(target, draft, ctx=256, device="cpu", spec="chain")
        for p in ps:
            assert spec.generate(p, max_tokens=24).tokens == plain.generate(p, max_tokens=24).tokens


def test_concurrent_sessions_match_sequential(pair: tuple[str, str]) -> None:
    """Sessions of one engine generating on several threads interleave step by step and give the
    same tokens as one at a time (the engine serialises compute; state is per session)."""
    import threading

    target, draft = pair
    engine = lucebox.Engine(target, draft, ctx=512, device="cpu", spec="chain")
    ps = prompts(6)
    expected = [engine.generate(p, max_tokens=40).tokens for p in ps]
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = engine.session().generate(ps[i], max_tokens=40).tokens
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(ps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [results[i] for i in range(len(ps))] == expected


def test_auto_drops_to_plain_steps_when_speculation_does_not_pay(pair: tuple[str, str]) -> None:
    """spec="auto": a random-weight draft is almost never accepted, so after a few measured steps
    the engine decodes plainly (plain_steps), with the same greedy tokens as plain decoding; later
    generations start with a plain run after such a loss; a sampled generation runs too.
    spec="chain" never takes plain steps."""
    target, draft = pair
    plain = lucebox.Engine(target, ctx=512, device="cpu")
    auto = lucebox.Engine(target, draft, ctx=512, device="cpu")  # the default: spec="auto"
    chain = lucebox.Engine(target, draft, ctx=512, device="cpu", spec="chain")
    for i, p in enumerate(prompts(4)):
        ref = plain.generate(p, max_tokens=120).tokens
        got = auto.generate(p, max_tokens=120)
        assert got.tokens == ref
        s = got.stats.spec
        assert s["speculative"] and s["plain_steps"] > 0
        if i == 0:  # later generations may start with a plain run (speculation lost before)
            assert s["steps"] >= 1
        assert sum(s["accept_histogram"]) == s["steps"]
        c = chain.generate(p, max_tokens=120)
        assert c.tokens == ref and c.stats.spec["plain_steps"] == 0
    sampled = auto.generate(prompts(1)[0], max_tokens=60, temperature=0.8, top_k=20, seed=3)
    assert len(sampled.tokens) > 0 and all(0 <= t < auto.hparams.n_vocab for t in sampled.tokens)


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_k": 40, "seed": 5},
                                      {"temperature": 0.0, "repetition_penalty": 1.2}],
                         ids=["greedy", "sampled", "penalized"])
def test_ngram_lookup_equals_plain_decoding(pair: tuple[str, str], sampling: dict) -> None:
    """Draftless speculation (spec="ngram"): proposals looked up in the
    context (what followed an earlier occurrence of its last tokens) verified as a chain. The tokens
    and logprobs are plain decoding's: the bundled demo target (whose greedy text repeats itself, so
    the lookup's proposals are accepted) and the random tiny target. A session's later
    generations (after a continuation, a reset or a restore) look up in their own context."""
    from lucebox import default_model

    demo = str(default_model.default_model_paths()[0])
    snippet = Path(lucebox.__file__).with_name("prefix_cache.py").read_text()[1500:2700]
    accepted = 0
    for target, prompt in [(demo, snippet + "\n\n" + snippet + "\n\n" + snippet[:300]), (pair[0], None)]:
        plain = lucebox.Engine(target, ctx=1024, device="cpu", spec="off")
        ngram = lucebox.Engine(target, ctx=1024, device="cpu", spec="ngram")
        for p in ([plain.encode_prompt(prompt)] if prompt else prompts(4)):
            ref = plain.generate(p, max_tokens=96, logprobs=2, **sampling)
            got = ngram.generate(p, max_tokens=96, logprobs=2, **sampling)
            assert got.tokens == ref.tokens
            assert [lp.logprob for lp in got.logprobs] == [lp.logprob for lp in ref.logprobs]
            s = got.stats.spec
            assert s["speculative"] and sum(s["accept_histogram"]) == s["steps"]
            accepted += s["accepted"]
    assert accepted > 0 or sampling  # (sampled or penalized, the demo target strays from its loops)
    # one session: generations after a continuation, a reset and a restore equal plain ones
    a, b = prompts(2)
    ses, ref_ses = ngram.session(), plain.session()
    for ids in (a, b):
        assert ses.generate(ids, max_tokens=40, **sampling).tokens == ref_ses.generate(ids, max_tokens=40,
                                                                                      **sampling).tokens
    snap, ref_snap = ses.snapshot(), ref_ses.snapshot()
    ses.reset(), ref_ses.reset()
    assert ses.generate(b, max_tokens=40, **sampling).tokens == ref_ses.generate(b, max_tokens=40, **sampling).tokens
    ses.restore(snap), ref_ses.restore(ref_snap)
    assert ses.generate(a, max_tokens=40, **sampling).tokens == ref_ses.generate(a, max_tokens=40, **sampling).tokens


def test_ngram_takes_no_draft(pair: tuple[str, str]) -> None:
    target, draft = pair
    with pytest.raises(lucebox.ConfigError, match="ngram"):
        lucebox.Engine(target, draft, ctx=256, device="cpu", spec="ngram")
    plain = lucebox.Engine(target, ctx=256, device="cpu")  # no draft: "auto" decodes plainly
    assert not plain.generate([1, 2, 3], max_tokens=4).stats.spec["speculative"]


def test_ngram_falls_back_to_plain_steps(pair: tuple[str, str]) -> None:
    """Text from a two-letter alphabet (a grammar) makes the lookup match at most steps, but the
    random target's sampled letters follow the matches only by chance, so the policy measures a window
    of speculative steps against plain steps (which touch no draft) and switches on what it measured;
    the tokens are plain sampling's either way. An engine per generation: the policy's losses are
    shared by an engine's generations, and after a few (whether speculation loses is the machine's
    timing) a new generation would start with a plain run longer than its 150 tokens. A fresh one
    always starts with a speculative window, and measures the plain step cost with plain steps."""
    target, _ = pair
    plain = lucebox.Engine(target, ctx=512, device="cpu", spec="off")
    letters = lucebox.Grammar.regex(r"[ab]{400}")
    for seed, p in enumerate(prompts(3)):
        kw = dict(max_tokens=150, logprobs=1, temperature=1.0, seed=seed, grammar=letters)
        ref = plain.generate(p, **kw)
        got = lucebox.Engine(target, ctx=512, device="cpu", spec="ngram").generate(p, **kw)
        assert got.tokens == ref.tokens
        s = got.stats.spec
        assert s["steps"] >= 4 and s["plain_steps"] > 0, s


def test_cli_generate_spec_ngram(pair: tuple[str, str]) -> None:
    import os
    import subprocess
    import sys

    target, draft = pair
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    base = [sys.executable, "-m", "lucebox", "generate", target, "ab ab ab ab ab ab", "--device", "cpu",
            "--ctx", "256", "--max-tokens", "16", "--spec", "ngram", "--stats"]
    ok = subprocess.run(base, capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "[spec]" in ok.stderr
    bad = subprocess.run([*base, "--draft", draft], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode != 0 and "ngram" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("split", ["layer", "tensor"])
def test_ngram_on_splits(split: str) -> None:
    """The lookup's chain verifies on a layer or tensor split over two CPU devices: the tokens of the
    same placement decoding plainly (the bundled demo target repeats itself, so proposals are accepted)."""
    from lucebox import default_model

    target = str(default_model.default_model_paths()[0])
    placement = dict(ctx=1024, devices=["cpu:0", "cpu:1"], split=split)
    plain = lucebox.Engine(target, spec="off", **placement)
    ngram = lucebox.Engine(target, spec="ngram", **placement)
    accepted = 0
    for text in ["def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\ndef fib(n):\n",
                 "import os\nimport sys\n"]:
        ids = plain.encode_prompt(text)
        got = ngram.generate(ids, max_tokens=80)
        assert got.tokens == plain.generate(ids, max_tokens=80).tokens
        accepted += got.stats.spec["accepted"]
    assert accepted > 0


def test_cli_generate_with_a_prediction(pair: tuple[str, str], tmp_path: Path) -> None:
    """`lucebox generate --prediction FILE`: the same text as without it, its proposals accepted."""
    import os
    import subprocess
    import sys

    target, _ = pair
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    base = [sys.executable, "-m", "lucebox", "generate", target, "once upon a time", "--device", "cpu",
            "--ctx", "256", "--max-tokens", "40", "--spec", "off"]
    plain = subprocess.run(base, capture_output=True, text=True, env=env, timeout=300)
    assert plain.returncode == 0, plain.stderr
    (tmp_path / "expected.txt").write_text(plain.stdout[:-1], encoding="utf-8")  # (less the final newline)
    got = subprocess.run([*base, "--prediction", str(tmp_path / "expected.txt"), "--stats"], capture_output=True,
                         text=True, env=env, timeout=300)
    assert got.returncode == 0, got.stderr
    assert got.stdout == plain.stdout
    accepted = int(got.stderr.split("[prediction] ")[1].split()[0])
    assert accepted > 0, got.stderr


@pytest.mark.parametrize("spec", ["off", "auto", "chain", "tree", "ngram"])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "top_k": 30, "seed": 2}], ids=["greedy", "sampled"])
def test_a_prediction_changes_the_speed_not_the_tokens(pair: tuple[str, str], spec: str, sampling: dict) -> None:
    """Predicted outputs: the plain answer given back as the prediction (whole, edited, or unrelated)
    is verified as proposals on every engine; the tokens and logprobs are the plain ones, and most
    of an exact prediction is accepted (a tree's steps ignore it)."""
    target, draft = pair
    plain = lucebox.Engine(target, ctx=512, device="cpu", spec="off")
    engine = lucebox.Engine(target, None if spec in ("off", "ngram") else draft, ctx=512, device="cpu", spec=spec)
    for p in prompts(3):
        ref = plain.generate(p, max_tokens=64, logprobs=1, **sampling)
        edited = ref.tokens[:20] + [7, 8, 9] + ref.tokens[25:]
        for prediction in (ref.tokens, edited, [5, 6, 7, 8] * 10):
            got = engine.generate(p, max_tokens=64, logprobs=1, prediction=prediction, **sampling)
            assert got.tokens == ref.tokens
            assert [lp.logprob for lp in got.logprobs] == [lp.logprob for lp in ref.logprobs]
            if prediction is ref.tokens and spec != "tree":
                assert got.stats.spec["predicted_accepted"] >= len(ref.tokens) // 2, got.stats.spec
    with pytest.raises(lucebox.ConfigError, match="prediction"):
        engine.generate(prompts(1)[0], max_tokens=4, prediction=[10**9])
    session = engine.session()
    with pytest.raises(lucebox.ConfigError, match="prediction"):
        session.generate(prompts(1)[0], max_tokens=4, prediction=[10**9])
    assert session.n_past == 0  # refused before any work
