"""scripts/fuzz_shapes.py's first cases as a test: random target shapes, weight types, K / V cache types,
micro-batches and drafts against upstream llama.cpp (one-token bits), a restored prefix against the cold
prefill, speculation against plain decoding, with upstream's DFlash example built the drafts' proposals
against upstream's at every step, and placements over several CPU devices against one. The script runs as a user runs it (upstream in a child
process, since it aborts on some shapes); its cases are seeded, so a failure names a case to replay
with `--start N --cases 1`."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES = 16  # ~10 s on a 2-core machine; the script's own runs cover thousands


def test_the_first_cases_find_nothing(tmp_path: Path) -> None:
    oracle = pytest.importorskip("oracle")
    ok, why = oracle.available()
    if not ok:
        pytest.skip(why)
    env = dict(os.environ, GGML_NO_BACKTRACE="1")  # (upstream's aborts print no gdb backtrace)
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "fuzz_shapes.py"), "--start", "0", "--cases",
                          str(CASES), "--dir", str(tmp_path)], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"0 finding(s) in cases [0, {CASES})" in run.stdout
    # the cases did the work they claim: most compared with upstream, every written one speculated
    counts = ast.literal_eval(run.stdout.split("outcomes ", 1)[1].splitlines()[0])
    assert counts["compared"] >= CASES // 2 and counts["spec_checked"] == CASES - counts["refused_by_synth"]
    assert counts["layer_splits_checked"] + counts["tensor_splits_checked"] + counts["tensor_splits_refused"] \
        == counts["spec_checked"] and counts["layer_splits_checked"] > 0
    import upstream_spec
    if upstream_spec.find_binary()[0] is not None:
        assert counts["draft_steps_checked"] > counts["draft_steps_own_types"] > 0, counts  # (F32 twins and own types)
