"""The exact model a quantized target approximates, for GPU tests that compare CUDA with the CPU.

The two backends quantize activations differently inside a quantized product (CUDA: 32-value q8_1
blocks, or lucebox's kernel's; the CPU: q8_0 / q8_1, or 256-value q8_K blocks for the K- and
i-quants), so their logits differ by more than either differs from the truth. The truth here is the
same weights decoded to F32 (synth.decoded_weights) and run on the CPU, whose F32 products take
the activations as they are. A CUDA run passes when its error against that is of the CPU's order.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

import lucebox
from lucebox import synth

# CUDA's rms error against the exact model, at most this many times the CPU's (+ ERROR_FLOOR of
# the logit scale). Measured (36th session, tiny preset, 4 layers): 0.4x..1.1x for the K-quants,
# i-quants, MXFP4, Q1_0 and Q5_0, 2.1x (Q4_1) and 2.4x (Q5_1) for the types with a block minimum,
# whose MMQ / MMVQ sums run in half precision; a wrong kernel is off by the logit scale itself.
ERROR_RATIO = 2.5
ERROR_FLOOR = 0.01


def exact_logits(path: str, ids: list[int], overrides: Mapping[str, Any], tmp_path: Path, ctx: int = 256,
                 ubatch: int = 512) -> np.ndarray:
    """Logits of the F32 decoding of the tiny-preset target at `path` (written with `overrides`)."""
    exact = tmp_path / (Path(path).stem + "-exact-f32.gguf")
    synth.write_target(exact, "tiny", type="f32", overrides=dict(overrides), weights=synth.decoded_weights(path))
    return lucebox.Engine(str(exact), ctx=ctx, device="cpu", ubatch=ubatch).session().eval(ids)


def check_like_the_cpu(what: str, exact: np.ndarray, cpu: np.ndarray, cuda: np.ndarray) -> None:
    """CUDA's rms error against `exact` within ERROR_RATIO of the CPU's, and CUDA's top token the
    exact model's wherever its lead is more than twice the CPU's largest error."""
    assert np.isfinite(cuda).all()
    scale = float(np.sqrt(np.mean(np.square(exact, dtype=np.float64))))

    def rms(x: np.ndarray) -> float:
        return float(np.sqrt(np.mean(np.square(x - exact, dtype=np.float64)))) / scale

    cpu_err, cuda_err = rms(cpu), rms(cuda)
    top2 = np.sort(exact, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * float(np.abs(cpu - exact).max())
    agree = cuda.argmax(-1) == exact.argmax(-1)
    print(f"{what}: rms error vs exact: cpu {cpu_err:.4f}, cuda {cuda_err:.4f} (x {scale:.3g}, the logit scale); "
          f"cuda top-1 {agree.mean():.3f} ({agree[clear].mean() if clear.any() else float('nan'):.3f} "
          f"on {clear.sum()} clear)")
    assert cpu_err > 0  # (the exact model is not the quantized one)
    assert cuda_err <= ERROR_RATIO * cpu_err + ERROR_FLOOR
    assert agree[clear].all()
