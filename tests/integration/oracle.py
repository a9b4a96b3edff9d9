"""Upstream llama.cpp as the independent oracle for lucebox's numerics.

Upstream llama.cpp at the pinned version (the ``llama-cpp-python`` build installed by
``scripts/install_oracle.sh``) evaluates the same GGUF on the CPU; lucebox's logits must agree
with it position by position (DESIGN.md, "Oracle agreement"). Everything here goes through the
``llama_cpp.Llama`` class of llama-cpp-python 0.3.36, fed token ids directly (no tokenization):

- ``logits_all=True``: every position of every ``llama_decode`` batch requests its logits
  (``Llama.eval`` marks each batch entry), and ``Llama.scores[:n_tokens]`` holds them row by row;
- ``flash_attn=True`` sets ``llama_context_params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED``
  (llama.cpp refuses a quantized V cache without flash attention);
- ``type_k`` / ``type_v`` are ggml type ids (``llama_cpp.GGML_TYPE_*``) written into
  ``llama_context_params.type_k`` / ``type_v``;
- ``n_batch`` is the most tokens per ``llama_decode`` call (``Llama.eval`` splits longer inputs),
  ``n_ubatch`` the micro-batch llama.cpp splits each decode into; ``Llama`` clamps
  ``n_batch <= n_ctx`` and ``n_ubatch <= n_batch``;
- ``Llama.reset()`` clears the memory of a hybrid model (KV cache and recurrent state);
- ``repack=False`` loads the weights without upstream's extra CPU buffer types
  (``llama_model_params.use_extra_bufts``, which ``Llama`` does not expose: the default parameters
  are patched while the model loads). With them (the default) llama.cpp repacks some quantized
  matrices (on x86 with AVX2 Q4_0, Q4_K and IQ4_NL among them) into interleaved rows and
  multiplies them with other kernels, whose rounding differs from the plain ones that lucebox's
  CPU backend runs;
- with a quantized K (V) cache and a head size that is a multiple of 64, llama.cpp at this pin
  rotates Q and K (V and the attention output) by a Walsh-Hadamard matrix before storing them
  (``attn_rot_k`` / ``attn_rot_v`` in ``llama-kv-cache.cpp``), which spreads outliers before
  quantization. It reads ``LLAMA_ATTN_ROT_DISABLE`` when the context is created; ``attn_rot=False``
  sets it for that moment, giving the plain quantized-cache computation.

The module imports ``llama_cpp`` lazily, so importing it never fails; callers skip when
`available()` is false.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Defaults: small enough for CI, large enough for the integration prompts.
DEFAULT_N_CTX = 512
DEFAULT_N_BATCH = 512
DEFAULT_N_UBATCH = 512
#: Threads for the oracle; ggml's CPU kernels split work by rows, so results do not depend on it, but
#: for one query row over 512 keys or more, where the attention splits the keys over the threads and
#: adds the parts (scripts/fuzz_shapes.py takes 1 thread for its long prompts).
DEFAULT_N_THREADS = 2

_ATTN_ROT_ENV = "LLAMA_ATTN_ROT_DISABLE"

# ggml type names (as lucebox spells KV types) -> ggml type ids (enum ggml_type).
_GGML_TYPE_IDS = {
    "f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20,
    "bf16": 30,
}


def available() -> tuple[bool, str]:
    """(True, version) when llama_cpp imports, else (False, the reason)."""
    try:
        import llama_cpp
    except Exception as exc:  # ImportError, or OSError from a broken shared library
        return False, f"llama_cpp (upstream oracle) not importable: {type(exc).__name__}: {exc}"
    return True, getattr(llama_cpp, "__version__", "?")


def tokenize(model_path: str | os.PathLike[str], text: str) -> list[int]:
    """llama.cpp's token ids of `text` as its examples tokenize a prompt (add_special, parse_special),
    from the model's vocabulary alone."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=os.fspath(model_path), vocab_only=True, verbose=False)
    try:
        return [int(t) for t in llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)]
    finally:
        llm.close()


def ggml_type_id(name: str | int) -> int:
    """ggml type id of a KV cache type given by name ('f16', 'q8_0', ...) or already as an id."""
    if isinstance(name, (int, np.integer)):
        return int(name)
    try:
        return _GGML_TYPE_IDS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown KV cache type {name!r}; known: {sorted(_GGML_TYPE_IDS)}") from None


class ReferenceSession:
    """One llama.cpp context on a model: `eval` appends tokens and returns their logits.

    Mirrors lucebox's ``Session.eval(tokens, all_logits=True)`` so the two can be driven the
    same way (one shot, or in chunks).
    """

    def __init__(self, model_path: str | os.PathLike[str], *, n_ctx: int = DEFAULT_N_CTX,
                 type_k: str | int = "f16", type_v: str | int = "f16",
                 n_batch: int = DEFAULT_N_BATCH, n_ubatch: int = DEFAULT_N_UBATCH,
                 n_threads: int = DEFAULT_N_THREADS, flash_attn: bool = True,
                 attn_rot: bool = True, repack: bool = True) -> None:
        import llama_cpp
        import llama_cpp.llama as high_level

        # Llama clamps n_batch to n_ctx and n_ubatch to n_batch; do it here so `n_ubatch` below
        # is what runs.
        n_batch = min(n_batch, n_ctx)
        n_ubatch = min(n_ubatch, n_batch)
        self._llm: Any = None
        saved = os.environ.get(_ATTN_ROT_ENV)
        if attn_rot:
            os.environ.pop(_ATTN_ROT_ENV, None)  # upstream's default, whatever the caller's env
        else:
            os.environ[_ATTN_ROT_ENV] = "1"
        default_params = high_level.llama_cpp.llama_model_default_params  # where Llama takes its model's

        def without_repack() -> Any:
            p = default_params()
            p.use_extra_bufts = False
            return p

        if not repack:
            high_level.llama_cpp.llama_model_default_params = without_repack
        try:
            self._llm = self._load(llama_cpp, model_path, n_ctx, n_batch, n_ubatch, n_threads,
                                   type_k, type_v, flash_attn)
        finally:
            high_level.llama_cpp.llama_model_default_params = default_params
            if saved is None:
                os.environ.pop(_ATTN_ROT_ENV, None)
            else:
                os.environ[_ATTN_ROT_ENV] = saved
        self.attn_rot = attn_rot
        ctx = self._llm.ctx
        #: What the context really uses (llama.cpp may round n_ctx up).
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self.n_batch = int(llama_cpp.llama_n_batch(ctx))
        self.n_ubatch = int(llama_cpp.llama_n_ubatch(ctx))
        if self.n_ctx < n_ctx or self.n_ubatch != n_ubatch:
            raise RuntimeError(f"llama.cpp context has n_ctx={self.n_ctx}, n_ubatch={self.n_ubatch}; "
                               f"asked for {n_ctx}, {n_ubatch}")
        self.n_vocab: int = self._llm.n_vocab()

    @staticmethod
    def _load(llama_cpp: Any, model_path, n_ctx, n_batch, n_ubatch, n_threads, type_k, type_v,
              flash_attn) -> Any:
        return llama_cpp.Llama(
            model_path=os.fspath(model_path),
            n_gpu_layers=0,
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_ubatch=n_ubatch,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            type_k=ggml_type_id(type_k),
            type_v=ggml_type_id(type_v),
            flash_attn=flash_attn,
            logits_all=True,
            verbose=False,
        )

    @property
    def n_tokens(self) -> int:
        return int(self._llm.n_tokens)

    def eval(self, tokens: Sequence[int]) -> np.ndarray:
        """Append `tokens` to the context; return their logits, float32 [len(tokens), n_vocab]."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        bad = [t for t in tokens if not 0 <= t < self.n_vocab]
        if bad:
            raise ValueError(f"token ids out of range [0, {self.n_vocab}): {bad[:5]}")
        start = self.n_tokens
        if start + len(tokens) > self.n_ctx:
            raise ValueError(f"{start} + {len(tokens)} tokens exceed n_ctx={self.n_ctx}")
        self._llm.eval(tokens)
        return np.array(self._llm.scores[start:start + len(tokens)], dtype=np.float32, copy=True)

    def reset(self) -> None:
        """Forget all tokens (KV cache and recurrent state)."""
        self._llm.reset()

    def close(self) -> None:
        if self._llm is not None:
            self._llm.close()
            self._llm = None

    def __enter__(self) -> ReferenceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reference_logits(model_path: str | os.PathLike[str], tokens: Sequence[int], *,
                     n_ctx: int = DEFAULT_N_CTX, type_k: str | int = "f16", type_v: str | int = "f16",
                     n_batch: int = DEFAULT_N_BATCH, n_ubatch: int = DEFAULT_N_UBATCH,
                     n_threads: int = DEFAULT_N_THREADS, attn_rot: bool = True,
                     chunks: Sequence[int] | None = None, repack: bool = True) -> np.ndarray:
    """Logits of every position of `tokens` from llama.cpp on the CPU: float32 [len, n_vocab].

    Row i is the distribution of the token after ``tokens[: i + 1]`` (causal, from an empty
    context). `chunks` optionally gives sizes of successive ``eval`` calls (their sum must be
    ``len(tokens)``); by default the whole prompt is one call, split by llama.cpp into batches
    of `n_batch` and micro-batches of `n_ubatch`. `attn_rot=False` turns off llama.cpp's
    Hadamard rotation of quantized K/V caches (no effect on F16/F32 caches); `repack=False` its
    repacked weights (see `ReferenceSession`).
    """
    tokens = list(tokens)
    sizes = [len(tokens)] if chunks is None else [int(c) for c in chunks]
    if sum(sizes) != len(tokens) or any(c < 0 for c in sizes):
        raise ValueError(f"chunks {sizes} do not add up to {len(tokens)} tokens")
    with ReferenceSession(model_path, n_ctx=n_ctx, type_k=type_k, type_v=type_v, n_batch=n_batch,
                          n_ubatch=n_ubatch, n_threads=n_threads, attn_rot=attn_rot, repack=repack) as ref:
        out, pos = [], 0
        for size in sizes:
            out.append(ref.eval(tokens[pos:pos + size]))
            pos += size
    return np.concatenate(out, axis=0)


def reference_greedy(model_path: str | os.PathLike[str], prompt_tokens: Sequence[int], n_predict: int,
                     *, n_ctx: int = DEFAULT_N_CTX, type_k: str | int = "f16", type_v: str | int = "f16",
                     n_batch: int = DEFAULT_N_BATCH, n_ubatch: int = DEFAULT_N_UBATCH,
                     n_threads: int = DEFAULT_N_THREADS, attn_rot: bool = True) -> list[int]:
    """Greedy continuation (temperature 0, no penalties, no stop tokens): `n_predict` token ids.

    Each step takes the argmax of the last position's logits (lowest id on ties, like
    llama.cpp's greedy sampler) and feeds it back one token at a time.
    """
    prompt = list(prompt_tokens)
    if not prompt:
        raise ValueError("prompt_tokens must not be empty")
    if len(prompt) + n_predict > n_ctx:
        raise ValueError(f"prompt ({len(prompt)}) + n_predict ({n_predict}) exceed n_ctx={n_ctx}")
    out: list[int] = []
    with ReferenceSession(model_path, n_ctx=n_ctx, type_k=type_k, type_v=type_v, n_batch=n_batch,
                          n_ubatch=n_ubatch, n_threads=n_threads, attn_rot=attn_rot) as ref:
        last = ref.eval(prompt)[-1]
        for i in range(n_predict):
            tok = int(np.argmax(last))
            out.append(tok)
            if i + 1 < n_predict:
                last = ref.eval([tok])[-1]
    return out


#: llama_ftype of the mixes `quantize` writes (llama.h: LLAMA_FTYPE_MOSTLY_*).
FTYPES = {"q4_k_m": 15, "q5_k_m": 17}


def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], ftype: str, *, n_threads: int = DEFAULT_N_THREADS) -> None:
    """Write `dst`: `src` quantized by llama.cpp's own quantizer (``llama_model_quantize``) to the
    mix `ftype` names (a key of `FTYPES`), each tensor's type chosen by upstream's rules."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.nthread = n_threads
    rc = llama_cpp.llama_model_quantize(os.fsencode(src), os.fsencode(dst), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src!r} -> {dst!r}, {ftype}) returned {rc}")
