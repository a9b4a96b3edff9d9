"""The exact model a quantized target approximates, for GPU tests that compare CUDA with the CPU, and
the rule by which a CUDA speculative run may part from plain CUDA decoding (check_same_or_near_tie).

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
# Types whose blocks carry an offset (q4_0 / q5_0 subtract 8 / 16 from each quant, q4_1 / q5_1 add a block
# minimum): CUDA's products (ggml's MMQ / MMVQ) take the offset times the block's activation sum from a
# q8_1 block's half-precision sum, where the CPU's work on the shifted quants in integers. Measured (66th
# session, scripts/fuzz_cuda.py's random shapes, H100): up to 2.9x (q4_0, rows of 160), 2.1x (q5_0).
OFFSET_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1")
OFFSET_ERROR_RATIO = 4.0


def error_ratio(type_: str) -> float:
    """The bound on CUDA's rms error over the CPU's for weights of `type_`."""
    return OFFSET_ERROR_RATIO if type_ in OFFSET_TYPES else ERROR_RATIO


def exact_logits(path: str, ids: list[int], overrides: Mapping[str, Any], tmp_path: Path, ctx: int = 256,
                 ubatch: int = 512) -> np.ndarray:
    """Logits of the F32 decoding of the tiny-preset target at `path` (written with `overrides`)."""
    exact = tmp_path / (Path(path).stem + "-exact-f32.gguf")
    synth.write_target(exact, "tiny", type="f32", overrides=dict(overrides), weights=synth.decoded_weights(path))
    return lucebox.Engine(str(exact), ctx=ctx, device="cpu", ubatch=ubatch).session().eval(ids)


def check_like_the_cpu(what: str, exact: np.ndarray, cpu: np.ndarray, cuda: np.ndarray,
                       cpu_is_exact: bool = False, ratio: float = ERROR_RATIO) -> None:
    """CUDA's rms error against `exact` within `ratio` (error_ratio(type)) of the CPU's (+ ERROR_FLOOR), and
    CUDA's top token the exact model's wherever its lead is more than twice the larger of the CPU's largest
    error and ERROR_FLOOR of the logit scale (the rms error CUDA may have where the CPU's is 0).
    `cpu_is_exact`: F32 weights, whose CPU run is the exact model (its error 0, CUDA's within ERROR_FLOOR)."""
    assert np.isfinite(cuda).all()
    scale = float(np.sqrt(np.mean(np.square(exact, dtype=np.float64))))

    def rms(x: np.ndarray) -> float:
        return float(np.sqrt(np.mean(np.square(x - exact, dtype=np.float64)))) / scale

    cpu_err, cuda_err = rms(cpu), rms(cuda)
    top2 = np.sort(exact, axis=-1)[:, -2:]
    lead = top2[:, 1] - top2[:, 0]
    # (the CPU's largest error is 0 where it runs the exact model: CUDA's own rounding then needs the floor)
    tie = 2 * max(float(np.abs(cpu - exact).max()), ERROR_FLOOR * scale)
    clear = lead > tie
    agree = cuda.argmax(-1) == exact.argmax(-1)
    print(f"{what}: rms error vs exact: cpu {cpu_err:.4f}, cuda {cuda_err:.4f} (x {scale:.3g}, the logit scale); "
          f"cuda top-1 {agree.mean():.3f} ({agree[clear].mean() if clear.any() else float('nan'):.3f} "
          f"on {clear.sum()} clear)")
    if cpu_is_exact:  # (F32 weights: the CPU runs the exact model itself)
        assert cpu_err == 0, f"the cpu's error is {cpu_err:.3g}, not 0"
    else:
        assert cpu_err > 0  # (the exact model is not the quantized one)
    assert cuda_err <= ratio * cpu_err + ERROR_FLOOR, \
        f"cuda's error {cuda_err:.4f} > {ratio} x cpu's {cpu_err:.4f} + {ERROR_FLOOR}"
    wrong = ~agree & clear
    assert not wrong.any(), (f"cuda's top token is not the exact model's at {int(wrong.sum())} clear rows "
                             f"(leads {np.round(lead[wrong][:4], 4).tolist()} > {tie:.4f})")


def check_same_or_near_tie(engine: lucebox.Engine, cpu: lucebox.Engine, prompt: list[int], ref: list[int],
                           got: list[int], batched: lucebox.Engine | None = None) -> None:
    """`got` (a speculative or otherwise batched run on CUDA `engine`) is `ref` (plain greedy decoding
    there), or parts from it only where the two tokens' logits are closer than twice the rounding noise.
    A verify runs several-token batches while plain decoding runs single tokens; on CUDA the two may take
    other kernels (activations quantized to q8_1, other accumulation orders), so their logits differ by
    rounding, which also accumulates in the recurrent state. The noise is measured at the parting row as
    the largest |CUDA - CPU| logit difference (`cpu`: the same file on the CPU) of `engine`'s prefill and,
    where given, of `batched`'s (the same file with micro-batches of the verify's width or more: an
    `engine` of micro-batches of a few tokens prefills on the one-token kernels, whose error may be far
    below a verify's, e.g. F32 weights, which batched products multiply in half precision)."""
    common = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
    if common == len(ref) == len(got):
        return
    row = engine.session().eval(prompt + ref[:common])[-1]
    truth = cpu.session().eval(prompt + ref[:common])[-1]
    noise = float(np.abs(row - truth).max())
    if batched is not None:
        noise = max(noise, float(np.abs(batched.session().eval(prompt + ref[:common])[-1] - truth).max()))
    if common < min(len(ref), len(got)):
        margin = float(row[ref[common]] - row[got[common]])
    else:  # one stopped early: the top-2 margin
        a, b = np.sort(row)[-2:]
        margin = float(b - a)
    assert margin < 2 * noise, f"parted at token {common} with margin {margin:.4f} >= 2 x noise {noise:.4f}"
