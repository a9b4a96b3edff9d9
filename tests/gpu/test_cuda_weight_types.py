"""Weight types beyond the ones lucebox's own kernels take (the i-quants, Q2_K / Q3_K, the legacy
quants, MXFP4, Q1_0) run on CUDA through ggml's kernels and compute the model about as well as the
CPU does; types ggml's CUDA backend cannot multiply (TQ1_0, TQ2_0) or look rows up in (NVFP4
embeddings) are refused at load with an error naming the tensor and the device, instead of
aborting in the first graph."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import lucebox
from lucebox import synth
from lucebox.errors import UnsupportedError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exact_model import check_like_the_cpu, error_ratio, exact_logits  # noqa: E402

pytestmark = pytest.mark.gpu

# Row lengths that are multiples of 256, so every matrix takes the type (no fallbacks).
SHAPE = dict(n_embd=256, n_ff=512, ssm_d_state=64, head_dim=64, n_layer=4)


def _write(tmp_path: Path, type_: str) -> str:
    path = tmp_path / f"{type_}.gguf"
    synth.write_target(path, "tiny", type=type_, seed=3, overrides=SHAPE)
    return str(path)


@pytest.mark.parametrize("type_", ["q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "iq1_s", "iq1_m", "iq2_xxs", "iq2_xs",
                                   "iq2_s", "iq3_xxs", "iq3_s", "iq4_nl", "iq4_xs", "mxfp4", "q1_0"])
def test_type_runs_on_cuda_like_the_cpu(type_: str, tmp_path: Path) -> None:
    """A 40-token micro-batch (ggml's MMQ) and 10 decode steps (MMVQ) on CUDA against the exact
    model (exact_model.py), as the CPU's run of the same file."""
    path = _write(tmp_path, type_)
    ids = [int(x) for x in np.random.default_rng(11).integers(0, 1000, 50)]
    exact = exact_logits(path, ids, SHAPE, tmp_path)
    cpu = lucebox.Engine(path, ctx=256, device="cpu").session().eval(ids)
    s = lucebox.Engine(path, ctx=256, device="cuda").session()
    cuda = np.concatenate([s.eval(ids[:40]), *[s.eval([t]) for t in ids[40:]]])
    check_like_the_cpu(type_, exact, cpu, cuda, ratio=error_ratio(type_))


@pytest.mark.parametrize("type_, what", [("tq1_0", "cannot multiply"), ("tq2_0", "cannot multiply"),
                                         ("nvfp4", "cannot look up rows")])
def test_type_cuda_cannot_run_is_refused_at_load(type_: str, what: str, tmp_path: Path) -> None:
    """(token_embd.weight comes first in the file, and is the one named.)"""
    path = _write(tmp_path, type_)
    with pytest.raises(UnsupportedError) as e:
        lucebox.Engine(path, ctx=256, device="cuda")
    msg = str(e.value)
    print(msg)
    assert "tensor 'token_embd.weight'" in msg and type_ in msg and what in msg and "CUDA0" in msg
    # the same file runs on the CPU
    assert len(lucebox.Engine(path, ctx=256, device="cpu").generate([1, 2, 3], max_tokens=4).tokens) == 4
