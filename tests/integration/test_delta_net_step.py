"""The fused DeltaNet step ops (cpp/kernels/delta_net_step.h) inside the model, on the CPU: the tiny
preset's DeltaNet heads are 32 wide, so these tests use heads of 128 (the ops' size, every real
qwen35 GGUF's): the forward agrees with upstream llama.cpp with the ops in use (short batches and
decode steps), and chain speculation with every accept length equals plain greedy decoding (the
verify keeps the ops' inputs, the commit re-runs the kept tokens and copies the conv windows in one
node), at other conv lengths and layer patterns, after snapshot restores and on a layer split's
ranges, without memory for whole DeltaNet states until a tree asks for them."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import lucebox
from lucebox import _core, synth
from forcing import forced, forced_tree

HEAD128 = dict(ssm_d_state=128, ssm_n_k_heads=1, ssm_n_v_heads=2)
BLOCK = 16


@pytest.fixture(scope="module")
def target128(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("dn128") / "target.gguf"
    synth.write_target(str(path), "tiny", type="f32", seed=9, overrides=HEAD128)
    return str(path)


def test_forward_with_the_ops_matches_upstream(target128: str) -> None:
    oracle = pytest.importorskip("oracle")
    ok, why = oracle.available()
    if not ok:
        pytest.skip(why)
    ids = [int(x) for x in np.random.default_rng(1).integers(0, 1000, 70)]
    before = _core.delta_net_step_runs()
    ours = lucebox.Engine(target128, ctx=300, device="cpu", ubatch=32).session().eval(ids)
    assert _core.delta_net_step_runs() > before  # 32-token micro-batches: the ops, not ggml's
    ref = oracle.reference_logits(target128, ids, n_ctx=512)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 2e-2  # as test_oracle_shapes.py (F32 weights)
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() >= 0.98


def test_a_tokens_bits_do_not_depend_on_its_batch(target128: str) -> None:
    # on the CPU the ops take batches of any length (a prefill's micro-batch of more than MAX_TOKENS
    # (64) tokens too), so a prompt's logits are the same bits in micro-batches of 1, 16 or 512
    ids = [int(x) for x in np.random.default_rng(2).integers(0, 1000, 150)]
    rows = {}
    for ubatch in (1, 16, 512):
        before = _core.delta_net_step_runs()
        rows[ubatch] = lucebox.Engine(target128, ctx=300, device="cpu", ubatch=ubatch).session().eval(ids)
        assert _core.delta_net_step_runs() > before
    np.testing.assert_array_equal(rows[16], rows[1])
    np.testing.assert_array_equal(rows[512], rows[1])


def test_a_tree_of_more_than_64_nodes_equals_plain_greedy(target128: str) -> None:
    # a DDTree verify of more nodes than MAX_TOKENS runs the ops too on the CPU: each node gets
    # the bits of the decode steps along its path (the emitted tokens' logprobs, exactly)
    engine = lucebox.Engine(target128, ctx=512, device="cpu", tree_budget=100)
    p = [int(x) for x in np.random.default_rng(4).integers(0, 1000, 30)]
    ref = engine.generate(p, max_tokens=30, logprobs=0)
    for depth in (0, 3, 12):
        got = engine.session().generate(p, max_tokens=30, logprobs=0,
                                         propose_tree=forced_tree(ref.tokens, len(p), depth))
        assert got.tokens == ref.tokens, f"depth {depth}"
        assert [lp.logprob for lp in got.logprobs] == [lp.logprob for lp in ref.logprobs], f"depth {depth}"


def test_replayed_commits_equal_plain_greedy(target128: str) -> None:
    engine = lucebox.Engine(target128, ctx=512, device="cpu")
    rng = np.random.default_rng(7)
    for i in range(3):
        p = [int(x) for x in rng.integers(0, 1000, int(rng.integers(5, 60)))]
        before = _core.delta_net_step_runs()
        ref = engine.generate(p, max_tokens=40).tokens
        assert _core.delta_net_step_runs() > before
        for k in (0, 1, 5, BLOCK - 2, None):  # accept lengths 0, 1, 5, 14, then all 15
            got = engine.session().generate(p, max_tokens=40, propose=forced(ref, len(p), k))
            assert got.tokens == ref, f"prompt {i}, corrupt_at={k}"
            assert got.stats.spec["fast_rollbacks"] == got.stats.spec["steps"]


@pytest.mark.parametrize("shape", [
    dict(ssm_d_conv=2),  # a one-value window
    dict(ssm_d_conv=6, ssm_n_k_heads=2, ssm_n_v_heads=6, n_layer=6,  # three value heads a key head, as the 27B
         recurrent_layers=(True, False, True, True, True, False)),
    dict(ssm_d_conv=8),  # the longest conv the fused ops take (MAX_D_CONV)
], ids=["conv2", "conv6_three_value_heads_a_key_head_six_layers", "conv8"])
def test_replayed_commits_equal_plain_greedy_at_other_shapes(tmp_path: Path, shape: dict) -> None:
    # the commit's one replay_layers node also carries each layer's conv window, d_conv-1 values a
    # channel from a checkpoint d_conv-1+16 wide: other conv lengths, head counts and layer patterns
    # than the preset's still equal plain greedy decoding at every accept length
    path = tmp_path / "target.gguf"
    synth.write_target(str(path), "tiny", type="f32", seed=4, overrides={**HEAD128, **shape})
    engine = lucebox.Engine(str(path), ctx=256, device="cpu")
    p = [int(x) for x in np.random.default_rng(5).integers(0, 1000, 23)]
    before = _core.delta_net_step_runs()
    ref = engine.generate(p, max_tokens=36).tokens
    assert _core.delta_net_step_runs() > before
    for k in (0, 2, BLOCK - 3, None):
        got = engine.session().generate(p, max_tokens=36, propose=forced(ref, len(p), k))
        assert got.tokens == ref, f"corrupt_at={k}"
        assert got.stats.spec["fast_rollbacks"] == got.stats.spec["steps"]


def test_a_conv_longer_than_the_ops_take_runs_ggml_ops(tmp_path: Path) -> None:
    # conv kernel 9 > MAX_D_CONV (8): ggml's ops, and speculation still equals plain greedy decoding
    path = tmp_path / "conv9.gguf"
    synth.write_target(str(path), "tiny", type="f32", seed=5, overrides=dict(HEAD128, ssm_d_conv=9))
    engine = lucebox.Engine(str(path), ctx=256, device="cpu")
    p = [int(x) for x in np.random.default_rng(3).integers(0, 1000, 20)]
    before = _core.delta_net_step_runs()
    ref = engine.generate(p, max_tokens=24).tokens
    assert _core.delta_net_step_runs() == before
    got = engine.session().generate(p, max_tokens=24, propose=forced(ref, len(p), 5))
    assert got.tokens == ref


def test_chain_sessions_hold_no_state_checkpoints_until_a_tree(target128: str) -> None:
    # chain verifies of fused layers keep their inputs: neither the plan nor the session holds whole
    # DeltaNet states per verified token; a tree (propose_tree) adds them on first use, and both
    # still equal plain greedy decoding
    engine = lucebox.Engine(target128, ctx=256, device="cpu")
    hp = _core.TargetFile.open(target128).hparams
    n_gdn = sum(1 for r in hp.is_recurrent if r)
    state_bytes = n_gdn * hp.ssm_d_state * hp.ssm_d_state * hp.ssm_n_v_heads * 4  # one token's, all layers
    plan = engine.memory_plan()
    kept = _core.plan_memory(_core.TargetFile.open(target128), n_ctx=256, verify_tokens=16, keep_states=True)
    assert plan["checkpoint_bytes_per_token"] + state_bytes == kept["checkpoint_bytes_per_token"]
    assert plan["checkpoint_bytes"] == 16 * plan["checkpoint_bytes_per_token"]

    p = [int(x) for x in np.random.default_rng(11).integers(0, 1000, 30)]
    ref = engine.generate(p, max_tokens=40).tokens
    s = engine.session()
    before = s.state_nbytes
    got = s.generate(p, max_tokens=40, propose=forced(ref, len(p), 5))
    assert got.tokens == ref and s.state_nbytes == before
    s.reset()
    got = s.generate(p, max_tokens=40, propose_tree=forced_tree(ref, len(p), 4))
    assert got.tokens == ref
    added = s.state_nbytes - before
    assert 16 * state_bytes <= added <= 16 * state_bytes + 4096  # 16 checkpoint slots (forced blocks)
    s.reset()  # the checkpoints stay: a chain, then a tree again
    assert s.generate(p, max_tokens=40, propose=forced(ref, len(p), 3)).tokens == ref
    s.reset()
    assert s.generate(p, max_tokens=40, propose_tree=forced_tree(ref, len(p), 2)).tokens == ref
    assert s.state_nbytes == before + added


def test_restored_sessions_replay_their_own_states(target128: str) -> None:
    # a commit's replay_layers node writes through the addresses in the session's replay table: a
    # snapshot restored into another session (from host or device memory), or into the same session
    # after more steps, continues with chain speculation exactly as plain greedy decoding
    engine = lucebox.Engine(target128, ctx=256, device="cpu")
    p = [int(x) for x in np.random.default_rng(2).integers(0, 1000, 30)]
    ref = engine.generate(p, max_tokens=50).tokens
    s = engine.session()
    first = s.generate(p, max_tokens=20, propose=forced(ref, len(p), 5)).tokens
    snap = s.snapshot("host")
    for copy in (snap, engine.copy_snapshot(snap, "device")):
        other = engine.session()
        other.restore(copy)
        assert first + other.generate([], max_tokens=30, propose=forced(ref, len(p), 3)).tokens == ref
    s.generate([], max_tokens=10, propose=forced(ref, len(p), 7))
    s.restore(snap)
    assert first + s.generate([], max_tokens=30, propose=forced(ref, len(p), 2)).tokens == ref


@pytest.mark.parametrize("pattern,devices,proportions", [
    (None, ["cpu:0", "cpu:1"], ()),
    # the middle range holds attention layers only: no replay table there
    ((True, True, False, False, True, True), ["cpu:0", "cpu:1", "cpu:2"], (1.0, 1.0, 1.0)),
], ids=["two_ranges", "a_range_without_deltanet"])
def test_layer_split_replays_each_range(tmp_path: Path, pattern: tuple[bool, ...] | None, devices: list[str],
                                        proportions: tuple[float, ...]) -> None:
    # a layer split's ranges each commit their own fused layers through their own replay table: chain
    # speculation at every accept length equals one device's plain greedy decoding
    path = tmp_path / "target.gguf"
    shape = {} if pattern is None else dict(n_layer=len(pattern), recurrent_layers=pattern)
    synth.write_target(str(path), "tiny", type="f32", seed=3, overrides={**HEAD128, **shape})
    single = lucebox.Engine(str(path), ctx=256, device="cpu")
    split = lucebox.Engine(str(path), ctx=256, devices=devices, split="layer", layer_proportions=proportions)
    p = [int(x) for x in np.random.default_rng(8).integers(0, 1000, 26)]
    ref = single.generate(p, max_tokens=36).tokens
    for k in (0, 4, None):
        before = _core.delta_net_step_runs()
        got = split.session().generate(p, max_tokens=36, propose=forced(ref, len(p), k))
        assert got.tokens == ref, f"corrupt_at={k}"
        assert _core.delta_net_step_runs() > before
        assert got.stats.spec["fast_rollbacks"] == got.stats.spec["steps"]
