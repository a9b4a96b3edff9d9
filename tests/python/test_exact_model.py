"""The comparison rule of the GPU tests' exact_model.check_like_the_cpu, on made-up logits (no GPU needed)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from exact_model import ERROR_FLOOR, check_like_the_cpu  # noqa: E402

ROWS, VOCAB = 64, 512


def _logits(seed: int = 0) -> np.ndarray:
    """[ROWS, VOCAB] logits of scale ~1 whose row 0 has a near tie (lead 1e-4) between tokens 0 and 1."""
    x = np.random.default_rng(seed).standard_normal((ROWS, VOCAB)).astype(np.float32)
    x[0, 0], x[0, 1] = 8.0, 8.0 - 1e-4
    return x


def _flip(x: np.ndarray, row: int) -> np.ndarray:
    """`x` with row `row`'s top two logits swapped."""
    y = x.copy()
    a, b = np.argsort(y[row])[-2:]
    y[row, a], y[row, b] = y[row, b], y[row, a]
    return y


def test_exact_cpu_allows_cuda_rounding_at_a_near_tie() -> None:
    # F32 weights: the CPU runs the exact model (error 0); CUDA rounds slightly and takes the other token at
    # row 0's near tie: a tie, not a finding (the fuzz_cuda case 1504 on an H100 parted like this).
    exact = _logits()
    noise = np.random.default_rng(1).standard_normal(exact.shape).astype(np.float32) * 2e-4
    check_like_the_cpu("near tie", exact, exact.copy(), _flip(exact, 0) + noise, cpu_is_exact=True)


def test_a_clear_row_with_another_top_token_fails() -> None:
    exact = _logits()
    lead = np.diff(np.sort(exact, axis=-1)[:, -2:], axis=-1)[:, 0]
    row = int(np.argmax(lead))
    scale = float(np.sqrt(np.mean(np.square(exact))))
    assert lead[row] > 2 * ERROR_FLOOR * scale  # (the row is clear)
    with pytest.raises(AssertionError, match="clear rows"):
        check_like_the_cpu("clear", exact, exact.copy(), _flip(exact, row), cpu_is_exact=True)
    # a quantized target: the CPU's largest error sets the tie, which this row's lead exceeds
    cpu = exact + np.float32(0.2 * lead[row] / 2) * np.sign(np.random.default_rng(2).standard_normal(exact.shape))
    with pytest.raises(AssertionError, match="clear rows"):
        check_like_the_cpu("clear, quantized", exact, cpu.astype(np.float32), _flip(exact, row))


def test_cuda_error_beyond_the_bound_fails() -> None:
    exact = _logits()
    off = exact + np.random.default_rng(3).standard_normal(exact.shape).astype(np.float32) * 0.05
    with pytest.raises(AssertionError, match="cuda's error"):
        check_like_the_cpu("too far", exact, exact.copy(), off, cpu_is_exact=True)
