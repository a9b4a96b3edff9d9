"""Oracle agreement (DESIGN.md, Invariants): lucebox's target logits equal upstream llama.cpp's on
the same GGUF, position by position, within the tolerances stated below; and greedy generation
at temperature 0 produces the same tokens.

The oracle is llama.cpp at the pinned version, through llama-cpp-python (installed by
``scripts/install_oracle.sh``); see ``oracle.py``. The models are the tiny synthetic ``qwen35``
targets of ``conftest.py`` (3 Gated DeltaNet layers + 1 gated attention layer, vocabulary 1024).

The first group of tests checks the oracle by itself, so a broken oracle is told apart from a
broken engine. The second group compares the engine with it; those tests skip until
``lucebox.Engine`` exists.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import oracle

_ok, _why = oracle.available()
if not _ok:
    pytest.skip(f"{_why}; install it with: bash scripts/install_oracle.sh <venv>/bin/python",
                allow_module_level=True)

from oracle import ReferenceSession, reference_greedy, reference_logits  # noqa: E402

# ----------------------------------------------------------------------------------------------
# Tolerances
#
# All absolute tolerances are relative to the logit scale: the RMS of the reference logits over
# all positions and the whole vocabulary (about 1.0 for the tiny random models, whose logits
# reach |4.5|). A random-weight model has nearly flat distributions: the gap between the top two
# logits is below 0.005 x scale at about 1% of positions and below 0.04 x scale at about 12%, so
# top-1 agreement is only demanded where the reference's top-2 gap exceeds TIE_MARGIN (a
# difference far inside the tolerance can legitimately flip a near-tie).
#
# Measured inside llama.cpp itself (same model, same tokens; 4 prompts of 200 tokens), between
# one micro-batch of 512 and micro-batches of 64, or one-shot and prefill + 8 single-token
# decodes: max |diff| / scale = 3.3e-4 .. 5.1e-4 with F32 weights, 2.1e-2 .. 2.5e-2 with Q8_0
# weights (ggml's CPU matmul takes a different path by batch size; activations are quantized to
# Q8_0 against Q8_0 weights), and top-1 identical everywhere. Q8_0 K and V vs F16 KV:
# 6.4e-3 (F32 weights) and 4.1e-2 (Q8_0 weights), top-1 agreement >= 99%. lucebox today (same
# ggml, same graph) is bit-identical to llama.cpp with an F16 cache, with either weight type.
#
# Quantized KV caches: llama.cpp at this pin rotates Q/K and V by a Walsh-Hadamard matrix before
# quantizing them into the cache (see oracle.py); an engine that does not (lucebox today) carries
# quantization noise independent of the reference's. Each quantized-KV comparison is therefore
# made twice: loosely (TOL_QUANT_KV) against upstream's default, and tightly (the F16-KV
# tolerance of the weight type) against the closer of the two upstream variants (rotation on or
# off), so an engine with either choice passes and a real error does not. Measured (lucebox,
# tiny models, 100-300 tokens): bit-identical to the variant without rotation; against the
# rotated default, max |diff| 5e-3 .. 1.2e-2 (F32 weights) and 3.7e-2 .. 4.5e-2 (Q8_0 weights),
# top-1 agreement 98.0% .. 100%.
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    max_abs: float       # max |ours - reference| over all positions and tokens, x logit scale
    min_top1: float      # top-1 agreement: 1.0 = every position except near-ties (TIE_MARGIN);
                         # below 1.0 = this fraction of all positions


#: Reference top-2 gaps below this (x scale) count as ties for the "every position" top-1 rule.
TIE_MARGIN = 5e-3
#: F32 weights, F16 KV: the only roundings are the F16 K/V stores, identical on both sides if
#: the same values are stored; 2e-2 leaves room for a different but equally exact op order
#: (40x llama.cpp's own spread).
TOL_F32_F16KV = Tolerance(max_abs=2e-2, min_top1=1.0)
#: Q8_0 weights, F16 KV: llama.cpp alone differs by up to 2.5e-2 between batch sizes; 6e-2 is
#: about 2.5x that. Top-1 may flip where the gap is within the tolerance.
TOL_Q8W_F16KV = Tolerance(max_abs=6e-2, min_top1=0.98)
#: Quantized KV (Q8_0 K and/or V) against upstream's default (rotated) cache, any weights: the
#: two sides' quantization noise is independent (each stored value rounded by up to 1/254 of its
#: block's range); measured 4.5e-2 and 98.0% at worst, so 0.2 and 95% leave room without
#: hiding a real error, which the tight comparison with the closer variant catches anyway.
TOL_QUANT_KV = Tolerance(max_abs=0.2, min_top1=0.95)
#: llama.cpp against itself (chunked vs one-shot, micro-batch 64 vs 512), see the numbers above.
ORACLE_SELF_TOL = {"f32": 2e-3, "q8_0": 5e-2}


def tolerance(weights: str, kv_k: str, kv_v: str) -> Tolerance:
    if quantized_kv(kv_k, kv_v):
        return TOL_QUANT_KV
    return TOL_F32_F16KV if weights == "f32" else TOL_Q8W_F16KV


def quantized_kv(kv_k: str, kv_v: str) -> bool:
    return kv_k != "f16" or kv_v != "f16"


def logit_scale(ref: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(ref, dtype=np.float64))))


def assert_logits_close(ours: np.ndarray, ref: np.ndarray, tol: Tolerance, what: str = "") -> None:
    """Position-by-position comparison with a readable failure message."""
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != reference {ref.shape}"
    assert ours.dtype == np.float32, f"{what}: dtype {ours.dtype}"
    assert np.isfinite(ours).all(), f"{what}: non-finite logits at rows {np.unique(np.where(~np.isfinite(ours))[0])[:10]}"
    scale = logit_scale(ref)
    diff = np.abs(ours.astype(np.float64) - ref)
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    max_rel = float(diff[worst]) / scale
    top_ref, top_ours = ref.argmax(axis=1), ours.argmax(axis=1)
    agree = top_ref == top_ours
    srt = np.sort(ref, axis=1)
    gap = (srt[:, -1] - srt[:, -2]) / scale
    decided = gap > TIE_MARGIN
    per_pos = diff.max(axis=1) / scale
    report = (f"{what}: max |diff| = {max_rel:.3e} x scale (scale {scale:.3f}; limit {tol.max_abs:.1e}) at "
              f"position {worst[0]} token {worst[1]}; per-position max (first 8): "
              f"{np.array2string(per_pos[:8], precision=2)}; top-1 agreement {agree.mean():.4f} "
              f"({int((~agree).sum())} of {len(agree)} differ: positions {np.where(~agree)[0][:10].tolist()}; "
              f"{int((~decided).sum())} near-ties)")
    assert max_rel <= tol.max_abs, report
    if tol.min_top1 >= 1.0:
        assert agree[decided].all(), report
    else:
        assert agree.mean() >= tol.min_top1, report


def assert_matches_oracle(ours: np.ndarray, model, tokens: list[int], weights: str, kv_k: str, kv_v: str,
                          what: str, **ref_kw) -> None:
    """`ours` against reference_logits(model, tokens, **ref_kw) with the tolerances above; for a
    quantized KV cache also tightly against the closer of upstream's two cache variants."""
    ref = reference_logits(model, tokens, n_ctx=CTX, type_k=kv_k, type_v=kv_v, **ref_kw)
    assert_logits_close(ours, ref, tolerance(weights, kv_k, kv_v), what)
    if quantized_kv(kv_k, kv_v):
        plain = reference_logits(model, tokens, n_ctx=CTX, type_k=kv_k, type_v=kv_v, attn_rot=False, **ref_kw)
        closer, name = min(((ref, "rotated"), (plain, "not rotated")),
                           key=lambda r: float(np.abs(ours.astype(np.float64) - r[0]).max()))
        assert_logits_close(ours, closer, tolerance(weights, "f16", "f16"),
                            f"{what} (tight, vs the closer upstream variant: KV {name})")


# ----------------------------------------------------------------------------------------------
# Prompts
# ----------------------------------------------------------------------------------------------

N_VOCAB = 1024  # the tiny preset's vocabulary
CTX = 512
UBATCH = 64
LONG = 150  # > UBATCH: the prompt spans three micro-batches

TEXTS = {
    "prose": ("The quick brown fox jumps over the lazy dog. Numbers like 3.14159 and 2718 appear, "
              "as do words in other scripts: naïve café, Grüße, 東京, and emoji 🙂. "
              "A second sentence follows; it is long enough to need more than one micro-batch "
              "of sixty-four tokens when the synthetic vocabulary splits it into small pieces."),
    "chat": ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
             "Write a Python function that returns the n-th Fibonacci number.<|im_end|>\n"
             "<|im_start|>assistant\n<think>\n\n</think>\n\ndef fib(n):\n    a, b = 0, 1\n"
             "    for _ in range(n):\n        a, b = b, a + b\n    return a\n"),
}


def random_tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, N_VOCAB, size=n).tolist()


@pytest.fixture(scope="session")
def prompts(tiny_tokenizer) -> dict[str, list[int]]:
    out = {"random": random_tokens(LONG, seed=7), "random-short": random_tokens(23, seed=8)}
    for name, text in TEXTS.items():
        ids = tiny_tokenizer.encode(text)
        assert len(ids) > UBATCH, (name, len(ids))
        out[name] = ids
    return out


# ----------------------------------------------------------------------------------------------
# The oracle by itself
# ----------------------------------------------------------------------------------------------


def test_oracle_shape_finite_deterministic(tiny_model, prompts):
    toks = prompts["random"]
    a = reference_logits(tiny_model, toks, n_ctx=CTX)
    b = reference_logits(tiny_model, toks, n_ctx=CTX)
    assert a.shape == (len(toks), N_VOCAB) and a.dtype == np.float32
    assert np.isfinite(a).all()
    assert np.array_equal(a, b), "llama.cpp is not deterministic on the CPU for identical calls"
    # Not degenerate: real spread within a row, and rows depend on the context.
    assert a.std(axis=1).min() > 0.1
    assert len({int(t) for t in a.argmax(axis=1)}) > len(toks) // 10


def test_oracle_prefix_causal(tiny_model, prompts):
    """Logits of a prefix do not depend on what follows (causal model, fresh context)."""
    toks = prompts["prose"]
    full = reference_logits(tiny_model, toks, n_ctx=CTX)
    head = reference_logits(tiny_model, toks[:40], n_ctx=CTX)
    assert np.allclose(head, full[:40], rtol=0, atol=ORACLE_SELF_TOL["q8_0"] * logit_scale(full))


@pytest.mark.parametrize("kind", ["chunks", "ubatch"])
def test_oracle_chunked_equals_one_shot(tiny_target, prompts, kind):
    """llama.cpp agrees with itself: one shot (one micro-batch) vs prefill + 8 single-token
    decodes, or vs micro-batches of 64."""
    for weights in ("f32", "q8_0"):
        model = tiny_target(weights)
        toks = prompts["random"]
        one = reference_logits(model, toks, n_ctx=CTX, n_ubatch=512)
        if kind == "chunks":
            other = reference_logits(model, toks, n_ctx=CTX, n_ubatch=512, chunks=[len(toks) - 8] + [1] * 8)
        else:
            other = reference_logits(model, toks, n_ctx=CTX, n_ubatch=UBATCH)
        assert_logits_close(other, one, Tolerance(ORACLE_SELF_TOL[weights], 1.0), f"oracle {kind} {weights}")


def test_oracle_kv_type_is_applied(tiny_f32, prompts):
    """type_k/type_v reach llama.cpp: Q8_0 KV changes the logits, a little."""
    toks = prompts["random"]
    f16 = reference_logits(tiny_f32, toks, n_ctx=CTX, n_ubatch=UBATCH)
    q8 = reference_logits(tiny_f32, toks, n_ctx=CTX, n_ubatch=UBATCH, type_k="q8_0", type_v="q8_0")
    q8k = reference_logits(tiny_f32, toks, n_ctx=CTX, n_ubatch=UBATCH, type_k="q8_0")
    assert not np.array_equal(q8, f16)
    assert not np.array_equal(q8k, f16)
    assert not np.array_equal(q8k, q8)
    assert_logits_close(q8, f16, TOL_QUANT_KV, "oracle q8_0 KV vs f16 KV")
    # The Hadamard rotation applies to quantized caches only.
    plain = reference_logits(tiny_f32, toks, n_ctx=CTX, n_ubatch=UBATCH, type_k="q8_0", type_v="q8_0",
                             attn_rot=False)
    assert not np.array_equal(plain, q8)
    assert_logits_close(plain, q8, TOL_QUANT_KV, "oracle q8_0 KV, rotation off vs on")
    assert np.array_equal(reference_logits(tiny_f32, toks, n_ctx=CTX, n_ubatch=UBATCH, attn_rot=False), f16)


def test_oracle_greedy_is_teacher_forced_argmax(tiny_model, prompts):
    """reference_greedy = argmax of the logits of prompt + its own continuation, evaluated the
    same way (prefill, then one token at a time): bit-identical computation."""
    prompt = prompts["random-short"]
    gen = reference_greedy(tiny_model, prompt, 16, n_ctx=CTX)
    assert len(gen) == 16 and all(0 <= t < N_VOCAB for t in gen)
    logits = reference_logits(tiny_model, prompt + gen[:-1], n_ctx=CTX, chunks=[len(prompt)] + [1] * 15)
    assert logits[len(prompt) - 1:].argmax(axis=1).tolist() == gen


def test_oracle_session_reset(tiny_f32, prompts):
    with ReferenceSession(tiny_f32, n_ctx=CTX, n_ubatch=UBATCH) as ref:
        a = ref.eval(prompts["chat"])
        ref.reset()
        assert ref.n_tokens == 0
        b = ref.eval(prompts["prose"])
    assert np.array_equal(b, reference_logits(tiny_f32, prompts["prose"], n_ctx=CTX, n_ubatch=UBATCH))
    assert np.array_equal(a, reference_logits(tiny_f32, prompts["chat"], n_ctx=CTX, n_ubatch=UBATCH))


def test_oracle_rejects_bad_input(tiny_f32):
    with pytest.raises(ValueError):
        reference_logits(tiny_f32, [0, N_VOCAB], n_ctx=CTX)
    with pytest.raises(ValueError):
        reference_logits(tiny_f32, [1, 2, 3], n_ctx=CTX, chunks=[1, 1])
    with pytest.raises(ValueError):
        reference_logits(tiny_f32, [1], n_ctx=CTX, type_k="q9_9")


# ----------------------------------------------------------------------------------------------
# lucebox against the oracle
# ----------------------------------------------------------------------------------------------

KV_CASES = [("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "f16")]


@pytest.fixture(scope="module")
def make_engine():
    """Factory for CPU engines on the tiny models; skips while lucebox.Engine does not exist."""
    import lucebox

    if not hasattr(lucebox, "Engine"):
        pytest.skip("lucebox.Engine is not available yet")
    cache: dict[tuple, object] = {}

    def make(model, kv_k="f16", kv_v="f16", ubatch=UBATCH):
        key = (str(model), kv_k, kv_v, ubatch)
        if key not in cache:
            cache[key] = lucebox.Engine(model, ctx=CTX, kv_type_k=kv_k, kv_type_v=kv_v, device="cpu",
                                        ubatch=ubatch)
        return cache[key]

    return make


@pytest.mark.parametrize("prompt_name", ["random", "prose", "chat"])
@pytest.mark.parametrize("kv", KV_CASES, ids=lambda kv: f"k-{kv[0]}-v-{kv[1]}")
@pytest.mark.parametrize("weights", ["f32", "q8_0"])
def test_logits_match_oracle(make_engine, tiny_target, prompts, weights, kv, prompt_name):
    """One-shot prefill of a prompt longer than one micro-batch (64), both sides."""
    model = tiny_target(weights)
    toks = prompts[prompt_name]
    ours = make_engine(model, *kv).session().eval(toks, all_logits=True)
    assert_matches_oracle(ours, model, toks, weights, *kv, f"{weights} weights, K {kv[0]} V {kv[1]}, {prompt_name}",
                          n_ubatch=UBATCH)


@pytest.mark.parametrize("weights", ["f32", "q8_0"])
def test_logits_independent_of_ubatch(make_engine, tiny_target, prompts, weights):
    """150 tokens in micro-batches of 64 (ours) vs one micro-batch of 512 (reference)."""
    model = tiny_target(weights)
    toks = prompts["random"]
    assert len(toks) > 2 * UBATCH
    ref = reference_logits(model, toks, n_ctx=CTX, n_ubatch=512)
    ours = make_engine(model, ubatch=UBATCH).session().eval(toks, all_logits=True)
    assert_logits_close(ours, ref, tolerance(weights, "f16", "f16"), f"{weights} ubatch 64 vs one-shot 512")


@pytest.mark.parametrize("kv", [("f16", "f16"), ("q8_0", "q8_0")], ids=lambda kv: f"k-{kv[0]}-v-{kv[1]}")
@pytest.mark.parametrize("weights", ["f32", "q8_0"])
def test_chunked_eval_matches_one_shot_oracle(make_engine, tiny_target, prompts, weights, kv):
    """Prefill, then 8 single-token decodes in the same session = the reference in one shot."""
    model = tiny_target(weights)
    toks = prompts["random"]
    session = make_engine(model, *kv).session()
    parts = [session.eval(toks[:-8], all_logits=True)]
    parts += [session.eval([t], all_logits=True) for t in toks[-8:]]
    assert all(p.shape[0] == n for p, n in zip(parts, [len(toks) - 8] + [1] * 8))
    ours = np.concatenate(parts, axis=0)
    assert_matches_oracle(ours, model, toks, weights, *kv, f"{weights}, K {kv[0]} V {kv[1]}, prefill + 8 decodes",
                          n_ubatch=UBATCH)


def test_session_reset_matches_oracle(make_engine, tiny_f32, prompts):
    session = make_engine(tiny_f32).session()
    session.eval(prompts["chat"], all_logits=True)
    session.reset()
    ours = session.eval(prompts["prose"], all_logits=True)
    ref = reference_logits(tiny_f32, prompts["prose"], n_ctx=CTX, n_ubatch=UBATCH)
    assert_logits_close(ours, ref, TOL_F32_F16KV, "after reset")


N_GREEDY = 32


@pytest.mark.parametrize("prompt_name", ["random-short", "random", "chat"])
def test_greedy_matches_oracle(make_engine, tiny_f32, tiny_tokenizer, prompts, prompt_name):
    """F32 weights, F16 KV, temperature 0: the same 32 tokens as llama.cpp (up to an end token,
    where lucebox stops and the reference, which knows no stop tokens, goes on)."""
    prompt = prompts[prompt_name]
    ref = reference_greedy(tiny_f32, prompt, N_GREEDY, n_ctx=CTX, n_ubatch=UBATCH)
    result = make_engine(tiny_f32).generate(prompt, max_tokens=N_GREEDY, temperature=0.0)
    ours = list(result.tokens)
    stop = next((i for i, t in enumerate(ref) if t in tiny_tokenizer.eos_ids), None)
    if stop is not None and len(ours) <= stop + 1:
        ref = ref[:len(ours)]  # ours stopped at the end token (kept or not)
    if ours != ref:
        i = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
        row = reference_logits(tiny_f32, prompt + ref[:i], n_ctx=CTX, n_ubatch=UBATCH,
                               chunks=[len(prompt)] + [1] * i)[-1]
        top2 = np.sort(row)[-2:]
        pytest.fail(f"greedy tokens differ from position {i} (ours {ours[i:i + 4]}, reference "
                    f"{ref[i:i + 4]}; lengths {len(ours)}/{len(ref)}); reference top-2 gap there: "
                    f"{top2[1] - top2[0]:.2e}")
