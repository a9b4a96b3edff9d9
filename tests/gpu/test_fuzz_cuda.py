"""scripts/fuzz_cuda.py's first cases on the GPU: fuzz_shapes' random targets, weight and cache types and
drafts run on CUDA against the exact model as the CPU runs them, a restored snapshot against the session
that took it, and speculation (the case's draft, forced chains) against plain CUDA decoding. The script
runs as a user runs it (each case in a child process); a failure names a case to replay with
`--start N --cases 1`."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
CASES = 24


def test_the_first_cases_find_nothing_on_cuda(tmp_path: Path) -> None:
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "fuzz_cuda.py"), "--start", "0", "--cases",
                          str(CASES), "--dir", str(tmp_path)], capture_output=True, text=True, timeout=900, env=env)
    print(run.stdout[-3000:])
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"0 finding(s) in cases [0, {CASES}) on cuda" in run.stdout
    # the cases did the work they claim: every written and loaded one checked its logits and speculated twice
    counts = ast.literal_eval(run.stdout.split("outcomes ", 1)[1].splitlines()[0])
    ran = CASES - counts.get("refused_by_synth", 0) - counts.get("refused_on_device", 0)
    # (case 2 draws conv width 2, which ggml's CUDA conv has no kernel for: lucebox pads it to 3)
    assert "case 2: refused" not in run.stdout
    assert ran >= CASES // 2 and counts["logits_checked"] == ran and counts["spec_checked"] == 2 * ran, counts
