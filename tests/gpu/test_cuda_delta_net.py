"""The fused DeltaNet step ops on CUDA (lucebox's kernels through ggml patch 0007) inside the model:
a tiny model with DeltaNet heads of 128 (the ops' size; the tiny preset's are 32), its logits on
CUDA against the CPU over a short prefill and decode steps (both backends run the ops), and chain
speculation at every forced accept length equal to plain greedy decoding on the GPU (the verify
keeps the ops' inputs, the commit re-runs the kept tokens), or parting only at a near-tie as in
test_cuda_speculative.py (a 16-token verify's attention and products round differently); such a
chain session holds no whole-state checkpoints until a tree asks for them."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import lucebox
from lucebox import _core, synth

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from forcing import forced, forced_tree  # noqa: E402
from exact_model import check_same_or_near_tie  # noqa: E402

pytestmark = pytest.mark.gpu

HEAD128 = dict(ssm_d_state=128, ssm_n_k_heads=2, ssm_n_v_heads=4)
MAX_ABS = 0.5  # Q8_0 weights, as test_cuda_target.py
BLOCK = 16


@pytest.fixture(scope="module")
def target128(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("dn128-gpu") / "target.gguf"
    synth.write_target(str(path), "tiny", type="q8_0", seed=13, overrides=HEAD128)
    return str(path)


def test_logits_with_the_ops_match_cpu(target128: str) -> None:
    ids = [int(x) for x in np.random.default_rng(2).integers(0, 1000, 60)]
    ref = lucebox.Engine(target128, ctx=256, device="cpu", ubatch=32).session().eval(ids)
    before = _core.delta_net_step_runs()
    s = lucebox.Engine(target128, ctx=256, device="cuda", ubatch=32).session()
    got = np.concatenate([s.eval(ids[:40]), *[s.eval([t]) for t in ids[40:]]])
    assert _core.delta_net_step_runs() > before  # lucebox's kernels ran
    diff = np.abs(got - ref).max()
    print(f"max abs diff to the CPU {diff:.4g}")
    assert diff <= MAX_ABS


def test_replayed_commits_equal_plain_greedy_on_gpu(target128: str) -> None:
    engine = lucebox.Engine(target128, ctx=512, device="cuda")
    cpu = lucebox.Engine(target128, ctx=512, device="cpu")
    p = list(range(30, 75))
    ref = engine.generate(p, max_tokens=40).tokens
    for k in (0, 1, 5, BLOCK - 2, None):
        got = engine.session().generate(p, max_tokens=40, propose=forced(ref, len(p), k)).tokens
        common = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), len(ref))
        print(f"corrupt_at={k}: {common} of {len(ref)} tokens as plain decoding")
        check_same_or_near_tie(engine, cpu, p, ref, got)


def test_a_tree_in_a_chain_session_adds_its_state_checkpoints_on_gpu(target128: str) -> None:
    engine = lucebox.Engine(target128, ctx=512, device="cuda")
    cpu = lucebox.Engine(target128, ctx=512, device="cpu")
    hp = engine.hparams
    n_gdn = sum(1 for r in hp.is_recurrent if r)
    state_bytes = n_gdn * hp.ssm_d_state * hp.ssm_d_state * hp.ssm_n_v_heads * 4  # one token's, all layers
    p = list(range(40, 80))
    ref = engine.generate(p, max_tokens=32).tokens
    s = engine.session()
    before = s.state_nbytes
    check_same_or_near_tie(engine, cpu, p, ref, s.generate(p, max_tokens=32, propose=forced(ref, len(p), 5)).tokens)
    assert s.state_nbytes == before  # chain verifies: the fused inputs only
    s.reset()
    tree = s.generate(p, max_tokens=32, propose_tree=forced_tree(ref, len(p), 4)).tokens
    check_same_or_near_tie(engine, cpu, p, ref, tree)
    added = s.state_nbytes - before
    print(f"state checkpoints added by the first tree: {added} bytes")
    assert 16 * state_bytes <= added <= 16 * state_bytes + 4096  # 16 slots (forced blocks), device memory
